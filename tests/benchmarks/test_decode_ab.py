"""Smoke run of the engine-level kernel A/B against this commit's own kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.slow
def test_two_engines_alternate_and_agree_on_tokens(capsys):
    import decode_ab
    from pagoda.runtime.cpu import attention as cpu_attention

    argv = ["--old-ref", "HEAD", "--seqs", "3", "--context", "40", "--blocks", "2"]
    assert decode_ab.main([*argv, "--block-steps", "2"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| 3 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    if cpu_attention.load() is not None:
        assert "attention" in cells[1]  # the old build really replaced the engine's kernel
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and cells[4].endswith("x")
    assert cells[5] == "True"  # HEAD's kernels and this tree's give the same tokens
