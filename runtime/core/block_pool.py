"""The pool of KV-cache blocks: reference counts, an LRU free queue and the prefix-cache map.

Safety contract (checked by `check_integrity`):
- every block is either in use (ref_cnt > 0, not in the free queue) or free (ref_cnt == 0, in
  the free queue exactly once); free blocks that still hold a hash are *cached-evictable*;
- a block is in the hash map iff it carries that hash, and one hash maps to one block;
- the free queue is LRU: blocks are freed to its tail and taken from its head, so the block
  whose last user left longest ago is evicted (and loses its hash) first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class KVCacheBlock:
    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) popleft, append and removal from the middle."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free = len(blocks)
        self._head = KVCacheBlock(-1)  # sentinels
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for b in blocks:
            prev.next_free, b.prev_free = b, prev
            prev = b
        prev.next_free, self._tail.prev_free = self._tail, prev

    def popleft(self) -> KVCacheBlock:
        b = self._head.next_free
        if b is self._tail or b is None:
            raise ValueError("no free blocks")
        self.remove(b)
        return b

    def remove(self, b: KVCacheBlock) -> None:
        if b.prev_free is None or b.next_free is None:
            raise ValueError(f"{b} is not in the free queue")
        b.prev_free.next_free = b.next_free
        b.next_free.prev_free = b.prev_free
        b.prev_free = b.next_free = None
        self.num_free -= 1

    def append(self, b: KVCacheBlock) -> None:
        last = self._tail.prev_free  # the head sentinel when empty, never None
        last.next_free, b.prev_free = b, last  # type: ignore[union-attr]
        b.next_free, self._tail.prev_free = self._tail, b
        self.num_free += 1

    def __iter__(self):
        b = self._head.next_free
        while b is not None and b is not self._tail:
            yield b
            b = b.next_free


class BlockPool:
    """Owns all `num_blocks` blocks; hands them out, takes them back, remembers full ones by hash."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVCacheBlock] = {}
        # told of each hash whose block is evicted (a hybrid's state snapshots go with it)
        self.on_evict: Callable[[bytes], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free, cached-evictable included)."""
        return self.free_queue.num_free

    def usage(self) -> float:
        return 1.0 - self.free_queue.num_free / self.num_blocks

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take `n` blocks from the LRU head, evicting their cached contents."""
        if n > self.free_queue.num_free:
            raise ValueError(f"asked for {n} blocks, {self.free_queue.num_free} free")
        out = []
        for _ in range(n):
            b = self.free_queue.popleft()
            if b.block_hash is not None:
                del self.cached[b.block_hash]
                if self.on_evict is not None:
                    self.on_evict(b.block_hash)
                b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add a user to (possibly free, cached) blocks found by a prefix hit."""
        for b in blocks:
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one user from each block; pass them tail-first so a sequence's end evicts first."""
        for b in blocks:
            b.ref_cnt -= 1
            if b.ref_cnt < 0:
                raise RuntimeError(f"double free of {b}")
            if b.ref_cnt == 0:
                self.free_queue.append(b)

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Register a full block under its chained hash (first writer wins)."""
        if block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible when no block is in use."""
        if self.free_queue.num_free != self.num_blocks:
            return False
        for b in self.blocks:
            b.block_hash = None
        self.cached.clear()
        return True

    def check_integrity(self) -> None:
        """Raise RuntimeError when the accounting contract above is broken."""
        in_queue = list(self.free_queue)
        ids = [b.block_id for b in in_queue]
        if len(ids) != len(set(ids)) or len(ids) != self.free_queue.num_free:
            raise RuntimeError("free queue has duplicates or a wrong count")
        free_set = set(ids)
        for b in self.blocks:
            if b.ref_cnt < 0:
                raise RuntimeError(f"negative ref count: {b}")
            if (b.ref_cnt == 0) != (b.block_id in free_set):
                raise RuntimeError(f"block neither in use nor free (or both): {b}")
            if b.block_hash is not None and self.cached.get(b.block_hash) is not b:
                raise RuntimeError(f"hash map does not point back to {b}")
        for h, b in self.cached.items():
            if b.block_hash != h:
                raise RuntimeError(f"hash map entry stale for {b}")
        in_use = sum(1 for b in self.blocks if b.ref_cnt > 0)
        evictable = sum(1 for b in in_queue if b.block_hash is not None)
        plain_free = len(in_queue) - evictable
        if in_use + evictable + plain_free != self.num_blocks:
            raise RuntimeError("free + in use + cached-evictable does not account for every block")
