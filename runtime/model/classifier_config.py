"""A decoder served as a sequence classifier (`pooler_config.DECODER_CLASSIFIERS`:
`Qwen3ForSequenceClassification`, `LlamaForSequenceClassification`, Qwen2's, Mistral's): its
config fields and the tensor its head reads. No torch (the config readers import it).

- A `*ForSequenceClassification` checkpoint: the decoder and a `score` matrix [num_labels,
  hidden] without a bias on the last prompt token's final-norm row (transformers' pooling of
  the last token), `classifier_tokens` empty.
- A head made of LM head rows, as vLLM builds it from `classifier_from_token` (the tokens' ids
  read from tokenizer.json: `classifier_tokens`) and `method` (`classifier_method`):
  "from_2_way_softmax" (two tokens; what `is_original_qwen3_reranker` means): one label whose
  row is the second token's row less the first's - Qwen3-Reranker (a `Qwen3ForCausalLM` under
  ``--hf-overrides '{"architectures": ["Qwen3ForSequenceClassification"],
  "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}'``), whose
  sigmoid is sigmoid(logit_yes - logit_no), the reranker's probability of "yes";
  "no_post_processing": the tokens' rows themselves, a label each - bge-reranker-v2-gemma
  (`GemmaForCausalLM` under ``{"architectures": ["GemmaForSequenceClassification"],
  "classifier_from_token": ["Yes"], "method": "no_post_processing"}``: sigmoid(logit_Yes)).
  Another method, two-way without two tokens, or a token tokenizer.json lacks is refused in
  one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagoda.runtime.model.template_files import read_json_object
from pagoda.runtime.pooler_config import DECODER_CLASSIFIERS, ENCODERS, num_labels

SCORE = "score.weight"
# how a head is made of LM head rows (vLLM's `method`s of `classifier_from_token`)
METHODS = ("from_2_way_softmax", "no_post_processing")
# the key `hf_loader` puts the classifier tokens' ids under (`read_side_files`)
TOKEN_IDS = "_classifier_token_ids"


# the activations a classifier head runs (`classifier_head.ACTIVATIONS`' names)
HEAD_ACTIVATIONS = ("tanh", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "relu")


def supported_activation(name: str, arch: str) -> str:
    """`name` when a head runs it, else ValueError (one line)."""
    if name not in HEAD_ACTIVATIONS:
        raise ValueError(f"{arch}: classifier activation {name!r} is not supported "
                         f"({', '.join(HEAD_ACTIVATIONS)})")  # fmt: skip
    return name


def is_decoder_classifier(cfg: dict[str, Any]) -> bool:
    return any(a in DECODER_CLASSIFIERS for a in cfg.get("architectures") or ())


def read_side_files(model_dir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The ids of `classifier_from_token` (tokenizer.json's vocabulary, or its added tokens)
    under `TOKEN_IDS`; ValueError, one line, for a form not served or a token not found."""
    names = cfg.get("classifier_from_token")
    if not names or not is_decoder_classifier(cfg):
        return {}
    method = head_method(cfg)
    if method not in METHODS or (method == "from_2_way_softmax" and len(names) != 2):
        raise ValueError(f"classifier_from_token with method {method!r} is not supported: "
                         '"from_2_way_softmax" of two tokens (Qwen3-Reranker\'s, '
                         '"is_original_qwen3_reranker": true) or "no_post_processing"')  # fmt: skip
    tok = read_json_object(model_dir / "tokenizer.json")
    vocab = dict((tok.get("model") or {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in tok.get("added_tokens") or ()
                  if isinstance(t, dict) and "content" in t})  # fmt: skip
    missing = [n for n in names if not isinstance(vocab.get(n), int)]
    if missing:
        raise ValueError(f"classifier_from_token {missing[0]!r} is not a token of tokenizer.json")
    return {TOKEN_IDS: [vocab[n] for n in names]}


def head_method(cfg: dict[str, Any]) -> str | None:
    """How a head is made of LM head rows (module docstring): config.json's `method`, else
    Qwen3-Reranker's."""
    return cfg.get("method") or ("from_2_way_softmax" if cfg.get("is_original_qwen3_reranker")
                                 else None)  # fmt: skip


def family_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """`num_labels` and `classifier_tokens` of a decoder classifier (module docstring); {} for
    any other checkpoint."""
    if not is_decoder_classifier(cfg):
        return {}
    tokens = tuple(int(t) for t in cfg.get(TOKEN_IDS) or ())
    return {"num_labels": num_labels(cfg), "classifier_tokens": tokens,
            "classifier_method": (head_method(cfg) or "") if tokens else ""}  # fmt: skip


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """A `*ForSequenceClassification` checkpoint's `score` matrix; no LM head (the reranker's
    LM head is the checkpoint's own, listed as a generator's)."""
    encoder = c.architecture in ENCODERS.values()  # (an encoder's head: its own names)
    if c.family.num_labels and not c.family.classifier_tokens and not encoder:
        out[SCORE] = (c.family.num_labels, c.hidden_size)
        out.pop("lm_head.weight", None)
