"""Mamba-1's configs as transformers reads them (`MambaForCausalLM`, `FalconMambaForCausalLM`:
Falcon-Mamba, with weightless RMSNorms on dt, B and C), for `model/mamba1.py`; reached through
`mamba_config`; and the Mamba-1 mixer's tensors, Jamba's too (`jamba_config.py`). Kept apart
from the model so that reading a config imports no layer code.

A Mamba-1 mixer in every layer, each layer ``x + mixer(norm(x))``; no attention, no MLP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.recurrent_configs import MambaConfig

ARCHITECTURES = {
    "MambaForCausalLM": "mamba",  # Mamba-1 (model/mamba1.py)
    "FalconMambaForCausalLM": "falcon_mamba",  # Mamba-1 with norms on B, C and dt
}
# transformers' config defaults, where config.json leaves one out
DEFAULTS = {
    arch: {"vocab_size": 50280, "hidden_size": 768, "state_size": 16, "layer_norm_epsilon": 1e-5,
           "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
           "hidden_act": "silu", "time_step_rank": "auto", "tie_word_embeddings": True,
           "mixer_rms_eps": 1e-6, "max_position_embeddings": 2048}
    for arch in ("mamba", "falcon_mamba")
}  # fmt: skip


def _inner(cfg: Mapping[str, Any]) -> int:
    """Mamba-1's d_inner: config.json's `intermediate_size` where it has one (transformers'
    MambaConfig keeps it), else expand x hidden_size."""
    return int(cfg.get("intermediate_size") or int(cfg["expand"]) * int(cfg["hidden_size"]))


def mamba(cfg: Mapping[str, Any], arch: str, n: int) -> MambaConfig:
    """MambaForCausalLM's and FalconMambaForCausalLM's mixers (`model/mamba1.py`)."""
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a {arch} model "
                         "(silu)")  # fmt: skip
    hidden = int(cfg["hidden_size"])
    rank = cfg["time_step_rank"]
    return MambaConfig(
        layers=(True,) * n,
        n_heads=1,
        head_dim=_inner(cfg),
        d_state=int(cfg["state_size"]),
        d_conv=int(cfg["conv_kernel"]),
        chunk_size=1,  # (the scan's position-major layout: `ssd.pack` in chunks of one token)
        conv_bias=bool(cfg["use_conv_bias"]),
        proj_bias=bool(cfg["use_bias"]),
        mlp_layers=(False,) * n,
        mixer="mamba1",
        dt_rank=-(-hidden // 16) if rank == "auto" else int(rank),
        bcdt_eps=float(cfg["mixer_rms_eps"]) if arch == "falcon_mamba" else None,
    )


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """No attention, no MLP: heads of 64 stand in."""
    heads = max(1, int(cfg["hidden_size"]) // 64)
    return {"num_attention_heads": heads, "num_key_value_heads": heads,
            "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False,
            "intermediate_size": _inner(cfg)}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], arch: str, n: int) -> dict[str, Any]:
    """The mixers; no rotary (no attention); no MLP (`ModelConfig.hybrid_params` takes off the
    one its width, d_inner, counts)."""
    return {"mamba": mamba(cfg, arch, n), "rope_layers": (False,) * n}


def mixer_shapes(m: MambaConfig, h: int, p: str) -> dict[str, tuple[int, ...]]:
    """A Mamba-1 mixer's tensors (`p`: the layer's prefix) in a model of hidden size `h`."""
    x, d, n, r = p + "mamba.", m.d_inner, m.d_state, m.dt_rank
    out = {x + "in_proj.weight": (2 * d, h), x + "conv1d.weight": (d, 1, m.d_conv),
           x + "x_proj.weight": (r + 2 * n, d), x + "dt_proj.weight": (d, r),
           x + "dt_proj.bias": (d,), x + "A_log": (d, n), x + "D": (d,),
           x + "out_proj.weight": (h, d)}  # fmt: skip
    if m.conv_bias:
        out[x + "conv1d.bias"] = (d,)
    if m.bcdt_weighted:
        out.update({x + "dt_layernorm.weight": (r,), x + "b_layernorm.weight": (n,),
                    x + "c_layernorm.weight": (n,)})  # fmt: skip
    return out


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norm: its mixer."""
    return mixer_shapes(c.family.mamba, c.hidden_size, f"model.layers.{i}.")
