"""Mamba2 alone (`Mamba2ForCausalLM`: Mamba-Codestral-7B) as transformers reads its config, and
what the Mamba2 mixer's readers share (`mamba_config.py`'s Granite 4.0, Bamba and Falcon-H1,
`nemotron_h_config.py`): its time-step limits and its tensors. Kept apart from the model so
that reading a config imports no layer code.

Mamba2ForCausalLM: a Mamba2 mixer in every layer, each layer ``x + mixer(norm(x))`` as
Nemotron-H's Mamba blocks (`nemotron_h.Mamba2Model`); no attention (no KV cache: the engine's
blocks are positions only), no MLP. The checkpoint's `backbone.` names read as Nemotron-H's.
The residual stream is in the model's dtype (transformers' `residual_in_fp32` keeps it in
float32: the same in float32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {"Mamba2ForCausalLM": "mamba2"}  # Mamba2 alone (Mamba-Codestral): no attention
DEFAULTS = {
    # (no max_position_embeddings in Mamba2Config: vLLM's fallback of 2048 where config.json
    # has none)
    "mamba2": {"num_heads": 128, "head_dim": 64, "vocab_size": 32768, "hidden_size": 4096,
               "state_size": 128, "layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4,
               "n_groups": 8, "use_bias": False, "use_conv_bias": True, "hidden_act": "silu",
               "chunk_size": 256, "tie_word_embeddings": False, "max_position_embeddings": 2048},
}  # fmt: skip


def _limit(value: Any) -> float:
    """A time_step_limit bound: a number, "Infinity", or transformers' {"__float__": "Infinity"}."""
    if isinstance(value, Mapping):
        value = value.get("__float__")
    return float(value)


def time_step_limits(cfg: Mapping[str, Any]) -> dict[str, float]:
    """The mixer's dt clamp (`MambaConfig.dt_min`, `dt_max`): `time_step_limit`, else none."""
    low, high = cfg.get("time_step_limit") or (0.0, math.inf)
    return {"dt_min": _limit(low), "dt_max": _limit(high)}


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """Mamba2ForCausalLM's mixers: one in every layer, its gated norm over `n_groups` groups."""
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a mamba2 model "
                         "(silu)")  # fmt: skip
    heads, head_dim = int(cfg["num_heads"]), int(cfg["head_dim"])
    if heads * head_dim != int(cfg["expand"]) * int(cfg["hidden_size"]):
        raise ValueError(f"num_heads ({heads}) x head_dim ({head_dim}) must be expand x "
                         f"hidden_size ({int(cfg['expand']) * int(cfg['hidden_size'])})")  # fmt: skip
    return MambaConfig(
        layers=(True,) * n,
        n_heads=heads,
        head_dim=head_dim,
        d_state=int(cfg["state_size"]),
        n_groups=int(cfg["n_groups"]),
        d_conv=int(cfg["conv_kernel"]),
        chunk_size=int(cfg["chunk_size"]),
        conv_bias=bool(cfg["use_conv_bias"]),
        proj_bias=bool(cfg["use_bias"]),
        **time_step_limits(cfg),
        mlp_layers=(False,) * n,
    )


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """No attention, no MLP: the mixer's heads stand in for attention's."""
    heads = cfg["num_heads"]
    return {"num_attention_heads": heads, "num_key_value_heads": heads,
            "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False,
            "intermediate_size": int(cfg["expand"]) * int(cfg["hidden_size"])}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """The mixers; no rotary (no attention); no MLP (`ModelConfig.hybrid_params` takes off the
    one its width, d_inner, counts)."""
    return {"mamba": mamba(cfg, n), "rope_layers": (False,) * n}


def mixer_shapes(m: MambaConfig, h: int, p: str) -> dict[str, tuple[int, ...]]:
    """A Mamba2 mixer's tensors (`p`: the layer's prefix) in a model of hidden size `h`."""
    x = p + "mamba."
    out = {x + "in_proj.weight": (m.d_inner + m.conv_dim + m.n_heads, h),
           x + "conv1d.weight": (m.conv_dim, 1, m.d_conv),
           x + "A_log": (m.n_heads,), x + "D": (m.n_heads,), x + "dt_bias": (m.n_heads,),
           x + "out_proj.weight": (h, m.d_inner)}  # fmt: skip
    if m.gated_norm:
        out[x + "norm.weight"] = (m.d_inner,)
    if m.conv_bias:
        out[x + "conv1d.bias"] = (m.conv_dim,)
    return out
