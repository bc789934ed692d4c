"""Smoke run of benchmarks/weights_estimate.py with --small on the CPU: every case's weight count
equals what the built model holds (the script's GPU run is the same code on CUDA)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_small_cases_match_the_built_models(capsys):
    import weights_estimate

    rows = weights_estimate.main(["--small", "--device", "cpu"])
    assert {r["case"] for r in rows} >= {"llama-tied", "llama-untied", "qwen3moe",
                                         "llama-untied fp8-channel checkpoint",
                                         "llama-untied fp8-block checkpoint"}  # fmt: skip
    assert all(abs(r["ratio"] - 1) <= weights_estimate.TOLERANCE for r in rows), rows
    assert "| llama-tied |" in capsys.readouterr().out
