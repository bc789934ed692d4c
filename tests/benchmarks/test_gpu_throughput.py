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


def test_moe_shape_floor_counts_the_active_experts():
    """Qwen3-30B-A3B's floor: every expert at a full batch of 256, a few at batch 1."""
    import gpu_throughput
    from common import checkpoint_shapes

    cfg = gpu_throughput.SHAPES["qwen3-30b-a3b"]
    shapes = checkpoint_shapes(cfg, gpu_throughput.ARCHITECTURES["qwen3-30b-a3b"])
    params = sum(s.numel() for s in shapes.values())
    assert 30.4e9 < params < 30.6e9  # the published 30.5B
    assert gpu_throughput.active_experts(cfg, 256) > 127.9
    assert 7.7 < gpu_throughput.active_experts(cfg, 1) <= 8.0 + 1e-9
    # bandwidth 1 GB/s and no context: the floor in ms is the bytes read / 1e6
    full = gpu_throughput.memory_floor_ms(cfg, 2, 0, 1e9, batch=256) * 1e6
    embed = cfg["vocab_size"] * cfg["hidden_size"] * 2  # gathered rows, not read whole
    norms = sum(s.numel() for n, s in shapes.items() if len(s) == 1) * 2
    assert abs(full - (2 * params - embed - norms)) < 0.001 * full
    one = gpu_throughput.memory_floor_ms(cfg, 2, 0, 1e9, batch=1) * 1e6
    assert 0.1 < one / full < 0.15  # ~3.3B active parameters of 30.5B
    llama = gpu_throughput.SHAPES["1b"]  # dense shapes: the batch does not matter
    assert gpu_throughput.memory_floor_ms(llama, 2, 10, 1e9, batch=1) == (
        gpu_throughput.memory_floor_ms(llama, 2, 10, 1e9, batch=256)
    )


def test_lazy_random_weights_have_the_checkpoints_names_and_shapes(tmp_path):
    """What `--shape qwen3-30b-a3b` feeds the engine instead of a 61 GB checkpoint: the names
    and shapes `save_pretrained` writes, drawn the same on every read."""
    import gpu_throughput
    import torch
    from common import RandomWeights, checkpoint_shapes, write_random_model
    from safetensors import safe_open

    cfg, arch = gpu_throughput.SHAPES["tiny-moe"], gpu_throughput.ARCHITECTURES["tiny-moe"]
    write_random_model(tmp_path, cfg, torch.float32, arch)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    shapes = checkpoint_shapes(cfg, arch)
    assert {k: tuple(v) for k, v in shapes.items()} == saved
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in saved
    weights = RandomWeights(shapes, torch.bfloat16, "cpu")
    name = "model.layers.0.mlp.experts.3.gate_proj.weight"
    w = weights[name]
    assert w.dtype == torch.bfloat16 and tuple(w.shape) == saved[name]
    assert torch.equal(w, weights[name]) and 0.01 < w.float().std() < 0.03
    assert (weights["model.norm.weight"] == 1).all() and len(weights) == len(saved)
    assert name in weights and "model.layers.0.mlp.experts.8.up_proj.weight" not in weights


@pytest.mark.timeout(300)
def test_tiny_moe_run(capsys):
    """The MoE shape's path end to end (random Qwen3-MoE, floor with active experts)."""
    import gpu_throughput

    res = gpu_throughput.main(["--tiny", "--shape", "qwen3-30b-a3b", "--hf-requests", "2"])
    assert res["tok_s"] > 0 and res["full_batch"] == 8 and 0 < res["floor_ms"] < res["step_ms"]
    assert 7.0 < res["active_experts"] <= 8.0  # 8 sequences x top-2 of 8 experts
    assert "experts active per layer" in capsys.readouterr().out
