"""ModernBERT (`model/modernbert.py`) against transformers: a tiny random `ModernBertModel`
whose local layers see 4 positions either side (prompts up to 32 tokens, so the window
counts) pools CLS (normalized) and MEAN as transformers' last hidden states (float32, 1e-5);
`ModernBertForSequenceClassification` scores pairs (one label, `classifier_pooling: mean`) and
classifies (3 labels, CLS) as transformers; a config in the older form (global_rope_theta,
global_attn_every_n_layers) reads as the same layers; two tensor-parallel ranks pool as
transformers; the refusals are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from embed_testlib import hf_pair_scores, make_modernbert
from pagoda.runtime.engine.llm import LLM

transformers = pytest.importorskip("transformers")

PROMPTS = [[2] + [(7 * i) % 90 + 5 for i in range(30)] + [3], [2, 4, 3],
           [2, *range(10, 30), 3], [2, 60, 61, 3]]  # fmt: skip
ARGS = dict(dtype="float32", device="cpu", num_blocks_override=32, max_num_seqs=3)


def _hf_hidden(model, prompts):
    """transformers' last hidden states of a right-padded batch and its mask [B, L, 1]."""
    n = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (n - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (n - len(p)) for p in prompts])
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    return h, mask.unsqueeze(-1).float()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("modernbert")
    return path, make_modernbert(path)


def test_vectors_equal_transformers(encoder):
    """CLS, normalized by default (no sentence-transformers files); MEAN by --pooler-config;
    3 sequences a step; the local window changes the answer (transformers' with a window over
    the whole prompt is far off)."""
    path, model = encoder
    h, m = _hf_hidden(model, PROMPTS)
    llm = LLM(str(path), **ARGS)
    pc = llm.config.pooler_config
    assert (llm.config.runner, pc.pooling_type, pc.normalize) == ("pooling", "CLS", True)
    assert not llm.config.scheduler.enable_chunked_prefill
    got = np.array([o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)])
    want = F.normalize(h[:, 0], dim=-1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    llm = LLM(str(path), pooler_config={"pooling_type": "MEAN"}, **ARGS)
    got = np.array([o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)])
    np.testing.assert_allclose(got, F.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy(),
                               atol=1e-5)  # fmt: skip
    wide = transformers.ModernBertModel(
        transformers.ModernBertConfig(**{**model.config.to_dict(), "local_attention": 128})
    ).eval()
    wide.load_state_dict(model.state_dict())
    far = F.normalize(_hf_hidden(wide, PROMPTS[:1])[0][:, 0], dim=-1).numpy()
    assert np.abs(far - want[:1]).max() > 1e-2


def test_cross_encoder_with_mean_pooling_scores_as_transformers(tmp_path):
    """One label, `classifier_pooling: mean`: the head (dense, GELU, LayerNorm, classifier) on
    each pair's mean row, sigmoid: `LLM.score` equals transformers' (1e-5)."""
    model = make_modernbert(tmp_path, "ForSequenceClassification", num_labels=1,
                            classifier_pooling="mean")  # fmt: skip
    llm = LLM(str(tmp_path), **ARGS)
    assert llm.config.pooler_config.pooling_type == "MEAN"
    query, docs = "w5 w9 w13", ["w3 w4", "w7 w8 w9 w10 w11 " * 3, "w40", "w5 w9"]
    want = hf_pair_scores(model, tmp_path, query, docs, types=False)
    got = np.array([o.outputs.score for o in llm.score(query, docs, use_tqdm=False)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.ptp(want) > 1e-3


def test_classifier_of_three_labels_classifies_as_transformers(tmp_path):
    labels = {0: "a", 1: "b", 2: "c"}
    model = make_modernbert(tmp_path, "ForSequenceClassification", id2label=labels)
    llm = LLM(str(tmp_path), **ARGS)
    assert llm.config.pooler_config.pooling_type == "CLS"
    got = np.array([o.outputs.probs for o in llm.classify(PROMPTS, use_tqdm=False)])
    with torch.no_grad():
        logits = torch.cat([model(input_ids=torch.tensor([p])).logits for p in PROMPTS])
    np.testing.assert_allclose(got, torch.softmax(logits, -1).numpy(), atol=1e-5)


# a ModernBERT config in the older form (transformers 4.48's keys: global_rope_theta,
# local_rope_theta, global_attn_every_n_layers; no layer_types or rope_parameters), as
# gte-modernbert-base's, at its sizes
OLDER = {"architectures": ["ModernBertModel"], "attention_bias": False, "bos_token_id": 50281,
         "classifier_activation": "gelu", "classifier_pooling": "mean", "eos_token_id": 50282,
         "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "hidden_activation": "gelu",
         "hidden_size": 768, "intermediate_size": 1152, "local_attention": 128,
         "local_rope_theta": 10000.0, "max_position_embeddings": 8192, "mlp_bias": False,
         "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05,
         "num_attention_heads": 12, "num_hidden_layers": 22, "pad_token_id": 50283,
         "vocab_size": 50368}  # fmt: skip


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_pool_as_transformers(encoder):
    """Two ranks (gloo): each its query and KV head of the global and local layers' q/k/v
    (one stored Wqkv), o_proj row-parallel, the GeGLU by width; rank 0 pools the whole hidden
    states: transformers' CLS vectors, normalized."""
    path, model = encoder
    h, _ = _hf_hidden(model, PROMPTS)
    with LLM(str(path), tensor_parallel_size=2, **ARGS) as two:
        assert two.engine.runner.backend.num_heads == 1  # (this rank's)
        got = np.array([o.outputs.embedding for o in two.embed(PROMPTS, use_tqdm=False)])
    np.testing.assert_allclose(got, F.normalize(h[:, 0], dim=-1).numpy(), atol=1e-5)


def test_older_config_reads_and_refusals_are_one_line(tmp_path):
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(OLDER))
    c = read_model_config(str(tmp_path))
    f = c.family
    assert (c.architecture, c.rope_theta, f.local_rope_theta, f.encoder_window) == (
        "modernbert", 160000.0, 10000.0, 64)  # fmt: skip
    assert f.window_layers == tuple(i % 3 != 0 for i in range(22)) and c.context_length == 8192
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 512}')
    assert read_model_config(str(tmp_path)).context_length == 512  # (as BERT's: vLLM's bound)
    check(c, 4)  # (split by heads as a decoder: 12 heads, a GeGLU 1152 wide)
    with pytest.raises(ValueError, match="tensor-parallel-size 5 does not divide the model's 12"):
        check(c, 5)
    bad = {"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}}
    for change, words in ((bad, "rope_type 'yarn' is not supported"),
                          ({"architectures": ["ModernBertForMaskedLM"]}, "encoder-only model not")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**OLDER, **change}))
        with pytest.raises(ValueError, match=words) as e:
            read_model_config(str(tmp_path))
        assert "\n" not in str(e.value)


def test_head_activations_named_in_config_are_the_heads():
    """The config's list (torch-free, read when config.json is) is what the head runs."""
    from pagoda.runtime.model.classifier_config import HEAD_ACTIVATIONS
    from pagoda.runtime.model.classifier_head import ACTIVATIONS

    assert set(HEAD_ACTIVATIONS) == set(ACTIVATIONS)
