"""Smoke run of the GEMV before/after benchmark against this commit's own kernel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_before_after_reports_each_row_count_with_equal_bits(capsys):
    import cpu_gemv
    from pagoda.runtime.cpu import gemv
    from pagoda.runtime.model.linear import _pack

    if gemv.load(_pack) is None:
        pytest.skip("the CPU GEMV needs AVX-512 BF16")
    assert cpu_gemv.main(["--old-ref", "HEAD", "--rows", "1", "24", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith(("| 1 |", "| 24 |"))]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and cells[3].endswith("x")
        assert cells[4] == "True"  # HEAD's kernel and this tree's give the same bits
