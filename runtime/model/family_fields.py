"""The `FamilyConfig` fields each architecture family sets from its config.json (besides the
window and the activation every family reads, in `hf_loader._family`): `FIELDS[arch]` maps
(cfg, arch, layers, window, window_layers, scaling) to the dict of fields it sets. Also the
rotary reading (`read_rope`) that both this module and the loader use."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from pagoda.runtime.model import (
    bert_config,
    hy_v4_config,
    modernbert_config,
    moe_families,
    positions_config,
    ungated_config,
)
from pagoda.runtime.model import bitnet_config as bitnet
from pagoda.runtime.model import deepseek_config as deepseek
from pagoda.runtime.model import gemma3n_config as gemma3n
from pagoda.runtime.model import gemma4_config as gemma4
from pagoda.runtime.model import glm4_moe_config as glm4_moe
from pagoda.runtime.model import llama4_config as llama4
from pagoda.runtime.model import mamba_config as hybrid
from pagoda.runtime.model.ops import rope_kind

# (cfg, arch, n, window, window_layers, scaling) -> the fields the family sets
Fields = Callable[
    [Mapping[str, Any], str, int, "int | None", "tuple[bool, ...]", "Mapping[str, Any] | None"],
    dict[str, Any],
]


def read_rope(
    cfg: Mapping[str, Any], kind: str | None, phi3: bool = False
) -> tuple[float, dict | None]:
    """(theta, rope_scaling) from transformers 5's `rope_parameters` (keyed by layer kind for
    Gemma 3) or the older `rope_theta` / `rope_scaling`, with what transformers fills in where
    a config leaves it out (llama3's and yarn's original context, yarn's factor)."""
    params = cfg.get("rope_parameters") or {}
    nested = kind is not None and isinstance(params.get(kind), dict)
    if nested:
        params = params[kind]
    theta = params.get("rope_theta") or cfg.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling")
    if params.get("rope_type", "default") != "default" or "partial_rotary_factor" in params:
        scaling = params
    if cfg.get("partial_rotary_factor") not in (None, 1, 1.0):  # rope_parameters' own wins
        scaling = {"partial_rotary_factor": cfg["partial_rotary_factor"], **(scaling or {})}
    if phi3 and rope_kind(scaling) in ("su", "yarn"):  # transformers' Phi3Config: longrope
        scaling = {**scaling, "rope_type": "longrope"}
    if scaling and rope_kind(scaling) in ("llama3", "yarn", "longrope"):
        context = cfg.get("max_position_embeddings")
        scaling = dict(scaling)
        # transformers' standardize_rope_params: a top-level original_max_position_embeddings
        # (Phi-3's place for it) wins over rope_scaling's; without either, the model's context
        top = None if nested else cfg.get("original_max_position_embeddings")
        if top:
            scaling["original_max_position_embeddings"] = int(top)
        elif not scaling.get("original_max_position_embeddings") and context:
            scaling["original_max_position_embeddings"] = int(context)
        if rope_kind(scaling) in ("yarn", "longrope") and not scaling.get("factor") and context:
            scaling["factor"] = int(context) / scaling["original_max_position_embeddings"]
    return float(theta), scaling


def _no_rope_layers(cfg: Mapping[str, Any], n: int) -> tuple[bool, ...]:
    """SmolLM3's per-layer rotary (1: rotated, 0: NoPE); by default every
    `no_rope_layer_interval`-th layer skips it (transformers' SmolLM3Config)."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = int(cfg["no_rope_layer_interval"])
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n:
        raise ValueError(f"no_rope_layers names {len(flags)} layers, the model has {n}")
    return tuple(bool(f) for f in flags)


def _smollm3_layer_types(cfg: Mapping[str, Any], n: int, window: int | None, layers):
    """transformers' default layer_types: the NoPE layers slide (when a window is on); else
    `layers`, the window layers as layer_types names them."""
    if window is None or cfg.get("layer_types"):
        return layers
    return tuple(not rope for rope in _no_rope_layers(cfg, n))


def _local_rope_theta(cfg: Mapping[str, Any], fallback: str, family: str) -> float:
    """The rotary base of the sliding-window layers (transformers 5's
    `rope_parameters.sliding_attention`, else config.json's `fallback` key); a scaling there is
    refused in one line."""
    params = (cfg.get("rope_parameters") or {}).get("sliding_attention")
    params = params if isinstance(params, dict) else {}
    if rope_kind(params) != "default":
        raise ValueError(f"rope_scaling {rope_kind(params)!r} on {family}'s sliding-window "
                         "layers is not supported")  # fmt: skip
    return float(params.get("rope_theta") or cfg[fallback])


def _llama4_query_scale(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Ministral 3's q scale by position (`FamilyConfig.query_scale_beta`): its
    `rope_parameters`' `llama_4_scaling_beta` over their `original_max_position_embeddings`
    (transformers reads both there and fails without them)."""
    _, scaling = read_rope(cfg, None)
    scaling = scaling or {}
    beta, context = (
        scaling.get("llama_4_scaling_beta"),
        scaling.get("original_max_position_embeddings"),
    )
    if beta is None or not context:
        raise ValueError("Ministral 3 needs rope_parameters with llama_4_scaling_beta and "
                         "original_max_position_embeddings")  # fmt: skip
    return {"query_scale_beta": float(beta), "query_scale_context": int(context)}


def _qwen3(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return {"qk_norm": True}


def _glm(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return {"rope_interleaved": True, "glm4_norms": arch == "glm4"}


def _cohere(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    fields = {
        "cohere_layer": True,
        "rope_interleaved": True,
        "logit_scale": float(cfg["logit_scale"]),
    }
    if arch == "cohere" and cfg.get("use_qk_norm"):  # (Cohere 2's attention has none)
        fields["qk_norm"] = True
    if arch == "cohere2":  # the global layers attend without rotary
        fields["rope_layers"] = layers
    return fields


def _ministral3(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return _llama4_query_scale(cfg)


def _diffllama(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """DiffLlama (model/diffllama.py): Llama's model with differential attention, which pairs
    the first half of the query heads with the second and splits the values' KV heads in two."""
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    if kv % 2:
        raise ValueError(f"DiffLlama with num_key_value_heads {kv} is not supported: its "
                         "differential attention splits the KV heads in two (an even count)")  # fmt: skip
    return {"diff_attention": True}


def _ernie4_5(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return {"rope_interleaved": True}


def _exaone4(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # norms after; per-head q/k norms; with a window, global layers NoPE
    fields: dict[str, Any] = {"olmo2_norms": True, "qk_norm": True}
    if window is not None:
        fields["rope_layers"] = layers
    return fields


def _smollm3(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return {
        "rope_layers": _no_rope_layers(cfg, n),
        "window_layers": _smollm3_layer_types(cfg, n, window, layers),
    }


def _gemma3(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention (an embedding model's attention, "
                         "EmbeddingGemma) is not supported: Pagoda serves causal decoders")  # fmt: skip
    return dict(
        qk_norm=True,
        gemma_norms=True,
        local_rope_theta=_local_rope_theta(cfg, "rope_local_base_freq", "Gemma 3"),
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]),
        # attn_logit_softcapping is in Gemma 3's config (inherited from Gemma 2's) but its
        # attention never applies it, in transformers as in llama.cpp: neither do we
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
    )


def _gemma2(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return dict(
        gemma_norms=True,
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]),
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
    )


def _stablelm(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # StarCoder2's LayerNorms; per-head q/k LayerNorms; one norm in parallel, or Llama's layer
    return {
        "layer_norm_bias": True,
        "qk_norm": bool(cfg.get("qk_layernorm")),
        "falcon_norms": "one" if cfg.get("use_parallel_residual") else "sequential",
    }


def _gemma(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return {"gemma_norms": True}  # (1 + w) norms, the scaled embedding; two norms a layer


def _olmo(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    clip = cfg.get("clip_qkv")
    if clip is not None and not float(clip) > 0:
        raise ValueError(f"clip_qkv must be positive, got {clip}")
    return {"clip_qkv": None if clip is None else float(clip)}


def _minicpm3(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # DeepSeek's latent attention (rotate-half rotary), a dense MLP, muP's scales (Granite's
    # fields; the logits' divisor applies to the hidden states before the head: minicpm3.py)
    depth = cfg.get("scale_depth")
    base = cfg.get("dim_model_base") or cfg["hidden_size"]
    return {
        **deepseek.family_fields(cfg, "minicpm3", n, scaling),
        "embedding_multiplier": float(cfg["scale_emb"]),
        "residual_multiplier": 1.0 if depth is None else float(depth) / math.sqrt(n),
        "logits_scaling": int(cfg["hidden_size"]) / int(base),
    }


def _mixtral(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return dict(
        num_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["intermediate_size"]),
    )


def _qwen_moe(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # the hub's configs say num_experts; transformers 5 writes num_local_experts
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 128)
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    fields = dict(
        num_experts=experts,
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        round_topk_to_model_dtype=True,
        moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(n)),
    )
    if arch in ("qwen3moe", "qwen3_vl_moe", "internvl_qwen3_moe"):
        fields["qk_norm"] = True
    if arch == "qwen3_vl_moe":  # (its router renormalises the top k always)
        fields["norm_topk_prob"] = True
    if arch == "qwen2moe":
        fields["shared_expert_intermediate_size"] = int(cfg["shared_expert_intermediate_size"])
    return fields


def _olmo2(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    fields: dict[str, Any] = {"olmo2_norms": True, "qk_norm_whole": True}
    if arch == "olmo3" and window is not None:  # the window layers' rotary: unscaled
        local = _local_rope_theta(cfg, "rope_theta", "OLMo 3")
        theta, full_scaling = read_rope(cfg, "full_attention")
        if full_scaling is not None or local != theta:
            fields["local_rope_theta"] = local
    return fields


def _olmoe(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    if cfg.get("clip_qkv") is not None:
        raise ValueError(f"clip_qkv {cfg['clip_qkv']} (OLMoE's q/k/v clamp) is not supported")
    return dict(
        qk_norm_whole=True,
        num_experts=int(cfg["num_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["intermediate_size"]),
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        round_topk_to_model_dtype=True,
    )


def _granite(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if arch == "granitemoe":  # Mixtral's experts; softmax over the top-k logits, rounded
        fields.update(
            _mixtral(cfg, arch, n, window, layers, scaling), round_topk_to_model_dtype=True
        )
        # GraniteMoeShared's ungated shared_mlp beside the experts (0, GraniteMoe's: none)
        fields["shared_expert_intermediate_size"] = int(cfg.get("shared_intermediate_size") or 0)
    # transformers' defaults: 1.0 each (a softmax scale of 1, too)
    for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                 "logits_scaling"):  # fmt: skip
        fields[name] = float(cfg.get(name, 1.0))
    return fields


def _hyperclovax(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # Granite's embedding and residual scalars; the softmax scale head_dim ** -0.5 unless
    # attention_multiplier; logits x logits_scaling (Cohere's logit_scale); peri-norms (GLM-4's)
    attention = cfg.get("attention_multiplier")
    return {
        "embedding_multiplier": float(cfg.get("embedding_multiplier", 1.0)),
        "residual_multiplier": float(cfg.get("residual_multiplier", 1.0)),
        "attention_multiplier": None if attention is None else float(attention),
        "logit_scale": float(cfg.get("logits_scaling", 1.0)),
        "glm4_norms": bool(cfg.get("use_post_norm", True)),
    }


def _gpt_oss(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # softmax over the top-k logits: the renormalised top-k
    return dict(
        num_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=int(cfg["intermediate_size"]),
        round_topk_to_model_dtype=True,
        attention_sinks=True,
        swiglu_alpha=float(cfg["swiglu_alpha"]),
        swiglu_limit=float(cfg["swiglu_limit"]),
    )


def _deepseek(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    if arch == "hy_v4":  # GLM-5's, with hyper-connections (model/hy_v4.py)
        return hy_v4_config.family_fields(cfg, n, scaling)
    return deepseek.family_fields(cfg, arch, n, scaling)


def _glm4_moe(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # GLM-4.5: V3's router, shared experts, optional q/k norms
    return glm4_moe.family_fields(cfg, n)


def _llama4(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # NoPE layers, top-1 sigmoid experts with a shared one
    return llama4.family_fields(cfg, n)


def _hybrid(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    # Mamba2 layers among attention layers (Granite 4.0, Bamba)
    return hybrid.family_fields(cfg, arch, n)


FIELDS: dict[str, Fields] = {
    **positions_config.FIELDS,  # learned or sinusoidal position tables, ALiBi
    **bert_config.FIELDS,  # BERT's, RoBERTa's: post-norm encoders (model/bert.py)
    **modernbert_config.FIELDS,  # ModernBERT's: local and global layers (model/modernbert.py)
    "qwen3": _qwen3,
    "qwen3_vl": _qwen3,
    "internvl_qwen3": _qwen3,  # (InternVL 3.5's text model)
    "gemma3": _gemma3,
    **dict.fromkeys(
        gemma4.ARCHS,
        lambda cfg, arch, n, window, layers, scaling: gemma4.family_fields(cfg, n, arch),
    ),
    "gemma3n": lambda cfg, arch, n, window, layers, scaling: gemma3n.family_fields(cfg, n),
    "gemma2": _gemma2,
    "vaultgemma": _gemma2,
    "gemma": _gemma,
    "olmo": _olmo,
    "stablelm": _stablelm,
    "minicpm3": _minicpm3,
    "glm": _glm,
    "glm4": _glm,
    "cohere": _cohere,
    "cohere2": _cohere,
    "ministral3": _ministral3,
    **ungated_config.FIELDS,  # down(act(up(x))) MLPs
    "ernie4_5": _ernie4_5,
    "helium": _ernie4_5,  # (the interleaved rotary)
    "diffllama": _diffllama,
    "exaone4": _exaone4,
    "bitnet": lambda cfg, arch, n, window, layers, scaling: bitnet.family_fields(cfg),
    "smollm3": _smollm3,
    "mixtral": _mixtral,
    "qwen3moe": _qwen_moe,
    "qwen3_vl_moe": _qwen_moe,
    "internvl_qwen3_moe": _qwen_moe,  # (InternVL3.5-MoE's text model)
    "qwen2moe": _qwen_moe,
    "olmo2": _olmo2,
    "olmo3": _olmo2,
    "olmoe": _olmoe,
    "granite": _granite,
    "granitemoe": _granite,
    "hyperclovax": _hyperclovax,
    "gpt_oss": _gpt_oss,
    **dict.fromkeys(deepseek.ARCHITECTURES.values(), _deepseek),
    "glm4_moe": _glm4_moe,
    "llama4": _llama4,
    **dict.fromkeys(hybrid.DEFAULTS, _hybrid),
    **moe_families.FIELDS,
}
