"""Decoders served as sequence classifiers (`model/classifier_config.py`) against transformers'
tiny random models: `Qwen3ForSequenceClassification` of 3 labels classifies (its `score` head on
the last prompt token, softmax) with prompts prefilled in chunks; a `LlamaForSequenceClassification`
of one label scores pairs (the two texts' tokens one after the other, sigmoid); Qwen3-Reranker
as vLLM serves it (a `Qwen3ForCausalLM` checkpoint whose config names
Qwen3ForSequenceClassification, `classifier_from_token`, `is_original_qwen3_reranker`) scores
sigmoid(logit_yes - logit_no) of the last token, by config.json and by `hf_overrides`, and
bge-reranker-v2-gemma's form (the "Yes" row alone) sigmoid(logit_Yes); the refusals are one
line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_oracle import TINY, make_tiny_model, randomize, save_tiny
from pagoda.runtime.engine.llm import LLM

transformers = pytest.importorskip("transformers")

ARGS = dict(dtype="float32", device="cpu", num_blocks_override=64, max_num_seqs=4,
            max_num_batched_tokens=16)  # fmt: skip
PROMPTS = [[5, 9, 13, 60, 7, 7, 31, 3, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51], [4, 3],
           [50, 51, 52, 8, 9, 10, 3]]  # fmt: skip
QUERY, DOCS = "w5 w9 w13", ["w3 w4", "w7 w8 w9 w10 w11", "w40", "w5 w9"]
# Qwen3-Reranker's override (vLLM's --hf-overrides), its "no" / "yes" here w7 / w9
RERANKER = {"architectures": ["Qwen3ForSequenceClassification"],
            "classifier_from_token": ["w7", "w9"], "is_original_qwen3_reranker": True}  # fmt: skip


def _classifier(path, arch: str, labels: int):
    torch.manual_seed(0)
    config = getattr(transformers, f"{arch}Config")(**TINY, pad_token_id=0, num_labels=labels)
    model = getattr(transformers, f"{arch}ForSequenceClassification")(config).eval()
    return save_tiny(randomize(model, scale=2.0), path)


def _pair_ids(llm, query: str, docs: list[str]) -> list[list[int]]:
    tok = llm.engine.tokenizer
    return [tok.encode_whole(query) + tok.encode_whole(d) for d in docs]


def test_qwen3_classifier_of_three_labels(tmp_path):
    model = _classifier(tmp_path, "Qwen3", 3)
    llm = LLM(str(tmp_path), **ARGS)
    pc = llm.config.pooler_config
    assert (llm.config.runner, pc.pooling_type, pc.labels) == (
        "pooling", "LAST", ("LABEL_0", "LABEL_1", "LABEL_2"))  # fmt: skip
    assert llm.config.scheduler.enable_chunked_prefill  # (a causal model: chunks are fine)
    got = np.array([o.outputs.probs for o in llm.classify(PROMPTS, use_tqdm=False)])
    with torch.no_grad():
        logits = torch.cat([model(input_ids=torch.tensor([p])).logits for p in PROMPTS])
    np.testing.assert_allclose(got, torch.softmax(logits, -1).numpy(), atol=1e-5)
    assert np.ptp(got[:, 0]) > 1e-3
    with pytest.raises(ValueError, match="a pair's score needs one label"):
        llm.score(QUERY, DOCS, use_tqdm=False)


def test_llama_reranker_of_one_label_scores_pairs(tmp_path):
    model = _classifier(tmp_path, "Llama", 1)
    llm = LLM(str(tmp_path), **ARGS)
    got = np.array([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    with torch.no_grad():
        want = [torch.sigmoid(model(input_ids=torch.tensor([p])).logits[0, 0]).item()
                for p in _pair_ids(llm, QUERY, DOCS)]  # fmt: skip
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.ptp(want) > 1e-3


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """(directory, transformers' Qwen3ForCausalLM): a Qwen3-Reranker-shaped generator."""
    path = tmp_path_factory.mktemp("qwen3-reranker")
    return path, make_tiny_model(path, "Qwen3", scale=2.0)


def _yes_no(model, ids: list[list[int]]) -> np.ndarray:
    """transformers' reranker score: sigmoid(logit_yes - logit_no) of the last token."""
    with torch.no_grad():
        last = [model(input_ids=torch.tensor([p])).logits[0, -1] for p in ids]
    return np.array([torch.sigmoid(x[9] - x[7]).item() for x in last])


def test_qwen3_reranker_by_config_and_by_hf_overrides(reranker, tmp_path):
    path, model = reranker
    llm = LLM(str(path), runner="pooling", hf_overrides=RERANKER, **ARGS)
    assert llm.config.pooler_config.labels == ("LABEL_0",)
    got = np.array([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    want = _yes_no(model, _pair_ids(llm, QUERY, DOCS))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.ptp(want) > 1e-3
    for f in path.iterdir():  # the same override written into config.json
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    cfg = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **RERANKER}))
    llm = LLM(str(tmp_path), **ARGS)  # (--runner auto: pooling)
    again = np.array([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    np.testing.assert_allclose(again, got, atol=1e-6)


def test_refusals_are_one_line(reranker, tmp_path):
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.pooling import check_pooling
    from pagoda.runtime.model.loader import read_model_config

    path, _ = reranker
    for edit, words in (({**RERANKER, "is_original_qwen3_reranker": False}, "method None is not"),
                        ({**RERANKER, "method": "from_2_way_softmax", "classifier_from_token": ["w7"]},
                         "of two tokens"),
                        ({**RERANKER, "classifier_from_token": ["no", "yes"]}, "'no' is not a token")):  # fmt: skip
        with pytest.raises(ValueError, match=words) as e:
            LLM(str(path), hf_overrides=edit, **ARGS)
        assert "\n" not in str(e.value)
    _classifier(tmp_path, "Qwen3", 2)
    with pytest.raises(ValueError, match="Qwen3ForSequenceClassification is a sequence classifier"):
        LLM(str(tmp_path), runner="generate", **ARGS)
    config = EngineConfig.create(str(tmp_path), runner="pooling", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor parallelism is not supported for a sequence"):
        check_pooling(config, read_model_config(str(tmp_path)))


def test_serve_flag_hf_overrides_reaches_every_reader(reranker):
    """`pagoda serve PATH --hf-overrides JSON`: the server's checks and the engine config read
    the overlay (config.json overridden, the other files the checkpoint's): a pooling runner
    scoring one label."""
    from pagoda.runtime import options
    from pagoda.runtime.server.cli import build_parser, server_config
    from pagoda.runtime.server.launch import preflight

    path, _ = reranker
    args = build_parser().parse_args([str(path), "--device", "cpu", "--dtype", "float32",
                                      "--hf-overrides", json.dumps(RERANKER)])  # fmt: skip
    cfg = preflight(server_config(args), options.engine_kwargs(vars(args)))[0]
    assert cfg.runner == "pooling" and cfg.pooler_config.labels == ("LABEL_0",)
    overlay = json.loads((Path(cfg.model) / "config.json").read_text())
    assert overlay["architectures"] == RERANKER["architectures"] and Path(cfg.model) != path
    assert (Path(cfg.model) / "model.safetensors").resolve() == (path / "model.safetensors")


def test_hf_overrides_merge_nested_configs_as_vllm():
    """A nested model config (it has a model_type) is updated key by key; any other value,
    a dict too, replaced whole."""
    from pagoda.runtime.model.hf_overrides import merge

    cfg = {"text_config": {"model_type": "qwen3", "a": 1, "b": 2}, "rope_scaling": {"x": 1, "y": 2}}
    got = merge(cfg, {"text_config": {"b": 3}, "rope_scaling": {"x": 5}, "c": [1]})
    assert got == {"text_config": {"model_type": "qwen3", "a": 1, "b": 3}, "rope_scaling": {"x": 5},
                   "c": [1]}  # fmt: skip


def test_bge_reranker_gemma_form_scores_the_yes_logit(tmp_path):
    """bge-reranker-v2-gemma as vLLM serves it (`GemmaForCausalLM` under
    GemmaForSequenceClassification, `classifier_from_token` ["Yes"], `method`
    no_post_processing; its "Yes" here w9): sigmoid of the last token's "Yes" logit."""
    model = make_tiny_model(tmp_path, "Gemma", scale=2.0)
    override = {"architectures": ["GemmaForSequenceClassification"],
                "classifier_from_token": ["w9"], "method": "no_post_processing"}  # fmt: skip
    llm = LLM(str(tmp_path), hf_overrides=override, **ARGS)
    got = np.array([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    with torch.no_grad():
        last = [model(input_ids=torch.tensor([p])).logits[0, -1, 9]
                for p in _pair_ids(llm, QUERY, DOCS)]  # fmt: skip
    np.testing.assert_allclose(got, torch.sigmoid(torch.stack(last)).numpy(), atol=1e-5)
