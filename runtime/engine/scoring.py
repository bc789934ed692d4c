"""Scoring with an embedding model (a bi-encoder), as vLLM scores with one: a pair's score is
the cosine similarity of its two texts' vectors. The pairing rule of vLLM's score API (1:1, 1:N,
N:N), the scores of a batch of vector pairs, and the offline `LLM.score(data_1, data_2)` whose
outputs have vLLM's `.outputs.score` (`ScoringRequestOutput`).

Every input is embedded once, all of one call together (`pooling.embed`; the server's
`server/score.py` adds them as one batch too): a single first text (1:N) is pooled once, not
once per pair. numpy only (the API server's process reads this module). A sequence classifier's
`LLM.classify` (`classify`: its labels' probabilities, vLLM's `ClassificationRequestOutput`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pagoda.runtime.engine.pooling import PoolingParams, embed


def pair_indices(
    n1: int, n2: int, names: tuple[str, str] = ("data_1", "data_2")
) -> list[tuple[int, int]]:
    """Each pair's (first, second) input index for `n1` first and `n2` second inputs (vLLM's
    rule: 1:1, 1:N - the one first input with each second - or N:N, pairwise); ValueError,
    one line naming the sides (`names`), for an empty side or N:M."""
    if n1 == 0 or n2 == 0:
        raise ValueError(f"'{names[n1 != 0]}' must not be empty (a text on each side)")
    if n1 != 1 and n1 != n2:
        raise ValueError(f"'{names[0]}' has {n1} inputs and '{names[1]}' {n2}: the pairs must "
                         "be 1:1, 1:N or N:N")  # fmt: skip
    return [(0 if n1 == 1 else i, i) for i in range(n2)]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [N, D] arrays (float64 [N] in [-1, 1]: rounding kept
    inside; a zero vector scores 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.clip(np.einsum("nd,nd->n", a, b) / np.maximum(norms, 1e-12), -1.0, 1.0)


def pair_scores(vectors: list[np.ndarray], pairs: list[tuple[int, int]], n1: int) -> list[float]:
    """The pairs' scores from the inputs' vectors (the first inputs', then the second's)."""
    first = np.stack([vectors[i] for i, _ in pairs])
    second = np.stack([vectors[n1 + j] for _, j in pairs])
    return cosine(first, second).tolist()


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """vLLM's: `request_id` the two inputs' ids joined by "_", `prompt_token_ids` the two
    prompts' ids one after the other."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True


def score(llm: Any, data_1: list, data_2: list, params: PoolingParams | None,
          bar: Any) -> list[ScoringRequestOutput]:  # fmt: skip
    """`LLM.score`'s work: both sides' prompts embedded together, one output per pair."""
    if llm.engine.config.runner != "pooling":
        raise ValueError("score needs the pooling runner (an embedding model): "
                         "LLM(..., runner='pooling')")  # fmt: skip
    pairs = pair_indices(len(data_1), len(data_2))
    if llm.engine.config.pooler_config.cross_encoder:
        return cross_scores(llm, data_1, data_2, pairs, params, bar)
    embedded = embed(llm, [*data_1, *data_2], params, bar)
    vectors = [np.asarray(e.outputs.embedding, dtype=np.float32) for e in embedded]
    scores = pair_scores(vectors, pairs, len(data_1))
    out = []
    for (i, j), s in zip(pairs, scores, strict=True):
        a, b = embedded[i], embedded[len(data_1) + j]
        out.append(ScoringRequestOutput(f"{a.request_id}_{b.request_id}",
                                        a.prompt_token_ids + b.prompt_token_ids,
                                        ScoringOutput(s)))  # fmt: skip
    return out


def cross_scores(llm: Any, data_1: list, data_2: list, pairs: list[tuple[int, int]],
                 params: PoolingParams | None, bar: Any) -> list[ScoringRequestOutput]:  # fmt: skip
    """A cross-encoder's scores: each pair's texts encoded together (`Tokenizer.encode_pair`)
    as one prompt, all pooled together; its one output is the pair's score."""
    if len(llm.engine.config.pooler_config.labels) != 1:
        raise ValueError(f"this model is a classifier of "
                         f"{len(llm.engine.config.pooler_config.labels)} labels: a pair's score "
                         "needs one label (use classify)")  # fmt: skip
    if params is not None and params != PoolingParams():
        raise ValueError("a cross-encoder takes no pooling params (dimensions, "
                         "truncate_prompt_tokens): its pairs are scored whole")  # fmt: skip
    texts = [*data_1, *data_2]
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("a cross-encoder scores text pairs: data_1 and data_2 must be strings")
    tok = llm.engine.tokenizer
    prompts = [tok.encode_pair(data_1[i], data_2[j]) for i, j in pairs]
    scored = embed(llm, prompts, None, bar)
    return [ScoringRequestOutput(o.request_id, o.prompt_token_ids,
                                 ScoringOutput(float(o.outputs.embedding[0]))) for o in scored]  # fmt: skip


@dataclass
class ClassificationOutput:
    """vLLM's: the labels' probabilities (softmax, or sigmoid for one label or a multi-label
    classifier: `model/classifier_head.activate`)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True


def classify(llm: Any, prompts: list, params: PoolingParams | None,
             bar: Any) -> list[ClassificationRequestOutput]:  # fmt: skip
    """`LLM.classify`'s work: every prompt pooled together through the classifier's head."""
    pc = llm.engine.config.pooler_config
    if pc is None or not pc.cross_encoder:
        raise ValueError("classify needs a sequence-classification model "
                         "(*ForSequenceClassification); this one embeds: use embed")  # fmt: skip
    if params is not None and params.dimensions is not None:
        raise ValueError("dimensions applies to Matryoshka embedding models, not a classifier")
    return [ClassificationRequestOutput(o.request_id, o.prompt_token_ids,
                                        ClassificationOutput(o.outputs.embedding))
            for o in embed(llm, prompts, params, bar)]  # fmt: skip
