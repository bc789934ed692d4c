"""A sequence classifier's head (`*ForSequenceClassification`): what turns a prompt's pooled
vector into its labels' logits, run by the pooler after pooling (`worker/pooler.py`), so that a
head after MEAN pooling (ModernBERT's `classifier_pooling: mean`) reads the mean, as
transformers' does.

A head is a few stages in float32 on the pooled rows [N, hidden] (a handful per step): linear
layers (with or without a bias), an activation, a LayerNorm. BERT's and RoBERTa's: dense, tanh,
out (`model/bert.py`); ModernBERT's: dense, its activation, LayerNorm, classifier
(`model/modernbert.py`); a decoder's (`Qwen3ForSequenceClassification`'s `score`, or Qwen3-Reranker's
row made from its LM head's "yes" and "no" rows): one linear layer. The logits become
probabilities in the pooler (`activate`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


class ClassifierHead:
    """The stages of a head, each ("linear", weight, bias or None), ("act", name) or
    ("norm", weight, bias or None, eps), applied in order; `num_labels` its last linear's rows."""

    def __init__(self, stages: list[tuple]) -> None:
        self.stages = []
        for stage in stages:
            if stage[0] == "act":
                self.stages.append(("act", ACTIVATIONS[stage[1]]))
            else:  # (float32 copies: the head runs on the pooled float32 rows)
                self.stages.append((stage[0], *(_f32(t) for t in stage[1:3]), *stage[3:]))
        self.num_labels = int(
            next(s[1] for s in reversed(self.stages) if s[0] == "linear").shape[0]
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [N, num_labels]: the logits of the pooled rows `x` [N, hidden]."""
        x = x.float()
        for stage in self.stages:
            if stage[0] == "linear":
                x = F.linear(x, stage[1], stage[2])
            elif stage[0] == "act":
                x = stage[1](x)
            else:
                x = F.layer_norm(x, x.shape[-1:], stage[1], stage[2], stage[3])
        return x


def decoder_head(w, family, lm_head: str) -> ClassifierHead | None:
    """A decoder classifier's head (`model/classifier_config.py`), None for any other model:
    its `score` matrix, or LM head rows (Qwen3-Reranker's one row: "yes" less "no")."""
    from pagoda.runtime.model.classifier_config import SCORE

    if not family.num_labels:
        return None
    if family.classifier_tokens:  # (LM head rows: `classifier_config.METHODS`)
        rows = w[lm_head][list(family.classifier_tokens)]
        if family.classifier_method == "from_2_way_softmax":
            rows = (rows[1] - rows[0]).unsqueeze(0)
        return ClassifierHead([("linear", rows, None)])
    return ClassifierHead([("linear", w[SCORE], None)])


def activate(logits: torch.Tensor, multi_label: bool) -> torch.Tensor:
    """A classifier's probabilities (vLLM's): sigmoid for one label (a cross-encoder's score)
    or a multi-label classifier (`problem_type: multi_label_classification`), else softmax."""
    if multi_label or logits.shape[-1] == 1:
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()
