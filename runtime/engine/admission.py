"""Admission and fair sharing: which requests the engine takes now, which it refuses (400 or
503), and in what order the prompts of multi-sequence requests reach the core.

Fair sharing (docs/reliability.md): limits count sequences, prompts × n. The waiting queue holds
`max_queue_len` of them; one request may ask for at most `max_seqs_per_request`, and never more
than half the queue. Requests of several sequences ("bulk") may together fill the queue but for
a reserve kept for single-sequence requests. A bulk request is not handed to the core all at
once either: its prompts wait here and are fed round-robin with the other bulk requests, so that
together they hold at most `max_num_seqs` minus a reserve of the core's sequence slots. A
single-sequence request goes to the core at once and finds a reserved slot, so a short request
is never queued behind the thousands of sequences one client asked for.

`Admission` is bookkeeping only, run on the event loop: it never talks to the core.
`AsyncEngine` asks it before admitting (`check_size`, `check_room`), tells it what happened
(`admit`, `unqueue`, `release`) and hands the core what `next_for_core` returns.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from pagoda.runtime.sampling.params import ParamError, SamplingParams

# A prompt of a bulk request not handed to the core yet: (request id, token ids, params).
Waiting = tuple[str, list[int], SamplingParams]


class EngineUnavailableError(RuntimeError):
    """The engine cannot take requests now (loading, draining or dead): HTTP 503."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFullError(EngineUnavailableError):
    """More than `max_queue_len` requests wait for their first token: HTTP 503 + Retry-After."""


def reserved(slots: int) -> int:
    """Of `slots` (the core's batch, the waiting queue), those kept for single-sequence
    requests: an eighth, at least one, never all of them."""
    return min(slots - 1, max(1, slots // 8))


class Admission:
    """The waiting queue's bounds and the bulk requests' share of the core's batch."""

    def __init__(
        self,
        max_queue_len: int = 512,
        max_seqs_per_request: int | None = None,
        max_num_seqs: int | None = None,
        retry_after: int = 1,
    ) -> None:
        """`max_queue_len`: sequences waiting for their first token; `max_seqs_per_request`
        (default and at most: half of `max_queue_len`): prompts × n of one request;
        `max_num_seqs`: the core's batch, whose slots bulk requests share (None: no rule);
        `retry_after`: the seconds a full queue's 503 asks the client to wait."""
        self.max_queue_len = max_queue_len
        half = max(1, max_queue_len // 2)
        self.max_seqs_per_request = min(max_seqs_per_request or half, half)
        self.bulk_queue = max_queue_len - reserved(max_queue_len)  # room bulk requests share
        self.bulk_slots = None if max_num_seqs is None else max_num_seqs - reserved(max_num_seqs)
        self.retry_after = retry_after
        self._queued: dict[str, tuple[int, bool]] = {}  # no output yet: id -> (seqs, bulk)
        self._num_queued = 0  # their sum: the waiting queue we bound
        self._bulk_queued = 0  # the part of it from bulk requests
        # Multi-sequence requests: prompts not handed to the core yet, per request batch
        # (round-robin order), and the unfinished sequences of those handed over.
        self._backlog: collections.OrderedDict[str, collections.deque[Waiting]] = (
            collections.OrderedDict()
        )
        self._bulk: dict[str, int] = {}  # request id -> unfinished sequences in the core
        self._bulk_seqs = 0

    @property
    def num_queued(self) -> int:
        """Sequences accepted that have no output yet (the bound of `max_queue_len`)."""
        return self._num_queued

    @property
    def bulk_in_core(self) -> int:
        """Unfinished sequences of bulk requests handed to the core."""
        return self._bulk_seqs

    @property
    def num_waiting(self) -> int:
        """Prompts of bulk requests waiting here for their turn at the core."""
        return sum(len(prompts) for prompts in self._backlog.values())

    @property
    def num_waiting_seqs(self) -> int:
        """Sequences (prompts × n) of bulk requests waiting here for their turn at the core."""
        return sum(len(p) * p[0][2].n for p in self._backlog.values() if p)

    @property
    def has_waiting(self) -> bool:
        """Some bulk prompt waits here for the core."""
        return bool(self._backlog)

    @property
    def paces_bulk(self) -> bool:
        """Bulk prompts wait here for a share of the core's batch (`max_num_seqs` was given)."""
        return self.bulk_slots is not None

    # -- the decisions -----------------------------------------------------------------------
    def check_size(self, num_prompts: int, params: SamplingParams) -> None:
        """ParamError (400) when prompts × n exceeds what one request may ask for."""
        seqs, cap = num_prompts * params.n, self.max_seqs_per_request
        if seqs > cap:
            field = "n" if num_prompts == 1 else "prompt"
            raise ParamError(
                field,
                f"{field}: this request asks for {num_prompts} prompt(s) × n={params.n} = {seqs} "
                f"sequences; this server takes at most {cap} per request",
            )

    def check_room(self, seqs: int, bulk: bool) -> None:
        """QueueFullError (503 + Retry-After) when `seqs` more sequences do not fit now."""
        full = self._num_queued + seqs > self.max_queue_len
        if full or (bulk and self._bulk_queued + seqs > self.bulk_queue):
            raise QueueFullError(
                f"too many waiting sequences ({self._num_queued} of {self.max_queue_len}"
                f"{', of which multi-sequence requests may fill ' if bulk else ''}"
                f"{self.bulk_queue if bulk else ''}); retry later",
                self.retry_after,
            )

    # -- the bookkeeping ---------------------------------------------------------------------
    def admit(self, rid: str, seqs: int, bulk: bool) -> None:
        """Count request `rid` (`seqs` sequences) as waiting for its first output."""
        self._queued[rid] = (seqs, bulk)
        self._num_queued += seqs
        self._bulk_queued += seqs if bulk else 0

    def unqueue(self, rid: str) -> None:
        """`rid` has an output, failed or was aborted: it no longer waits (no-op if it did not)."""
        seqs, bulk = self._queued.pop(rid, (0, False))
        self._num_queued -= seqs
        self._bulk_queued -= seqs if bulk else 0

    def hold_back(self, prefix: str, prompts: Sequence[Waiting]) -> None:
        """A bulk batch's prompts (ids `prefix-i`) wait here; `next_for_core` feeds them."""
        self._backlog[prefix] = collections.deque(prompts)

    def next_for_core(self) -> list[Waiting]:
        """The waiting prompts of multi-sequence requests to hand to the core now, one per
        request in turn, while they hold fewer than `bulk_slots` sequences there (at least one
        prompt whenever none is there, so a prompt with n above the share still runs)."""
        assert self.bulk_slots is not None
        fed: list[Waiting] = []
        while self._backlog:
            prefix, prompts = next(iter(self._backlog.items()))
            rid, ids, params = prompts[0]
            if self._bulk_seqs and self._bulk_seqs + params.n > self.bulk_slots:
                break
            prompts.popleft()
            if prompts:
                self._backlog.move_to_end(prefix)
            else:
                del self._backlog[prefix]
            self._bulk[rid] = params.n
            self._bulk_seqs += params.n
            fed.append((rid, ids, params))
        return fed

    def release(self, rid: str, seqs: int | None = None) -> bool:
        """`seqs` (all when None) of a bulk request's sequences in the core are done; False if
        `rid` holds none there (not a bulk request, or not handed over)."""
        held = self._bulk.get(rid)
        if held is None:
            return False
        done = held if seqs is None else min(seqs, held)
        self._bulk_seqs -= done
        if held == done:
            del self._bulk[rid]
        else:
            self._bulk[rid] = held - done
        return True

    def drop_waiting(self, rid: str) -> bool:
        """Remove a prompt still waiting here for the core; True if it was."""
        prefix = rid.rpartition("-")[0]
        prompts = self._backlog.get(prefix)
        if prompts is None:
            return False
        kept = collections.deque(p for p in prompts if p[0] != rid)
        if len(kept) == len(prompts):
            return False
        if kept:
            self._backlog[prefix] = kept
        else:
            del self._backlog[prefix]
        return True

    def clear_waiting(self) -> None:
        """Forget every prompt waiting here (the engine died)."""
        self._backlog.clear()
