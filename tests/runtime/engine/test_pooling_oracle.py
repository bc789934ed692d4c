"""The pooling runner against transformers: a tiny random Qwen3 (and Llama) saved as the
published Qwen3-Embedding layout; the engine's vectors for a batch of unequal prompts, prefilled
in chunks, equal transformers' final hidden states pooled (LAST, MEAN, CLS) and normalized."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from embed_testlib import hf_embeddings, make_embedding_model
from pagoda.runtime.engine.llm import LLM
from pagoda.runtime.engine.pooling import PoolingParams

PROMPTS = [[5, 9, 13, 200, 7, 7, 31, 2, 99, 101, 17], [3, 4], [250, 251, 252, 8, 9, 10, 11],
           [42]]  # fmt: skip
ARGS = dict(dtype="float32", device="cpu", max_model_len=64, num_blocks_override=64,
            block_size=16, max_num_batched_tokens=8, max_num_seqs=4, long_prefill_token_threshold=0,
            enforce_eager=True)  # fmt: skip


def _vectors(outs) -> np.ndarray:
    return np.stack([np.asarray(o.outputs.embedding, dtype=np.float32) for o in outs])


@pytest.mark.parametrize(("arch", "pooling"), [("Qwen3", "LAST"), ("Llama", "MEAN")])
def test_vectors_equal_transformers_with_chunked_prefill(tmp_path, arch, pooling):
    """`--runner auto` reads the sentence-transformers layout; 8-token steps split the longest
    prompts across steps beside the others; each prompt alone gives the same vector; a prompt
    of the whole context (64 tokens: a pooled prompt generates nothing) is pooled too."""
    model = make_embedding_model(tmp_path, arch, pooling)
    want = hf_embeddings(model, PROMPTS, pooling).numpy()
    llm = LLM(str(tmp_path), **ARGS)
    assert llm.config.runner == "pooling"
    assert llm.config.pooler_config.pooling_type == pooling
    assert not llm.config.cache.enable_prefix_caching
    outs = llm.embed(PROMPTS, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    got = _vectors(outs)
    np.testing.assert_allclose(got, want, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    alone = _vectors(llm.embed([PROMPTS[0]], use_tqdm=False))
    np.testing.assert_allclose(alone[0], got[0], atol=1e-5)
    full = [(7 * i) % 290 + 3 for i in range(64)]  # the whole context, in 8 chunks
    np.testing.assert_allclose(_vectors(llm.embed([full], use_tqdm=False)),
                               hf_embeddings(model, [full], pooling).numpy(), atol=1e-4)  # fmt: skip
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks  # no KV kept after
    # text as transformers' tokenizer reads it: tokenizer.json's post-processor appends w2
    (text,) = llm.embed("w3 w4", use_tqdm=False)
    assert text.prompt_token_ids == [3, 4, 2]
    want = hf_embeddings(model, [[3, 4, 2]], pooling).numpy()[0]
    np.testing.assert_allclose(text.outputs.embedding, want, atol=1e-4)


def test_cls_unnormalized_and_matryoshka_dimensions(tmp_path):
    """--pooler-config overrides the checkpoint's pooling; a Matryoshka model's `dimensions`
    cuts the vector (then normalized when the pooler normalizes); a model without Matryoshka
    fields refuses `dimensions`."""
    model = make_embedding_model(tmp_path, "Qwen3", "LAST", is_matryoshka=True)
    llm = LLM(str(tmp_path), pooler_config={"pooling_type": "CLS", "normalize": False}, **ARGS)
    got = _vectors(llm.embed(PROMPTS, use_tqdm=False))
    np.testing.assert_allclose(got, hf_embeddings(model, PROMPTS, "CLS", False).numpy(), atol=1e-4)
    llm = LLM(str(tmp_path), runner="pooling", **ARGS)
    cut = _vectors(llm.embed(PROMPTS, PoolingParams(dimensions=16), use_tqdm=False))
    full = hf_embeddings(model, PROMPTS, "LAST", False)[:, :16]
    want = torch.nn.functional.normalize(full, dim=-1).numpy()
    np.testing.assert_allclose(cut, want, atol=1e-4)


def test_refusals(tmp_path):
    make_embedding_model(tmp_path, "Qwen3", "LAST")
    with pytest.raises(ValueError, match="Matryoshka"):
        LLM(str(tmp_path), pooler_config={"dimensions": 8}, **ARGS)
    with pytest.raises(ValueError, match="unknown or unsupported key"):
        LLM(str(tmp_path), pooler_config={"softmax": True}, **ARGS)
    with pytest.raises(ValueError, match="speculative decoding is not supported with the pooling"):
        LLM(str(tmp_path), speculative_config={"num_speculative_tokens": 2}, **ARGS)
    with pytest.raises(ValueError, match="LoRA adapters are not supported with the pooling"):
        LLM(str(tmp_path), enable_lora=True, **ARGS)
    with pytest.raises(ValueError, match="pooler_config applies to the pooling runner only"):
        LLM(str(tmp_path), runner="generate", pooler_config={"pooling_type": "MEAN"}, **ARGS)
    llm = LLM(str(tmp_path), **ARGS)
    with pytest.raises(ValueError, match="use embed"):
        llm.generate([[1, 2]])
    with pytest.raises(ValueError, match="Matryoshka"):
        llm.embed([[1, 2]], PoolingParams(dimensions=8))
    gen = LLM(str(tmp_path), runner="generate", **ARGS)
    with pytest.raises(ValueError, match="embed needs the pooling runner"):
        gen.embed([[1, 2]])


@pytest.mark.parametrize(
    ("arch", "kind", "fields", "words"),
    [
        ("MambaForCausalLM", "Mamba", {}, "keeps per-sequence state"),
        ("Gemma3nForCausalLM", "Gemma3nText",
         dict(num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
              num_kv_shared_layers=0, layer_types=["sliding_attention", "full_attention"],
              activation_sparsity_pattern=[0.0, 0.0]),
         "its forward does not hand back final hidden states"),
    ],
)  # fmt: skip
def test_families_the_pooling_runner_refuses(tmp_path, arch, kind, fields, words):
    """From config.json alone (what `pagoda serve` checks before loading): a recurrent family,
    and one whose model computes its own forward (the hidden-state seam is Llama's)."""
    import transformers
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.pooling import check_pooling
    from pagoda.runtime.model.loader import read_model_config

    cfg = getattr(transformers, f"{kind}Config")(hidden_size=64, num_hidden_layers=2,
                                                 vocab_size=300, **fields)  # fmt: skip
    cfg.architectures = [arch]
    cfg.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=words):
        check_pooling(EngineConfig.create(str(tmp_path), runner="pooling"),
                      read_model_config(str(tmp_path)))  # fmt: skip


def test_a_bare_decoder_is_a_pooling_model(tmp_path):
    """A checkpoint of transformers' `Qwen3Model` (architectures ["Qwen3Model"], its tensors
    without `model.`, no LM head: e5-mistral's layout) is served by the pooling runner (LAST,
    normalized); --runner generate refuses it."""
    import transformers
    from hf_oracle import TINY, randomize, save_word_tokenizer

    torch.manual_seed(0)
    bare = randomize(transformers.Qwen3Model(transformers.Qwen3Config(**TINY)).eval())
    bare.save_pretrained(tmp_path)
    save_word_tokenizer(tmp_path, TINY["vocab_size"])
    llm = LLM(str(tmp_path), **ARGS)
    assert llm.config.runner == "pooling"
    got = _vectors(llm.embed(PROMPTS, use_tqdm=False))
    want = hf_embeddings(type("Wrapped", (), {"model": bare}), PROMPTS, "LAST").numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    with pytest.raises(ValueError, match="bare decoder without an LM head"):
        LLM(str(tmp_path), runner="generate", **ARGS)
