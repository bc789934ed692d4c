"""Apertus 1.5's text model (`Apertus1p5TextForCausalLM`: Apertus' layers, a vocabulary with the
visual and audio codes, the LM head pruned to the first `output_vocab_size` ids) against
transformers, on a tiny random checkpoint it writes: the engine's greedy tokens are
transformers', its logits transformers' on the kept ids and -inf on the pruned ones, in a
batch of unequal prompts chunked into 16-token steps, on a warm prefix cache and preempted, on
one rank and on two; the weights estimate from config.json alone; a sparse config read with transformers'
defaults; what is refused."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from arch_cases import LLAMA3, SMALL_POOL, built_fixture, generate, prompts
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Apertus1p5TextConfig"):
    pytest.skip("transformers without Apertus 1.5", allow_module_level=True)

KEPT = 260  # of the 300 ids: the head's rows


def write(name: str, path):
    return make_tiny_model(path, "Apertus1p5Text", rope_parameters=LLAMA3,
                           output_vocab_size=KEPT, num_key_value_heads=1)  # fmt: skip


built = built_fixture(write)


def _check(got, reference, what: str) -> None:
    for i, ((tokens, logits), (ref_tokens, ref_logits)) in enumerate(zip(got, reference)):
        assert tokens == ref_tokens, f"{what}: prompt {i}"
        for ours, theirs in zip(logits, ref_logits):
            assert ours.shape == (300,) and theirs.shape == (KEPT,)
            assert torch.isneginf(ours[KEPT:]).all(), f"{what}: a pruned id's logit"
            assert float((ours[:KEPT] - theirs).abs().max()) < 1e-3, f"{what}: prompt {i}"


def test_apertus1p5_matches_transformers_chunked_cached_batched_and_preempted(built):
    _, _, loaded, reference = built("pruned")
    assert loaded.config.architecture == "apertus1p5"
    assert loaded.config.family.head_rows == KEPT and loaded.config.vocab_size == 300
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    _check(generate(llm, prompts()), reference, "cold")
    _check(generate(llm, prompts()[::-1])[::-1], reference, "warm")
    assert llm.engine.kv.prefix_hits > 0
    small = LLM(loaded=loaded, **SMALL_POOL)
    _check(generate(small, prompts()), reference, "preempted")
    assert small.engine.scheduler.num_preemptions > 0


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool then a warm cache: the embedding's 300 rows and the
    pruned head's 260 each split over the ranks on their own, the gathered logits -inf past the
    head's rows; rank 0's weights as the estimate counts them (less xIELU's scalars)."""
    from model_bytes import check_estimate

    path, _, loaded, reference = built("pruned")
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        _check(generate(two, prompts()), reference, "two ranks, cold")
        _check(generate(two, prompts()[::-1])[::-1], reference, "two ranks, warm")
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        core.check_integrity()
    check_estimate(path, 2, rel=1e-3)


def test_the_checked_tensors_and_the_estimate_count_the_pruned_head(built):
    """`expected_shapes` names every tensor transformers saved but the MLPs' (their widths are
    read from the weights), the head [260, 64] too; the weights estimate from config.json alone
    and the parameter count are the saved tensors'."""
    from pagoda.runtime.model.checkpoint_shapes import expected_shapes
    from pagoda.runtime.server.weights import from_shapes
    from safetensors import safe_open

    path, _, loaded, _ = built("pruned")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        stored = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118
    assert stored["lm_head.weight"] == (KEPT, 64)
    assert expected_shapes(loaded.config) == {
        n: s
        for n, s in stored.items()
        if ".mlp.p" not in n and ".mlp.up" not in n and ".mlp.down" not in n
    }
    c, size = loaded.config, sum(torch.Size(s).numel() for s in stored.values())
    whole = dataclasses.replace(c, family=dataclasses.replace(c.family, head_rows=0))
    pruned = 4 * (300 - KEPT) * 64
    assert from_shapes(whole, torch.float32, False) - from_shapes(c, torch.float32, False) == pruned
    assert 4 * (whole.num_params - c.num_params) == pruned
    # (Apertus' estimate leaves out xIELU's four scalars a layer)
    assert from_shapes(c, torch.float32, False) == 4 * (size - 4 * c.num_layers)


SPARSE = {"architectures": ["Apertus1p5TextForCausalLM"], "model_type": "apertus1p5_text",
          "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_hidden_layers": 2, "output_vocab_size": 131_272}  # fmt: skip


def test_a_sparse_config_reads_as_transformers_reads_it(tmp_path):
    """Apertus1p5TextConfig's defaults where config.json leaves them out: its 266,752-id
    vocabulary (the embedding's rows), Apertus' xIELU, eps, llama3 rotary and context; an
    `output_vocab_size` equal to the vocabulary is no pruning, and neither is one with tied
    embeddings (transformers' head is then the embedding: every id scored)."""
    (tmp_path / "config.json").write_text(json.dumps(SPARSE))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    assert ours.architecture == "apertus1p5" and ours.vocab_size == theirs.vocab_size == 266_752
    assert ours.family.head_rows == theirs.output_vocab_size == 131_272
    assert ours.family.hidden_act == theirs.hidden_act == "xielu" and ours.family.qk_norm
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    assert ours.rope_scaling["rope_type"] == theirs.rope_parameters["rope_type"] == "llama3"
    assert ours.tie_word_embeddings is theirs.tie_word_embeddings is False
    (tmp_path / "config.json").write_text(json.dumps({**SPARSE, "output_vocab_size": 266_752}))
    assert read_model_config(str(tmp_path)).family.head_rows == 0
    (tmp_path / "config.json").write_text(json.dumps({**SPARSE, "tie_word_embeddings": True}))
    assert read_model_config(str(tmp_path)).family.head_rows == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"output_vocab_size": 300_000}, r"output_vocab_size \(300000\) must be in"),
        ({"output_vocab_size": 0}, r"output_vocab_size \(0\) must be in"),
    ],
)
def test_what_apertus1p5_does_not_compute_is_refused_in_one_line(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**SPARSE, **change}))
    with pytest.raises(ValueError, match=message) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


def test_allowed_token_ids_past_the_pruned_head_alone_are_refused(built):
    """Ids the pruned head does not score (-inf) as the only allowed ones: no token could be
    drawn, so the request is refused (400 at the server: `EngineInfo.validate`), not run."""
    from pagoda.runtime import SamplingParams
    from pagoda.runtime.engine.info import EngineInfo
    from pagoda.runtime.sampling.params import ParamError

    _, _, loaded, _ = built("pruned")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=4 << 20)
    params = SamplingParams(temperature=0, max_tokens=2, allowed_token_ids=[270, 280])
    with pytest.raises(ValueError, match=r"no id this model generates: its LM head scores"):
        llm.generate([{"prompt_token_ids": [5, 6]}], params)
    info = EngineInfo.from_core(llm.engine)
    with pytest.raises(ParamError, match=r"scores \[0, 260\)"):
        info.validate([5, 6], params)
    ok = SamplingParams(temperature=0, max_tokens=2, allowed_token_ids=[7, 280])
    (out,) = llm.generate([{"prompt_token_ids": [5, 6]}], ok)
    assert out.outputs[0].token_ids == [7, 7]
