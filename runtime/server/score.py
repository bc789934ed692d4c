"""vLLM's score and rerank APIs on a pooling server, for an embedding model (a bi-encoder): a
pair's score is the cosine similarity of its two texts' vectors (`engine/scoring.py`).

`POST /v1/score` (and `/score`): `text_1` a string or a list, `text_2` a string or a list, paired
1:1, 1:N (one `text_1` with each `text_2`) or N:N (pairwise); answers `{"id", "object": "list",
"created", "model", "data": [{"index", "object": "score", "score"}], "usage"}`, one score per
pair in `text_2`'s order. `POST /v1/rerank` (and `/rerank`, `/v2/rerank`; Jina's and Cohere's
shape, as vLLM's): `query` and `documents` (strings); answers `{"id", "model", "usage",
"results": [{"index", "document": {"text"}, "relevance_score"}]}` sorted by score, highest
first, the first `top_n` (0, the default: all), `document` left out with `return_documents`
false. Both take vLLM's `truncate_prompt_tokens` (each text cut to its last k tokens).

Every text of a call is one engine request, all added together (all-or-nothing) so that they
batch in the engine's steps; a single `text_1` or the query is pooled once. `usage` counts the
prompt tokens pooled. A generating server answers these paths with the 400 `unsupported_api` of
the other unserved APIs. A sequence classifier of one label (`pooler_config.CLASSIFIERS`: BERT's,
RoBERTa's, ModernBERT's cross-encoders, the decoders' `score` heads, Qwen3-Reranker) scores each
pair in one forward: the pair encoded as one prompt (`Tokenizer.encode_pair`), its output the
pair's score (`cross_prompts`); one of several labels is refused here (a 400: `/classify`
serves it), and other `*ForSequenceClassification` models when the server starts
(`pooler_config.check_not_classifier`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.engine.pooling import vector
from pagoda.runtime.engine.scoring import pair_indices, pair_scores
from pagoda.runtime.server.embeddings import EmbeddingsRoute, tokenized, usage
from pagoda.runtime.server.protocol import APIError, _Strict
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.serving import to_json
from pydantic import Field, StrictBool, StrictInt, StrictStr


class ScoreRequest(_Strict):
    model: str | None = None
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)
    user: str | None = None


class RerankRequest(_Strict):
    model: str | None = None
    query: StrictStr
    documents: list[StrictStr]
    top_n: StrictInt = Field(default=0, ge=0)  # 0: every document (vLLM's default)
    return_documents: StrictBool = True
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)
    user: str | None = None


@dataclass(frozen=True)
class Pairs:
    """A parsed request and its pairs: `pairs[k]` = (index of the first text, index of the
    second), the first texts' prompts first (`n1` of them), then the second's."""

    req: ScoreRequest | RerankRequest
    pairs: list[tuple[int, int]]
    n1: int
    cross: bool = False  # a cross-encoder's: one prompt per pair, its output the pair's score


def cross_prompts(info: EngineInfo, req, firsts: list[str], seconds: list[str],
                  pairs: list[tuple[int, int]], param: str) -> list[list[int]]:  # fmt: skip
    """A cross-encoder's prompts: each pair's two texts encoded together
    (`Tokenizer.encode_pair`), checked as `tokenized` checks an input; truncate_prompt_tokens
    refused (a pair is scored whole)."""
    if req.truncate_prompt_tokens is not None:
        raise APIError(400, "truncate_prompt_tokens is not supported by a cross-encoder (a pair "
                       "is scored whole)", param="truncate_prompt_tokens",
                       code="unsupported_parameter")  # fmt: skip
    enc = info.tokenizer.encode_pair
    return tokenized(info, [enc(firsts[i], seconds[j]) for i, j in pairs], param, None)


def _pairs(firsts: list, seconds: list, first: str, second: str) -> list[tuple[int, int]]:
    """`pair_indices` as a 400 naming the side at fault."""
    try:
        return pair_indices(len(firsts), len(seconds), (first, second))
    except ValueError as e:
        param = first if not firsts else second
        code = "empty_array" if not firsts or not seconds else "invalid_value"
        raise APIError(400, str(e), param=param, code=code) from e


class _PairRoute(EmbeddingsRoute):
    """A route that embeds two sides' texts and scores their pairs (`EmbeddingsRoute`'s steps,
    its own request and answer): one parse for both, each route naming its request's sides
    (`sides`)."""

    request_class: type[ScoreRequest | RerankRequest]
    # each route's: its request's first texts, second texts and the two fields' names
    sides: Callable[[Any], tuple[list[str], list[str], tuple[str, str]]]

    def parse(self, body: bytes, info: EngineInfo) -> tuple[Pairs, list[list[int]]]:
        req = parse_request(body, self.request_class)
        self.resolve_model(req.model)
        firsts, seconds, (first, second) = self.sides(req)
        pairs = _pairs(firsts, seconds, first, second)
        if info.pooler.cross_encoder:
            if len(info.pooler.labels) != 1:  # (vLLM's rule: a pair's score is one label's)
                raise APIError(400, f"The model does not support the {self.api} API: it is a "
                               f"classifier of {len(info.pooler.labels)} labels (a pair's score "
                               "needs one label; /classify serves it)",
                               code="unsupported_api")  # fmt: skip
            prompts = cross_prompts(info, req, firsts, seconds, pairs, second)
            return Pairs(req, pairs, len(firsts), cross=True), prompts
        truncate = req.truncate_prompt_tokens
        prompts = tokenized(info, firsts, first, truncate)
        prompts += tokenized(info, seconds, second, truncate)
        return Pairs(req, pairs, len(firsts)), prompts

    @staticmethod
    def scores(job: Pairs, outs: list[StepOutput]) -> list[float]:
        """The pairs' scores from the inputs' outputs (their pooled vectors; a cross-encoder's
        outputs are the pairs' scores)."""
        if job.cross:
            return [float(vector(o.embedding, None, False)[0]) for o in outs]
        return pair_scores([vector(o.embedding, None, False) for o in outs], job.pairs, job.n1)


class ScoreRoute(_PairRoute):
    api, input_param, id_prefix = "Score", "text_2", "score"
    request_class = ScoreRequest

    @staticmethod
    def sides(req) -> tuple[list[str], list[str], tuple[str, str]]:
        firsts = [req.text_1] if isinstance(req.text_1, str) else req.text_1
        seconds = [req.text_2] if isinstance(req.text_2, str) else req.text_2
        return firsts, seconds, ("text_1", "text_2")

    def body(self, job: Pairs, info: EngineInfo, outs: list[StepOutput]) -> bytes:
        data = [{"index": i, "object": "score", "score": s}
                for i, s in enumerate(self.scores(job, outs))]  # fmt: skip
        return to_json({"id": f"score-{uuid.uuid4().hex}", "object": "list",
                        "created": int(time.time()), "model": self.resolve_model(job.req.model),
                        "data": data, "usage": usage(outs)})  # fmt: skip


class RerankRoute(_PairRoute):
    api, input_param, id_prefix = "Rerank", "documents", "rerank"
    request_class = RerankRequest

    @staticmethod
    def sides(req) -> tuple[list[str], list[str], tuple[str, str]]:
        return [req.query], req.documents, ("query", "documents")

    def body(self, job: Pairs, info: EngineInfo, outs: list[StepOutput]) -> bytes:
        req = job.req
        assert isinstance(req, RerankRequest)
        scores = self.scores(job, outs)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # (stable: ties by index)
        results = []
        for i in order[: req.top_n or None]:
            r = {"index": i, "relevance_score": scores[i]}
            if req.return_documents:
                r["document"] = {"text": req.documents[i]}
            results.append(r)
        return to_json({"id": f"rerank-{uuid.uuid4().hex}", "model": self.resolve_model(req.model),
                        "usage": usage(outs), "results": results})  # fmt: skip


# the paths served (vLLM's), each with its route's class
SCORE_PATHS = {"/v1/score": ScoreRoute, "/score": ScoreRoute, "/v1/rerank": RerankRoute,
               "/rerank": RerankRoute, "/v2/rerank": RerankRoute}  # fmt: skip
