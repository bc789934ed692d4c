"""Smoke run of benchmarks/sampler_ab.py: a commit's native sampler built from its own sources
beside this tree's, on every row kind; against a commit whose sources are this tree's, the two
libraries must pick the same tokens on every row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pagoda.runtime.sampling import native

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
pytestmark = pytest.mark.skipif(not native.available(), reason="no native kernels")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_head_beside_this_tree_reports_every_row_kind(capsys):
    import sampler_ab

    same_source = sampler_ab.library_at("HEAD", sampler_ab.BUILD) == native._build()
    sampler_ab.main(["--old-ref", "HEAD", "--rows", "16", "--vocab", "8192", "--rounds", "1",
                     "--reps", "1", "--top-k", "700"])  # fmt: skip
    out = capsys.readouterr().out
    assert "machine: " in out and "before = HEAD" in out
    rows = [ln.strip("|").split("|") for ln in out.splitlines() if "σ" in ln or "peaked" in ln]
    assert len(rows) == 10  # 4 sigmas and a peaked row, in bf16 and float32
    for cells in rows:
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and cells[3].strip().endswith("x")
        if same_source:  # a clean checkout: the same C source, so the same tokens
            assert cells[4].strip() == "yes"
