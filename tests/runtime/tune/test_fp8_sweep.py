"""FP8 GEMM tuning on small shapes under Triton's interpreter (compiled kernels on CUDA): buckets
only for a model served in FP8, candidates rejected when wrong, refused or not batch-invariant,
the fastest correct one saved where the runtime's lookup finds it."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch

pytest.importorskip("triton")

from pagoda import kernels
from pagoda.kernels import config as kc
from pagoda.kernels.fp8 import fp8_supported
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.tune import fp8_matmul, matmul, sweep
from pagoda.runtime.tune.kernel_stage import kernel_buckets, run_kernel_stage
from pagoda.runtime.tune.kernels import candidate_space
from sweep_testlib import DEVICE, timer, tune_one

if DEVICE.type == "cuda" and not fp8_supported(DEVICE):
    pytest.skip("FP8 kernels need compute capability 8.9 or later", allow_module_level=True)
BUCKET = matmul.MatmulBucket("o", {"n": 48, "k": 96}, rows=(5, 40), gemm=fp8_matmul.FP8_LINEAR)
GOOD = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=2)
WRONG = {**GOOD, "BLOCK_N": 32}  # the patched kernel corrupts these
VARIANT = {**GOOD, "BLOCK_M": 32}  # ... and makes these depend on M
INVALID = {**GOOD, "BLOCK_K": 16}  # the launcher refuses K tiles under 32
LLAMA_8B = ModelConfig(128256, 4096, 14336, 32, 32, 8, 128)
TINY = ModelConfig(300, 64, 128, 2, 4, 2, 16)


@pytest.fixture
def faulty_fp8_linear(monkeypatch):
    """`kernels.fp8_linear`, patched: BLOCK_N 32 is off by 5 %, BLOCK_M 32 adds M-dependent noise."""
    real = kernels.fp8_linear

    def patched(**kw):
        y = real(**kw)
        if kw["config"]["BLOCK_N"] == 32:
            y.mul_(1.05)
        if kw["config"]["BLOCK_M"] == 32:
            y.add_(1e-3 * kw["x"].shape[0])
        return y

    monkeypatch.setattr(kernels, "fp8_linear", patched)


def _base(model: str, **kw) -> EngineConfig:
    return EngineConfig.create(model, device=DEVICE.type, attention_backend="triton", **kw)


def test_fp8_buckets_only_when_the_model_is_served_in_fp8(tmp_path):
    buckets = fp8_matmul.plan_fp8_buckets(
        LLAMA_8B, torch.bfloat16, max_num_seqs=256, max_num_batched_tokens=8192, quick=False
    )
    assert {b.name: (b.shape["n"], b.shape["k"]) for b in buckets} == {
        "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
    }  # fmt: skip
    assert {b.rows for b in buckets} == {(256, 4096)} and {b.kernel for b in buckets} == {
        "fp8_matmul"
    }

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    plan = SimpleNamespace(decode_batches=[8], chunk_sizes=[64])

    def kinds(base: EngineConfig) -> list[tuple[str, str]]:
        found = kernel_buckets(TINY, base, plan, max_model_len=128, quick=False)
        return [(b.kernel, getattr(b, "name", "")) for b in found if "matmul" in b.kernel]

    bf16 = [("matmul", n) for n in ("qkv", "o", "gate_up", "down", "lm_head")]
    assert kinds(_base(str(tmp_path))) == bf16
    fp8 = [("fp8_matmul", n) for n in ("qkv", "o", "gate_up", "down")] + [("matmul", "lm_head")]
    assert kinds(_base(str(tmp_path), quantization="fp8")) == fp8
    assert kinds(_base(str(tmp_path), quantization="fp8", batch_invariant=False)) == fp8[:4]
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic"}  # an FP8 checkpoint, no flag
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    assert kinds(_base(str(tmp_path))) == fp8
    with pytest.raises(ValueError, match="quantization must be one of fp8"):
        _base(str(tmp_path), quantization="int4")


def test_wrong_refused_and_variant_candidates_are_rejected(faulty_fp8_linear):
    result = sweep.sweep_matmul_bucket(BUCKET, [WRONG, INVALID, VARIANT, GOOD], DEVICE, timer=timer)
    assert result.config == GOOD and result.median_ms > 0
    assert result.default_ms is None  # the baseline (first candidate) was rejected
    assert ["wrong output" in r for r in result.rejected] == [True, False, False]
    assert "failed: ValueError" in result.rejected[1] and "BLOCK_K >= 32" in result.rejected[1]
    assert "not batch-invariant" in result.rejected[2]


def test_tune_kernels_saves_the_fp8_winner(tmp_path, monkeypatch, faulty_fp8_linear):
    space = lambda kernel: [WRONG, VARIANT, GOOD]  # noqa: E731
    r = tune_one(BUCKET, space, tmp_path / "configs", monkeypatch, good=GOOD, candidates=4,
                 rejected=2)  # fmt: skip
    assert kc.get_kernel_config("fp8_matmul", {"n": 48, "k": 96}, "Test GPU") == r["config"]
    assert kc.get_kernel_config("matmul", {"n": 48, "k": 96}, "Test GPU") != r["config"]
    kc.clear_config_cache()


def test_every_shipped_candidate_is_correct_and_invariant():
    """The space `pagoda tune` tries on a GPU: no config in it is wrong, refused or variant."""
    gen = torch.Generator().manual_seed(1)
    space = candidate_space(fp8_matmul.FP8_MATMUL)
    assert space == fp8_matmul.FP8_LINEAR.candidate_space()
    assert len(space) == len(fp8_matmul.CANDIDATES)
    default = kc.get_kernel_config("fp8_matmul", {"n": 136, "k": 200}, "default")
    bucket = matmul.MatmulBucket("t", {"n": 136, "k": 200}, (1, 8), gemm=fp8_matmul.FP8_LINEAR)
    failures = {str(c): matmul.check_candidate(bucket, c, DEVICE, gen) for c in [default, *space]}
    assert {c: why for c, why in failures.items() if why} == {}


def test_kernel_stage_sweeps_fp8_buckets_end_to_end(tmp_path, monkeypatch):
    """The kernel stage of `pagoda tune` for a model served in FP8 (quick: the first FP8 shape
    and the LM head, before the attention buckets), winners in the profile folder."""
    monkeypatch.delenv(kc.CONFIG_DIR_ENV, raising=False)
    (tmp_path / "config.json").write_text("{}")
    base = _base(str(tmp_path), quantization="fp8", dtype="float32", kv_cache_memory=4 << 20)
    plan = SimpleNamespace(decode_batches=[4], chunk_sizes=[32])
    buckets = kernel_buckets(TINY, base, plan, max_model_len=64, quick=True)
    assert [b.kernel for b in buckets][2:] == ["prefill_attention", "prefill_attention"]
    buckets = buckets[:2]  # the attention sweep has its own tests
    sections = []
    section = run_kernel_stage(
        TINY, base, buckets, label="Test GPU", out=tmp_path / "profile", previous=None,
        deadline=float("inf"), quick=True, progress=lambda _: None, save=sections.append,
    )  # fmt: skip
    kinds = [b["kernel"] for b in section["buckets"]]
    assert kinds == ["fp8_matmul", "matmul"]
    assert section["complete"] and all(
        b["config"] and not b["rejected"] for b in section["buckets"]
    )
    saved = json.loads((tmp_path / "profile" / "Test_GPU.json").read_text())
    assert saved["kernels"]["fp8_matmul"] == [
        {"shape": {"n": 128, "k": 64}, "config": section["buckets"][0]["config"]}
    ]
    assert len(sections) == len(buckets)  # saved after every bucket (resumable)
    kc.clear_config_cache()
