"""Scoring with an embedding model (`engine/scoring.py`): vLLM's pairing rule, the cosine, and
offline `LLM.score` against `LLM.embed`'s vectors of the same prompts (a tiny random Qwen3 in
Qwen3-Embedding's layout)."""

from __future__ import annotations

import numpy as np
import pytest
from embed_testlib import make_embedding_model
from pagoda.runtime.engine.llm import LLM
from pagoda.runtime.engine.scoring import cosine, pair_indices

ARGS = dict(dtype="float32", device="cpu", max_model_len=32, num_blocks_override=32,
            max_num_batched_tokens=16, max_num_seqs=8, enforce_eager=True)  # fmt: skip


def test_pairing_rule_and_cosine():
    assert pair_indices(1, 3) == [(0, 0), (0, 1), (0, 2)]
    assert pair_indices(2, 2) == [(0, 0), (1, 1)]
    assert pair_indices(1, 1) == [(0, 0)]
    with pytest.raises(ValueError, match="'text_1' has 2 inputs and 'text_2' 3"):
        pair_indices(2, 3, ("text_1", "text_2"))
    with pytest.raises(ValueError, match="'data_2' must not be empty"):
        pair_indices(1, 0)
    with pytest.raises(ValueError, match="'data_1' must not be empty"):
        pair_indices(0, 2)
    a = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0], [2.0, 2.0]])
    b = np.array([[6.0, 8.0], [0.0, 5.0], [1.0, 1.0], [-1.0, -1.0]])
    np.testing.assert_allclose(cosine(a, b), [1.0, 0.0, 0.0, -1.0], atol=1e-12)


def test_llm_score_is_the_cosine_of_the_embeddings(tmp_path):
    make_embedding_model(tmp_path, "Qwen3", "LAST")
    llm = LLM(str(tmp_path), **ARGS)
    query, docs = "w5 w9 w13", ["w5 w9 w13 w7", "w100 w101", [3, 4, 2]]
    vecs = np.array([e.outputs.embedding for e in llm.embed([query, *docs], use_tqdm=False)])
    outs = llm.score(query, docs, use_tqdm=False)
    want = cosine(np.repeat(vecs[:1], 3, axis=0), vecs[1:])
    np.testing.assert_allclose([o.outputs.score for o in outs], want, atol=1e-6)
    assert len(set(np.round(want, 3))) == 3
    assert outs[2].prompt_token_ids == [5, 9, 13, 2, 3, 4, 2]  # the two prompts' ids
    assert len(set(o.request_id for o in outs)) == 3 and all(o.finished for o in outs)
    two = llm.score(docs[:2], [{"prompt": query}, docs[2]], use_tqdm=False)  # (TextPrompt)
    np.testing.assert_allclose([o.outputs.score for o in two],
                               cosine(vecs[1:3], vecs[[0, 3]]), atol=1e-6)  # fmt: skip
    cut = llm.score(query, docs[0], truncate_prompt_tokens=2, use_tqdm=False)
    assert cut[0].prompt_token_ids == [13, 2, 7, 2]
    with pytest.raises(ValueError, match="the pairs must be 1:1, 1:N or N:N"):
        llm.score(docs[:2], docs, use_tqdm=False)
    with pytest.raises(ValueError, match="'data_2' must not be empty"):
        llm.score(query, [], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    gen = LLM(str(tmp_path), runner="generate", **ARGS)
    with pytest.raises(ValueError, match="score needs the pooling runner"):
        gen.score(query, docs)
