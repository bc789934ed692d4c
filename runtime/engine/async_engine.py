"""AsyncEngine: the synchronous `EngineCore` on its own thread, behind an asyncio façade.

Why a thread: a step is long (tens of ms of model compute) and must not block the event loop
that accepts requests and streams tokens; PyTorch releases the GIL inside its kernels, so HTTP
work overlaps the model. The thread owns the core exclusively. The event loop talks to it only
through an inbox of commands (add, abort, call) and receives each step's outputs in one
`loop.call_soon_threadsafe` batch, which fans them out to per-request asyncio queues.

The serving layer sees only this class and the immutable `EngineInfo` snapshot it publishes once
the model is loaded (tokenizer, context length, vocabulary), never the core itself.

Failure model: a bad request is rejected before it reaches the thread (`validate`, one path,
errors are `ParamError(field, message)`); an error while adding one request fails only that
request. An exception inside `step()` cannot be pinned on one request, so it is fatal: every
stream fails, `error` is set and `/health` turns 503.

Fair sharing (docs/reliability.md): limits count sequences, prompts × n. The waiting queue holds
`max_queue_len` of them; one request may ask for at most `max_seqs_per_request`, and never more
than half the queue. Requests of several sequences ("bulk") may together fill the queue but for
a reserve kept for single-sequence requests. A bulk request is not handed to the core all at
once either: its prompts wait here and are fed round-robin with the other bulk requests, so that
together they hold at most `max_num_seqs` minus a reserve of the core's sequence slots. A
single-sequence request goes to the core at once and finds a reserved slot, so a short request
is never queued behind the thousands of sequences one client asked for.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.sampling.params import ParamError, SamplingParams

if TYPE_CHECKING:
    from pagoda.runtime.engine.core import EngineCore

log = logging.getLogger(__name__)


class EngineUnavailableError(RuntimeError):
    """The engine cannot take requests now (loading, draining or dead): HTTP 503."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFullError(EngineUnavailableError):
    """More than `max_queue_len` requests wait for their first token: HTTP 503 + Retry-After."""


class StepObserver(Protocol):
    """Metrics hook; `record_step` runs on the engine thread and must stay cheap."""

    def record_step(self, outputs: Sequence[StepOutput], stats: EngineStats | None) -> None: ...

    def record_abort(self, arrival_time: float, tokens_per_sample: Sequence[int]) -> None: ...


_END = object()


class RequestStream:
    """The outputs of one request (all `n` samples), consumed with `async for`."""

    def __init__(self, request_id: str, n: int) -> None:
        self.request_id = request_id
        self.n = n
        self.arrival_time = time.monotonic()
        self.done = [False] * n
        self.tokens = [0] * n  # output tokens so far, per sample
        self.finished = False  # every sample finished, or the request failed/aborted
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    def _put(self, out: StepOutput) -> bool:
        """Event loop: queue one delta; True once every sample has finished."""
        self.tokens[out.index] = out.num_output_tokens
        self._queue.put_nowait(out)
        if out.finished:
            self.done[out.index] = True
            if all(self.done):
                self.finished = True
                self._queue.put_nowait(_END)
        return self.finished

    def _abort(self) -> None:
        for i, d in enumerate(self.done):
            if not d:
                end = StepOutput(
                    request_id=self.request_id,
                    index=i,
                    new_token_ids=[],
                    new_text="",
                    new_logprobs=[],
                    finished=True,
                    finish_reason="abort",
                    num_output_tokens=self.tokens[i],
                )
                self._queue.put_nowait(end)
        self.finished = True
        self._queue.put_nowait(_END)

    def _fail(self, exc: BaseException) -> None:
        self.finished = True
        self._queue.put_nowait(exc)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StepOutput:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # stay exhausted
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item


class AsyncEngine:
    """Engine thread + event-loop bookkeeping. All public methods run on the event loop."""

    def __init__(
        self,
        core_factory: Callable[[], EngineCore],
        *,
        max_queue_len: int = 512,
        max_seqs_per_request: int | None = None,
        max_num_seqs: int | None = None,
        observer: StepObserver | None = None,
        retry_after: int = 1,
    ) -> None:
        """`max_queue_len`: sequences waiting for their first token; `max_seqs_per_request`
        (default and at most: half of `max_queue_len`): prompts × n of one request;
        `max_num_seqs`: the core's batch, whose slots bulk requests share (None: no rule)."""
        self._factory = core_factory
        self.max_queue_len = max_queue_len
        half = max(1, max_queue_len // 2)
        self.max_seqs_per_request = min(max_seqs_per_request or half, half)
        self.bulk_queue = max_queue_len - reserved(max_queue_len)  # room bulk requests share
        self.bulk_slots = None if max_num_seqs is None else max_num_seqs - reserved(max_num_seqs)
        self.observer = observer
        self.retry_after = retry_after
        self._core: EngineCore | None = None  # the engine thread's; never touched elsewhere
        self.info: EngineInfo | None = None  # published once the model is loaded
        self.ready = False  # model loaded and one warm-up step done
        self.draining = False
        self.error: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}
        self._queued: dict[str, tuple[int, bool]] = {}  # no output yet: id -> (seqs, bulk)
        self._num_queued = 0  # their sum: the waiting queue we bound
        self._bulk_queued = 0  # the part of it from bulk requests
        # Multi-sequence requests: prompts not handed to the core yet, per request batch
        # (round-robin order), and the unfinished sequences of those handed over.
        self._backlog: collections.OrderedDict[str, collections.deque[tuple]] = (
            collections.OrderedDict()
        )
        self._bulk: dict[str, int] = {}  # request id -> unfinished sequences in the core
        self._bulk_seqs = 0
        self._feed_pending = False
        self._inbox: collections.deque[tuple] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started: asyncio.Future[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (it loads the model, warms up, then serves)."""
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name="pagoda-engine", daemon=True)
        self._thread.start()

    async def wait_started(self) -> None:
        """Return once ready; raise the load/warm-up error if the thread died first."""
        assert self._started is not None, "start() first"
        await asyncio.shield(self._started)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    @property
    def dead(self) -> bool:
        """The loop failed, or its thread ended without being asked to stop."""
        thread_gone = self._thread is not None and not self._thread.is_alive() and not self._stop
        return self.error is not None or thread_gone

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_queued(self) -> int:
        """Sequences accepted that have no output yet (the bound of `max_queue_len`)."""
        return self._num_queued

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, let in-flight ones finish for `timeout` s, abort the rest.

        Returns the number of requests aborted at the deadline.
        """
        self.draining = True
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = list(self._streams)
        for rid in left:
            self.abort(rid)
        return len(left)

    # -- requests (event loop) ---------------------------------------------------------------
    def loaded_info(self) -> EngineInfo:
        """The engine's info, or EngineUnavailableError (503) while it cannot take requests."""
        if self.error is not None:
            raise EngineUnavailableError(f"engine loop died: {self.error!r}")
        if self.draining:
            raise EngineUnavailableError("server is shutting down", self.retry_after)
        if not self.ready or self.info is None:
            raise EngineUnavailableError("model is still loading", self.retry_after)
        return self.info

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """The one validation path: ParamError for bad input, EngineUnavailableError if down."""
        if not isinstance(params, SamplingParams):
            raise TypeError("params must be a SamplingParams")
        self.loaded_info().validate(prompt_token_ids, params)

    def check_prompts(
        self, info: EngineInfo, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> None:
        """The per-prompt checks of `add_requests` (ParamError), safe on any thread: they read
        the immutable `info` and fixed limits only. The server runs them on its worker thread,
        so a 4 MiB body of token ids (2 M ids, about a second of Python) is never scanned on
        the event loop; it then calls `add_requests(..., checked=True)`."""
        self.check_size(len(prompts), params)
        for ids in prompts:
            info.validate(ids, params)
            time.sleep(0)  # let the event loop's thread take the GIL between prompts

    def add_requests(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        prefix: str,
        *,
        checked: bool = False,
    ) -> list[RequestStream]:
        """Admit a batch all-or-nothing (ids `prefix-0`, `prefix-1`, ...).

        More sequences (prompts × n) than `max_seqs_per_request` can never be admitted:
        ParamError (400), not 503. A full queue is QueueFullError (503). `checked`: the
        prompts passed `check_prompts` already (the engine's availability is checked here).
        """
        self.check_size(len(prompts), params)
        if checked:
            self.loaded_info()
        else:
            for ids in prompts:
                self.validate(ids, params)
        seqs = len(prompts) * params.n
        bulk = seqs > 1
        self._check_room(seqs, bulk)
        rids = [f"{prefix}-{i}" for i in range(len(prompts))]
        if any(rid in self._streams for rid in rids):
            raise ValueError(f"duplicate request id prefix {prefix!r}")
        streams = [self._admit(rid, params, bulk) for rid in rids]
        if bulk and self.bulk_slots is not None:  # shared out round-robin (`_feed`)
            self._backlog[prefix] = collections.deque(
                (rid, list(ids), params) for rid, ids in zip(rids, prompts)
            )
            self._feed()
        else:
            for rid, ids in zip(rids, prompts):
                self._post(("add", rid, list(ids), params))
        return streams

    def check_size(self, num_prompts: int, params: SamplingParams) -> None:
        """ParamError when prompts × n exceeds what one request may ask for."""
        seqs, cap = num_prompts * params.n, self.max_seqs_per_request
        if seqs > cap:
            field = "n" if num_prompts == 1 else "prompt"
            raise ParamError(
                field,
                f"{field}: this request asks for {num_prompts} prompt(s) × n={params.n} = {seqs} "
                f"sequences; this server takes at most {cap} per request",
            )

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Admit a request or raise: ParamError (bad input), EngineUnavailableError, QueueFullError."""
        self.check_size(1, params)
        self.validate(prompt_token_ids, params)
        self._check_room(params.n, params.n > 1)
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"duplicate request id {rid!r}")
        stream = self._admit(rid, params, params.n > 1)
        self._post(("add", rid, list(prompt_token_ids), params))
        return stream

    def _check_room(self, seqs: int, bulk: bool) -> None:
        full = self._num_queued + seqs > self.max_queue_len
        if full or (bulk and self._bulk_queued + seqs > self.bulk_queue):
            raise QueueFullError(
                f"too many waiting sequences ({self._num_queued} of {self.max_queue_len}"
                f"{', of which multi-sequence requests may fill ' if bulk else ''}"
                f"{self.bulk_queue if bulk else ''}); retry later",
                self.retry_after,
            )

    def _admit(self, rid: str, params: SamplingParams, bulk: bool) -> RequestStream:
        stream = RequestStream(rid, params.n)
        self._streams[rid] = stream
        self._queued[rid] = (params.n, bulk)
        self._num_queued += params.n
        self._bulk_queued += params.n if bulk else 0
        return stream

    def _unqueue(self, rid: str) -> None:
        seqs, bulk = self._queued.pop(rid, (0, False))
        self._num_queued -= seqs
        self._bulk_queued -= seqs if bulk else 0

    def _feed(self) -> None:
        """Hand waiting prompts of multi-sequence requests to the core, one per request in
        turn, while they hold fewer than `bulk_slots` sequences there (at least one prompt
        whenever none is there, so a prompt with n above the share still runs)."""
        assert self.bulk_slots is not None
        while self._backlog:
            prefix, prompts = next(iter(self._backlog.items()))
            rid, ids, params = prompts[0]
            if self._bulk_seqs and self._bulk_seqs + params.n > self.bulk_slots:
                return
            prompts.popleft()
            if prompts:
                self._backlog.move_to_end(prefix)
            else:
                del self._backlog[prefix]
            self._bulk[rid] = params.n
            self._bulk_seqs += params.n
            self._post(("add", rid, ids, params))

    def _feed_soon(self) -> None:
        if self._loop is None:
            self._feed()
        elif not self._feed_pending:
            self._feed_pending = True
            self._loop.call_soon(self._fed_later)

    def _fed_later(self) -> None:
        self._feed_pending = False
        self._feed()

    def _release(self, rid: str, seqs: int | None = None) -> None:
        """`seqs` (all when None) of a multi-sequence request's core sequences are done."""
        held = self._bulk.get(rid)
        if held is None:
            return
        done = held if seqs is None else min(seqs, held)
        self._bulk_seqs -= done
        if held == done:
            del self._bulk[rid]
        else:
            self._bulk[rid] = held - done

    def _drop_waiting(self, rid: str) -> bool:
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

    def abort(self, request_id: str) -> None:
        """Abort a request still running (no-op otherwise); its blocks are freed next iteration."""
        stream = self._streams.pop(request_id, None)
        self._unqueue(request_id)
        if stream is None or stream.finished:
            return
        if not self._drop_waiting(request_id):
            self._post(("abort", request_id))
        if request_id in self._bulk:
            self._release(request_id)
            self._feed_soon()  # after the caller's other aborts (a job aborts all its prompts)
        if self.observer is not None and not stream.done[0]:
            pending = [t for t, d in zip(stream.tokens, stream.done) if not d]
            self.observer.record_abort(stream.arrival_time, pending)
        stream._abort()

    async def check_integrity(self) -> dict[str, Any]:
        """Block-pool integrity check (raises if inconsistent) and stats, between steps."""

        def probe(core: EngineCore) -> dict[str, Any]:
            core.check_integrity()
            return dataclasses.asdict(core.stats())

        stats = await self.run_in_engine(probe)
        return {"stats": stats, "in_flight": self.num_in_flight, "queued": self.num_queued}

    async def run_in_engine(self, fn: Callable[[EngineCore], Any]) -> Any:
        """Run `fn(core)` on the engine thread between steps (debug endpoints, tests)."""
        if not self.alive:
            raise EngineUnavailableError("engine loop is not running")
        assert self._loop is not None
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._post(("call", fn, fut))
        return await fut

    def _post(self, cmd: tuple) -> None:
        self._inbox.append(cmd)
        self._wake.set()

    # -- event-loop callbacks (scheduled from the engine thread) -----------------------------
    def _dispatch(self, outputs: list[StepOutput]) -> None:
        released = False
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted meanwhile
            if out.request_id in self._queued:
                self._unqueue(out.request_id)
            if out.finished and out.request_id in self._bulk:
                self._release(out.request_id, 1)
                released = True
            if stream._put(out):
                del self._streams[out.request_id]
        if released and self._backlog:
            self._feed()

    def _fail(self, request_id: str, exc: BaseException) -> None:
        self._unqueue(request_id)
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream._fail(exc)
        if request_id in self._bulk:
            self._release(request_id)
            if self._backlog:
                self._feed()

    def _fail_all(self, exc: BaseException) -> None:
        self._backlog.clear()
        for rid in list(self._streams):
            self._fail(rid, EngineUnavailableError(f"engine loop died: {exc!r}"))
        if self._started is not None and not self._started.done():
            self._started.set_exception(exc)

    def _set_ready(self) -> None:
        self.ready = True
        if self._started is not None and not self._started.done():
            self._started.set_result(None)

    # -- the engine thread -------------------------------------------------------------------
    def _call_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: the server is going away
            self._stop = True

    def _run(self) -> None:
        try:
            self._core = core = self._factory()
            self.info = EngineInfo.from_core(core)
            self._warm_up(core)
            self._call_loop(self._set_ready)
            self._serve(core)
        except BaseException as exc:
            log.exception("engine loop died")
            self.error = exc
            self._call_loop(self._fail_all, exc)

    def _warm_up(self, core: EngineCore) -> None:
        """One real step, so the first client does not pay for lazy initialisation."""
        ids = core.tokenizer.encode("Hello") or [0]
        core.add_request("__warmup__", ids, SamplingParams(max_tokens=1, temperature=0.0))
        while core.has_unfinished_requests():
            core.step()
        self._stats(core)

    def _stats(self, core: EngineCore, outputs: Sequence[StepOutput] = ()) -> None:
        if self.observer is None:
            return
        try:
            self.observer.record_step(outputs, core.stats())
        except Exception:  # metrics must never take the engine down
            log.exception("metrics update failed")

    def _serve(self, core: EngineCore) -> None:
        while not self._stop:
            self._wake.clear()
            had_cmds = self._apply_inbox(core)
            if not core.has_unfinished_requests():
                if had_cmds:
                    self._stats(core)
                self._wake.wait()
                continue
            outputs = core.step()
            self._stats(core, outputs)
            if outputs:
                self._call_loop(self._dispatch, outputs)

    def _apply_inbox(self, core: EngineCore) -> bool:
        n = 0
        while self._inbox:
            cmd = self._inbox.popleft()
            n += 1
            kind = cmd[0]
            if kind == "add":
                _, rid, ids, params = cmd
                try:
                    core.add_request(rid, ids, params)
                except Exception as exc:  # this request only
                    self._call_loop(self._fail, rid, exc)
            elif kind == "abort":
                core.abort_request(cmd[1])
            elif kind == "call":
                _, fn, fut = cmd
                try:
                    result, exc = fn(core), None
                except Exception as e:
                    result, exc = None, e
                self._call_loop(_settle, fut, result, exc)
        return n > 0


def reserved(slots: int) -> int:
    """Of `slots` (the core's batch, the waiting queue), those kept for single-sequence
    requests: an eighth, at least one, never all of them."""
    return min(slots - 1, max(1, slots // 8))


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
