"""The `FamilyConfig` fields each architecture family sets from its config.json (besides the
window and the activation every family reads, in `hf_loader._family`): `FIELDS[arch]` maps
(cfg, arch, layers, window, window_layers, scaling) to the dict of fields it sets. Also the
rotary reading (`read_rope`) that both this module and the loader use."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from pagoda.runtime.model import bitnet_config as bitnet
from pagoda.runtime.model import deepseek_config as deepseek
from pagoda.runtime.model import gemma3n_config as gemma3n
from pagoda.runtime.model import gemma4_config as gemma4
from pagoda.runtime.model import glm4_moe_config as glm4_moe
from pagoda.runtime.model import hy_v4_config, moe_families
from pagoda.runtime.model import llama4_config as llama4
from pagoda.runtime.model import mamba_config as hybrid
from pagoda.runtime.model.ops import rope_kind

# (cfg, arch, n, window, window_layers, scaling) -> the fields the family sets
Fields = Callable[
    [Mapping[str, Any], str, int, "int | None", "tuple[bool, ...]", "Mapping[str, Any] | None"],
    dict[str, Any],
]
# down(act(up(x))) MLPs (model/ungated_mlp.py)
UNGATED = ("arcee", "apertus", "starcoder2", "nemotron", "phi", "falcon", "gpt_neox", "jais2",
           "gpt_neox_japanese")  # fmt: skip
UNGATED += ("gptj", "nanochat", "codegen", "persimmon", "apertus1p5")


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


def _ungated(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    fields: dict[str, Any] = {"gated_mlp": False}
    if arch in (
        "starcoder2",
        "nemotron",
        "phi",
        "falcon",
        "gpt_neox",
        "jais2",
        "gpt_neox_japanese",
    ):  # (Nemotron: 1 + w)
        fields["layer_norm_bias"] = True
    if arch == "falcon":
        fields.update(_falcon(cfg))
    if arch == "gpt_neox":  # Falcon's per-head q/k/v; two norms in parallel, or Llama's layer
        parallel = cfg.get("use_parallel_residual", True)
        fields.update(falcon_qkv="per_head", falcon_norms="two" if parallel else "sequential")
    if arch == "gpt_neox_japanese":  # GPT-NeoX's q/k/v per head in Llama's layer, no biases
        fields.update(falcon_qkv="per_head", falcon_norms="sequential")  # (but the last o_proj's)
    if arch in ("gptj", "codegen"):  # Phi's model, the rotary interleaved (GLM's layout)
        fields.update(layer_norm_bias=True, rope_interleaved=True)
    if arch == "phi" and cfg.get("qk_layernorm"):  # a LayerNorm over each head, with a bias
        fields["qk_norm"] = True
    if arch == "persimmon":  # GPT-NeoX's q/k/v per head in Llama's layer; Phi's q/k norms
        fields.update(layer_norm_bias=True, falcon_qkv="per_head", falcon_norms="sequential",
                      qk_norm=bool(cfg.get("qk_layernorm")))  # fmt: skip
    if arch == "apertus":
        fields["qk_norm"] = True
    if arch == "apertus1p5":  # Apertus', its LM head pruned to `output_vocab_size` rows
        fields.update(qk_norm=True, head_rows=_apertus1p5_head(cfg))
    if arch == "nanochat":  # (its q/k norms have no weights: model/nanochat.py)
        cap = cfg.get("final_logit_softcapping")
        fields["final_logit_softcapping"] = float(cap) if cap else None
    return fields


def _diffllama(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """DiffLlama (model/diffllama.py): Llama's model with differential attention, which pairs
    the first half of the query heads with the second and splits the values' KV heads in two."""
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    if kv % 2:
        raise ValueError(f"DiffLlama with num_key_value_heads {kv} is not supported: its "
                         "differential attention splits the KV heads in two (an even count)")  # fmt: skip
    return {"diff_attention": True}


def _apertus1p5_head(cfg) -> int:
    """The pruned head's rows (0: none, the vocabulary's), as Apertus1p5TextConfig checks
    them; tied, none (transformers' head is then the embedding, every id scored)."""
    rows, vocab = cfg.get("output_vocab_size"), int(cfg["vocab_size"])
    if rows is None or int(rows) == vocab:
        return 0
    if not 1 <= int(rows) <= vocab:
        raise ValueError(f"output_vocab_size ({rows}) must be in [1, vocab_size] "
                         f"(vocab_size is {vocab})")  # fmt: skip
    return 0 if cfg.get("tie_word_embeddings") else int(rows)


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


def _falcon(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Falcon's q/k/v layout and layer (model/falcon.py), as transformers' FalconDecoderLayer
    picks them; ALiBi refused."""
    if cfg.get("alibi"):
        raise ValueError("Falcon with alibi (ALiBi position biases: falcon-rw) is not supported")
    new, parallel = bool(cfg.get("new_decoder_architecture")), bool(cfg.get("parallel_attn"))
    if new:
        layers = cfg.get("num_ln_in_parallel_attn") or 2
        if layers == 1 and not parallel:  # (transformers' layer has no MLP input then)
            raise ValueError("Falcon's new_decoder_architecture with num_ln_in_parallel_attn 1 "
                             "and parallel_attn false is not supported")  # fmt: skip
        norms = "two" if layers == 2 else "one"
    else:
        norms = "one" if parallel else "sequential"
    qkv = "grouped" if new else "multi_query" if cfg.get("multi_query") else "per_head"
    return {"falcon_qkv": qkv, "falcon_norms": norms}


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
    if arch == "qwen3moe":
        fields["qk_norm"] = True
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


def _learned(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-2, GPTBigCode, OPT, OpenAI GPT (model/positions.py): learned positions, LayerNorms with biases,
    an ungated MLP, a fused q/k/v (GPT-2's stacked, StarCoder 1's multi-query or per head)."""
    fields: dict[str, Any] = {"positions": "learned", "gated_mlp": False, "layer_norm_bias": True}
    if arch in ("gpt2", "gpt_bigcode"):
        if cfg.get("scale_attn_by_inverse_layer_idx"):  # (GPT-2's: BioMedLM's, CRFM's)
            fields["q_scale_by_layer"] = True
        if cfg.get("add_cross_attention"):
            raise ValueError("add_cross_attention (an encoder-decoder's cross-attention) is "
                             "not supported: Pagoda serves causal decoders")  # fmt: skip
        if not cfg.get("scale_attn_weights", True):  # scores unscaled
            fields["attention_multiplier"] = 1.0
        multi_query = arch == "gpt_bigcode" and cfg.get("multi_query", True)
        mha = "stacked" if arch == "gpt2" else "per_head"
        fields["falcon_qkv"] = "multi_query" if multi_query else mha
    if arch == "openai_gpt":  # GPT-1: GPT-2's stacked c_attn, norms after each residual add
        fields.update(falcon_qkv="stacked", post_norm=True)
    if arch == "gpt_neo":  # q/k/v apart without biases, out_proj's; scores unscaled
        fields.update(attention_multiplier=1.0, o_proj_bias=True)
    if arch == "opt":
        if not cfg.get("layer_norm_elementwise_affine", True):
            raise ValueError("OPT with layer_norm_elementwise_affine false (LayerNorms without "
                             "parameters) is not supported")  # fmt: skip
        pre = bool(cfg.get("do_layer_norm_before", True))
        if pre and cfg.get("_remove_final_layer_norm"):
            raise ValueError("OPT with _remove_final_layer_norm (no final norm after "
                             "pre-norm layers) is not supported")  # fmt: skip
        proj = int(cfg.get("word_embed_proj_dim") or cfg["hidden_size"])
        fields.update(position_offset=2, post_norm=not pre,
                      embed_proj_dim=0 if proj == int(cfg["hidden_size"]) else proj)  # fmt: skip
    return fields


def _xglm(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """XGLM (model/positions.py): a sinusoidal table offset by 2, the embeddings scaled by
    sqrt(hidden) (`scale_embedding`), OPT's pre-norm layer with biases, an ungated MLP."""
    if cfg.get("add_cross_attention"):
        raise ValueError("add_cross_attention (an encoder-decoder's cross-attention) is "
                         "not supported: Pagoda serves causal decoders")  # fmt: skip
    pad = cfg.get("pad_token_id")
    if pad is not None and int(pad) >= 2:  # (transformers zeroes that row of its table)
        raise ValueError(f"XGLM with pad_token_id {pad} (its position table's row {pad} "
                         "zeroed) is not supported: 0, 1 or null")  # fmt: skip
    scale = math.sqrt(int(cfg["hidden_size"])) if cfg.get("scale_embedding", True) else 1.0
    return {"positions": "sinusoidal", "position_offset": 2, "gated_mlp": False,
            "layer_norm_bias": True, "embedding_multiplier": scale}  # fmt: skip


def _biogpt(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """BioGPT (model/positions.py): OPT's learned table offset by 2, the embeddings scaled by
    sqrt(hidden) (`scale_embedding`), pre-norm layers with biases, an ungated MLP."""
    scale = math.sqrt(int(cfg["hidden_size"])) if cfg.get("scale_embedding", True) else 1.0
    return {"positions": "learned", "position_offset": 2, "gated_mlp": False,
            "layer_norm_bias": True, "embedding_multiplier": scale}  # fmt: skip


def _ctrl(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """CTRL (model/positions.py): its own sinusoidal table (no offset), the embeddings scaled by
    sqrt(hidden), pre-norm layers with biases (eps 1e-6 in its layers), a ReLU MLP, a head bias."""
    eps = float(cfg.get("layer_norm_epsilon", 1e-6))
    if eps != 1e-6:  # (transformers' layers run 1e-6 whatever it says; the final norm its value)
        raise ValueError(f"CTRL with layer_norm_epsilon {eps} is not supported (1e-6: its "
                         "layers' LayerNorms run 1e-6 whatever the config says)")  # fmt: skip
    return {"positions": "sinusoidal", "gated_mlp": False, "layer_norm_bias": True,
            "embedding_multiplier": math.sqrt(int(cfg["hidden_size"])), "lm_head_bias": True}  # fmt: skip


def _alibi(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """BLOOM and MPT (model/bloom.py): ALiBi, an ungated MLP, a fused q/k/v."""
    fields: dict[str, Any] = {"positions": "alibi", "alibi_slopes": arch, "gated_mlp": False}
    if arch == "bloom":
        if cfg.get("apply_residual_connection_post_layernorm"):
            raise ValueError("BLOOM with apply_residual_connection_post_layernorm (the residual "
                             "taken after the norm) is not supported")  # fmt: skip
        fields.update(layer_norm_bias=True, falcon_qkv="per_head")
        return fields
    a = cfg.get("attn_config") or {}
    if not a.get("alibi", True):
        raise ValueError("MPT without attn_config.alibi (learned positions) is not supported "
                         "(transformers' MPT runs ALiBi only)")  # fmt: skip
    if a.get("qk_ln"):
        raise ValueError("MPT with attn_config.qk_ln (q/k LayerNorms) is not supported "
                         "(transformers' MPT does not run them)")  # fmt: skip
    if a.get("attn_type", "multihead_attention") != "multihead_attention" or a.get("prefix_lm"):
        raise ValueError(f"MPT attn_config attn_type {a.get('attn_type')!r} / prefix_lm is not "
                         "supported (multihead_attention, causal)")  # fmt: skip
    if cfg.get("logit_scale") not in (None, 1, 1.0):  # MPT's own code scales the logits
        raise ValueError(f"MPT with logit_scale {cfg['logit_scale']!r} (the logits scaled) is not "
                         "supported (transformers' MPT does not scale them)")  # fmt: skip
    if not cfg.get("no_bias", True):
        raise ValueError("MPT with no_bias false (biases transformers' MPT does not load) is "
                         "not supported")  # fmt: skip
    clip, scale = a.get("clip_qkv"), a.get("softmax_scale")
    if clip is not None and not float(clip) > 0:
        raise ValueError(f"clip_qkv must be positive, got {clip}")
    # the slopes' alibi_bias_max as MPT's own code and vLLM read it (transformers' MPT runs 8
    # whatever the config says)
    bias_max = float(8 if a.get("alibi_bias_max") is None else a["alibi_bias_max"])
    if not bias_max > 0:
        raise ValueError(f"attn_config.alibi_bias_max must be positive, got {bias_max}")
    fields.update(falcon_qkv="stacked", clip_qkv=None if clip is None else float(clip),
                  attention_multiplier=None if scale is None else float(scale),
                  alibi_bias_max=bias_max)  # fmt: skip
    return fields


FIELDS: dict[str, Fields] = {
    **dict.fromkeys(("gpt2", "gpt_bigcode", "opt", "gpt_neo", "openai_gpt"), _learned),
    **dict.fromkeys(("bloom", "mpt"), _alibi),
    "xglm": _xglm,
    "biogpt": _biogpt,
    "ctrl": _ctrl,
    "qwen3": _qwen3,
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
    **dict.fromkeys(UNGATED, _ungated),
    "ernie4_5": _ernie4_5,
    "helium": _ernie4_5,  # (the interleaved rotary)
    "diffllama": _diffllama,
    "exaone4": _exaone4,
    "bitnet": lambda cfg, arch, n, window, layers, scaling: bitnet.family_fields(cfg),
    "smollm3": _smollm3,
    "mixtral": _mixtral,
    "qwen3moe": _qwen_moe,
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
