"""The `FamilyConfig` fields of the families without a rotary (`family_fields.FIELDS` takes
`FIELDS`, `family_fields.Fields`' signature): learned position tables (GPT-2, GPTBigCode, OPT,
GPT-Neo, OpenAI GPT, BioGPT), sinusoidal ones (XGLM, CTRL) (`model/positions.py`) and ALiBi
(BLOOM, MPT: `model/bloom.py`); each family's refusals in one line. No layer code."""

from __future__ import annotations

import math
from typing import Any

_CROSS_ATTENTION = ("add_cross_attention (an encoder-decoder's cross-attention) is not "
                    "supported: Pagoda serves causal decoders")  # fmt: skip


def _learned() -> dict[str, Any]:
    """Learned positions, LayerNorms with biases, an ungated MLP (model/positions.py)."""
    return {"positions": "learned", "gated_mlp": False, "layer_norm_bias": True}


def _gpt2(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-2 and GPTBigCode: a fused q/k/v (GPT-2's stacked, StarCoder 1's multi-query or per
    head)."""
    fields = _learned()
    if cfg.get("scale_attn_by_inverse_layer_idx"):  # (GPT-2's: BioMedLM's, CRFM's)
        fields["q_scale_by_layer"] = True
    if cfg.get("add_cross_attention"):
        raise ValueError(_CROSS_ATTENTION)
    if not cfg.get("scale_attn_weights", True):  # scores unscaled
        fields["attention_multiplier"] = 1.0
    multi_query = arch == "gpt_bigcode" and cfg.get("multi_query", True)
    mha = "stacked" if arch == "gpt2" else "per_head"
    fields["falcon_qkv"] = "multi_query" if multi_query else mha
    return fields


def _openai_gpt(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-1: GPT-2's stacked c_attn, norms after each residual add."""
    return _learned() | {"falcon_qkv": "stacked", "post_norm": True}


def _gpt_neo(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-Neo: q/k/v apart without biases, out_proj's; scores unscaled."""
    return _learned() | {"attention_multiplier": 1.0, "o_proj_bias": True}


def _opt(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """OPT: its table offset by 2, pre- or post-norm layers, embeddings narrower than hidden
    projected in and out (`word_embed_proj_dim`)."""
    if not cfg.get("layer_norm_elementwise_affine", True):
        raise ValueError("OPT with layer_norm_elementwise_affine false (LayerNorms without "
                         "parameters) is not supported")  # fmt: skip
    pre = bool(cfg.get("do_layer_norm_before", True))
    if pre and cfg.get("_remove_final_layer_norm"):
        raise ValueError("OPT with _remove_final_layer_norm (no final norm after "
                         "pre-norm layers) is not supported")  # fmt: skip
    proj = int(cfg.get("word_embed_proj_dim") or cfg["hidden_size"])
    return _learned() | {"position_offset": 2, "post_norm": not pre,
                         "embed_proj_dim": 0 if proj == int(cfg["hidden_size"]) else proj}  # fmt: skip


def _xglm(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """XGLM (model/positions.py): a sinusoidal table offset by 2, the embeddings scaled by
    sqrt(hidden) (`scale_embedding`), OPT's pre-norm layer with biases, an ungated MLP."""
    if cfg.get("add_cross_attention"):
        raise ValueError(_CROSS_ATTENTION)
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


def _bloom(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """BLOOM (model/bloom.py): ALiBi, LayerNorms with biases, an ungated MLP, a fused q/k/v
    per head."""
    if cfg.get("apply_residual_connection_post_layernorm"):
        raise ValueError("BLOOM with apply_residual_connection_post_layernorm (the residual "
                         "taken after the norm) is not supported")  # fmt: skip
    return {"positions": "alibi", "alibi_slopes": arch, "gated_mlp": False,
            "layer_norm_bias": True, "falcon_qkv": "per_head"}  # fmt: skip


def _mpt(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """MPT (model/bloom.py): ALiBi, an ungated MLP, a stacked fused q/k/v, clip_qkv, the
    scores' scale and the slopes' alibi_bias_max from its attn_config."""
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
    return {"positions": "alibi", "alibi_slopes": arch, "gated_mlp": False,
            "falcon_qkv": "stacked", "clip_qkv": None if clip is None else float(clip),
            "attention_multiplier": None if scale is None else float(scale),
            "alibi_bias_max": bias_max}  # fmt: skip


# architecture -> its fields (`family_fields.Fields`)
FIELDS = {"gpt2": _gpt2, "gpt_bigcode": _gpt2, "openai_gpt": _openai_gpt, "gpt_neo": _gpt_neo,
          "opt": _opt, "xglm": _xglm, "biogpt": _biogpt, "ctrl": _ctrl, "bloom": _bloom,
          "mpt": _mpt}  # fmt: skip
