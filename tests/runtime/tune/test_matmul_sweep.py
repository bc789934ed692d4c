"""Matmul tuning on small shapes under Triton's interpreter (compiled kernels on CUDA): buckets
from the model's weight shapes, candidates rejected when wrong, refused or not batch-invariant,
the fastest correct one saved where the runtime's lookup finds it."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch

pytest.importorskip("triton")

from pagoda import kernels
from pagoda.kernels import config as kc
from pagoda.runtime.config import FamilyConfig, ModelConfig
from pagoda.runtime.model_configs import MlaConfig
from pagoda.runtime.tune import matmul, sweep
from pagoda.runtime.tune.fp8_matmul import plan_fp8_buckets
from pagoda.runtime.tune.kernels import candidate_space
from sweep_testlib import DEVICE, timer, tune_one

BUCKET = matmul.MatmulBucket("o", {"n": 48, "k": 80}, rows=(5, 40), dtype=torch.float32)
GOOD = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8, num_warps=4, num_stages=2)
WRONG = {**GOOD, "BLOCK_N": 32}  # the patched kernel corrupts these
VARIANT = {**GOOD, "BLOCK_M": 32}  # ... and makes these depend on M
INVALID = {k: v for k, v in GOOD.items() if k != "num_warps"}


@pytest.fixture
def faulty_linear(monkeypatch):
    """`kernels.linear`, patched: BLOCK_N 32 is off by 2 %, BLOCK_M 32 adds M-dependent noise."""
    real, calls = kernels.linear, []

    def patched(*, x, weight, bias=None, out=None, config=None):
        calls.append(config)
        y = real(x=x, weight=weight, bias=bias, out=out, config=config)
        if config["BLOCK_N"] == 32:
            y.mul_(1.02)
        if config["BLOCK_M"] == 32:
            y.add_(1e-6 * x.shape[0])  # within tolerance, not bitwise
        return y

    monkeypatch.setattr(kernels, "linear", patched)
    return calls


def test_buckets_are_the_models_weight_shapes():
    llama1b = ModelConfig(32000, 2048, 8192, 16, 32, 8, 64)
    buckets = matmul.plan_matmul_buckets(
        llama1b, torch.bfloat16, max_num_seqs=256, max_num_batched_tokens=16384, quick=False
    )
    got = {b.name: (b.shape["n"], b.shape["k"]) for b in buckets}
    assert got == {
        "qkv": (3072, 2048),
        "o": (2048, 2048),
        "gate_up": (16384, 2048),
        "down": (2048, 8192),
        "lm_head": (32000, 2048),
    }
    assert {b.rows for b in buckets} == {(256, matmul.MAX_PREFILL_ROWS)}
    square = ModelConfig(64, 64, 48, 1, 4, 4, 16)  # o and lm_head are both 64x64
    names = [b.name for b in matmul.plan_matmul_buckets(
        square, torch.float32, max_num_seqs=8, max_num_batched_tokens=8, quick=False)]  # fmt: skip
    assert names == ["qkv", "o+lm_head", "gate_up", "down"] and len(set(names)) == 4
    # Qwen2-MoE's shared expert: a dense MLP of its own width, in FP8 too
    qwen2moe = dataclasses.replace(llama1b, family=FamilyConfig(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=5632))  # fmt: skip
    for plan in (matmul.plan_matmul_buckets, plan_fp8_buckets):
        got = {b.name: (b.shape["n"], b.shape["k"]) for b in plan(
            qwen2moe, torch.bfloat16, max_num_seqs=8, max_num_batched_tokens=8, quick=False)}  # fmt: skip
        assert got["shared_gate_up"] == (11264, 2048) and got["shared_down"] == (2048, 5632)
    # DeepSeek-V3's latent attention: q_a with kv_a_proj_with_mqa, q_b, o (FP8 too; kv_b is
    # absorbed, no Linear)
    mla = MlaConfig(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                    q_lora_rank=1536)  # fmt: skip
    v3 = ModelConfig(129280, 7168, 18432, 61, 128, 1, 576, family=FamilyConfig(mla=mla))
    for plan in (matmul.plan_matmul_buckets, plan_fp8_buckets):
        got = {b.name: (b.shape["n"], b.shape["k"]) for b in plan(
            v3, torch.bfloat16, max_num_seqs=8, max_num_batched_tokens=8, quick=False)}  # fmt: skip
        assert got["qkv"] == (1536 + 576, 7168) and got["q_b"] == (128 * 192, 1536)
        assert "kv_b" not in got and got["o"] == (7168, 128 * 128)


def test_wrong_refused_and_variant_candidates_are_rejected(faulty_linear):
    result = sweep.sweep_matmul_bucket(BUCKET, [WRONG, INVALID, VARIANT, GOOD], DEVICE, timer=timer)
    assert result.config == GOOD and result.median_ms > 0
    assert result.default_ms is None  # the baseline (first candidate) was rejected
    assert ["wrong output" in r for r in result.rejected] == [True, False, False]
    assert (
        "failed: KernelConfigError" in result.rejected[1]
        and "lacks num_warps" in result.rejected[1]
    )
    assert "not batch-invariant" in result.rejected[2]


def test_tune_kernels_saves_the_matmul_winner(tmp_path, monkeypatch, faulty_linear):
    space = lambda kernel: [WRONG, VARIANT, GOOD]  # noqa: E731
    r = tune_one(BUCKET, space, tmp_path / "configs", monkeypatch, good=GOOD, candidates=4,
                 rejected=2)  # fmt: skip
    assert kc.get_kernel_config("matmul", {"n": 48, "k": 80}, "Test GPU") == r["config"]
    kc.clear_config_cache()


def test_every_shipped_candidate_is_correct_and_invariant():
    """The space `pagoda tune` tries on a GPU: no config in it is wrong, refused or variant."""
    gen = torch.Generator().manual_seed(1)
    space = candidate_space(matmul.MATMUL)
    assert space == matmul.candidate_space() and len(space) == len(matmul.CANDIDATES)
    bucket = matmul.MatmulBucket("t", {"n": 136, "k": 200}, (1, 8), torch.float32)
    failures = {str(c): matmul.check_candidate(bucket, c, DEVICE, gen) for c in space}
    assert {c: why for c, why in failures.items() if why} == {}


def test_candidate_time_weighs_each_row_count_per_row():
    """A decode-sized call counts as often as it takes to match the prefill chunk's rows."""
    inputs = matmul.timing_inputs(BUCKET, torch.device("cpu"), torch.Generator().manual_seed(0))
    ms = matmul.time_candidate(BUCKET, GOOD, inputs, timer=lambda fn: 1.5)
    assert ms == 1.5 * 40 / 5 + 1.5


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")
def test_graph_timer_replays_the_captured_calls():
    x = torch.randn(256, 2048, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device=DEVICE, dtype=torch.bfloat16)
    calls = []

    def fn():
        calls.append(1)
        kernels.linear(x=x, weight=w, config=GOOD)

    ms = sweep.cuda_graph_timer(fn, calls=8, replays=5)
    assert 0 < ms < 10 and len(calls) == 3 + 8  # warm-ups, then captured once: replays skip Python
