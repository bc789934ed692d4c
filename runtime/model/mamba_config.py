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
- Nemotron-H (`NemotronHForCausalLM`): each layer one block, norm -> mixer -> residual add, the
  mixer a Mamba2 one, attention (no rotary) or an ungated ReLU² MLP (`layers_block_type`, or
  the older `hybrid_override_pattern` "M" / "*" / "-"); the SSM state in float32
  (`mamba_ssm_cache_dtype`); or a MoE block ("moe", "E": Nemotron 3): ungated ReLU² experts
  routed by DeepSeek-V3's sigmoid router beside a shared expert (`recurrent_configs.NemotronHExperts`).
  The checkpoint's `backbone.` names are read as Llama's (`nemotron_name`; the MoE block's
  under `mlp.`, as DeepSeek's).
- Mamba2 (`Mamba2ForCausalLM`: Mamba-Codestral-7B): a Mamba2 mixer in every layer, each layer
  ``x + mixer(norm(x))`` as Nemotron-H's Mamba blocks; no attention (no KV cache: the engine's
  blocks are positions only), no MLP. The checkpoint's `backbone.` names read as Nemotron-H's.
  The residual stream is in the model's dtype (transformers' `residual_in_fp32` keeps it in
  float32: the same in float32).
- Jamba (`JambaForCausalLM`, `model/jamba.py`): attention (no rotary) every
  `attn_layer_period`-th layer from `attn_layer_offset`, a Mamba-1 mixer (`model/mamba1.py`,
  RMSNorms with weights on dt, B and C) elsewhere; every layer's MLP behind `pre_ff_layernorm`,
  Mixtral-style experts every `expert_layer_period`-th from `expert_layer_offset` (softmax
  top-k, not renormalised), a dense `feed_forward` elsewhere.
- Zamba2 (`Zamba2ForCausalLM`): `zamba2_config.py`.
- Falcon-H1 (`FalconH1ForCausalLM`): attention and a Mamba2 mixer side by side in every layer
  (`mamba_d_ssm` wide, its output norm optional: `mamba_rms_norm`, normalised before the gate),
  then Llama's MLP after `pre_ff_layernorm`; µP multipliers on the embedding, the keys, the
  mixers' inputs and outputs, the Mamba projection's five parts, the MLP and the logits
  (`recurrent_configs.FalconH1Scales`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import (
    kimi_linear_config,
    lfm2_config,
    olmo_hybrid_config,
    qwen3_next_config,
    zamba2_config,
)
from pagoda.runtime.model_configs import ExpertRouting
from pagoda.runtime.recurrent_configs import FalconH1Scales, MambaConfig, NemotronHExperts

ARCHITECTURES = {
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "BambaForCausalLM": "bamba",
    "NemotronHForCausalLM": "nemotron_h",
    "FalconH1ForCausalLM": "falcon_h1",
    "Mamba2ForCausalLM": "mamba2",  # Mamba2 alone (Mamba-Codestral): no attention layer
    "MambaForCausalLM": "mamba",  # Mamba-1 (model/mamba1.py)
    "FalconMambaForCausalLM": "falcon_mamba",  # Mamba-1 with norms on B, C and dt
    "JambaForCausalLM": "jamba",  # Mamba-1 layers among attention layers, experts (jamba.py)
    **lfm2_config.ARCHITECTURES,  # LFM2: short convs among attention layers (model/lfm2.py)
    **qwen3_next_config.ARCHITECTURES,  # Qwen3-Next, Qwen3.5: Gated DeltaNet (qwen3_next.py)
    **olmo_hybrid_config.ARCHITECTURES,  # OLMo Hybrid: Gated DeltaNet, OLMo 3's attention
    **kimi_linear_config.ARCHITECTURES,  # Kimi Linear: KDA, DeepSeek-V3's (kimi_linear.py)
    **zamba2_config.ARCHITECTURES,  # Zamba2: Mamba2 layers, shared blocks (model/zamba2.py)
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
    "nemotron_h": {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 4096, "intermediate_size": 21504,
                   "mlp_hidden_act": "relu2", "mamba_num_heads": 128, "mamba_head_dim": 64,
                   "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
                   "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
                   "layer_norm_epsilon": 1e-5, "mamba_hidden_act": "silu",
                   "mamba_ssm_cache_dtype": "float32", "n_routed_experts": 8,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 7688,
                   "moe_shared_expert_intermediate_size": 7688, "n_group": 1, "topk_group": 1,
                   "routed_scaling_factor": 1.0, "norm_topk_prob": True},
    "falcon_h1": {**_MAMBA_DEFAULTS, "mamba_d_ssm": 1024, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8, "max_position_embeddings": 8192,
                  "mamba_norm_before_gate": True, "mamba_rms_norm": False},
    # (no max_position_embeddings in Mamba2Config: vLLM's fallback of 2048 where config.json
    # has none)
    "mamba2": {"num_heads": 128, "head_dim": 64, "vocab_size": 32768, "hidden_size": 4096,
               "state_size": 128, "layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4,
               "n_groups": 8, "use_bias": False, "use_conv_bias": True, "hidden_act": "silu",
               "chunk_size": 256, "tie_word_embeddings": False, "max_position_embeddings": 2048},
    **{arch: {
        "vocab_size": 50280, "hidden_size": 768, "state_size": 16, "layer_norm_epsilon": 1e-5,
        "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
        "hidden_act": "silu", "time_step_rank": "auto", "tie_word_embeddings": True,
        "mixer_rms_eps": 1e-6, "max_position_embeddings": 2048} for arch in ("mamba", "falcon_mamba")},
    "jamba": {"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262_144,
              "tie_word_embeddings": False, "num_experts": 16, "num_experts_per_tok": 2,
              "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8,
              "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
              "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False},
    **lfm2_config.DEFAULTS,
    **qwen3_next_config.DEFAULTS,
    **olmo_hybrid_config.DEFAULTS,
    **kimi_linear_config.DEFAULTS,
    **zamba2_config.DEFAULTS,
}  # fmt: skip
# Nemotron-H's older config keys (transformers' NemotronHConfig reads them so)
_NEMOTRON_ALIASES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                     "mamba_chunk_size": "chunk_size", "mamba_conv_bias": "use_conv_bias",
                     "mamba_dt_limit": "time_step_limit"}  # fmt: skip
_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_MAMBA, _ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")


def nemotron_types(cfg: Mapping[str, Any]) -> list[str]:
    """Nemotron-H's per-layer block types: `layers_block_type`, or `hybrid_override_pattern`."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is None:
        pattern = cfg.get("hybrid_override_pattern")
        if not pattern:
            raise ValueError("a nemotron_h config.json needs layers_block_type or "
                             "hybrid_override_pattern")  # fmt: skip
        unknown = sorted(set(pattern) - set(_PATTERN))
        if unknown:
            raise ValueError(f"hybrid_override_pattern has unknown block types {unknown}")
        types = [_PATTERN[c] for c in pattern]
    types = [{"linear_attention": "mamba", "full_attention": "attention"}.get(t, t) for t in types]
    unknown = sorted({t for t in types if t not in ("mamba", "attention", "mlp", "moe")})
    if unknown:
        raise ValueError(f"layers_block_type {unknown} are not supported in a nemotron_h model")
    return types


def _layers(cfg: Mapping[str, Any], arch: str, n: int) -> tuple[bool, ...]:
    """Per layer: True where a Mamba2 mixer runs."""
    if arch == "falcon_h1":  # a mixer in every layer (attention beside it)
        return (True,) * n
    if arch == "bamba":
        attn = set(cfg.get("attn_layer_indices") or ())
        return tuple(i not in attn for i in range(n))
    if arch == "nemotron_h":
        return tuple(t == "mamba" for t in nemotron_types(cfg))
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


def _nemotron_mamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    cfg = {**cfg, **{new: cfg[old] for old, new in _NEMOTRON_ALIASES.items() if old in cfg}}
    if cfg["mamba_hidden_act"] != "silu":
        raise ValueError(f"mamba_hidden_act {cfg['mamba_hidden_act']!r} is not supported (silu)")
    low, high = cfg.get("time_step_limit") or (0.0, math.inf)
    return MambaConfig(
        layers=_layers(cfg, "nemotron_h", n),
        n_heads=int(cfg["mamba_num_heads"]),
        head_dim=int(cfg["mamba_head_dim"]),
        d_state=int(cfg["ssm_state_size"]),
        n_groups=int(cfg["n_groups"]),
        d_conv=int(cfg["conv_kernel"]),
        chunk_size=int(cfg["chunk_size"]),
        conv_bias=bool(cfg["use_conv_bias"]),
        proj_bias=bool(cfg["use_bias"]),
        dt_min=_limit(low),
        dt_max=_limit(high),
        mlp_layers=tuple(t == "mlp" for t in nemotron_types(cfg)),
        ssm_float32=cfg.get("mamba_ssm_cache_dtype") == "float32",
        moe=_nemotron_experts(cfg),
    )


def _nemotron_experts(cfg: Mapping[str, Any]) -> NemotronHExperts | None:
    layers = tuple(t == "moe" for t in nemotron_types(cfg))
    if not any(layers):
        return None
    if cfg.get("mlp_hidden_act", "relu2") != "relu2":
        raise ValueError(f"mlp_hidden_act {cfg['mlp_hidden_act']!r} in Nemotron-H's experts is "
                         "not supported (relu2)")  # fmt: skip
    routing = ExpertRouting(scoring="sigmoid", topk_method="noaux_tc",
                            n_group=int(cfg["n_group"]), topk_group=int(cfg["topk_group"]),
                            routed_scaling_factor=float(cfg["routed_scaling_factor"]))  # fmt: skip
    latent = cfg.get("moe_latent_size")
    return NemotronHExperts(
        layers=layers,
        num_experts=int(cfg["n_routed_experts"]),
        top_k=int(cfg["num_experts_per_tok"]),
        intermediate=int(cfg["moe_intermediate_size"]),
        shared_intermediate=int(cfg["moe_shared_expert_intermediate_size"]),
        routing=routing,
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        latent=int(latent) if latent else None,
    )


def _falcon_scales(cfg: Mapping[str, Any]) -> FalconH1Scales:
    one = {k: float(cfg.get(k) or 1.0) for k in (
        "embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
        "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")}  # fmt: skip
    zxbcdt = tuple(float(x) for x in cfg.get("ssm_multipliers") or (1.0,) * 5)
    gate, down = (float(x) for x in cfg.get("mlp_multipliers") or (1.0, 1.0))
    if len(zxbcdt) != 5:
        raise ValueError(f"ssm_multipliers must have 5 values (z, x, B, C, dt), got {len(zxbcdt)}")
    return FalconH1Scales(
        embedding=one["embedding_multiplier"], lm_head=one["lm_head_multiplier"],
        key=one["key_multiplier"], attention_in=one["attention_in_multiplier"],
        attention_out=one["attention_out_multiplier"], ssm_in=one["ssm_in_multiplier"],
        ssm_out=one["ssm_out_multiplier"], zxbcdt=zxbcdt, mlp_gate=gate, mlp_down=down,
    )  # fmt: skip


def _pure_mamba2(cfg: Mapping[str, Any], n: int) -> MambaConfig:
    """Mamba2ForCausalLM's mixers: one in every layer, its gated norm over `n_groups` groups."""
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a mamba2 model "
                         "(silu)")  # fmt: skip
    heads, head_dim = int(cfg["num_heads"]), int(cfg["head_dim"])
    if heads * head_dim != int(cfg["expand"]) * int(cfg["hidden_size"]):
        raise ValueError(f"num_heads ({heads}) x head_dim ({head_dim}) must be expand x "
                         f"hidden_size ({int(cfg['expand']) * int(cfg['hidden_size'])})")  # fmt: skip
    low, high = cfg.get("time_step_limit") or (0.0, math.inf)
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
        dt_min=_limit(low),
        dt_max=_limit(high),
        mlp_layers=(False,) * n,
    )


def _mamba1_inner(cfg: Mapping[str, Any]) -> int:
    """Mamba-1's d_inner: config.json's `intermediate_size` where it has one (transformers'
    MambaConfig keeps it), else expand x hidden_size."""
    return int(cfg.get("intermediate_size") or int(cfg["expand"]) * int(cfg["hidden_size"]))


def _mamba1(cfg: Mapping[str, Any], arch: str, n: int) -> MambaConfig:
    """MambaForCausalLM's and FalconMambaForCausalLM's mixers (`model/mamba1.py`)."""
    if cfg["hidden_act"] != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported in a {arch} model "
                         "(silu)")  # fmt: skip
    hidden = int(cfg["hidden_size"])
    rank = cfg["time_step_rank"]
    return MambaConfig(
        layers=(True,) * n,
        n_heads=1,
        head_dim=_mamba1_inner(cfg),
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


def _period(cfg: Mapping[str, Any], kind: str, n: int) -> tuple[bool, ...]:
    """Jamba's layers of one kind ("attn", "expert"): every `{kind}_layer_period`-th from
    `{kind}_layer_offset` (transformers' `layers_block_type`, `layers_num_experts`)."""
    period, offset = int(cfg[f"{kind}_layer_period"]), int(cfg[f"{kind}_layer_offset"])
    if not 0 <= offset < period:
        raise ValueError(f"{kind}_layer_offset ({offset}) must be in [0, {kind}_layer_period "
                         f"({period}))")  # fmt: skip
    return tuple(i % period == offset for i in range(n))


def _jamba(cfg: Mapping[str, Any], n: int) -> MambaConfig:
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


def mamba(cfg: Mapping[str, Any], arch: str, n: int) -> MambaConfig:
    if arch == "jamba":
        return _jamba(cfg, n)
    if arch == "nemotron_h":
        return _nemotron_mamba(cfg, n)
    if arch in ("mamba", "falcon_mamba"):
        return _mamba1(cfg, arch, n)
    if arch == "mamba2":
        return _pure_mamba2(cfg, n)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["mamba_n_heads"])
    head_dim = cfg["mamba_d_head"]
    inner = int(cfg["mamba_expand"]) * hidden
    if arch == "falcon_h1" and cfg.get("mamba_d_ssm") is not None:
        inner = int(cfg["mamba_d_ssm"])
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
        **_falcon_fields(cfg, arch),
    )


def _falcon_fields(cfg: Mapping[str, Any], arch: str) -> dict[str, Any]:
    if arch != "falcon_h1":
        return {}
    return dict(gated_norm=bool(cfg["mamba_rms_norm"]),
                norm_before_gate=bool(cfg["mamba_norm_before_gate"]), parallel_attention=True,
                falcon=_falcon_scales(cfg))  # fmt: skip


def overrides(cfg: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """config.json fields read otherwise for `ModelConfig`: Granite 4.0's MLP in every layer is
    the shared one (`shared_intermediate_size`), its experts' width goes to the family."""
    if arch in lfm2_config.DEFAULTS:
        return lfm2_config.overrides(cfg)
    if arch in qwen3_next_config.DEFAULTS:
        return qwen3_next_config.overrides(cfg, arch)
    if arch in olmo_hybrid_config.DEFAULTS:
        return olmo_hybrid_config.overrides(cfg)
    if arch in kimi_linear_config.DEFAULTS:
        return kimi_linear_config.overrides(cfg)
    if arch == "zamba2":
        return zamba2_config.overrides(cfg)
    if arch in ("mamba", "falcon_mamba"):  # no attention, no MLP: heads of 64 stand in
        heads = max(1, int(cfg["hidden_size"]) // 64)
        return {"num_attention_heads": heads, "num_key_value_heads": heads,
                "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False,
                "intermediate_size": _mamba1_inner(cfg)}  # fmt: skip
    if arch == "mamba2":  # no attention, no MLP: the mixer's heads stand in for attention's
        heads = cfg["num_heads"]
        return {"num_attention_heads": heads, "num_key_value_heads": heads,
                "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False,
                "intermediate_size": int(cfg["expand"]) * int(cfg["hidden_size"])}  # fmt: skip
    if arch == "granitemoehybrid":
        return {"intermediate_size": cfg["shared_intermediate_size"],
                "granite_expert_width": cfg.get("intermediate_size")}  # fmt: skip
    if arch == "bamba":  # transformers hard-codes it, whatever config.json says
        return {"partial_rotary_factor": 0.5}
    if arch == "nemotron_h":  # the layers from their types; the MLPs' activation; the norms' eps
        return {"num_hidden_layers": len(nemotron_types(cfg)), "hidden_act": cfg["mlp_hidden_act"],
                "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False}  # fmt: skip
    return {}


def family_fields(cfg: Mapping[str, Any], arch: str, n: int) -> dict[str, Any]:
    if arch in lfm2_config.DEFAULTS:
        return lfm2_config.family_fields(cfg, n)
    if arch in qwen3_next_config.DEFAULTS:
        return qwen3_next_config.family_fields(cfg, arch, n)
    if arch in olmo_hybrid_config.DEFAULTS:
        return olmo_hybrid_config.family_fields(cfg, n)
    if arch in kimi_linear_config.DEFAULTS:
        return kimi_linear_config.family_fields(cfg, n)
    if arch == "zamba2":
        return zamba2_config.family_fields(cfg, n)
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
    if arch == "nemotron_h":  # ungated ReLU² MLPs; attention without rotary
        fields.update(gated_mlp=False, rope_layers=(False,) * n)
    if arch in (
        "mamba2",
        "mamba",
        "falcon_mamba",
    ):  # no rotary (no attention); no MLP (`ModelConfig.hybrid_params`
        fields["rope_layers"] = (False,) * n  # takes off the one its width, d_inner, counts)
    if arch == "falcon_h1":  # the logits scaled after the head (no sampling fused into it)
        fields["logit_scale"] = fields["mamba"].falcon.lm_head
    if arch == "jamba":  # attention without rotary; Mixtral's experts where the period says,
        fields["rope_layers"] = (False,) * n  # their top-k weights not renormalised, rounded
        experts = int(cfg["num_experts"])  # to the model's dtype (transformers' router)
        if experts > 1:  # (1: a dense MLP in every layer, as transformers builds it)
            fields.update(num_experts=experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                          moe_intermediate_size=int(cfg["intermediate_size"]),
                          moe_layers=_period(cfg, "expert", n), norm_topk_prob=False,
                          round_topk_to_model_dtype=True)  # fmt: skip
    return fields


_NEMOTRON_LAYER = re.compile(r"backbone\.layers\.(\d+)\.(norm|mixer)\.(.*)")
_NEMOTRON_TOP = {"backbone.embeddings.weight": "model.embed_tokens.weight",
                 "backbone.norm_f.weight": "model.norm.weight"}  # fmt: skip
_ATTENTION_PARTS = ("q_proj.", "k_proj.", "v_proj.", "o_proj.")
_MOE_PARTS = ("experts.", "gate.", "shared_experts.", "fc1_latent_proj.", "fc2_latent_proj.")


def nemotron_name(stored: str) -> str:
    """A Nemotron-H checkpoint's tensor under Llama's name: `backbone.` is `model.`, a layer's
    `norm` its `input_layernorm`, its `mixer.` `self_attn.`, `mlp.` or `mamba.` by what it
    holds (`safetensors_weights` reads the checkpoint so)."""
    if stored in _NEMOTRON_TOP:
        return _NEMOTRON_TOP[stored]
    m = _NEMOTRON_LAYER.fullmatch(stored)
    if m is None:
        return "model." + stored.removeprefix("backbone.")
    i, part, rest = m.groups()
    if part == "norm":
        return f"model.layers.{i}.input_layernorm.{rest}"
    if rest.startswith(_ATTENTION_PARTS):
        return f"model.layers.{i}.self_attn.{rest}"
    if rest.startswith(("up_proj.", "down_proj.", *_MOE_PARTS)):  # an MLP, or a MoE block
        return f"model.layers.{i}.mlp.{rest}"
    return f"model.layers.{i}.mamba.{rest}"


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norms: its Mamba2 mixer (or nothing for an attention
    layer, checked as Llama's) and, for Granite 4.0, its MLP."""
    if c.architecture in lfm2_config.DEFAULTS:
        return lfm2_config.expected_shapes(c, i)
    if c.architecture in qwen3_next_config.DEFAULTS:
        return qwen3_next_config.expected_shapes(c, i)
    if c.architecture in olmo_hybrid_config.DEFAULTS:
        return olmo_hybrid_config.expected_shapes(c, i)
    if c.architecture in kimi_linear_config.DEFAULTS:
        return kimi_linear_config.expected_shapes(c, i)
    if c.architecture == "zamba2":
        return zamba2_config.expected_shapes(c, i)
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out: dict[str, tuple[int, ...]] = {}
    if m.mixer == "mamba1":  # Mamba-1's mixer (Jamba's: on its Mamba layers; its router)
        f = c.family
        if f.has_experts(i):
            out[p + "feed_forward.router.weight"] = (f.num_experts, h)
        if not m.layers[i]:
            return out
        x, d, n, r = p + "mamba.", m.d_inner, m.d_state, m.dt_rank
        out.update({x + "in_proj.weight": (2 * d, h), x + "conv1d.weight": (d, 1, m.d_conv),
                    x + "x_proj.weight": (r + 2 * n, d), x + "dt_proj.weight": (d, r),
                    x + "dt_proj.bias": (d,), x + "A_log": (d, n), x + "D": (d,),
                    x + "out_proj.weight": (h, d)})  # fmt: skip
        if m.conv_bias:
            out[x + "conv1d.bias"] = (d,)
        if m.bcdt_weighted:
            out.update({x + "dt_layernorm.weight": (r,), x + "b_layernorm.weight": (n,),
                        x + "c_layernorm.weight": (n,)})  # fmt: skip
        return out
    if m.layers[i]:
        x = p + "mamba."
        out.update({x + "in_proj.weight": (m.d_inner + m.conv_dim + m.n_heads, h),
                    x + "conv1d.weight": (m.conv_dim, 1, m.d_conv),
                    x + "A_log": (m.n_heads,), x + "D": (m.n_heads,), x + "dt_bias": (m.n_heads,),
                    x + "out_proj.weight": (h, m.d_inner)})  # fmt: skip
        if m.gated_norm:
            out[x + "norm.weight"] = (m.d_inner,)
        if m.conv_bias:
            out[x + "conv1d.bias"] = (m.conv_dim,)
    if c.architecture == "nemotron_h" and m.mlp_layers[i]:  # up and down
        s = c.intermediate_size
        out.update({p + "mlp.up_proj.weight": (s, h), p + "mlp.down_proj.weight": (h, s)})
    if m.moe is not None and m.moe.layers[i]:
        out.update(_moe_shapes(m.moe, h, p + "mlp."))
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


def _moe_shapes(e: NemotronHExperts, h: int, p: str) -> dict[str, tuple[int, ...]]:
    """A Nemotron-H MoE block's tensors (under Llama's `mlp.`: `nemotron_name`)."""
    width, n, s = e.latent or h, e.intermediate, e.shared_intermediate
    out = {p + "gate.weight": (e.num_experts, h), p + "gate.e_score_correction_bias": (e.num_experts,),
           p + "shared_experts.up_proj.weight": (s, h), p + "shared_experts.down_proj.weight": (h, s)}  # fmt: skip
    for x in range(e.num_experts):
        out[f"{p}experts.{x}.up_proj.weight"] = (n, width)
        out[f"{p}experts.{x}.down_proj.weight"] = (width, n)
    if e.latent:
        out[p + "fc1_latent_proj.weight"] = (e.latent, h)
        out[p + "fc2_latent_proj.weight"] = (h, e.latent)
    return out
