"""Smoke run of the image-input benchmark with tiny settings: every configuration's row is
printed, the tokens agree across configurations (the script asserts it), and the images the
tower encoded are the counts the encoder cache must give (no timings asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.slow
def test_vision_serving_counts_encoded_images(capsys):
    import vision_serving

    argv = ["--requests", "6", "--images", "2", "--size", "56", "--tokens", "2"]
    assert vision_serving.main([*argv, "--rounds", "1", "--max-num-seqs", "2"]) == 0
    out = capsys.readouterr().out
    rows = {
        (c[0], c[1]): c
        for ln in out.splitlines()
        if ln.startswith("| 2 shared") or ln.startswith("| 6 distinct")
        for c in [[x.strip() for x in ln.strip("|").split("|")]]
    }
    assert len(rows) == 8
    encoded = {k: int(c[2]) for k, c in rows.items()}
    # two requests a step: without the cache each step encodes its two pictures again
    assert encoded["2 shared", "prefix off, encoder cache 0"] == 6
    assert encoded["2 shared", "prefix off, encoder cache"] == 2
    assert encoded["2 shared", "prefix on, encoder cache"] <= 2
    for label in ("prefix off, encoder cache 0", "prefix off, encoder cache"):
        assert encoded["6 distinct", label] == 6
    for c in rows.values():
        assert float(c[4]) > 0 and float(c[5]) > 0  # requests/s, output tok/s
        assert 0 < float(c[6]) <= float(c[7])  # TTFT p50 <= p99
