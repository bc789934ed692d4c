"""The configs of hybrid state-space models (Mamba2 layers among attention layers) as
transformers reads them: the `ModelConfig` overrides and `FamilyConfig` fields that
`model/granite_hybrid.py` runs, and the tensors their checkpoints hold. Kept apart from the
model so that reading a config imports no layer code.

- Granite 4.0 (`GraniteMoeHybridForCausalLM`): `layer_types` ("mamba" / "attention", or
  transformers 5's "linear_attention" / "full_attention") picks each layer's mixer; every
  layer's MLP is the `shared_mlp` (`shared_intermediate_size`, gate and up in one
  `input_linear`), plus Mixtral-style experts (`block_sparse_moe`) when `num_local_experts` > 0;
  Granite's four multipliers; rotary only with `position_embedding_type` "rope" (the
  published models are NoPE).
- Bamba (`BambaForCausalLM`): attention on `attn_layer_indices`, a dense `feed_forward` MLP
  behind `pre_ff_layernorm`, rotary on half of each head (transformers hard-codes
  `partial_rotary_factor` 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import MambaConfig, ModelConfig

ARCHITECTURES = {
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "BambaForCausalLM": "bamba",
}
# transformers' config defaults, where config.json leaves one out
_MAMBA_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
                   "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2,
                   "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False}  # fmt: skip
DEFAULTS: dict[str, dict[str, Any]] = {
    "granitemoehybrid": {**_MAMBA_DEFAULTS, "num_local_experts": 8, "num_experts_per_tok": 2,
                         "shared_intermediate_size": 1024, "max_position_embeddings": 2048},
    "bamba": {**_MAMBA_DEFAULTS, "rms_norm_eps": 1e-5, "num_key_value_heads": 8,
              "max_position_embeddings": 262_144, "partial_rotary_factor": 0.5},
}  # fmt: skip
_MAMBA, _ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")


def _layers(cfg: Mapping[str, Any], arch: str, n: int) -> tuple[bool, ...]:
    """Per layer: True where a Mamba2 mixer runs."""
    if arch == "bamba":
        attn = set(cfg.get("attn_layer_indices") or ())
        return tuple(i not in attn for i in range(n))
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if types is None:  # transformers' default: every layer a Mamba layer
        return (True,) * n
    if len(types) != n:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
    unknown = sorted({t for t in types if t not in _MAMBA + _ATTENTION})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported in a {arch} model "
                         "(mamba or attention)")  # fmt: skip
    return tuple(t in _MAMBA for t in types)


def _limit(value: Any) -> float:
    """A time_step_limit bound: a number, "Infinity", or transformers' {"__float__": "Infinity"}."""
    if isinstance(value, Mapping):
        value = value.get("__float__")
    return float(value)


def mamba(cfg: Mapping[str, Any], arch: str, n: int) -> MambaConfig:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["mamba_n_heads"])
    head_dim = cfg["mamba_d_head"]
    inner = int(cfg["mamba_expand"]) * hidden
    if head_dim == "auto":
        head_dim = inner // heads
    if int(head_dim) * heads != inner:
        raise ValueError(f"mamba_n_heads ({heads}) x mamba_d_head ({head_dim}) must be "
                         f"mamba_expand x hidden_size ({inner})")  # fmt: skip
    low, high = cfg.get("time_step_limit") or (0.0, math.inf)
    return MambaConfig(
        layers=_layers(cfg, arch, n),
        n_heads=heads,
        head_dim=int(head_dim),
        d_state=int(cfg["mamba_d_state"]),
        n_groups=int(cfg["mamba_n_groups"]),
        d_conv=int(cfg["mamba_d_conv"]),
        chunk_size=int(cfg["mamba_chunk_size"]),
        conv_bias=bool(cfg["mamba_conv_bias"]),
        proj_bias=bool(cfg["mamba_proj_bias"]),
        dt_min=_limit(low),
        dt_max=_limit(high),
    )


def overrides(cfg: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`: Granite 4.0's MLP in every layer is
    the shared one (`shared_intermediate_size`), its experts' width goes to the family."""
    if arch == "granitemoehybrid":
        return {"intermediate_size": cfg["shared_intermediate_size"],
                "granite_expert_width": cfg.get("intermediate_size")}  # fmt: skip
    if arch == "bamba":  # transformers hard-codes it, whatever config.json says
        return {"partial_rotary_factor": 0.5}
    return {}


def family_fields(cfg: Mapping[str, Any], arch: str, n: int) -> dict[str, Any]:
    fields: dict[str, Any] = {"mamba": mamba(cfg, arch, n)}
    if arch == "granitemoehybrid":
        experts = int(cfg.get("num_local_experts") or 0)
        if experts:  # Mixtral's experts, softmax over the top-k logits, rounded (GraniteMoe's)
            fields.update(num_experts=experts,
                          num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                          moe_intermediate_size=int(cfg["granite_expert_width"]),
                          shared_expert_intermediate_size=int(cfg["intermediate_size"]),
                          round_topk_to_model_dtype=True)  # fmt: skip
        for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                     "logits_scaling"):  # fmt: skip
            fields[name] = float(cfg.get(name, 1.0))
        if cfg.get("position_embedding_type") != "rope":  # NoPE: no layer rotates
            fields["rope_layers"] = (False,) * n
    return fields


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norms: its Mamba2 mixer (or nothing for an attention
    layer, checked as Llama's) and, for Granite 4.0, its MLP."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out: dict[str, tuple[int, ...]] = {}
    if m.layers[i]:
        x = p + "mamba."
        out.update({x + "in_proj.weight": (m.d_inner + m.conv_dim + m.n_heads, h),
                    x + "conv1d.weight": (m.conv_dim, 1, m.d_conv),
                    x + "A_log": (m.n_heads,), x + "D": (m.n_heads,), x + "dt_bias": (m.n_heads,),
                    x + "norm.weight": (m.d_inner,), x + "out_proj.weight": (h, m.d_inner)})  # fmt: skip
        if m.conv_bias:
            out[x + "conv1d.bias"] = (m.conv_dim,)
    if c.architecture == "granitemoehybrid":
        s = c.intermediate_size
        out.update({p + "shared_mlp.input_linear.weight": (2 * s, h),
                    p + "shared_mlp.output_linear.weight": (h, s)})  # fmt: skip
        f = c.family
        if f.num_experts:
            e, n, b = f.num_experts, f.moe_intermediate_size, p + "block_sparse_moe."
            out.update({b + "router.layer.weight": (e, h), b + "input_linear.weight": (e, 2 * n, h),
                        b + "output_linear.weight": (e, h, n)})  # fmt: skip
    return out
