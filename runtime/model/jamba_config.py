"""Jamba's config as transformers reads it (`JambaForCausalLM`: AI21's Jamba-v0.1, Jamba 1.5 /
1.6 / 1.7), for `model/jamba.py`; reached through `mamba_config`. Kept apart from the model so
that reading a config imports no layer code.

Attention (no rotary) every `attn_layer_period`-th layer from `attn_layer_offset`, a Mamba-1
mixer (`model/mamba1.py`, RMSNorms with weights on dt, B and C) elsewhere; every layer's MLP
behind `pre_ff_layernorm`, Mixtral-style experts every `expert_layer_period`-th from
`expert_layer_offset` (softmax top-k, not renormalised), a dense `feed_forward` elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model.mamba1_config import mixer_shapes
from pagoda.runtime.recurrent_configs import MambaConfig

# Mamba-1 layers among attention layers, experts (jamba.py)
ARCHITECTURES = {"JambaForCausalLM": "jamba"}
# transformers' config defaults, where config.json leaves one out
DEFAULTS = {
    "jamba": {"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262_144,
              "tie_word_embeddings": False, "num_experts": 16, "num_experts_per_tok": 2,
              "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8,
              "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
              "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False},
}  # fmt: skip


def _period(cfg: Mapping[str, Any], kind: str, n: int) -> tuple[bool, ...]:
    """Jamba's layers of one kind ("attn", "expert"): every `{kind}_layer_period`-th from
    `{kind}_layer_offset` (transformers' `layers_block_type`, `layers_num_experts`)."""
    period, offset = int(cfg[f"{kind}_layer_period"]), int(cfg[f"{kind}_layer_offset"])
    if not 0 <= offset < period:
        raise ValueError(f"{kind}_layer_offset ({offset}) must be in [0, {kind}_layer_period "
                         f"({period}))")  # fmt: skip
    return tuple(i % period == offset for i in range(n))


def mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """JambaForCausalLM's Mamba-1 mixers (`model/mamba1.py`): d_inner mamba_expand x hidden
    (`intermediate_size` is the MLPs'), RMSNorms with weights on dt, B and C (`rms_norm_eps`)."""
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a jamba model "
                         "(silu)")  # fmt: skip
    hidden, rank = int(cfg["hidden_size"]), cfg["mamba_dt_rank"]
    return MambaConfig(
        layers=tuple(not a for a in _period(cfg, "attn", n)),
        n_heads=1,
        head_dim=int(cfg["mamba_expand"]) * hidden,
        d_state=int(cfg["mamba_d_state"]),
        d_conv=int(cfg["mamba_d_conv"]),
        chunk_size=1,  # (the scan's position-major layout, as Mamba-1's)
        conv_bias=bool(cfg["mamba_conv_bias"]),
        proj_bias=bool(cfg["mamba_proj_bias"]),
        mixer="mamba1",
        dt_rank=-(-hidden // 16) if rank == "auto" else int(rank),
        bcdt_eps=float(cfg["rms_norm_eps"]),
        bcdt_weighted=True,
    )


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    """The mixers; attention without rotary; Mixtral's experts where the period says, their
    top-k weights not renormalised, rounded to the model's dtype (transformers' router)."""
    fields: dict[str, Any] = {"mamba": mamba(cfg, n), "rope_layers": (False,) * n}
    experts = int(cfg["num_experts"])
    if experts > 1:  # (1: a dense MLP in every layer, as transformers builds it)
        fields.update(num_experts=experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                      moe_intermediate_size=int(cfg["intermediate_size"]),
                      moe_layers=_period(cfg, "expert", n), norm_topk_prob=False,
                      round_topk_to_model_dtype=True)  # fmt: skip
    return fields


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norms and MLP: its router (an expert layer), its mixer
    (a Mamba layer; nothing for an attention layer, checked as Llama's)."""
    f, h, p = c.family, c.hidden_size, f"model.layers.{i}."
    out: dict[str, tuple[int, ...]] = {}
    if f.has_experts(i):
        out[p + "feed_forward.router.weight"] = (f.num_experts, h)
    if f.mamba.layers[i]:
        out.update(mixer_shapes(f.mamba, h, p))
    return out
