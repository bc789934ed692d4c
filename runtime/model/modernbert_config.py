"""ModernBERT's config fields, tensor names and checkpoint shapes (`ModernBertModel`:
gte-modernbert-base, nomic-modernbert-embed; `ModernBertForSequenceClassification`:
gte-reranker-modernbert-base), the encoder of `model/modernbert.py`; no layer code.

- Fields (`fields`): rotary positions, the global layers' base `rope_theta` (transformers 5's
  `rope_parameters.full_attention`, older configs' `global_rope_theta`) and the local layers'
  (`sliding_attention`'s, `local_rope_theta`); the local layers (`layer_types`, else every
  layer whose index is not a multiple of `global_attn_every_n_layers`) attend to the keys
  within `local_attention // 2` positions either side (`encoder_window`, as transformers'
  bidirectional sliding mask); a gated MLP (GeGLU: `Wi` is [act input; gate]); LayerNorms
  with or without biases (`norm_bias`); a sequence classifier's labels and its head's
  activation (`classifier_activation`); sentence_bert_config.json's `max_seq_length` bounds the
  context as BERT's (`bert_config.read_side_files`). Refused in one line: a rope type other than
  "default", an activation no head runs.
- `read_checkpoint_names`: the stored names (with or without the `model.` prefix) listed as
  Llama's: `embeddings.tok_embeddings` as `model.embed_tokens`, `embeddings.norm` as the
  embeddings' LayerNorm, `layers.N.attn.Wqkv` / `Wo` as `self_attn.qkv_proj` (split into
  q/k/v: `phi3.split_fused`) / `o_proj`, `attn_norm` / `mlp_norm` as `input_layernorm` /
  `post_attention_layernorm`, `mlp.Wi` / `Wo` as `gate_up_proj` (split in halves) /
  `down_proj`, `final_norm` as `model.norm`; the classifier's `head.dense`, `head.norm`,
  `classifier` as `model.head_dense`, `model.head_norm`, `model.head_out`.
- `checkpoint_shapes`: layer 0 has no norm before attention (transformers' Identity); the
  embeddings' norm and a classifier's head beside the layers.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.runtime.model.bert_config import MAX_SEQ_LENGTH
from pagoda.runtime.model.classifier_config import supported_activation
from pagoda.runtime.pooler_config import num_labels

EMBED_NORM = "model.embed_layernorm.weight"
HEAD_DENSE, HEAD_NORM, HEAD_OUT = (
    "model.head_dense.weight",
    "model.head_norm.weight",
    "model.head_out.weight",
)

# transformers' ModernBertConfig defaults (config.json leaves some of them out)
DEFAULTS = {"modernbert": {
    "hidden_activation": "gelu", "norm_eps": 1e-5, "norm_bias": False, "local_attention": 128,
    "global_attn_every_n_layers": 3, "global_rope_theta": 160_000.0, "rope_theta": 160_000.0,
    "local_rope_theta": 10_000.0,
    "max_position_embeddings": 8192, "classifier_pooling": "cls", "classifier_activation": "gelu",
    "attention_bias": False, "tie_word_embeddings": True, "pad_token_id": 50283,
    "bos_token_id": 50281, "eos_token_id": 50282}}  # fmt: skip
# config.json keys read under the engine's names (older configs': no rope_parameters)
ALIASES = {"global_rope_theta": "rope_theta"}

_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^model\.", ""),
    (r"^embeddings\.tok_embeddings\.", "model.embed_tokens."),
    (r"^embeddings\.norm\.", "model.embed_layernorm."),
    (r"^(?:final_)?norm\.", "model.norm."),  # (`model.final_norm`: the loader's model.norm)
    (r"^layers\.(\d+)\.attn\.Wqkv\.", r"model.layers.\1.self_attn.qkv_proj."),
    (r"^layers\.(\d+)\.attn\.Wo\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^layers\.(\d+)\.mlp\.Wi\.", r"model.layers.\1.mlp.gate_up_proj."),
    (r"^layers\.(\d+)\.mlp\.Wo\.", r"model.layers.\1.mlp.down_proj."),
    (r"^head\.dense\.", "model.head_dense."),
    (r"^head\.norm\.", "model.head_norm."),
    (r"^classifier\.", "model.head_out."),
))  # fmt: skip


def local_layers(cfg: dict[str, Any], n: int) -> tuple[bool, ...]:
    """Per layer: True where it attends locally (module docstring)."""
    types = cfg.get("layer_types")
    if types:
        if len(types) != n:
            raise ValueError(f"modernbert layer_types has {len(types)} entries for {n} layers")
        return tuple(t == "sliding_attention" for t in types)
    every = int(cfg["global_attn_every_n_layers"])
    return tuple(bool(i % every) for i in range(n))


def _theta(cfg: dict[str, Any], kind: str, older: str) -> float:
    params = (cfg.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        raise ValueError(f"modernbert rope_type {params['rope_type']!r} is not supported "
                         "(default)")  # fmt: skip
    return float(params.get("rope_theta") or cfg[older])


def fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """The `FamilyConfig` fields of ModernBERT (module docstring)."""
    classifier = any(
        a.endswith("ForSequenceClassification") for a in cfg.get("architectures") or ()
    )
    act = supported_activation(str(cfg["classifier_activation"]), arch) if classifier else ""
    _theta(cfg, "full_attention", "global_rope_theta")  # (a rope type not run: refused)
    return {"positions": "rope", "layer_norm_bias": bool(cfg["norm_bias"]), "gated_mlp": True,
            "local_rope_theta": _theta(cfg, "sliding_attention", "local_rope_theta"),
            "window_layers": local_layers(cfg, n),
            "encoder_window": int(cfg["local_attention"]) // 2,
            "num_labels": num_labels(cfg) if classifier else 0, "classifier_act": act,
            "max_seq_length": int(cfg.get(MAX_SEQ_LENGTH) or 0)}  # fmt: skip


FIELDS = {"modernbert": fields}


def read_checkpoint_names(weights, config) -> None:
    """The stored names listed as the model reads them, the fused matrices split (module
    docstring)."""
    from pagoda.runtime.model.phi3 import split_fused

    weights.rename_by(_RENAMES)
    split_fused(weights, config)


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Layer 0 without its attention norm; the embeddings' norm; a classifier's head (the
    LayerNorms' biases are added by the caller)."""
    h = c.hidden_size
    del out["model.layers.0.input_layernorm.weight"]
    out[EMBED_NORM] = (h,)
    if c.family.num_labels:
        out.update({HEAD_DENSE: (h, h), HEAD_NORM: (h,), HEAD_OUT: (c.family.num_labels, h),
                    HEAD_OUT[:-6] + "bias": (c.family.num_labels,)})  # fmt: skip
