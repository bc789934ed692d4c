"""Smoke run of the quantized-GEMM benchmark: both paths timed, their outputs agreeing (one
layer and the LM head: the whole model's pass took ~20 s here and tests nothing more)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_reports_each_row_count_and_agreement(capsys):
    import cpu_qgemm
    from pagoda.runtime.cpu import qgemm

    if qgemm.load() is None:
        pytest.skip("the quantized GEMM needs AVX2 + FMA + F16C and a C++ compiler")
    assert cpu_qgemm.main(["--rows", "1", "3", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "float32 127 MB, quantized 32 MB" in out  # 3.5 M weights in Q4_1, 28.3 M in Q8_0
    rows = [ln for ln in out.splitlines() if ln.startswith(("| 1 |", "| 3 |"))]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and cells[3].endswith("x")
        assert cells[-1] == "True"
