"""Encoders (`model/bert.py`) against transformers: a tiny random BERT (`BertModel`, its tensors
saved under `bert.`, a WordPiece tokenizer whose post-processor adds [CLS] / [SEP], the
sentence-transformers layout: MEAN, Normalize) and XLM-RoBERTa (`XLMRobertaModel` saved as
pytorch_model.bin, no sentence-transformers files: CLS, normalized; positions offset by
pad_token_id + 1). The pooling runner's vectors for a batch of unequal prompts equal
transformers' last hidden states pooled and normalized (float32, atol 1e-5); the published
configs of bge-base-en-v1.5 and multilingual-e5-base read as encoders; the refusals are one
line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from embed_testlib import (
    ENCODER_SIZES,
    hf_encoder_embeddings,
    make_bert_model,
    save_wordpiece_tokenizer,
)
from hf_oracle import randomize
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.llm import LLM
from pagoda.runtime.engine.pooling import PoolingParams

transformers = pytest.importorskip("transformers")

PROMPTS = [[2, 5, 9, 13, 60, 7, 7, 31, 3], [2, 4, 3], [2, 50, 51, 52, 8, 9, 10, 3], [2, 3]]
ARGS = dict(dtype="float32", device="cpu", num_blocks_override=32, max_num_seqs=3)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(directory, transformers model): `embed_testlib.make_bert_model`'s (MEAN, normalized)."""
    path = tmp_path_factory.mktemp("bert")
    return path, make_bert_model(path)


def _vectors(outs) -> np.ndarray:
    return np.stack([np.asarray(o.outputs.embedding, dtype=np.float32) for o in outs])


def test_bert_vectors_equal_transformers(bert):
    """`--runner auto` serves it as an embedding model with its sentence-transformers pooling,
    each prompt whole in one step (chunked prefill and prefix caching off); 3 sequences a step
    put the 4 prompts in two steps of unequal lengths; each prompt alone gives its vector; a
    prompt may fill the context (64 of 64 positions: nothing is generated), one more is
    refused, truncate_prompt_tokens -1 keeps the last 64."""
    path, model = bert
    llm = LLM(str(path), **ARGS)
    c = llm.config
    assert c.runner == "pooling" and c.pooler_config.pooling_type == "MEAN"
    assert not c.scheduler.enable_chunked_prefill and not c.cache.enable_prefix_caching
    outs = llm.embed(PROMPTS, use_tqdm=False)
    np.testing.assert_allclose(
        _vectors(outs), hf_encoder_embeddings(model, PROMPTS, "MEAN"), atol=1e-5
    )
    alone = _vectors(llm.embed([PROMPTS[2]], use_tqdm=False))
    np.testing.assert_allclose(alone[0], _vectors(outs)[2], atol=1e-5)
    (text,) = llm.embed("W3 w4", use_tqdm=False)  # WordPiece, lower-cased, [CLS] ... [SEP]
    assert text.prompt_token_ids == [2, 8, 9, 3]
    np.testing.assert_allclose(text.outputs.embedding, hf_encoder_embeddings(model, [[2, 8, 9, 3]], "MEAN")[0],
                               atol=1e-5)  # fmt: skip
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    full = [[2] + [(7 * i) % 90 + 5 for i in range(62)] + [3], [2, 9, 3]]  # its 64 positions
    np.testing.assert_allclose(_vectors(llm.embed(full, use_tqdm=False)),
                               hf_encoder_embeddings(model, full, "MEAN"), atol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match=r"65 tokens; .* maximum context length is 64 tokens"):
        llm.embed([[2] * 65], use_tqdm=False)
    (cut,) = llm.embed([[4] + full[0]], PoolingParams(truncate_prompt_tokens=-1), use_tqdm=False)
    assert cut.prompt_token_ids == full[0]  # (-1: the last max_model_len tokens)


def test_xlm_roberta_from_a_pickle_pools_cls(tmp_path):
    """XLM-RoBERTa saved as pytorch_model.bin, no sentence-transformers modules: CLS pooling,
    normalized (vLLM's default for BERT-like models); its table of 66 rows (offset
    pad_token_id + 1 = 2) serves 64 positions, sentence_bert_config.json's max_seq_length 48 of
    them; a chunked-prefill flag is turned off for it."""
    torch.manual_seed(1)
    cfg = transformers.XLMRobertaConfig(**ENCODER_SIZES, max_position_embeddings=66, pad_token_id=1,
                                        type_vocab_size=1)  # fmt: skip
    model = randomize(transformers.XLMRobertaModel(cfg).eval(), scale=1.0)
    model.config.architectures = ["XLMRobertaModel"]
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # (transformers' older form)
    save_wordpiece_tokenizer(tmp_path)
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 48}')
    llm = LLM(str(tmp_path), enable_chunked_prefill=True, **ARGS)
    assert llm.config.pooler_config.pooling_type == "CLS" and llm.config.pooler_config.normalize
    assert not llm.config.scheduler.enable_chunked_prefill and llm.engine.max_model_len == 48
    got = _vectors(llm.embed(PROMPTS, use_tqdm=False))
    np.testing.assert_allclose(got, hf_encoder_embeddings(model, PROMPTS, "CLS"), atol=1e-5)


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_vectors_equal_transformers(bert):
    """Two ranks (gloo): each its head of the bidirectional attention (q/k/v rows with their
    biases, o_proj row-parallel, its bias once), the MLP by width, the post-norm LayerNorms
    and embeddings' tables whole; rank 0 pools: transformers' MEAN vectors."""
    path, model = bert
    with LLM(str(path), tensor_parallel_size=2, **ARGS) as two:
        assert two.engine.runner.backend.num_heads == 1  # (this rank's)
        got = _vectors(two.embed(PROMPTS, use_tqdm=False))
    np.testing.assert_allclose(got, hf_encoder_embeddings(model, PROMPTS, "MEAN"), atol=1e-5)


def test_refusals_are_one_line(bert):
    """An encoder generates nothing; more ranks than its heads, FP8 and a quantized KV cache
    are not run for it (from config.json alone, as `pagoda serve` checks before loading)."""
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype
    from pagoda.runtime.model.loader import read_model_config

    path, _ = bert
    model_config = read_model_config(str(path))
    assert model_config.architecture == "bert"
    with pytest.raises(ValueError, match=r"BertModel is an encoder .* --runner pooling"):
        LLM(str(path), runner="generate", **ARGS)
    check(model_config, 2)  # (split by heads as a decoder: two heads)
    with pytest.raises(ValueError, match="tensor-parallel-size 4 does not divide the model's 2"):
        check(model_config, 4)
    for flags in ({"quantization": "fp8"}, {"kv_cache_dtype": "int8"}):
        with pytest.raises(ValueError, match="not supported for a bert model") as e:
            check_dtype(EngineConfig.create(str(path), runner="pooling", **flags), model_config)
        assert "\n" not in str(e.value)


# BAAI/bge-base-en-v1.5's and intfloat/multilingual-e5-base's config.json as published
BGE_BASE = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1,
            "classifier_dropout": None, "gradient_checkpointing": False, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "hidden_size": 768, "id2label": {"0": "LABEL_0"},
            "initializer_range": 0.02, "intermediate_size": 3072, "label2id": {"LABEL_0": 0},
            "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
            "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
            "position_embedding_type": "absolute", "torch_dtype": "float32",
            "transformers_version": "4.30.0", "type_vocab_size": 2, "use_cache": True,
            "vocab_size": 30522}  # fmt: skip
ME5_BASE = {"architectures": ["XLMRobertaModel"], "attention_probs_dropout_prob": 0.1,
            "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
            "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "xlm-roberta",
            "num_attention_heads": 12, "num_hidden_layers": 12, "output_past": True,
            "pad_token_id": 1, "position_embedding_type": "absolute", "torch_dtype": "float32",
            "transformers_version": "4.29.0.dev0", "type_vocab_size": 1, "use_cache": True,
            "vocab_size": 250002}  # fmt: skip


@pytest.mark.parametrize(("cfg", "arch", "eps", "offset", "types"),
                         [(BGE_BASE, "bert", 1e-12, 0, 2), (ME5_BASE, "roberta", 1e-5, 2, 1)])  # fmt: skip
def test_published_configs_read_as_encoders(tmp_path, cfg, arch, eps, offset, types):
    """The published configs (no weights: what `pagoda serve` reads first) are 512-token
    encoders served by the pooling runner, CLS by default; another encoder architecture and a
    relative position embedding are refused in one line."""
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.pooler_config import resolve

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = read_model_config(str(tmp_path))
    f = c.family
    assert (c.architecture, c.context_length, c.rms_norm_eps) == (arch, 512, eps)
    assert (f.position_offset, f.type_vocab_size, f.post_norm, f.positions) == (
        offset, types, True, "learned")  # fmt: skip
    runner, pooler = resolve("auto", None, tmp_path, c.hidden_size)
    assert runner == "pooling" and (pooler.pooling_type, pooler.normalize) == ("CLS", True)
    for change, words in (({"position_embedding_type": "relative_key"}, "relative_key"),
                          ({"architectures": ["DistilBertModel"]}, "encoder-only model not")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ValueError, match=words) as e:
            read_model_config(str(tmp_path))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["Bert", "XLMRoberta"])
def test_cross_encoders_score_pairs_as_transformers(tmp_path, kind):
    """A one-label `*ForSequenceClassification` (a cross-encoder reranker): each pair encoded as
    one prompt (BERT's token types 1 after the first [SEP]; RoBERTa's none), its classifier
    head on the first row, sigmoid: `LLM.score` equals transformers' (1e-5); it has no
    vectors (`embed` refused) and takes no --pooler-config."""
    from embed_testlib import hf_pair_scores, make_cross_encoder

    model = make_cross_encoder(tmp_path, kind)
    query, docs = "w5 w9 w13", ["w3 w4", "w7 w8 w9 w10 w11", "w40", "w5 w9"]
    want = hf_pair_scores(model, tmp_path, query, docs, types=kind == "Bert")
    llm = LLM(str(tmp_path), **ARGS)
    assert llm.config.pooler_config.cross_encoder
    got = np.array([o.outputs.score for o in llm.score(query, docs, use_tqdm=False)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.ptp(want) > 1e-3  # (pairs told apart)
    if kind == "Bert":  # the token types count
        assert np.abs(hf_pair_scores(model, tmp_path, query, docs, types=False) - want).max() > 1e-4
    with pytest.raises(ValueError, match=r"sequence classifier .* use classify"):
        llm.embed(["w3"], use_tqdm=False)
    with pytest.raises(ValueError, match="cross-encoder's pooling is its classifier's"):
        LLM(str(tmp_path), pooler_config={"pooling_type": "MEAN"}, **ARGS)


@pytest.mark.parametrize("problem", [None, "multi_label_classification"])
def test_a_classifier_of_three_labels_classifies_as_transformers(tmp_path, problem):
    """A `BertForSequenceClassification` of 3 labels: `LLM.classify`'s probabilities are
    transformers' logits through softmax (sigmoid for multi_label_classification), 1e-5; score
    is refused (a pair's score needs one label), as embed is."""
    from embed_testlib import make_cross_encoder

    labels = {0: "neg", 1: "neutral", 2: "pos"}
    model = make_cross_encoder(tmp_path, "Bert", id2label=labels, problem_type=problem)
    llm = LLM(str(tmp_path), **ARGS)
    pc = llm.config.pooler_config
    assert (pc.labels, pc.multi_label) == (("neg", "neutral", "pos"), problem is not None)
    outs = llm.classify(PROMPTS, use_tqdm=False)
    with torch.no_grad():
        logits = torch.cat([model(input_ids=torch.tensor([p])).logits for p in PROMPTS])
    want = torch.sigmoid(logits) if problem else torch.softmax(logits, -1)
    got = np.array([o.outputs.probs for o in outs])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    assert outs[0].outputs.num_classes == 3 and np.ptp(got[:, 0]) > 1e-3
    with pytest.raises(ValueError, match="classifier of 3 labels: a pair's score needs one"):
        llm.score("w3", ["w4"], use_tqdm=False)
    with pytest.raises(ValueError, match="use classify"):
        llm.embed(["w3"], use_tqdm=False)
