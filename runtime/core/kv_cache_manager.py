"""Per-request block lists on top of the BlockPool, with hash-chained prefix caching.

A full block is named by ``hash(parent_hash, its token ids)``, so equal names mean equal whole
prefixes. Blocks are registered in the cache when allocated for tokens that this step computes:
every layer writes the step's K/V before attending, so a request admitted later in the same
step may already reuse them.

A hybrid model's Mamba layers also need their state at the end of a hit: with `snapshots`
(`core/state_snapshots.py`) a hit stops at the deepest boundary that has one.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from pagoda.runtime.core.block_pool import BlockPool, KVCacheBlock
from pagoda.runtime.core.state_snapshots import StateSnapshots
from pagoda.runtime.multimodal.hashing import block_extra
from pagoda.runtime.request import Request

_ROOT = b"pagoda-prefix-root"


def hash_block(parent: bytes | None, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """128-bit chained hash of one full block; `extra`: what else names its contents (the
    images whose placeholders it holds: `multimodal.hashing.block_extra`)."""
    h = hashlib.blake2b(parent or _ROOT, digest_size=16)
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(extra)
    return h.digest()


@dataclass
class PeakUsage:
    """The pool's high-water mark and, at that moment, the tokens held by the scheduled requests
    and the slots of their blocks (fragmentation = 1 - tokens / slots; blocks saved by prefix
    sharing = slots / block_size - blocks). Benchmarks read it; `reset` starts a new window."""

    blocks: int = 0
    tokens: int = 0
    slots: int = 0

    def reset(self) -> None:
        self.blocks = self.tokens = self.slots = 0


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        snapshots: StateSnapshots | None = None,
    ) -> None:
        """`snapshots`: a hybrid model's Mamba state snapshots (module docstring)."""
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.snapshots = snapshots
        if snapshots is not None:
            self.pool.on_evict = snapshots.drop
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_block_ids: dict[str, list[int]] = {}  # the same, as ids (read every step)
        self._num_cached: dict[str, int] = {}  # leading blocks of a request registered by hash
        # Per request: the token count it may reach with its blocks as they are (no new block,
        # none newly full to register): `allocate_slots`' fast path, read by the scheduler's
        # decode loop directly (a dict lookup per request instead of a call).
        self.room: dict[str, int] = {}
        self._cached_before_step: dict[str, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which found in the cache
        self.peak = PeakUsage()

    def record_peak(self, scheduled: Sequence) -> None:
        """After scheduling: update `peak` when the pool's high-water mark rises (rarely)."""
        used = self.pool.num_blocks - self.pool.num_free_blocks
        if used <= self.peak.blocks:
            return
        self.peak.blocks = used
        self.peak.tokens = sum(s.request.num_computed_tokens + s.num_new_tokens for s in scheduled)
        self.peak.slots = sum(len(s.block_ids) for s in scheduled) * self.block_size

    def caches(self, req: Request) -> bool:
        return self.enable_caching or req.cache_salt is not None

    def _update_hashes(self, req: Request) -> None:
        bs, hashes = self.block_size, req.block_hashes
        parent = hashes[-1] if hashes else req.cache_salt
        mm = req.params.multi_modal
        for i in range(len(hashes), req.num_tokens // bs):
            extra = b"" if mm is None else block_extra(mm, i * bs, (i + 1) * bs)
            parent = hash_block(parent, req.token_ids[i * bs : (i + 1) * bs], extra)
            hashes.append(parent)

    def get_computed_blocks(self, req: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a not-yet-running request (always leaves one token to compute).
        None for a request that still needs prompt logprobs: a cached block holds keys and
        values, not the logits of its positions (as vLLM skips the cache for them)."""
        if not self.caches(req) or req.wants_prompt_logprobs:
            return [], 0
        self._update_hashes(req)
        limit = (req.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for h in req.block_hashes[:limit]:
            b = self.pool.get_cached_block(h)
            if b is None:
                break
            hits.append(b)
        if self.snapshots is not None and hits:  # where a Mamba state snapshot is too
            del hits[self.snapshots.deepest(req.block_hashes, len(hits)) :]
        return hits, len(hits) * self.block_size

    def snapshot_entry(self, req: Request, num_cached: int) -> int:
        """The snapshot entry of a hybrid's hit of `num_cached` tokens (`get_computed_blocks`)."""
        return self.snapshots.entry(req.block_hashes[num_cached // self.block_size - 1])

    def record_prefix_lookup(self, req: Request, num_cached: int) -> None:
        """Count a first admission's prompt tokens and how many of them the cache supplied."""
        if req.num_preemptions == 0:
            self.prefix_queries += req.num_prompt_tokens
            self.prefix_hits += min(num_cached, req.num_prompt_tokens)

    def allocate_slots(
        self, req: Request, num_new_tokens: int, computed: Sequence[KVCacheBlock] = ()
    ) -> bool:
        """Reserve blocks for `num_new_tokens` more tokens (after `computed` prefix blocks).

        Returns False, changing nothing, when the pool cannot supply them.
        """
        bs, rid = self.block_size, req.request_id
        total = req.num_computed_tokens + len(computed) * bs + num_new_tokens
        if not computed and total <= self.room.get(rid, -1):
            # fast path (most decode steps): room in the last block and no block newly full;
            # nothing changes, so nothing this step registered needs recording for `free`
            return True
        blocks = self.req_blocks.get(rid)
        if blocks is None:
            blocks = self.req_blocks[rid] = []
        need = (total + bs - 1) // bs - len(blocks) - len(computed)
        revived = sum(1 for b in computed if b.ref_cnt == 0)  # leave the free queue when touched
        if max(need, 0) + revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(computed)
        had = len(blocks)
        blocks.extend(computed)
        if need > 0:
            blocks.extend(self.pool.get_new_blocks(need))
        # a new list (the block tables see a change by identity), built from the old one: a
        # long sequence's ids are copied in C, not rebuilt block by block in Python each time
        ids = self.req_block_ids.get(rid, [])
        self.req_block_ids[rid] = ids + [b.block_id for b in blocks[had:]]
        n_cached = self._num_cached.get(req.request_id, 0) + len(computed)
        self._cached_before_step[req.request_id] = n_cached
        if self.caches(req):
            self._update_hashes(req)
            n_full = min(total // bs, len(req.block_hashes))
            for i in range(n_cached, n_full):
                self.pool.cache_block(blocks[i], req.block_hashes[i])
            n_cached = max(n_cached, n_full)
            # until the first block not registered yet is full
            room = min(len(blocks) * bs, (n_cached + 1) * bs - 1)
        else:
            room = len(blocks) * bs
        self._num_cached[req.request_id] = n_cached
        self.room[rid] = room
        return True

    def free(self, req: Request, *, uncache_this_step: bool = False) -> None:
        """Release a request's blocks (tail first, so its end is evicted first).

        With `uncache_this_step`, blocks registered by this step's allocation are forgotten:
        their K/V will never be written because the request was unscheduled.
        """
        blocks = self.req_blocks.pop(req.request_id, [])
        self.req_block_ids.pop(req.request_id, None)
        self.room.pop(req.request_id, None)
        n_cached = self._num_cached.pop(req.request_id, 0)
        before = self._cached_before_step.pop(req.request_id, n_cached)
        if uncache_this_step:
            for b in blocks[before:n_cached]:
                if b.ref_cnt == 1 and b.block_hash is not None:
                    self.pool.cached.pop(b.block_hash, None)
                    b.block_hash = None
        self.pool.free_blocks(reversed(blocks))

    def end_step(self) -> None:
        self._cached_before_step.clear()
        if self.snapshots is not None:
            self.snapshots.end_step()

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (kept up to date by allocation; do not mutate)."""
        return self.req_block_ids.get(request_id, [])

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        if self.snapshots is not None:
            self.snapshots.check_integrity()
        held: dict[int, int] = {}
        for rid, blocks in self.req_blocks.items():
            if self.req_block_ids.get(rid, []) != [b.block_id for b in blocks]:
                raise RuntimeError(f"request {rid!r}: block ids out of step with its blocks")
            for b in blocks:
                held[b.block_id] = held.get(b.block_id, 0) + 1
        for b in self.pool.blocks:
            if b.ref_cnt != held.get(b.block_id, 0):
                raise RuntimeError(
                    f"{b} ref count != number of requests holding it ({held.get(b.block_id, 0)})"
                )
