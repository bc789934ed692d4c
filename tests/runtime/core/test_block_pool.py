"""BlockPool accounting: random allocate/free/cache/evict sequences keep check_integrity() true."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pagoda.runtime.core.block_pool import BlockPool


def test_lru_eviction_order_and_hash_reuse():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, b"ha")
    pool.cache_block(b, b"hb")
    pool.free_blocks([b, a])  # b freed first → evicted first
    assert pool.num_free_blocks == 4
    assert pool.get_cached_block(b"ha") is a
    # Two plain free blocks come first, then the cached ones in LRU order.
    got = pool.get_new_blocks(3)
    assert got[2] is b and b.block_hash is None and pool.get_cached_block(b"hb") is None
    assert pool.get_cached_block(b"ha") is a  # still cached, still evictable
    pool.touch([a])  # a prefix hit revives it
    assert a.ref_cnt == 1 and pool.num_free_blocks == 0
    pool.check_integrity()


def test_double_free_and_overdraw_raise():
    pool = BlockPool(2)
    (a,) = pool.get_new_blocks(1)
    pool.free_blocks([a])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free_blocks([a])
    with pytest.raises(ValueError, match="asked for 3 blocks"):
        BlockPool(2).get_new_blocks(3)


def test_integrity_detects_corruption():
    pool = BlockPool(3)
    (a,) = pool.get_new_blocks(1)
    a.ref_cnt = 0  # in use but not in the free queue
    with pytest.raises(RuntimeError):
        pool.check_integrity()


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "cache", "hit", "reset"]), st.integers(0, 7)),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_operations_keep_integrity(seq):
    pool = BlockPool(8)
    held: list = []  # one entry per reference we own
    for op, k in seq:
        if op == "alloc" and k <= pool.num_free_blocks:
            held.extend(pool.get_new_blocks(k))
        elif op == "free" and held:
            pool.free_blocks([held.pop(k % len(held))])
        elif op == "cache" and held:
            pool.cache_block(held[k % len(held)], bytes([k]))
        elif op == "hit":
            b = pool.get_cached_block(bytes([k]))
            if b is not None:
                pool.touch([b])
                held.append(b)
        elif op == "reset":
            assert pool.reset_prefix_cache() == (not held)
        pool.check_integrity()
        assert pool.num_free_blocks + len({id(b) for b in held}) == 8
