"""vLLM's `POST /classify` (`server/classify.py`) on a tiny random 3-label
`BertForSequenceClassification` (the real engine on its thread, the real app over httpx): each
input's probabilities are transformers' softmax of its logits, `label` id2label's name of the
likeliest; an input of the whole context (64 of 64 positions) is served, one more is a 400 unless
truncate_prompt_tokens cuts it; /v1/score and /v1/rerank refuse a classifier of 3 labels."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from pooling_serve_testlib import NAME, serve

pytest.importorskip("transformers")

LABELS = {0: "neg", 1: "neutral", 2: "pos"}
FULL = [2] + [(7 * i) % 90 + 5 for i in range(62)] + [3]  # 64 tokens: the whole context


def test_classify_answers_transformers_probabilities(tmp_path):
    from embed_testlib import make_cross_encoder
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.core import EngineCore

    model = make_cross_encoder(tmp_path, "Bert", id2label=LABELS)
    core = EngineCore(EngineConfig.create(str(tmp_path), dtype="float32", device="cpu",
                                          num_blocks_override=32, max_num_seqs=4))  # fmt: skip
    bodies = [("http://t/classify", {"model": NAME, "input": ["w5 w9 w13", "w40 w41"]}),
              ("http://t/classify", {"input": FULL}),
              ("http://t/classify", {"input": [4, *FULL]}),
              ("http://t/classify", {"input": [4, *FULL], "truncate_prompt_tokens": -1}),
              ("http://t/classify", {"input": "w3", "dimensions": 2}),
              ("score", {"text_1": "w3", "text_2": "w4"}),
              ("rerank", {"query": "w3", "documents": ["w4"]})]  # fmt: skip
    calls = [lambda _, http, p=p, b=b: http.post(p, json=b) for p, b in bodies]
    (texts, full, long, cut, field, score, rerank), _ = asyncio.run(serve(core, calls))
    body = texts.json()
    assert texts.status_code == 200 and body["object"] == "list" and body["model"] == NAME
    assert body["id"].startswith("classify-") and isinstance(body["created"], int)
    ids = [core.tokenizer.encode_whole(t) for t in ("w5 w9 w13", "w40 w41")] + [FULL]
    with torch.no_grad():
        want = [
            torch.softmax(model(input_ids=torch.tensor([p])).logits[0], -1).numpy() for p in ids
        ]
    got = [d["probs"] for d in body["data"]] + [full.json()["data"][0]["probs"]]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert [d["label"] for d in body["data"]] == [LABELS[int(np.argmax(w))] for w in want[:2]]
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["num_classes"] == 3
    assert body["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1])
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    np.testing.assert_allclose(cut.json()["data"][0]["probs"], want[2], atol=1e-5)
    assert field.status_code == 400 and field.json()["error"]["param"] == "dimensions"
    for refused in (score, rerank):
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_api"
        assert "classifier of 3 labels" in refused.json()["error"]["message"]
    assert not core.has_unfinished_requests() and core.kv.num_free_blocks == core.kv.num_blocks
