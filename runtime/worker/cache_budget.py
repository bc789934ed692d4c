"""How many KV cache blocks (and a hybrid's state snapshots) the memory budget holds.

The budget is bytes on CPU (`--kv-cache-memory`, 2 GiB by default) and, on CUDA, the device's
usable share less what is already held and the step's headroom (`cache_budget`). `CacheShape`
holds what the sizing needs to know of the model and the scheduler; `CacheShape.size` turns a
budget into a block count and a snapshot count. `ModelRunner` builds one and allocates what it
says; with tensor parallelism every rank then agrees on the smallest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from pagoda.runtime import options
from pagoda.runtime.config import CacheConfig, ModelConfig, SchedulerConfig
from pagoda.runtime.model import mamba2
from pagoda.runtime.worker.mamba_state import MambaState

CPU_DEFAULT_KV_BYTES = options.DEFAULT_CPU_KV_CACHE_MEMORY


@dataclass(frozen=True)
class CacheSize:
    num_blocks: int
    num_snapshots: int = 0  # a hybrid's Mamba state snapshots (`core/state_snapshots.py`)


@dataclass(frozen=True)
class CacheShape:
    """What sizing the cache needs to know: the bytes of one block of every attention layer's
    keys and values (0: no attention layer, blocks only count positions) and, for a hybrid with
    prefix caching, the tokens between snapshots and the bytes of one."""

    block_size: int
    bytes_per_block: int
    max_num_seqs: int
    snapshot_interval: int = 0  # 0: no snapshots
    snapshot_bytes: int = 0

    def size(
        self,
        budget: Callable[[], int],
        max_model_len: int,
        asked_len: int | None = None,
        override: int | None = None,
    ) -> CacheSize:
        """From the memory budget (`budget()`, asked for only when needed). A model without
        attention layers (Mamba2 or Mamba-1 alone) keeps no KV cache: its blocks, which only count
        positions, are enough for every sequence's whole context. A hybrid with prefix caching
        takes its state snapshots from the same budget first. `asked_len` is the
        `--max-model-len` asked for (None: left out); `override` an exact pool size (tests: as
        many snapshots as slots)."""
        interval, bs = self.snapshot_interval, self.block_size
        if override is not None:
            snaps = min(override * bs // interval, self.max_num_seqs) if interval else 0
            return CacheSize(override, snaps)
        positions = 0
        if self.bytes_per_block == 0:
            positions = self.max_num_seqs * (-(-max_model_len // bs) + 1)
            if not interval:
                return CacheSize(positions)
        left = budget()
        snaps = 0
        if interval:
            snaps = self.snapshot_entries(left, positions, asked_len)
            left -= snaps * self.snapshot_bytes
        if positions:
            return CacheSize(positions, snaps)
        n = left // self.bytes_per_block
        if n < 2:
            raise ValueError(f"KV cache budget of {left} bytes holds fewer than 2 blocks")
        return CacheSize(int(n), snaps)

    def snapshot_entries(self, budget: int, positions: int, asked_len: int | None = None) -> int:
        """A hybrid's snapshot entries from a cache budget of `budget` bytes: at most its
        `SNAPSHOT_SHARE`, one per snapshot boundary its blocks (`positions` blocks without
        attention layers) hold, and, with a `max_model_len` the budget holds, leaving that
        context its blocks (`server/memory.check_context_fits`). One the budget does not hold
        is capped to the cache anyway (`EngineCore._start`): `pagoda serve` sets the model's
        context where `--max-model-len` is left out, which reserved every block and turned
        prefix caching off wherever the context was longer than the budget held."""
        snap, bs = self.snapshot_bytes, self.block_size
        blocks = positions or budget // self.bytes_per_block
        n = min(int(budget * options.SNAPSHOT_SHARE) // snap, blocks * bs // self.snapshot_interval)
        if not positions and asked_len is not None and asked_len <= blocks * bs:
            n = min(n, (blocks - -(-asked_len // bs)) * self.bytes_per_block // snap)
        return n


def snapshot_interval(mamba: MambaState | None, block_size: int, prefix_caching: bool) -> int:
    """Tokens between a hybrid's state snapshots (`core/state_snapshots.py`): the least common
    multiple of the block size and the mixers' chunk (`MambaConfig.snapshot_chunk`: the SSD
    chunk, or 1); 0 without prefix caching for them (off, or no Mamba layer)."""
    if mamba is None or not mamba.layers or not mamba.m.snapshots:
        return 0
    if not prefix_caching:
        return 0
    return math.lcm(block_size, mamba.m.snapshot_chunk)


def cache_budget(
    cache: CacheConfig,
    device: torch.device,
    mc: ModelConfig,
    sched: SchedulerConfig,
    ranks: int = 1,
) -> int:
    """The bytes the KV cache (and a hybrid's snapshots) may take: `cache.kv_cache_memory`, or on
    CUDA its `gpu_memory_utilization` share of the device less what is in use and the headroom
    for activations, CUDA graphs and a hybrid's chunked-scan temporaries, or on CPU 2 GiB."""
    if cache.kv_cache_memory is not None:
        return cache.kv_cache_memory
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        headroom = options.GPU_HEADROOM + mamba2.step_scan_bytes(mc, sched, ranks)
        return int(total * cache.gpu_memory_utilization) - (total - free) - headroom
    return CPU_DEFAULT_KV_BYTES
