"""The configs of hybrid state-space models (Mamba2 layers among attention layers) as
transformers reads them: the `ModelConfig` overrides and `FamilyConfig` fields that
`model/granite_hybrid.py` and `model/falcon_h1.py` run, and the tensors their checkpoints hold;
the other recurrent families' readers reached through here (`ARCHITECTURES`, `overrides`,
`family_fields`, `expected_shapes`), each in its own module. Kept apart from the model so that
reading a config imports no layer code.

- Granite 4.0 (`GraniteMoeHybridForCausalLM`): `layer_types` ("mamba" / "attention", or
  transformers 5's "linear_attention" / "full_attention") picks each layer's mixer; every
  layer's MLP is the `shared_mlp` (`shared_intermediate_size`, gate and up in one
  `input_linear`), plus Mixtral-style experts (`block_sparse_moe`) when `num_local_experts` > 0;
  Granite's four multipliers; rotary only with `position_embedding_type` "rope" (the
  published models are NoPE).
- Bamba (`BambaForCausalLM`): attention on `attn_layer_indices`, a dense `feed_forward` MLP
  behind `pre_ff_layernorm`, rotary on half of each head (transformers hard-codes
  `partial_rotary_factor` 0.5).
- Falcon-H1 (`FalconH1ForCausalLM`): attention and a Mamba2 mixer side by side in every layer
  (`mamba_d_ssm` wide, its output norm optional: `mamba_rms_norm`, normalised before the gate),
  then Llama's MLP after `pre_ff_layernorm`; µP multipliers on the embedding, the keys, the
  mixers' inputs and outputs, the Mamba projection's five parts, the MLP and the logits
  (`recurrent_configs.FalconH1Scales`).
- Nemotron-H (`NemotronHForCausalLM`): `nemotron_h_config.py`.
- Mamba2 alone (`Mamba2ForCausalLM`): `mamba2_config.py` (with the Mamba2 mixer's time-step
  limits and tensors, which the readers here share).
- Mamba-1 (`MambaForCausalLM`, `FalconMambaForCausalLM`): `mamba1_config.py`.
- Jamba (`JambaForCausalLM`): `jamba_config.py`.
- Zamba2, Zamba, LFM2, Qwen3-Next / Qwen3.5, OLMo Hybrid, Kimi Linear, GLM-5-Next, Zaya:
  `zamba2_config.py`, `zamba_config.py`, `lfm2_config.py`, `qwen3_next_config.py`,
  `olmo_hybrid_config.py`, `kimi_linear_config.py`, `glm5_next_config.py`, `zaya_config.py`;
  Inkling, Inkling 2: `inkling_config.py`,
  `inkling2_config.py`.
- MiniMax-Text-01 (lightning attention): `minimax_config.py`.
- RecurrentGemma (RG-LRU blocks among local attention layers): `recurrent_gemma_config.py`.
- RWKV-4 (time-mix and channel-mix, no attention): `rwkv_config.py`.
- xLSTM (mLSTM layers, no attention): `xlstm_config.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import (
    bailing_hybrid_config,
    glm5_next_config,
    inkling2_config,
    inkling_config,
    jamba_config,
    kimi_linear_config,
    lfm2_config,
    mamba1_config,
    mamba2_config,
    minimax_config,
    nemotron_h_config,
    olmo_hybrid_config,
    qwen3_next_config,
    recurrent_gemma_config,
    rwkv_config,
    xlstm_config,
    zamba2_config,
    zamba_config,
    zaya_config,
)
from pagoda.runtime.recurrent_configs import FalconH1Scales, MambaConfig

ARCHITECTURES = {
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "BambaForCausalLM": "bamba",
    **nemotron_h_config.ARCHITECTURES,  # Nemotron-H: Mamba2, attention, MLP or MoE blocks
    "FalconH1ForCausalLM": "falcon_h1",
    **mamba2_config.ARCHITECTURES,  # Mamba2 alone (Mamba-Codestral): no attention layer
    **mamba1_config.ARCHITECTURES,  # Mamba-1, Falcon-Mamba (model/mamba1.py)
    **jamba_config.ARCHITECTURES,  # Jamba: Mamba-1 layers among attention layers, experts
    **lfm2_config.ARCHITECTURES,  # LFM2: short convs among attention layers (model/lfm2.py)
    **qwen3_next_config.ARCHITECTURES,  # Qwen3-Next, Qwen3.5: Gated DeltaNet (qwen3_next.py)
    **olmo_hybrid_config.ARCHITECTURES,  # OLMo Hybrid: Gated DeltaNet, OLMo 3's attention
    **kimi_linear_config.ARCHITECTURES,  # Kimi Linear: KDA, DeepSeek-V3's (kimi_linear.py)
    **bailing_hybrid_config.ARCHITECTURES,  # BailingHybrid: KDA, V3's (bailing_hybrid.py)
    **glm5_next_config.ARCHITECTURES,  # GLM-5-Next: KDA, NoPE DSA, mHC (glm5_next.py)
    **minimax_config.ARCHITECTURES,  # MiniMax-Text-01: lightning attention (minimax.py)
    **zamba2_config.ARCHITECTURES,  # Zamba2: Mamba2 layers, shared blocks (model/zamba2.py)
    **zamba_config.ARCHITECTURES,  # Zamba: Mamba-1 layers in heads, a shared block (zamba.py)
    **zaya_config.ARCHITECTURES,  # Zaya: a conv state feeding attention in every layer
    **recurrent_gemma_config.ARCHITECTURES,  # RG-LRU blocks, local attention
    **rwkv_config.ARCHITECTURES,  # RWKV-4: time-mix and channel-mix (model/rwkv.py)
    **xlstm_config.ARCHITECTURES,  # xLSTM: mLSTM layers, SwiGLU (model/xlstm.py)
    **inkling_config.ARCHITECTURES,  # Inkling: short convs' state beside attention, experts
    **inkling2_config.ARCHITECTURES,  # Inkling 2: Inkling's, block attention residuals
}
# what a hybrid changes in the tensors `checkpoint_shapes.expected_shapes` lists, (c, out) -> None
CHECKPOINT_SHAPES = {arch: m.checkpoint_shapes for m in (zaya_config, inkling_config, inkling2_config)
                     for arch in m.ARCHITECTURES.values()}  # fmt: skip
# transformers' config defaults, where config.json leaves one out
_MAMBA_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
                   "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2,
                   "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False}  # fmt: skip
DEFAULTS: dict[str, dict[str, Any]] = {
    "granitemoehybrid": {**_MAMBA_DEFAULTS, "num_local_experts": 8, "num_experts_per_tok": 2,
                         "shared_intermediate_size": 1024, "max_position_embeddings": 2048},
    "bamba": {**_MAMBA_DEFAULTS, "rms_norm_eps": 1e-5, "num_key_value_heads": 8,
              "max_position_embeddings": 262_144, "partial_rotary_factor": 0.5},
    **nemotron_h_config.DEFAULTS,
    "falcon_h1": {**_MAMBA_DEFAULTS, "mamba_d_ssm": 1024, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8, "max_position_embeddings": 8192,
                  "mamba_norm_before_gate": True, "mamba_rms_norm": False},
    **mamba2_config.DEFAULTS,
    **mamba1_config.DEFAULTS,
    **jamba_config.DEFAULTS,
    **lfm2_config.DEFAULTS,
    **qwen3_next_config.DEFAULTS,
    **olmo_hybrid_config.DEFAULTS,
    **kimi_linear_config.DEFAULTS,
    **bailing_hybrid_config.DEFAULTS,
    **glm5_next_config.DEFAULTS,
    **minimax_config.DEFAULTS,
    **zamba2_config.DEFAULTS,
    **zamba_config.DEFAULTS,
    **zaya_config.DEFAULTS,
    **recurrent_gemma_config.DEFAULTS,
    **rwkv_config.DEFAULTS,
    **xlstm_config.DEFAULTS,
    **inkling_config.DEFAULTS,
    **inkling2_config.DEFAULTS,
}  # fmt: skip
_MAMBA, _ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")


def _layers(cfg: Mapping[str, Any], arch: str, n: int) -> tuple[bool, ...]:
    """Per layer: True where a Mamba2 mixer runs."""
    if arch == "falcon_h1":  # a mixer in every layer (attention beside it)
        return (True,) * n
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


def mamba(cfg: Mapping[str, Any], arch: str, n: int) -> MambaConfig:
    """Granite 4.0's, Bamba's and Falcon-H1's Mamba2 mixers (the `mamba_*` keys)."""
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
        **mamba2_config.time_step_limits(cfg),
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
    if arch in qwen3_next_config.DEFAULTS:
        return qwen3_next_config.overrides(cfg, arch)
    for family in (lfm2_config, olmo_hybrid_config, kimi_linear_config, bailing_hybrid_config,
                   glm5_next_config,
                   zamba2_config, zamba_config, mamba1_config, mamba2_config, nemotron_h_config,
                   zaya_config, minimax_config, recurrent_gemma_config, rwkv_config,
                   xlstm_config, inkling_config, inkling2_config):  # fmt: skip
        if arch in family.DEFAULTS:
            return family.overrides(cfg)
    if arch == "granitemoehybrid":
        return {"intermediate_size": cfg["shared_intermediate_size"],
                "granite_expert_width": cfg.get("intermediate_size")}  # fmt: skip
    if arch == "bamba":  # transformers hard-codes it, whatever config.json says
        return {"partial_rotary_factor": 0.5}
    return {}


def family_fields(cfg: Mapping[str, Any], arch: str, n: int) -> dict[str, Any]:
    if arch in qwen3_next_config.DEFAULTS:
        return qwen3_next_config.family_fields(cfg, arch, n)
    if arch in mamba1_config.DEFAULTS:
        return mamba1_config.family_fields(cfg, arch, n)
    for family in (lfm2_config, olmo_hybrid_config, kimi_linear_config, bailing_hybrid_config,
                   glm5_next_config,
                   zamba2_config, zamba_config, mamba2_config, nemotron_h_config, jamba_config,
                   zaya_config, minimax_config, recurrent_gemma_config, rwkv_config,
                   xlstm_config, inkling_config, inkling2_config):  # fmt: skip
        if arch in family.DEFAULTS:
            return family.family_fields(cfg, n)
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
    if arch == "falcon_h1":  # the logits scaled after the head (no sampling fused into it)
        fields["logit_scale"] = fields["mamba"].falcon.lm_head
    return fields


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides its norms: its Mamba2 mixer (or nothing for an attention
    layer, checked as Llama's) and, for Granite 4.0, its MLP; the other families' their own."""
    for family in (lfm2_config, qwen3_next_config, olmo_hybrid_config, kimi_linear_config,
                   bailing_hybrid_config, glm5_next_config,
                   zamba2_config, zamba_config, nemotron_h_config, mamba1_config, jamba_config,
                   zaya_config, minimax_config, recurrent_gemma_config, rwkv_config,
                   xlstm_config, inkling_config, inkling2_config):  # fmt: skip
        if c.architecture in family.DEFAULTS:
            return family.expected_shapes(c, i)
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out = mamba2_config.mixer_shapes(m, h, p) if m.layers[i] else {}
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
