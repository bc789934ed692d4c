"""What the engine does differently for a model with recurrent layers (a hybrid's Mamba2
layers, `model_configs.MambaConfig`): checked and applied once, at start.

- Prefix caching is off: a cached prefix's KV blocks hold the attention layers' keys and values
  but not the Mamba layers' state after it, so a hit could not skip those tokens (vLLM v1 keeps
  per-block state snapshots for that; not done here). A log line says so.
- Preemption recomputes (the scheduler's only mode): the state slot is zeroed when the sequence
  starts again (`worker/mamba_state.py`).
"""

from __future__ import annotations

import dataclasses
import logging

from pagoda.runtime.config import EngineConfig, ModelConfig

log = logging.getLogger(__name__)


def keeps_state(mc: ModelConfig) -> bool:
    """Whether some layer keeps a recurrent state (Granite-4.0-Micro, a hybrid family with
    attention in every layer, keeps none: its KV blocks hold all it needs)."""
    return mc.family.mamba is not None and mc.family.mamba.num_layers > 0


def engine_config(config: EngineConfig, mc: ModelConfig) -> EngineConfig:
    """`config` with prefix caching off for a model with Mamba layers (module docstring)."""
    if not keeps_state(mc) or not config.cache.enable_prefix_caching:
        return config
    log.info("prefix caching off: a %s model's Mamba layers keep a state per sequence that "
             "cached KV blocks do not hold", mc.architecture)  # fmt: skip
    return dataclasses.replace(
        config, cache=dataclasses.replace(config.cache, enable_prefix_caching=False)
    )
