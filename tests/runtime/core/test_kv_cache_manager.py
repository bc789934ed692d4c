"""KVCacheManager: chained hashes, prefix hits, allocation failure leaves no trace, uncaching."""

from __future__ import annotations

from pagoda.runtime.core.kv_cache_manager import KVCacheManager, hash_block
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams


def req(rid, ids, salt=None):
    return Request(rid, list(ids), SamplingParams(), cache_salt=salt)


def test_hash_is_chained_over_the_whole_prefix():
    a = hash_block(None, [1, 2, 3, 4])
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert hash_block(None, [1, 2, 3, 4]) == a


def test_hits_stop_at_first_miss_and_leave_one_token():
    kv = KVCacheManager(16, 4)
    a = req("a", range(12))
    assert kv.allocate_slots(a, 12)
    b = req("b", range(12))
    blocks, n = kv.get_computed_blocks(b)
    assert n == 8 and [x.block_id for x in blocks] == kv.block_ids("a")[:2]  # not all 12
    c = req("c", [0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11])
    assert kv.get_computed_blocks(c)[1] == 4


def test_salt_isolates_caches_when_caching_is_off():
    kv = KVCacheManager(16, 4, enable_caching=False)
    assert kv.allocate_slots(req("a", range(9)), 9)
    assert kv.get_computed_blocks(req("b", range(9)))[1] == 0  # no global cache
    assert kv.allocate_slots(req("s1", range(9), salt=b"x"), 9)
    assert kv.get_computed_blocks(req("s2", range(9), salt=b"x"))[1] == 8  # siblings share
    assert kv.get_computed_blocks(req("s3", range(9), salt=b"y"))[1] == 0


def test_failed_allocation_changes_nothing():
    kv = KVCacheManager(3, 4)
    a = req("a", range(8))
    assert kv.allocate_slots(a, 8)
    b = req("b", range(100, 109))
    assert not kv.allocate_slots(b, 9)  # needs 3 blocks, 1 free
    assert kv.block_ids("b") == [] and kv.num_free_blocks == 1
    kv.check_integrity()


def test_revived_cached_blocks_count_against_free_space():
    kv = KVCacheManager(3, 4)
    a = req("a", range(8))
    kv.allocate_slots(a, 8)
    kv.free(a)  # 2 cached-evictable + 1 free
    b = req("b", [*range(8), 50, 51, 52, 53, 54])
    hits, n = kv.get_computed_blocks(b)
    assert n == 8
    # reviving 2 cached blocks and adding 2 new ones needs 4 > 3 blocks
    assert not kv.allocate_slots(b, 5, hits)
    assert kv.allocate_slots(b, 4, hits)
    kv.check_integrity()


def test_uncache_this_step_forgets_blocks_that_will_not_be_computed():
    kv = KVCacheManager(8, 4)
    a = req("a", range(12))
    assert kv.allocate_slots(a, 12)  # registers 3 full blocks
    hashes = list(a.block_hashes)
    kv.free(a, uncache_this_step=True)
    assert all(kv.pool.get_cached_block(h) is None for h in hashes)
    kv.check_integrity()
    b = req("b", range(12))
    assert kv.allocate_slots(b, 12)
    kv.end_step()  # b's blocks are now computed
    c = req("c", [*range(12), 1])
    assert kv.allocate_slots(c, 1, kv.get_computed_blocks(c)[0]) is True
    kv.free(c, uncache_this_step=True)  # c registered nothing new: b's blocks stay
    assert all(kv.pool.get_cached_block(h) is not None for h in b.block_hashes)
    kv.check_integrity()
