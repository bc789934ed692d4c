"""Kernel tuning logic on tiny shapes under Triton's interpreter (compiled kernels on CUDA).

The candidate space is three configs per bucket: a good one, one whose kernel is patched to
produce wrong output, and one that is invalid (the launcher raises). Only the good one may win
and be saved; the other two must be rejected with their reason.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch

pytest.importorskip("triton")

from pagoda.kernels import config as kc
from pagoda.kernels import decode_attention, prefill_attention
from pagoda.runtime.tune import sweep
from pagoda.runtime.tune.kernels import DECODE, PREFILL, AttentionShape, Bucket

DEVICE = torch.device("cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu")
SHAPE = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
DECODE_BUCKET = Bucket(DECODE, {"head_dim": 16, "num_seqs": 2, "max_seq_len": 64}, ((1, 64),) * 2)
PREFILL_BUCKET = Bucket(PREFILL, {"head_dim": 16, "max_query_len": 16}, ((16, 40),))
SPLIT = {"waves": 2, "min_tokens_per_split": 16, "max_splits": 2}
GOOD = {DECODE: {"TILE_SIZE": 16, "num_warps": 4, "num_stages": 2, **SPLIT},
        PREFILL: {"BLOCK_M": 16, "TILE_SIZE": 16, "num_warps": 4, "num_stages": 2}}  # fmt: skip
WRONG = {k: {**v, "TILE_SIZE": 64} for k, v in GOOD.items()}  # the patched kernel corrupts these
INVALID = {k: {kk: vv for kk, vv in v.items() if kk != "num_warps"} for k, v in GOOD.items()}
timer = sweep.cuda_timer if DEVICE.type == "cuda" else sweep.wall_timer


@pytest.fixture
def corrupting_kernels(monkeypatch):
    """Both launchers, patched to return slightly wrong attention for TILE_SIZE == 64."""
    calls = []

    def wrap(module, name):
        real = getattr(module, name)

        def patched(**kw):
            calls.append(kw["config"])
            real(**kw)
            if int(kw["config"]["TILE_SIZE"]) == 64:
                kw["out"].mul_(1.02)

        monkeypatch.setattr(module, name, patched)

    wrap(decode_attention, "launch_decode_attention")
    wrap(prefill_attention, "launch_prefill_attention")
    return calls


@pytest.mark.parametrize("bucket", [DECODE_BUCKET, PREFILL_BUCKET], ids=lambda b: b.kernel)
def test_wrong_and_invalid_candidates_are_rejected(corrupting_kernels, bucket):
    k = bucket.kernel
    result = sweep.sweep_bucket(bucket, SHAPE, [WRONG[k], INVALID[k], GOOD[k]], DEVICE, timer=timer)
    assert result.config == GOOD[k]
    assert result.median_ms is not None and result.median_ms > 0
    assert result.default_ms is None  # the baseline (first candidate) was rejected
    assert len(result.rejected) == 2
    assert "wrong output" in result.rejected[0]
    assert "failed: KeyError" in result.rejected[1]


def test_no_candidate_survives_nothing_is_chosen(corrupting_kernels):
    result = sweep.sweep_bucket(DECODE_BUCKET, SHAPE, [WRONG[DECODE]], DEVICE, timer=timer)
    assert result.config is None and result.median_ms is None
    assert result.as_json()["config"] is None


def test_tune_kernels_saves_winners_and_resumes(tmp_path, monkeypatch, corrupting_kernels):
    monkeypatch.delenv(kc.CONFIG_DIR_ENV, raising=False)
    kc.clear_config_cache()
    out = tmp_path / "configs"
    space = lambda kernel: [WRONG[kernel], INVALID[kernel], GOOD[kernel]]  # noqa: E731
    seen: list[str] = []
    reports, complete = sweep.tune_kernels(
        SHAPE, [DECODE_BUCKET, PREFILL_BUCKET], device=DEVICE, device_label="Test GPU",
        out_dir=out, timer=timer, space=space, progress=seen.append,
    )  # fmt: skip
    # the packaged config for the device is the baseline (first candidate): checked and timed too
    baseline = {
        b.kernel: kc.get_kernel_config(b.kernel, b.shape, DEVICE)
        for b in (DECODE_BUCKET, PREFILL_BUCKET)
    }
    assert complete and len(reports) == 2
    for r in reports:
        assert r["config"] in (GOOD[r["kernel"]], baseline[r["kernel"]])  # never WRONG/INVALID
        assert r["default_ms"] > 0 and r["speedup"] >= 1.0
        assert len(r["rejected"]) == 2 and r["candidates"] == 4
    saved = json.loads((out / "Test_GPU.json").read_text())
    for r, b in zip(reports, (DECODE_BUCKET, PREFILL_BUCKET), strict=True):
        assert saved["kernels"][b.kernel] == [{"shape": b.shape, "config": r["config"]}]
    # the runtime finds the tuned bucket when the folder is searched first
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, str(out))
    kc.clear_config_cache()
    assert kc.get_kernel_config(DECODE, DECODE_BUCKET.shape, "Test GPU") == {
        **baseline[DECODE],
        **reports[0]["config"],
    }
    kc.clear_config_cache()
    # resume: buckets already measured are kept, nothing is launched again
    corrupting_kernels.clear()
    again, complete = sweep.tune_kernels(
        SHAPE, [DECODE_BUCKET, PREFILL_BUCKET], device=DEVICE, device_label="Test GPU",
        out_dir=out, previous=reports, timer=timer, space=space, progress=seen.append,
    )  # fmt: skip
    assert again == reports and complete and corrupting_kernels == []
    assert seen[-2:] == [f"{DECODE_BUCKET.label} (kept)", f"{PREFILL_BUCKET.label} (kept)"]


def test_out_of_time_leaves_buckets_for_the_next_run(tmp_path):
    reports, complete = sweep.tune_kernels(
        SHAPE, [DECODE_BUCKET], device=DEVICE, device_label="Test GPU", out_dir=tmp_path,
        deadline=0.0, timer=timer,
    )  # fmt: skip
    assert reports == [] and not complete and not any(tmp_path.iterdir())


def test_default_device_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="default"):
        sweep.tune_kernels(SHAPE, [], device=DEVICE, device_label="default", out_dir=tmp_path)


@pytest.mark.parametrize("bucket", [DECODE_BUCKET, PREFILL_BUCKET], ids=lambda b: b.kernel)
def test_every_shipped_candidate_is_correct(bucket):
    """The space `pagoda tune` tries on a GPU: no config in it is wrong or refused."""
    from pagoda.runtime.tune.kernels import candidate_space

    gen = torch.Generator().manual_seed(1)
    space = candidate_space(bucket.kernel)
    assert len(space) == len({tuple(sorted(c.items())) for c in space}) <= 27
    failures = {str(c): sweep.check_candidate(bucket, SHAPE, c, DEVICE, gen) for c in space}
    assert {c: why for c, why in failures.items() if why} == {}


def test_buckets_follow_the_engine_limits():
    from pagoda.runtime.tune.kernels import MAX_TIMED_TOKENS, plan_buckets

    llama8b = AttentionShape(32, 8, 128, 16, torch.bfloat16)
    buckets = plan_buckets(
        llama8b, max_num_seqs=256, max_model_len=32768, max_num_batched_tokens=2048
    )
    decode = [b.shape for b in buckets if b.kernel == DECODE]
    prefill = [b.shape["max_query_len"] for b in buckets if b.kernel == PREFILL]
    assert {(s["num_seqs"], s["max_seq_len"]) for s in decode} >= {
        (1, 512),
        (64, 8192),
        (256, 2048),
    }
    assert all(s["num_seqs"] * s["max_seq_len"] <= MAX_TIMED_TOKENS for s in decode)
    assert (256, 32768) not in {(s["num_seqs"], s["max_seq_len"]) for s in decode}  # 64 GB of KV
    assert prefill == [16, 64, 512, 2048]


def test_invariant_prefill_buckets_share_the_decode_tile(tmp_path, monkeypatch):
    """Batch-invariant: the prefill kernel's decode and prefill buckets only (every row runs in
    it), and the prefill bucket is swept and saved with the decode bucket's TILE_SIZE."""
    from pagoda.kernels.attention import INVARIANT_PREFILL_LEN
    from pagoda.runtime.tune.kernels import plan_buckets

    llama8b = AttentionShape(32, 8, 128, 16, torch.bfloat16)
    planned = plan_buckets(
        llama8b, max_num_seqs=256, max_model_len=32768, max_num_batched_tokens=2048,
        batch_invariant=True,
    )  # fmt: skip
    assert [(b.kernel, b.shape["max_query_len"], b.invariant) for b in planned] == [
        (PREFILL, 1, True),
        (PREFILL, INVARIANT_PREFILL_LEN, True),
    ]
    assert planned[0].seqs == ((1, 2048),) * 64 and planned[1].seqs == ((2048, 4096),) * 4
    monkeypatch.delenv(kc.CONFIG_DIR_ENV, raising=False)
    kc.clear_config_cache()
    buckets = [
        Bucket(PREFILL, {"head_dim": 16, "max_query_len": 1}, ((1, 40),) * 2, invariant=True),
        Bucket(PREFILL, {"head_dim": 16, "max_query_len": 2048}, ((16, 40),), invariant=True),
    ]
    space = [{**GOOD[PREFILL], "TILE_SIZE": t} for t in (16, 32)]
    reports, complete = sweep.tune_kernels(
        SHAPE, buckets, device=DEVICE, device_label="Test GPU", out_dir=tmp_path, timer=timer,
        space=lambda kernel: space,
    )  # fmt: skip
    assert complete and reports[1]["config"]["TILE_SIZE"] == reports[0]["config"]["TILE_SIZE"]
    assert reports[1]["candidates"] == 2  # the baseline and one BLOCK_M: TILE_SIZE is fixed


def test_invariant_prefill_candidates_must_match_the_decode_bits(monkeypatch):
    """A batch-invariant prefill candidate whose rows round differently from the decode
    launch's (simulated: 1 ulp-sized change, well inside the reference tolerance) is rejected;
    an agreeing one passes."""
    if DEVICE.type == "cpu":  # a GPU's MMA rounds a row alike wherever it sits; make numpy's too
        from triton.runtime import interpreter

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            prod = a.data.astype(d.data.dtype)[..., :, :, None] * b.data.astype(d.data.dtype)
            return interpreter.TensorHandle(prod.sum(axis=-2) + d.data, d.dtype.scalar)

        monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    real = prefill_attention.launch_prefill_attention

    def nudged(**kw):
        real(**kw)
        if kw["config"]["BLOCK_M"] == 64 and not kw.get("one_token_per_seq"):
            kw["out"].mul_(1 + 2**-20)

    monkeypatch.setattr(prefill_attention, "launch_prefill_attention", nudged)
    bucket = Bucket(PREFILL, {"head_dim": 16, "max_query_len": 2048}, ((16, 40),), invariant=True)
    decode = {**GOOD[PREFILL], "TILE_SIZE": 32}
    gen = torch.Generator().manual_seed(0)
    for block_m, verdict in ((16, None), (64, "not batch-invariant")):
        config = {**decode, "BLOCK_M": block_m}
        why = sweep.check_candidate(bucket, SHAPE, config, DEVICE, gen, decode_config=decode)
        assert why == verdict if verdict is None else verdict in why
