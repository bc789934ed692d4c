"""BERT's and (XLM-)RoBERTa's config fields, tensor names and checkpoint shapes (the encoders
of `model/bert.py`; `pooler_config.ENCODERS` names their architectures). No layer code.

- Fields (`FIELDS`, `family_fields` takes them): learned positions (RoBERTa's table offset by
  pad_token_id + 1, as its position ids start there), LayerNorms with biases after each
  residual add (`post_norm`), an ungated MLP, the token-type table's rows. Refused in one line:
  `is_decoder` / `add_cross_attention` (a causal or encoder-decoder BERT), a
  `position_embedding_type` other than "absolute" (relative_key's distance tables).
- `overrides`: RoBERTa's `max_position_embeddings` counts its offset rows; the context is
  that less the offset (514 -> 512 tokens); `read_side_files`: sentence_bert_config.json's
  `max_seq_length` bounds it further where it is less (all-MiniLM-L6-v2: 256).
- `rename_weights`: the stored names (with or without the `bert.` / `roberta.` prefix)
  listed as Llama's (`embeddings.word_embeddings` as `model.embed_tokens`,
  `encoder.layer.N.attention.self.query` as `self_attn.q_proj`, the attention output's
  LayerNorm as `input_layernorm`, the layer output's as `post_attention_layernorm`, ...);
  the `pooler.` dense layer is not read (sentence-transformers and vLLM pool the last hidden
  states).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pagoda.runtime.model.template_files import read_json_object
from pagoda.runtime.pooler_config import num_labels

TOKEN_TYPES = "model.embed_token_types.weight"
# a sequence classifier's head (`*ForSequenceClassification`): BERT's pooler dense and
# classifier, RoBERTa's classifier.dense and out_proj, both dense -> tanh -> out
HEAD_DENSE, HEAD_OUT = "model.head_dense.weight", "model.head_out.weight"
# the key `hf_loader` puts a BERT cross-encoder's [SEP] id under (`read_side_files`)
SEP_TOKEN = "_sep_token_id"
# the key `hf_loader` puts sentence_bert_config.json's max_seq_length under (`read_side_files`)
MAX_SEQ_LENGTH = "_sentence_transformers_max_seq_length"
EMBED_NORM = "model.embed_layernorm.weight"

# transformers' BertConfig / RobertaConfig defaults (config.json leaves some of them out)
_COMMON = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
           "type_vocab_size": 2, "tie_word_embeddings": True}  # fmt: skip
DEFAULTS = {
    "bert": {**_COMMON, "pad_token_id": 0},
    "roberta": {**_COMMON, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
}

_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^(?:bert|roberta)\.", ""),
    (r"^pooler\.dense\.", "model.head_dense."), (r"^classifier\.dense\.", "model.head_dense."),
    (r"^classifier\.out_proj\.", "model.head_out."), (r"^classifier\.(weight|bias)$", r"model.head_out.\1"),
    (r"\.LayerNorm\.gamma$", ".LayerNorm.weight"), (r"\.LayerNorm\.beta$", ".LayerNorm.bias"),
    (r"^embeddings\.word_embeddings\.", "model.embed_tokens."),
    (r"^embeddings\.position_embeddings\.", "model.embed_positions."),
    (r"^embeddings\.token_type_embeddings\.", "model.embed_token_types."),
    (r"^embeddings\.LayerNorm\.", "model.embed_layernorm."),
    (r"^encoder\.layer\.(\d+)\.", r"model.layers.\1."),
    (r"\.attention\.self\.query\.", ".self_attn.q_proj."),
    (r"\.attention\.self\.key\.", ".self_attn.k_proj."),
    (r"\.attention\.self\.value\.", ".self_attn.v_proj."),
    (r"\.attention\.output\.dense\.", ".self_attn.o_proj."),
    (r"\.attention\.output\.LayerNorm\.", ".input_layernorm."),
    (r"\.intermediate\.dense\.", ".mlp.up_proj."),
    (r"\.output\.dense\.", ".mlp.down_proj."),
    (r"\.output\.LayerNorm\.", ".post_attention_layernorm."),
))  # fmt: skip


def offset(cfg: dict[str, Any], arch: str) -> int:
    """The row of position 0 in the table: RoBERTa's pad_token_id + 1, BERT's 0."""
    return int(cfg.get("pad_token_id") or 0) + 1 if arch == "roberta" else 0


def fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """The `FamilyConfig` fields of BERT and RoBERTa (module docstring)."""
    if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        raise ValueError(f"a {arch} config with is_decoder / add_cross_attention (a causal or "
                         "encoder-decoder model) is not supported: encoders only")  # fmt: skip
    if int(cfg["type_vocab_size"]) < 1:
        raise ValueError(f"{arch} type_vocab_size must be at least 1 (token type 0's row)")
    kind = cfg.get("position_embedding_type") or "absolute"
    if kind != "absolute":
        raise ValueError(f"{arch} position_embedding_type {kind!r} is not supported (absolute)")
    classifier = any(
        a.endswith("ForSequenceClassification") for a in cfg.get("architectures") or ()
    )
    labels = num_labels(cfg) if classifier else 0
    typed = _typed_classifier(cfg)  # (a pair's second text: type 1)
    if typed and cfg.get(SEP_TOKEN) is None:
        raise ValueError(f"a {arch} cross-encoder with token types needs tokenizer.json's [SEP] "
                         "token (its pairs' second text starts after it)")  # fmt: skip
    return {"positions": "learned", "position_offset": offset(cfg, arch), "gated_mlp": False,
            "num_labels": labels, "sep_token_id": int(cfg[SEP_TOKEN]) if typed else -1,
            "layer_norm_bias": True, "post_norm": True,
            "type_vocab_size": int(cfg["type_vocab_size"]),
            "max_seq_length": int(cfg.get(MAX_SEQ_LENGTH) or 0)}  # fmt: skip


FIELDS = {"bert": fields, "roberta": fields}


def overrides(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The context in tokens: the table's rows less RoBERTa's offset (module docstring)."""
    return {"max_position_embeddings": int(cfg["max_position_embeddings"]) - offset(cfg, arch)}


def _typed_classifier(cfg: dict[str, Any]) -> bool:
    """A cross-encoder whose pairs take token types: BERT's (RoBERTa's tokenizers give none:
    every token type 0, as transformers runs them)."""
    archs = cfg.get("architectures") or ()
    return "BertForSequenceClassification" in archs and int(cfg.get("type_vocab_size") or 1) > 1


def _sep_id(tok: dict[str, Any]) -> int | None:
    """tokenizer.json's [SEP] id: its post-processor's (BertProcessing's `sep`, a template's
    special token), else an added token's."""
    post = tok.get("post_processor") or {}
    if isinstance(post.get("sep"), list) and len(post["sep"]) == 2:  # BertProcessing
        return int(post["sep"][1])
    special = (post.get("special_tokens") or {}).get("[SEP]") or {}
    if special.get("ids"):  # TemplateProcessing
        return int(special["ids"][0])
    for t in tok.get("added_tokens") or ():
        if isinstance(t, dict) and t.get("content") == "[SEP]" and isinstance(t.get("id"), int):
            return t["id"]
    return None


def read_side_files(model_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """What the checkpoint's other files say: sentence_bert_config.json's `max_seq_length` (the
    length sentence-transformers embeds: all-MiniLM-L6-v2's 256 of its 512 positions) under
    `MAX_SEQ_LENGTH` (the context is then at most that, `ModelConfig.context_length`, as vLLM
    reads it); for a cross-encoder with token types, tokenizer.json's [SEP] id (`SEP_TOKEN`)."""
    out = {}
    if _typed_classifier(cfg):
        sep = _sep_id(read_json_object(model_dir / "tokenizer.json"))
        if sep is not None:
            out[SEP_TOKEN] = sep
    value = read_json_object(model_dir / "sentence_bert_config.json").get("max_seq_length")
    if value is None:
        return out
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"sentence_bert_config.json: max_seq_length must be a positive integer, "
                         f"got {value!r}")  # fmt: skip
    return {**out, MAX_SEQ_LENGTH: value}


def rename_weights(weights) -> None:
    """The stored names listed as the model reads them (module docstring)."""
    weights.rename_by(_RENAMES)


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """The embeddings' LayerNorm and the token-type table beside the layers' tensors (the
    LayerNorms' biases are added by the caller)."""
    out[EMBED_NORM] = (c.hidden_size,)
    out[TOKEN_TYPES] = (c.family.type_vocab_size, c.hidden_size)
    if c.family.num_labels:
        h, n = c.hidden_size, c.family.num_labels
        out.update({HEAD_DENSE: (h, h), HEAD_DENSE[:-6] + "bias": (h,), HEAD_OUT: (n, h),
                    HEAD_OUT[:-6] + "bias": (n,)})  # fmt: skip
