"""The offline benchmark's HF configurations: parsed, checked, and trimmed only without bf16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import offline_throughput


def test_asked_configurations_are_parsed_in_order():
    assert offline_throughput.hf_configs(["bf16:8", "fp32:32"]) == [("bf16", 8), ("fp32", 32)]


@pytest.mark.parametrize("bad", ["fp16:8", "fp32", "fp32:0", "fp32:x"])
def test_bad_configuration_is_refused_with_the_format(bad):
    with pytest.raises(SystemExit, match="DTYPE:BATCH"):
        offline_throughput.hf_configs([bad])


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_default_drops_bf16_batch_32_only_without_native_bf16(monkeypatch, fast_bf16):
    monkeypatch.setattr(offline_throughput, "cpu_has_fast_bf16", lambda: fast_bf16)
    got = offline_throughput.hf_configs(None)
    assert got[:3] == [("fp32", 8), ("fp32", 32), ("bf16", 8)]
    assert (("bf16", 32) in got) == fast_bf16


@pytest.mark.parametrize("gemm", ["fp32", "bf16"])
def test_report_compares_with_the_peak_of_the_dtype_pagoda_ran(capsys, gemm):
    from types import SimpleNamespace

    ours = {"system": "pagoda (auto)", "seconds": 10.0, "output_tokens": 1000, "tok_s": 100.0}
    ours |= {"peak_blocks": 8, "num_blocks": 64, "shared_blocks_saved": 1, "kv_waste": 0.1}
    ours |= {"prefix_hit_rate": 0.5}
    hf = {"system": "HF generate (fp32, batch 8)", "seconds": 40.0, "tok_s": 25.0}
    peaks = {"dtype": gemm, gemm: 100e9, f"{gemm}_after": 200e9, "fp32": 100e9}
    loaded = SimpleNamespace(config=SimpleNamespace(num_params=1e9))
    offline_throughput.report([ours, hf], peaks, loaded, n_prompt=0)
    out = capsys.readouterr().out
    assert "pagoda / best HF (HF generate (fp32, batch 8)): 4.00x" in out
    # 2e9 FLOP per token x 100 tok/s = 200 GFLOP/s: all of the best of the two peaks
    assert f"200 GFLOP/s of weight matmuls = 100% of the {gemm} GEMM peak (200 GFLOP/s" in out
    assert ("of fp32 (100 GFLOP/s)" in out) == (gemm == "bf16")
