"""Cache sizing from the memory budget (`worker/cache_budget.py`), without a model: the block
count, a hybrid's snapshot entries taken first, and a model without attention layers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pagoda.runtime import options
from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.worker.cache_budget import (
    CPU_DEFAULT_KV_BYTES,
    CacheShape,
    CacheSize,
    cache_budget,
    snapshot_interval,
)


def never() -> int:
    raise AssertionError("the budget was asked for")


def test_attention_blocks_are_the_budget_over_a_block_s_bytes() -> None:
    shape = CacheShape(block_size=16, bytes_per_block=1000, max_num_seqs=4)
    assert shape.size(lambda: 100_500, max_model_len=4096) == CacheSize(100, 0)
    with pytest.raises(ValueError, match="fewer than 2 blocks"):
        shape.size(lambda: 1999, max_model_len=4096)


def test_a_model_without_attention_layers_keeps_positions_only_blocks() -> None:
    """Every sequence's whole context (and one block more), whatever the budget."""
    shape = CacheShape(block_size=16, bytes_per_block=0, max_num_seqs=4)
    assert shape.size(never, max_model_len=100) == CacheSize(4 * (7 + 1), 0)
    # with snapshots the budget is asked for them, and the blocks stay the positions'
    snap = CacheShape(16, 0, 4, snapshot_interval=16, snapshot_bytes=1000)
    # a quarter of 100 kB holds 25 entries; the 32 blocks' boundaries hold 32
    assert snap.size(lambda: 100_000, max_model_len=100) == CacheSize(32, 25)
    assert snap.size(lambda: 1_000_000, max_model_len=100) == CacheSize(32, 32)


def test_a_hybrid_s_snapshots_take_their_quarter_of_the_budget_first() -> None:
    assert options.SNAPSHOT_SHARE == 0.25
    shape = CacheShape(16, 1000, 4, snapshot_interval=16, snapshot_bytes=1000)
    # 25 entries of 1000 bytes, then the 75 000 bytes left hold 75 blocks
    assert shape.size(lambda: 100_000, max_model_len=4096) == CacheSize(75, 25)
    # at most one entry per boundary the blocks hold (every 64 tokens: 100 blocks, 25 boundaries)
    wide = CacheShape(16, 1000, 4, snapshot_interval=64, snapshot_bytes=100)
    assert wide.size(lambda: 100_000, max_model_len=4096) == CacheSize(97, 25)


def test_an_asked_context_the_budget_holds_keeps_its_blocks() -> None:
    shape = CacheShape(16, 1000, 4, snapshot_interval=16, snapshot_bytes=1000)
    # 90 of the 100 blocks for --max-model-len 1440: 10 blocks' bytes are left for entries
    assert shape.size(lambda: 100_000, 4096, asked_len=1440) == CacheSize(90, 10)
    # a context longer than the budget holds is capped later, not given every block here
    assert shape.size(lambda: 100_000, 4096, asked_len=4096) == CacheSize(75, 25)


def test_an_override_is_the_pool_and_gives_a_snapshot_per_slot_at_most() -> None:
    shape = CacheShape(16, 1000, 4, snapshot_interval=32, snapshot_bytes=1000)
    assert shape.size(never, 4096, override=6) == CacheSize(6, 3)
    assert shape.size(never, 4096, override=20) == CacheSize(20, 4)
    assert CacheShape(16, 1000, 4).size(never, 4096, override=6) == CacheSize(6, 0)


def test_snapshot_interval_is_the_lcm_of_the_block_and_the_chunk() -> None:
    mamba = SimpleNamespace(layers=[1], m=SimpleNamespace(snapshots=True, snapshot_chunk=48))
    assert snapshot_interval(mamba, 32, prefix_caching=True) == 96
    assert snapshot_interval(mamba, 32, prefix_caching=False) == 0
    assert snapshot_interval(None, 32, prefix_caching=True) == 0
    none = SimpleNamespace(layers=[1], m=SimpleNamespace(snapshots=False, snapshot_chunk=48))
    assert snapshot_interval(none, 32, prefix_caching=True) == 0


def test_cpu_budget_is_the_asked_bytes_or_the_default() -> None:
    cpu, sched = torch.device("cpu"), SchedulerConfig()
    mc = None  # not read off CUDA
    assert cache_budget(CacheConfig(kv_cache_memory=12345), cpu, mc, sched) == 12345
    assert cache_budget(CacheConfig(), cpu, mc, sched) == CPU_DEFAULT_KV_BYTES
