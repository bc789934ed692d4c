"""`POST /v1/embeddings` through the `openai` SDK: a tiny random Qwen3 in Qwen3-Embedding's
published layout (the pooling runner picked by `--runner auto`), the real engine on its thread,
the real app over httpx's ASGI transport. Vectors equal transformers' (LAST token, normalized)
for every input form and both encodings; refusals are OpenAI-style 400s; a tiny ModernBERT's
CLS vectors are transformers'."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
import tokenizers
from embed_testlib import hf_embeddings
from pooling_serve_testlib import NAME, embedding_core, serve

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-embedding")
    model, core = embedding_core(path, matryoshka_dimensions=[16, 64])
    return model, core, path


def test_the_sdk_gets_transformers_vectors(served):
    model, core, _ = served
    texts = ["w5 w9 w13 w200 w7", "w3 w4"]
    ids = [[5, 9, 13, 200, 7, 2], [3, 4, 2]]  # the texts as transformers' tokenizer reads them
    tok = tokenizers.Tokenizer.from_file(str(served[2] / "tokenizer.json"))  # (its post-processor)
    assert [e.ids for e in tok.encode_batch(texts)] == ids
    want = hf_embeddings(model, ids, "LAST").numpy()

    async def strings(c, _):  # the SDK asks for base64 and decodes it
        return await c.embeddings.create(model=NAME, input=texts)

    async def floats(c, _):
        return await c.embeddings.create(model=NAME, input=ids, encoding_format="float")

    async def one(c, _):
        return await c.embeddings.create(model=NAME, input=ids[1], dimensions=16)

    async def raw(_, http):
        return await http.post("/embeddings", json={"input": ids[1], "encoding_format": "base64"})

    (a, b, cut, r), metrics = asyncio.run(serve(core, [strings, floats, one, raw]))
    for res in (a, b):
        assert res.object == "list" and res.model == NAME
        assert [d.index for d in res.data] == [0, 1]
        got = np.array([d.embedding for d in res.data], dtype=np.float32)
        np.testing.assert_allclose(got, want, atol=1e-4)
        assert res.usage.prompt_tokens == res.usage.total_tokens == 9
    short = want[1][:16] / np.linalg.norm(want[1][:16])
    np.testing.assert_allclose(cut.data[0].embedding, short, atol=1e-4)
    body = r.json()
    assert body["data"][0]["object"] == "embedding"
    v = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(v, want[1], atol=1e-4)
    prompt_tokens = metrics.registry.get_sample_value(
        "pagoda:prompt_tokens_total", {"model_name": NAME}
    )
    assert prompt_tokens == 9 + 9 + 3 + 3
    assert not core.has_unfinished_requests() and core.kv.num_free_blocks == core.kv.num_blocks


def test_refusals_are_openai_400s(served):
    _, core, _ = served
    bodies = {
        "long": {"input": list(range(1, 34))},  # (32, the context, is served)
        "dims": {"input": "w3", "dimensions": 32},
        "empty": {"input": []},
        "field": {"input": "w3", "softmax": True},
        "vocab": {"input": [[1, 10**6]]},
    }

    def post(body):
        return lambda _, http: http.post("/embeddings", json=body)

    async def completion(_, http):
        return await http.post("/completions", json={"prompt": "w3", "max_tokens": 2})

    calls = [post(b) for b in bodies.values()] + [completion]
    results, _ = asyncio.run(serve(core, calls))
    errors = dict(zip([*bodies, "completions"], (r.json()["error"] for r in results)))
    assert all(r.status_code == 400 for r in results), [r.text for r in results]
    assert errors["long"]["code"] == "context_length_exceeded"
    assert "not one this model was trained for" in errors["dims"]["message"]
    assert errors["empty"]["param"] == "input"
    assert errors["field"]["code"] == "unsupported_parameter"
    assert errors["vocab"]["param"] == "input"
    assert errors["completions"]["code"] == "unsupported_api"
    assert "pooling runner" in errors["completions"]["message"]
    core.check_integrity()


def test_an_encoder_is_served_too(tmp_path):
    """A tiny BERT (`model/bert.py`, `embed_testlib.make_bert_model`: WordPiece, MEAN,
    normalized): its texts tokenized with [CLS] / [SEP], transformers' vectors back, and the
    score API's cosine of them."""
    from embed_testlib import hf_encoder_embeddings, make_bert_model
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.core import EngineCore

    model = make_bert_model(tmp_path)
    core = EngineCore(EngineConfig.create(str(tmp_path), dtype="float32", device="cpu",
                                          num_blocks_override=16, max_num_seqs=4))  # fmt: skip

    async def texts(c, _):
        return await c.embeddings.create(model=NAME, input=["w5 w9 w13", "W3"])

    async def score(_, http):
        return await http.post("/score", json={"text_1": "w5 w9 w13", "text_2": "W3"})

    (res, scored), _ = asyncio.run(serve(core, [texts, score]))
    want = hf_encoder_embeddings(model, [[2, 10, 14, 18, 3], [2, 8, 3]], "MEAN")
    np.testing.assert_allclose([d.embedding for d in res.data], want, atol=1e-5)
    assert res.usage.prompt_tokens == 8
    cos = float(want[0] @ want[1])
    np.testing.assert_allclose(scored.json()["data"][0]["score"], cos, atol=1e-5)


def test_a_modernbert_encoder_serves_transformers_vectors(tmp_path):
    """A tiny ModernBERT (`embed_testlib.make_modernbert`: local layers of 4 positions either
    side): the SDK's vectors are transformers' CLS rows, normalized, for texts of up to 22
    tokens (the window counts)."""
    import torch
    import torch.nn.functional as F
    from embed_testlib import make_modernbert
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.core import EngineCore

    model = make_modernbert(tmp_path)
    core = EngineCore(EngineConfig.create(str(tmp_path), dtype="float32", device="cpu",
                                          num_blocks_override=16, max_num_seqs=4))  # fmt: skip
    texts = [" ".join(f"w{(7 * i) % 90}" for i in range(20)), "w3 w4"]

    async def call(client, _):
        return await client.embeddings.create(model=NAME, input=texts, encoding_format="float")

    (emb,), _ = asyncio.run(serve(core, [call]))
    got = np.array([d.embedding for d in emb.data])
    for text, row in zip(texts, got, strict=True):
        ids = torch.tensor([core.tokenizer.encode_whole(text)])
        with torch.no_grad():
            want = F.normalize(model(input_ids=ids).last_hidden_state[:, 0], dim=-1)[0]
        np.testing.assert_allclose(row, want.numpy(), atol=1e-5)
    assert emb.usage.prompt_tokens == 22 + 4
