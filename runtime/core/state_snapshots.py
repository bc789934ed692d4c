"""Snapshots of a hybrid model's Mamba state at prefix boundaries, for prefix caching (vLLM v1's
Mamba prefix caching in its "align" mode, in small): which prefixes have one, on the scheduler's
side. The state itself lives on the device (`worker/mamba_state.py`).

A prefix-cache hit skips the attention layers' tokens through the cached KV blocks; the Mamba
layers need their conv and SSM state after those tokens, which no block holds. An entry holds
that state for a prefix that ends at a *snapshot boundary*: every `every` blocks, where
``every * block_size = lcm(block_size, the SSD chunk size)`` (16 blocks of 16 tokens for the
published checkpoints' chunk of 256). Why there: the chunked scan computes the state at each of
its chunk boundaries anyway (`ssd.ssd_scan`, the recurrence over chunk positions), so a snapshot
there is a copy, not more compute, as long as the scan's chunks fall on multiples of the chunk
size, i.e. a sequence's chunk of the step starts at one. It does: a prompt starts at 0 or at a
hit (a boundary), and the scheduler ends a prefill chunk that stops short of the prompt's end
on a multiple of the SSD chunk where one lies in it (`Scheduler._aligned`; only a step with
less budget left than a chunk, 256 tokens for those checkpoints, cuts elsewhere, and the
boundaries inside the chunk after such a cut are not saved). The end of a step's chunk may be
a boundary whatever its start (the state is then the one left in the slot). Every boundary of
a prompt is saved (where the prompts that follow diverge is not known), none past the prompt.
Mamba-1's scan and LFM2's short convs hold a state at every token (`MambaConfig.snapshot_chunk`
1): a boundary every block, saved wherever it falls in a step's chunk, no chunk cut.

A hit resumes at the deepest boundary that has both its KV blocks and a snapshot; a prefix that
ends between boundaries computes the rest (a partial block, as for attention, and the blocks
after the boundary). The entries, `num` of them preallocated by the runner from the KV cache's
memory budget (`cache_budget.CacheShape.size`), are keyed by the chained hash of the block that ends
at the boundary (which names the whole prefix, salt included) and kept LRU as the block pool
keeps blocks: a hit refreshes its entry, a save takes a free entry or the least recently used,
and an entry goes when the KV block of its hash is evicted (a hit needs both). A save becomes
visible when its step ends (`end_step`): the step's restores run before its forward, so no
request may read, in the same step, a state the step has not written yet.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class StateSnapshots:
    def __init__(self, num: int, every: int, block_size: int, chunk: int) -> None:
        """`num` entries; a boundary every `every` blocks of `block_size` tokens; `chunk`: the
        SSD chunk size (a save inside a step's chunk needs the chunk to start on one)."""
        if num < 1 or every < 1:
            raise ValueError(f"need entries and an interval, got {num} and {every}")
        self.num, self.every, self.block_size, self.chunk = num, every, block_size, chunk
        self.interval = every * block_size  # tokens
        self._lru: OrderedDict[bytes, int] = OrderedDict()  # visible entries, oldest first
        self._pending: dict[bytes, int] = {}  # saved by the step being scheduled
        self._free = list(range(num - 1, -1, -1))

    def deepest(self, hashes: Sequence[bytes], blocks: int) -> int:
        """The most of the first `blocks` blocks (a KV hit) that end at a boundary with a
        snapshot (0: none); that entry is refreshed."""
        for j in range(blocks - blocks % self.every, 0, -self.every):
            entry = self._lru.get(hashes[j - 1])
            if entry is not None:
                self._lru.move_to_end(hashes[j - 1])
                return j
        return 0

    def entry(self, block_hash: bytes) -> int:
        """The entry of a visible snapshot (one `deepest` found)."""
        return self._lru[block_hash]

    def plan_saves(
        self, hashes: Sequence[bytes], start: int, end: int, prompt: int
    ) -> list[tuple[int, int]]:
        """(boundary, entry) of each boundary a step's chunk [start, end) of a prompt of
        `prompt` tokens reaches (up to the prompt's end, of the `hashes` known) and that has no
        snapshot yet, an entry reserved for each; inside the chunk only where it starts on an
        SSD chunk (module docstring)."""
        step = self.interval
        last = min(end, prompt, len(hashes) * self.block_size)
        first = (start // step + 1) * step
        if start % self.chunk:  # unaligned: the chunk's end alone
            first = end if end % step == 0 else last + 1
        out = []
        for b in range(first, last + 1, step):
            h = hashes[b // self.block_size - 1]
            if h in self._lru or h in self._pending:
                continue
            entry = self._take()
            if entry is None:
                break
            self._pending[h] = entry
            out.append((b, entry))
        return out

    def _take(self) -> int | None:
        if self._free:
            return self._free.pop()
        if not self._lru:
            return None  # every entry written this step
        return self._lru.popitem(last=False)[1]

    def drop(self, block_hash: bytes) -> None:
        """The KV block of `block_hash` was evicted: its snapshot goes with it (one being
        written this step stays: its entry is in use)."""
        entry = self._lru.pop(block_hash, None)
        if entry is not None:
            self._free.append(entry)

    def end_step(self) -> None:
        """The step's saves are written (queued before any later step): visible from now on."""
        if self._pending:
            self._lru.update(self._pending)
            self._pending.clear()

    @property
    def num_cached(self) -> int:
        return len(self._lru)

    def check_integrity(self) -> None:
        entries = [*self._lru.values(), *self._pending.values(), *self._free]
        if sorted(entries) != list(range(self.num)):
            raise RuntimeError("snapshot entries lost or shared")
