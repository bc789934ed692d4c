"""vLLM's score and rerank APIs on a pooling server (`server/score.py`): a tiny random Qwen3 in
Qwen3-Embedding's layout, the real engine on its thread, the real app over httpx (the `openai`
SDK has no score API; it fetches the vectors). Each score is the cosine similarity of the two
texts' `/v1/embeddings` vectors; rerank sorts by it; bad requests are OpenAI-style 400s. One
engine start for the file: every call is made once, by the `answers` fixture."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pooling_serve_testlib import NAME, embedding_core, serve

pytest.importorskip("transformers")

QUERY = "w5 w9 w13"
DOCS = ["w5 w9 w13 w7", "w100 w101", "w3 w4 w5", "w200"]
CALLS = {  # name: (path, body); paths without a leading slash are under /v1
    "1:N": ("score", {"model": NAME, "text_1": QUERY, "text_2": DOCS}),
    "N:N": ("http://t/score", {"text_1": DOCS[:2], "text_2": DOCS[2:]}),
    "1:1 cut": ("score", {"text_1": [QUERY], "text_2": DOCS[0], "truncate_prompt_tokens": 2}),
    "rerank": ("rerank", {"model": NAME, "query": QUERY, "documents": DOCS, "top_n": 2}),
    "rerank all": ("http://t/rerank", {"query": QUERY, "documents": DOCS}),
    "v2 no docs": (
        "http://t/v2/rerank",
        {"query": QUERY, "documents": DOCS, "return_documents": False},
    ),
}
BAD = {  # name: (path, body, param, code)
    "empty text_1": ("score", {"text_1": [], "text_2": "w3"}, "text_1", "empty_array"),
    "N:M": ("score", {"text_1": DOCS[:2], "text_2": DOCS[:3]}, "text_2", "invalid_value"),
    "long": (
        "score",
        {"text_1": "w3", "text_2": ["w3", "w4 " * 40]},
        "text_2[1]",
        "context_length_exceeded",
    ),
    "truncate 0": (
        "score",
        {"text_1": "w3", "text_2": "w4", "truncate_prompt_tokens": 0},
        "truncate_prompt_tokens",
        None,
    ),
    "score field": (
        "score",
        {"text_1": "w3", "text_2": "w4", "softmax": True},
        "softmax",
        "unsupported_parameter",
    ),
    "top_n": ("rerank", {"query": "w3", "documents": DOCS, "top_n": -1}, "top_n", None),
    "no docs": ("rerank", {"query": "w3", "documents": []}, "documents", "empty_array"),
    "doc object": (
        "rerank",
        {"query": "w3", "documents": [{"text": "w4"}]},
        "documents[0]",
        "invalid_type",
    ),
    "classify": ("http://t/classify", {"input": "w3"}, None, "unsupported_api"),
    "rerank field": (
        "http://t/v2/rerank",
        {"query": "w3", "documents": DOCS, "rank_fields": []},
        "rank_fields",
        "unsupported_parameter",
    ),
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """(the vectors of [QUERY, *DOCS] from /v1/embeddings with its usage, each call's answer,
    the engine core after them)."""
    _, core = embedding_core(tmp_path_factory.mktemp("qwen3-embedding"))
    step, core.steps = core.step, []  # each step's finished requests (the vectors it pooled)

    def counted():
        outs = step()
        core.steps.append([o.request_id for o in outs if o.embedding is not None])
        return outs

    core.step = counted

    async def vectors(client, _):
        return await client.embeddings.create(
            model=NAME, input=[QUERY, *DOCS], encoding_format="float"
        )

    def post(path, body):
        return lambda _, http: http.post(path, json=body)

    calls = [vectors] + [post(p, b) for p, b in CALLS.values()]
    calls += [post(p, b) for p, b, *_ in BAD.values()]
    (emb, *results), _ = asyncio.run(serve(core, calls))
    vecs = np.array([d.embedding for d in emb.data], dtype=np.float64)
    good = dict(zip(CALLS, results[: len(CALLS)], strict=True))
    bad = dict(zip(BAD, results[len(CALLS) :], strict=True))
    return vecs, emb.usage.prompt_tokens, good, bad, core


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _ok(response):
    assert response.status_code == 200, response.text
    return response.json()


def test_scores_are_cosine_similarities_of_the_embeddings(answers):
    vecs, tokens, good, _, core = answers
    body = _ok(good["1:N"])
    assert body["object"] == "list" and body["model"] == NAME and body["id"].startswith("score-")
    assert isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert {d["object"] for d in body["data"]} == {"score"}
    want = [_cos(vecs[0], vecs[1 + i]) for i in range(len(DOCS))]
    np.testing.assert_allclose([d["score"] for d in body["data"]], want, atol=1e-5)
    assert len(set(np.round(want, 3))) == len(DOCS)  # (distinct: the comparison means something)
    # the query pooled once beside every document: the embeddings call's tokens exactly
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    pairwise = _ok(good["N:N"])["data"]
    want = [_cos(vecs[1], vecs[3]), _cos(vecs[2], vecs[4])]
    np.testing.assert_allclose([d["score"] for d in pairwise], want, atol=1e-5)
    cut = _ok(good["1:1 cut"])
    assert len(cut["data"]) == 1 and cut["usage"]["prompt_tokens"] == 4  # two tokens each
    assert not core.has_unfinished_requests() and core.kv.num_free_blocks == core.kv.num_blocks
    # one batch: the 5 texts' 18 tokens in two 16-token steps, not a step (or more) each
    pooled = [ids for ids in core.steps if any(i.startswith("score-0-") for i in ids)]
    assert len(pooled) <= 2 and sum(map(len, pooled)) == 1 + len(DOCS), core.steps


def test_rerank_sorts_by_score_and_keeps_top_n(answers):
    vecs, tokens, good, _, _ = answers
    scores = [_cos(vecs[0], vecs[1 + i]) for i in range(len(DOCS))]
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    every = _ok(good["rerank all"])
    assert every["id"].startswith("rerank-") and every["model"] == NAME
    assert [r["index"] for r in every["results"]] == order
    np.testing.assert_allclose(
        [r["relevance_score"] for r in every["results"]], [scores[i] for i in order], atol=1e-5
    )
    assert [r["document"]["text"] for r in every["results"]] == [DOCS[i] for i in order]
    assert every["usage"]["total_tokens"] == tokens
    top = _ok(good["rerank"])["results"]
    assert [r["index"] for r in top] == order[:2]
    bare = _ok(good["v2 no docs"])["results"]
    assert [r["index"] for r in bare] == order and all("document" not in r for r in bare)


def test_bad_requests_are_openai_400s(answers):
    *_, bad, core = answers
    for name, (_, _, param, code) in BAD.items():
        r = bad[name]
        assert r.status_code == 400, (name, r.text)
        err = r.json()["error"]
        assert err["param"] == param, (name, err)
        assert code is None or err["code"] == code, (name, err)
    assert "1:1, 1:N or N:N" in bad["N:M"].json()["error"]["message"]
    core.check_integrity()


def _qwen3_reranker(path, query: str, docs: list[str]):
    """(the overlay of a tiny Qwen3ForCausalLM under Qwen3-Reranker's vLLM override, its "no" /
    "yes" w7 / w9; transformers' sigmoid(logit_yes - logit_no) of each pair's last token)."""
    import torch
    from hf_oracle import make_tiny_model
    from pagoda.runtime.model.hf_overrides import overlay
    from tokenizers import Tokenizer

    model = make_tiny_model(path, "Qwen3", scale=2.0)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    want = []
    for d in docs:
        ids = tok.encode(query).ids + tok.encode(d).ids
        with torch.no_grad():
            x = model(input_ids=torch.tensor([ids])).logits[0, -1]
        want.append(torch.sigmoid(x[9] - x[7]).item())
    override = {"architectures": ["Qwen3ForSequenceClassification"],
                "classifier_from_token": ["w7", "w9"], "is_original_qwen3_reranker": True}  # fmt: skip
    return overlay(path, override), np.array(want)


@pytest.mark.parametrize("kind", ["Bert", "ModernBert", "Qwen3-Reranker"])
def test_a_cross_encoder_scores_and_reranks_pairs(tmp_path, kind):
    """A tiny BERT or ModernBERT cross-encoder (`embed_testlib`), or Qwen3-Reranker served with
    vLLM's hf_overrides: /v1/score and /v1/rerank answer transformers' pair scores (each pair
    one prompt, its head's sigmoid), sorted for rerank; /v1/embeddings and
    truncate_prompt_tokens are 400s."""
    from embed_testlib import hf_pair_scores, make_cross_encoder, make_modernbert
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.core import EngineCore

    docs = ["w3 w4", "w7 w8 w9 w10 w11", "w40"]
    if kind == "Qwen3-Reranker":
        path, want = _qwen3_reranker(tmp_path, "w5 w9 w13", docs)
    else:
        path = tmp_path
        model = (make_cross_encoder(tmp_path, "Bert") if kind == "Bert" else
                 make_modernbert(tmp_path, "ForSequenceClassification", num_labels=1))  # fmt: skip
        want = hf_pair_scores(model, tmp_path, "w5 w9 w13", docs, types=kind == "Bert")
    assert np.ptp(want) > 1e-3
    core = EngineCore(EngineConfig.create(str(path), dtype="float32", device="cpu",
                                          num_blocks_override=16, max_num_seqs=4))  # fmt: skip
    bodies = [("score", {"text_1": "w5 w9 w13", "text_2": docs}),
              ("rerank", {"query": "w5 w9 w13", "documents": docs, "top_n": 2}),
              ("embeddings", {"input": "w3"}),
              ("rerank", {"query": "w3", "documents": docs, "truncate_prompt_tokens": 2})]  # fmt: skip
    calls = [lambda _, http, p=p, b=b: http.post(p, json=b) for p, b in bodies]
    (scored, ranked, embedded, cut), _ = asyncio.run(serve(core, calls))
    np.testing.assert_allclose([d["score"] for d in scored.json()["data"]], want, atol=1e-5)
    results = ranked.json()["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want)[:2])
    np.testing.assert_allclose([r["relevance_score"] for r in results], np.sort(want)[::-1][:2],
                               atol=1e-5)  # fmt: skip
    assert embedded.status_code == 400 and embedded.json()["error"]["code"] == "unsupported_api"
    assert cut.status_code == 400 and cut.json()["error"]["param"] == "truncate_prompt_tokens"
