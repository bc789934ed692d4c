"""What the engine does differently for a model with recurrent layers (a hybrid's Mamba2
layers, `recurrent_configs.MambaConfig`): checked and applied once, at start.

- Prefix caching keeps, beside the attention layers' KV blocks, snapshots of the Mamba layers'
  conv and SSM state at boundaries every lcm(block size, the mixers' chunk) tokens
  (`MambaConfig.snapshot_chunk`: the SSD chunk; 1 for Mamba-1 and LFM2's short convs, which
  hold a state at every token; `core/state_snapshots.py`: why there, how they are kept and
  evicted), so a hit skips the shared tokens in every layer: the deepest boundary of the
  cached prefix with a snapshot is restored into the sequence's state slot before its
  remaining prefill (`worker/mamba_state.py`) and the rest is computed. The snapshots take a
  share of the KV cache's budget (`cache_budget.CacheShape.size`; with tensor parallelism each
  rank's entries hold its heads, as its slots do, and the step's copies go to the other ranks
  with its slots: `worker/step_channel.py`); where it holds none, prefix caching is off, and
  a log line says so. Every mixer takes them: Mamba2's and the Gated DeltaNet's / KDA's
  chunked scans at their chunk boundaries, Mamba-1's scan and LFM2's short convolutions at any
  token.
- Preemption recomputes (the scheduler's only mode): the state slot is zeroed when the sequence
  starts again, or restored from a snapshot where its prefix is still cached.
"""

from __future__ import annotations

import dataclasses
import logging

from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.core.state_snapshots import StateSnapshots

log = logging.getLogger(__name__)


def keeps_state(mc: ModelConfig) -> bool:
    """Whether some layer keeps a recurrent state (Granite-4.0-Micro, a hybrid family with
    attention in every layer, keeps none: its KV blocks hold all it needs)."""
    return mc.family.mamba is not None and mc.family.mamba.num_layers > 0


def snapshots(
    config: EngineConfig, mc: ModelConfig, runner
) -> tuple[EngineConfig, StateSnapshots | None]:
    """The prefix cache's Mamba state snapshots of a hybrid (none for another model), from the
    entries the runner allocated; with none, `config` with prefix caching off."""
    if not keeps_state(mc) or not config.cache.enable_prefix_caching:
        return config, None
    if not runner.num_snapshots:
        why = f"its KV cache budget holds no snapshot of {runner.mamba.snapshot_bytes} bytes"
        asked = config.scheduler.max_model_len
        if asked is not None:  # the context's blocks come first (`cache_budget.CacheShape.size`)
            why += (f" beside the blocks of --max-model-len {asked} (a shorter context or a "
                    "larger --kv-cache-memory leaves room)")  # fmt: skip
        return _off(config, mc, why), None
    bs = config.cache.block_size
    every = runner.snapshot_interval // bs
    return config, StateSnapshots(runner.num_snapshots, every, bs, runner.mamba.m.snapshot_chunk)


def _off(config: EngineConfig, mc: ModelConfig, why: str) -> EngineConfig:
    log.info("prefix caching off for this %s model: %s", mc.architecture, why)
    return dataclasses.replace(
        config, cache=dataclasses.replace(config.cache, enable_prefix_caching=False)
    )
