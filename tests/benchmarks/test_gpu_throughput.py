"""Smoke run of benchmarks/gpu_throughput.py with --tiny on CPU: the whole path (random model
written as an HF directory, nano-vllm's workload, step timing, memory floor, HF baseline) runs
and reports numbers that add up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.timeout(120)
def test_tiny_run_reports_throughput_floor_and_baseline(capsys, tmp_path):
    import gpu_throughput

    argv = ["--tiny", "--also-async", "--kernel-profile", "3", "--kernel-config-dir", str(tmp_path)]
    res = gpu_throughput.main(argv)
    reqs = gpu_throughput.workload(8, 8, 32, 512, 0)
    assert res["output_tokens"] == sum(out for _, out in reqs)  # ignore_eos: every token counts
    assert res["tok_s"] > 0 and res["hf_tok_s"] > 0
    assert res["full_batch"] == 8 and res["step_ms"] > 0
    assert 0 < res["floor_ms"] < res["step_ms"]
    assert res["async"]["output_tokens"] == res["output_tokens"]  # the async engine's run
    assert res["async"]["full_batch"] == 8
    assert res["tuned"]["output_tokens"] == res["output_tokens"]  # --kernel-config-dir's run
    kernels = res["kernels"]  # CPU operators here; CUDA kernels on a GPU
    assert kernels and all(k["ms_per_step"] > 0 and k["calls_per_step"] > 0 for k in kernels)
    assert 0 < sum(k["share"] for k in kernels) <= 1 + 1e-9
    out = capsys.readouterr().out
    assert "kernel profile, steps from 2" in out
    assert "machine: " in out and "memory floor" in out and "HF generate" in out
    assert "Pagoda --async-scheduling: " in out and f"Pagoda kernels from {tmp_path}: " in out
