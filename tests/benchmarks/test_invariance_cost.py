"""Smoke run of benchmarks/invariance_cost.py --tiny under Triton's interpreter: both tables
come out, and the invariant kernels' rows are what the fast path's should be on the CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_tiny_run_reports_gemm_and_attention_tables(capsys):
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the --tiny run is the CPU smoke test; on CUDA run the full benchmark")
    import invariance_cost

    res = invariance_cost.main(["--tiny", "--reps", "2"])
    assert [r[2] for r in res["gemm"]] == [1, 5]
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in res["gemm"])
    assert len(res["attention"]) == 1 and float(res["attention"][0][3]) > 0
    out = capsys.readouterr().out
    assert "machine: " in out and "cuBLAS us" in out and "invariant KV GB/s" in out
