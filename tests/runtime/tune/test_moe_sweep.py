"""Fused-MoE tuning on tiny shapes under Triton's interpreter (compiled kernels on CUDA): the
expert shape read from real Hugging Face configs, buckets per invariance mode, candidates
rejected when wrong, refused or not batch-invariant, the winner saved where the lookup finds it."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("transformers")

import transformers
from pagoda.kernels import config as kc
from pagoda.kernels import fused_moe
from pagoda.runtime.config import EngineConfig, FamilyConfig, ModelConfig
from pagoda.runtime.tune import moe
from pagoda.runtime.tune.engine import make_plan
from pagoda.runtime.tune.kernel_stage import kernel_buckets
from sweep_testlib import DEVICE, timer, tune_one

TINY = moe.MoeShape(num_experts=8, intermediate=24, hidden=32, top_k=2)
GOOD = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8, num_warps=4, num_stages=2)
WRONG = {**GOOD, "BLOCK_N": 32}  # the patched kernel corrupts these
VARIANT = {**GOOD, "BLOCK_M": 32}  # ... and makes these depend on the batch
INVALID = {k: v for k, v in GOOD.items() if k != "num_warps"}


def _bucket(dtype=torch.float32, tokens=(3, 9)) -> moe.MoeBucket:
    key = fused_moe.moe_config_shape(
        num_experts=8, intermediate=24, hidden=32, dtype=dtype, num_tokens=256
    )
    return moe.MoeBucket(TINY, key, tokens, dtype)


def _qwen3_moe(path, **kw):
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, **kw,
    )  # fmt: skip
    cfg.save_pretrained(path)
    return cfg


def test_expert_shape_from_real_hf_configs(tmp_path):
    _qwen3_moe(tmp_path / "qwen3")
    transformers.MixtralConfig(
        hidden_size=64, intermediate_size=48, num_local_experts=4, num_experts_per_tok=1,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
    ).save_pretrained(tmp_path / "mixtral")  # fmt: skip
    transformers.Qwen3Config(hidden_size=64, num_attention_heads=4).save_pretrained(
        tmp_path / "dense"
    )
    assert moe.model_moe_shape(str(tmp_path / "qwen3"), None) == moe.MoeShape(8, 32, 64, 2)
    assert moe.model_moe_shape(str(tmp_path / "mixtral"), None) == moe.MoeShape(4, 48, 64, 1)
    assert moe.model_moe_shape(str(tmp_path / "dense"), None) is None
    nested = {"text_config": {"num_experts": 4, "moe_intermediate_size": 8, "hidden_size": 16,
                              "num_experts_per_tok": 2}}  # fmt: skip
    assert moe.moe_shape_from_hf(nested) == moe.MoeShape(4, 8, 16, 2)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        moe.moe_shape_from_hf({"num_local_experts": 8, "hidden_size": 16, "intermediate_size": 8})
    with pytest.raises(ValueError, match="top_k"):
        moe.moe_shape_from_hf({**nested["text_config"], "num_experts_per_tok": 5})
    gguf = tmp_path / "m.gguf"  # not a directory: the model config's attributes decide
    gguf.write_bytes(b"")
    family = FamilyConfig(num_experts=4, moe_intermediate_size=8, num_experts_per_tok=2)
    experts = ModelConfig(256, 16, 96, 2, 4, 2, 4, family=family)
    assert moe.model_moe_shape(str(gguf), experts) == moe.MoeShape(4, 8, 16, 2)
    assert moe.model_moe_shape(str(gguf), ModelConfig(256, 64, 96, 2, 4, 2, 16)) is None


def test_buckets_per_invariance_mode():
    kw = dict(max_num_seqs=64, max_num_batched_tokens=8192, quick=False)
    (one,) = moe.plan_moe_buckets(TINY, torch.bfloat16, batch_invariant=True, **kw)
    assert one.shape["tokens"] == fused_moe.INVARIANT_TOKENS and one.tokens == (64, 4096)
    assert one.shape == {"experts": 8, "intermediate": 24, "hidden": 32, "itemsize": 2,
                         "tokens": fused_moe.INVARIANT_TOKENS}  # fmt: skip
    each = moe.plan_moe_buckets(TINY, torch.bfloat16, batch_invariant=False, **kw)
    assert [b.tokens for b in each] == [(1,), (16,), (64,), (4096,)]
    assert [b.shape["tokens"] for b in each] == [1, 16, 64, 4096]
    assert moe.plan_moe_buckets(None, torch.bfloat16, batch_invariant=True, **kw) == []
    kw["quick"] = True
    assert len(moe.plan_moe_buckets(TINY, torch.bfloat16, batch_invariant=False, **kw)) == 1


def test_kernel_stage_adds_the_moe_bucket_for_moe_models_only(tmp_path):
    _qwen3_moe(tmp_path / "qwen3")
    transformers.LlamaConfig(hidden_size=64, num_attention_heads=4).save_pretrained(tmp_path / "l")
    mc = ModelConfig(256, 64, 96, 2, 4, 2, 16)  # the dense part's shapes (attention, LM head)
    plan = make_plan(max_model_len=128, cuda=False, quick=True)
    for model, invariant, want in (("qwen3", True, 1), ("qwen3", False, 1), ("l", True, 0)):
        base = EngineConfig.create(str(tmp_path / model), dtype="float32",
                                   batch_invariant=invariant)  # fmt: skip
        buckets = kernel_buckets(mc, base, plan, 128, quick=True)
        found = [b for b in buckets if b.kernel == moe.FUSED_MOE]
        assert len(found) == want, (model, invariant)
        if want:
            assert found[0].moe == moe.MoeShape(8, 32, 64, 2) and found[0].dtype == torch.float32
            assert buckets[0].kernel == "matmul" if invariant else buckets[0] is found[0]


@pytest.fixture
def faulty_experts(monkeypatch):
    """`fused_moe.fused_experts`, patched: BLOCK_N 32 is off by 2 %, BLOCK_M 32 adds noise that
    depends on the batch size."""
    real, calls = fused_moe.fused_experts, []

    def patched(*args, config=None, **kw):
        calls.append(config)
        y = real(*args, config=config, **kw)
        if config["BLOCK_N"] == 32:
            y.mul_(1.02)
        if config["BLOCK_M"] == 32:
            y.add_(1e-6 * y.shape[0])  # within tolerance, not bitwise
        return y

    monkeypatch.setattr(fused_moe, "fused_experts", patched)
    return calls


def test_wrong_refused_and_variant_candidates_are_rejected(faulty_experts):
    result = moe.sweep_moe_bucket(_bucket(), [WRONG, INVALID, VARIANT, GOOD], DEVICE, timer=timer)
    assert result.config == GOOD and result.median_ms > 0
    assert result.default_ms is None  # the baseline (first candidate) was rejected
    assert ["wrong output" in r for r in result.rejected] == [True, False, False]
    assert (
        "failed: KernelConfigError" in result.rejected[1]
        and "lacks num_warps" in result.rejected[1]
    )
    assert "not batch-invariant" in result.rejected[2]


@pytest.mark.slow
def test_tune_kernels_saves_the_moe_winner(tmp_path, monkeypatch, faulty_experts):
    """Two candidates (plus the packaged default as baseline), through `tune_kernels`."""
    space = lambda kernel: [WRONG, GOOD] if kernel == moe.FUSED_MOE else []  # noqa: E731
    r = tune_one(_bucket(), space, tmp_path / "configs", monkeypatch, good=GOOD, candidates=3,
                 rejected=1)  # fmt: skip
    try:
        got = fused_moe.get_moe_config(num_experts=8, intermediate=24, hidden=32,
                                       dtype=torch.float32, num_tokens=3, device="Test GPU")  # fmt: skip
        assert got == r["config"]
    finally:
        kc.clear_config_cache()


def test_every_shipped_candidate_is_correct_and_invariant():
    """The space `pagoda tune` tries on a GPU: no config in it is wrong, refused or variant."""
    gen = torch.Generator().manual_seed(1)
    space = moe.candidate_space()
    assert len(space) == len(moe.CANDIDATES) and moe.candidate_space(quick=True) == space[:2]
    failures = {str(c): moe.check_candidate(_bucket(), c, DEVICE, gen) for c in space}
    assert {c: why for c, why in failures.items() if why} == {}


def test_candidate_time_weighs_each_token_count_per_token():
    inputs = moe.timing_inputs(_bucket(), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert [s[0]["hidden_states"].shape[0] for s in inputs] == [3, 9]
    assert moe.time_candidate(GOOD, inputs, timer=lambda fn: 1.5) == 1.5 * 9 / 3 + 1.5


# `pagoda tune` end to end on a tiny Qwen3-MoE (its bucket swept and saved beside the dense ones):
# tests/runtime/tune/test_tune_interpreter.py, one run for the dense and the MoE buckets.
