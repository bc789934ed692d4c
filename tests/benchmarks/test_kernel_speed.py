"""benchmarks/kernel_speed.py's rows (its cases are benchmarks/kernel_cases.py's) under Triton's
interpreter (the script itself needs CUDA): each row's arithmetic and the tables, with a
wall-clock timer in place of CUDA's."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("the interpreter run of the MoE rows", allow_module_level=True)


def test_moe_rows_and_table(monkeypatch):
    import kernel_cases
    import kernel_speed

    def wall_us(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    monkeypatch.setattr(kernel_cases, "graph_us", wall_us)
    monkeypatch.setattr(kernel_cases, "bench_us", wall_us)
    shape = (8, 24, 32, 2)  # E, N, K, top-k
    rows = [kernel_cases.moe_row(t, shape, torch.bfloat16, "cpu") for t in (1, 9)]
    assert rows[0].active == 2 and 2 <= rows[1].active <= 8
    for r in rows:
        assert r.invariant_us > 0 and r.by_tokens_us > 0 and r.reference_us > 0
        assert r.max_err < 0.1  # bf16 rounding of the same sums
        moved = (r.active * 3 * 24 * 32 + 2 * r.tokens * 32) * 2
        assert r.gbps == pytest.approx(moved / r.invariant_us / 1e3)
    table = kernel_speed.moe_table(rows, peak=4.8).splitlines()
    assert len(table) == 4 and table[0].startswith("| tokens | active experts |")
    assert table[2].startswith("| 1 | 2 |")


def test_fp8_rows_and_table(monkeypatch):
    import kernel_cases
    import kernel_speed

    calls = []

    def wall_us(fn) -> float:
        calls.append(fn)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    monkeypatch.setattr(kernel_cases, "graph_us", wall_us)
    rows = [kernel_cases.fp8_row("o", 40, 96, t, "cpu") for t in (1, 5)]
    for r in rows:
        assert r.fp8_us > 0 and r.gemm_us > 0 and r.bf16_us > 0
        assert r.cublas_us is None and r.scaled_mm_us is None  # CUDA only
        assert r.max_err < 2e-2  # one bf16 rounding of the same sums
        moved = 40 * 96 + r.tokens * 96 * 2 + r.tokens * 40 * 2
        assert r.gbps == pytest.approx(moved / r.fp8_us / 1e3)
        assert r.tflops == pytest.approx(2 * r.tokens * 40 * 96 / r.fp8_us / 1e6)
    assert len(calls) == 6  # quant + GEMM, GEMM alone, bf16, per row
    table = kernel_speed.fp8_table(rows, peak=4.8).splitlines()
    assert len(table) == 4 and table[0].startswith("| weight | N×K | tokens |")
    assert table[3].startswith("| o | 40×96 | 5 |") and table[3].count("n/a") == 2
    assert kernel_speed.parse_args(["--fp8", ""]).fp8 == ""
    with pytest.raises(SystemExit):
        kernel_speed.parse_args(["--fp8", "llama-9000"])


def test_prefill_and_invariant_decode_rows(monkeypatch):
    """The prefill rows (one per path, SDPA timed once) and the batch-invariant decode rows, on
    tiny shapes: every path agrees with SDPA."""
    import kernel_cases
    import kernel_speed

    timed = []

    def wall_us(fn) -> float:
        timed.append(fn)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    monkeypatch.setattr(kernel_cases, "bench_us", wall_us)
    args = kernel_speed.parse_args(
        ["--heads", "4", "--kv-heads", "2", "--head-dim", "32",
         "--prefill-paths", "flash,flash-invariant,unified"]
    )  # fmt: skip
    rows = kernel_cases.prefill_rows(2, 24, 40, args, torch.float32, "cpu")
    assert [r.case for r in rows] == [
        "prefill chunk (flash)", "prefill chunk (flash-invariant)", "prefill chunk (unified)"
    ]  # fmt: skip
    assert len(timed) == 4  # three paths and SDPA once
    rows += kernel_cases.invariant_decode_rows(3, 33, args, torch.float32, "cpu")
    assert [r.case for r in rows[3:]] == ["decode (flash-invariant)", "decode (unified-invariant)"]
    for r in rows:
        assert r.triton_us > 0 and r.sdpa_us > 0 and r.max_err < 1e-4
    table = kernel_speed.table(rows, peak=None).splitlines()
    assert len(table) == 7 and table[2].startswith("| prefill chunk (flash) | 2 | 24 | 40 |")


def test_prefill_sweep_rows(monkeypatch):
    """--prefill-sweep N: the N fastest candidates (configs from `pagoda tune`'s space), checked
    against SDPA, after the path rows."""
    import kernel_cases
    import kernel_speed
    from pagoda.runtime.tune import kernels as tune_kernels

    def wall_us(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    monkeypatch.setattr(kernel_cases, "bench_us", wall_us)
    space = [
        {"BLOCK_M": m, "TILE_SIZE": t, "num_warps": 4, "num_stages": 2}
        for m, t in ((16, 16), (64, 32), (32, 64))
    ]
    monkeypatch.setattr(tune_kernels, "candidate_space", lambda kernel: space)
    args = kernel_speed.parse_args(
        ["--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--prefill-paths", "flash",
         "--prefill-sweep", "2"]
    )  # fmt: skip
    rows = kernel_cases.prefill_rows(1, 40, 40, args, torch.float32, "cpu")
    assert [r.case.split(" (")[1].split()[0] for r in rows] == ["flash)", "swept", "swept"]
    assert all(r.max_err < 1e-4 for r in rows)
    assert rows[1].triton_us <= rows[2].triton_us
