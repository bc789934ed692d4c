"""FP8 GEMM part of the kernel sweep: one launch config per FP8 weight shape of the served model.

It runs only when the served model runs FP8: the engine's ``quantization="fp8"``, or a checkpoint
whose ``config.json`` declares an FP8 ``quantization_config`` (`pagoda.runtime.quantization.fp8`).
The decoder layers' projections (qkv, o, gate_up, down) then run in
`pagoda.kernels.fp8_matmul.fp8_linear`, whose config, like the bf16 matmul's, is chosen from the
weight's ``(N, K)`` alone (kernel ``fp8_matmul``); the LM head stays 16-bit (a ``matmul`` bucket).
Each shape is a bucket timed at the engine's decode batch and at its prefill chunk, summed per
row (`tune.matmul.time_candidate`'s weighing), on activations already in FP8: the per-token
quantization before the GEMM costs the same under every config. The sweep is `tune.matmul`'s;
this module states what differs (`FP8_LINEAR`).

A candidate is rejected when it raises, when it disagrees with the torch reference
(`pagoda.kernels.fp8.fp8_linear`: dequantize, multiply in float32) on fresh random bf16
activations quantized per token as in serving, or when a row's bits change with the rows around
it.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from pagoda.runtime.tune.matmul import Gemm, MatmulBucket, Operands, plan_matmul_buckets

FP8_MATMUL = "fp8_matmul"
# the LM head stays 16-bit; Qwen2-MoE's shared expert runs in FP8 (moe.SharedExpertMoE), and
# DeepSeek's latent attention projections (model/deepseek.py; kv_b is absorbed, not a Linear)
FP8_LAYERS = ("qkv", "o", "gate_up", "down", "shared_gate_up", "shared_down", "q_b")
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); GROUP_M stays 8. FP8 MMAs take K in steps
# of 32 and move half the bytes of bf16 per element, so K tiles are twice the bf16 sweep's.
CANDIDATES = [(64, 64, 128, 4, 3), (64, 128, 128, 4, 4), (64, 32, 128, 4, 4), (64, 64, 256, 4, 3),
              (128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (128, 64, 128, 4, 4)]  # fmt: skip
TOL = 2e-2  # bf16 output: a rounding of the result plus float32 sums in another order


def _weights(n: int, k: int, dtype: Any, device: torch.device, gen: torch.Generator) -> Operands:
    """A random weight quantized per output channel (whatever the activations' ``dtype``)."""
    from pagoda.kernels.fp8 import quantize_weight

    wq, ws = quantize_weight((torch.randn((n, k), generator=gen) / k**0.5).to(device))
    return {"weight": wq, "weight_scale": ws}


def _rows(x: torch.Tensor, dtype: Any) -> Operands:
    """Activations as serving hands them to the GEMM: quantized per token already."""
    from pagoda.kernels.fp8 import quantize_per_token

    xq, xs = quantize_per_token(x)
    return {"x": xq, "x_scale": xs}


def _launch(config: dict, out: torch.Tensor | None = None, **operands) -> torch.Tensor:
    from pagoda.kernels import fp8_linear

    out_dtype = None if out is None else out.dtype
    return fp8_linear(**operands, out=out, out_dtype=out_dtype, config=config)


def _reference(**operands) -> torch.Tensor:
    """`pagoda.kernels.fp8.fp8_linear`: dequantize, multiply in float32."""
    from pagoda.kernels import fp8

    return fp8.fp8_linear(**operands, out_dtype=torch.float32)


FP8_LINEAR = Gemm(
    kernel=FP8_MATMUL,
    candidates=CANDIDATES,
    weight_bytes=1,
    weights=_weights,
    rows=_rows,
    launch=_launch,
    reference=_reference,
    tolerance=lambda dtype: TOL,
)


def model_serves_fp8(model: str, quantization: str | None) -> bool:
    """Whether serving ``model`` with engine ``quantization`` runs its linear layers in FP8."""
    if quantization is not None:
        return True
    from pagoda.runtime.model.loader import resolve_model_path
    from pagoda.runtime.quantization.fp8 import scheme_from_hf_config

    path = resolve_model_path(model)
    config = path / "config.json" if path.is_dir() else None
    if config is None or not config.is_file():
        return False
    return scheme_from_hf_config(json.loads(config.read_text())) is not None


def plan_fp8_buckets(
    mc: Any, dtype: torch.dtype, *, max_num_seqs: int, max_num_batched_tokens: int, quick: bool
) -> list[MatmulBucket]:
    """A bucket per FP8 weight shape, timed at the largest decode batch and prefill chunk."""
    return plan_matmul_buckets(
        mc, dtype, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        quick=quick, names=FP8_LAYERS, gemm=FP8_LINEAR,
    )  # fmt: skip
