"""FP8 GEMM part of the kernel sweep: one launch config per FP8 weight shape of the served model.

It runs only when the served model runs FP8: the engine's ``quantization="fp8"``, or a checkpoint
whose ``config.json`` declares an FP8 ``quantization_config`` (`pagoda.runtime.quantization.fp8`).
The decoder layers' projections (qkv, o, gate_up, down) then run in
`pagoda.kernels.fp8_matmul.fp8_linear`, whose config, like the bf16 matmul's, is chosen from the
weight's ``(N, K)`` alone (kernel ``fp8_matmul``); the LM head stays 16-bit (a ``matmul`` bucket).
Each shape is a bucket timed at the engine's decode batch and at its prefill chunk, summed per
row (`tune.matmul.time_candidate`'s weighing), on activations already in FP8: the per-token
quantization before the GEMM costs the same under every config.

A candidate is rejected when it raises, when it disagrees with the torch reference
(`pagoda.kernels.fp8.fp8_linear`: dequantize, multiply in float32) on fresh random bf16
activations quantized per token as in serving, or when a row's bits change with the rows around
it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pagoda.runtime.tune.matmul import MAX_PREFILL_ROWS, weight_shapes

FP8_MATMUL = "fp8_matmul"
FP8_LAYERS = ("qkv", "o", "gate_up", "down")  # the LM head stays 16-bit
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); GROUP_M stays 8. FP8 MMAs take K in steps
# of 32 and move half the bytes of bf16 per element, so K tiles are twice the bf16 sweep's.
CANDIDATES = [(64, 64, 128, 4, 3), (64, 128, 128, 4, 4), (64, 32, 128, 4, 4), (64, 64, 256, 4, 3),
              (128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (128, 64, 128, 4, 4)]  # fmt: skip
TOL = 2e-2  # bf16 output: a rounding of the result plus float32 sums in another order

Timer = Callable[[Callable[[], None]], float]  # returns milliseconds


@dataclass(frozen=True)
class Fp8Bucket:
    """One FP8 weight shape (config key ``{"n", "k"}``), timed at ``rows`` = (decode, prefill);
    ``dtype``: the activations' and output's dtype."""

    name: str
    shape: dict[str, int] = field(hash=False)
    rows: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    kernel: str = FP8_MATMUL

    @property
    def label(self) -> str:
        return f"fp8_matmul {self.name} n={self.shape['n']} k={self.shape['k']}"


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
) -> list[Fp8Bucket]:
    """A bucket per FP8 weight shape, timed at the largest decode batch and prefill chunk."""
    rows = tuple(sorted({max_num_seqs, min(max_num_batched_tokens, MAX_PREFILL_ROWS)}))
    buckets = [
        Fp8Bucket(name, {"n": n, "k": k}, rows, dtype)
        for name, (n, k) in weight_shapes(mc, FP8_LAYERS).items()
    ]
    return buckets[:1] if quick else buckets


def candidate_space(quick: bool = False) -> list[dict[str, Any]]:
    configs = [
        dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, num_warps=w, num_stages=s)
        for m, n, k, w, s in CANDIDATES
    ]
    return configs[:2] if quick else configs


def _weights(
    n: int, k: int, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, ...]:
    from pagoda.kernels.fp8 import quantize_weight

    return quantize_weight((torch.randn((n, k), generator=gen) / k**0.5).to(device))


def check_candidate(
    bucket: Fp8Bucket, config: dict, device: torch.device, gen: torch.Generator
) -> str | None:
    """None when ``config`` matches the reference and keeps rows independent of M."""
    from pagoda.kernels import fp8, fp8_linear

    n, k = bucket.shape["n"], bucket.shape["k"]
    wq, ws = _weights(n, k, device, gen)
    x = torch.randn((67, k), generator=gen).to(device=device, dtype=bucket.dtype)
    try:
        full = fp8_linear(x=x, weight=wq, weight_scale=ws, config=config)
        alone = fp8_linear(x=x[-3:].contiguous(), weight=wq, weight_scale=ws, config=config)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a config the compiler or launcher refuses is a rejected candidate
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    want = fp8.fp8_linear(x=x, weight=wq, weight_scale=ws, out_dtype=torch.float32)
    got = full.float()
    if not torch.isfinite(got).all():
        return "wrong output: non-finite values"
    err = (got - want).abs().max().item()
    if err > TOL * (1.0 + want.abs().max().item()):
        return f"wrong output: max |diff| {err:.3g} > tolerance"
    if not torch.equal(alone, full[-3:]):
        return "not batch-invariant: rows differ when computed alone"
    return None


def timing_inputs(
    bucket: Fp8Bucket, device: torch.device, gen: torch.Generator
) -> list[list[tuple[torch.Tensor, ...]]]:
    """Per row count, (x, x_scale, weight, weight_scale, out) over weight copies: on CUDA
    enough that rotating through them exceeds L2, as serving reads each weight once per step."""
    from pagoda.kernels.fp8 import quantize_per_token

    n, k = bucket.shape["n"], bucket.shape["k"]
    copies = 1
    if device.type == "cuda":
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        copies = min(-(-2 * l2 // (n * k)), 8)
    weights = [_weights(n, k, device, gen) for _ in range(copies)]
    out = []
    for m in bucket.rows:
        xq, xs = quantize_per_token(torch.randn((m, k), generator=gen).to(device))
        y = torch.empty(m, n, dtype=bucket.dtype, device=device)
        out.append([(xq, xs, wq, ws, y) for wq, ws in weights])
    return out


def time_candidate(
    config: dict, inputs: list[list[tuple[torch.Tensor, ...]]], timer: Timer
) -> float:
    """Milliseconds for the largest row count's rows at each timed row count, summed (a decode
    row and a prompt row weigh alike, as in `tune.matmul.time_candidate`)."""
    from pagoda.kernels import fp8_linear

    def runner(sets: list[tuple[torch.Tensor, ...]]) -> Callable[[], None]:
        turn = itertools.count()

        def run() -> None:
            x, xs, w, ws, out = sets[next(turn) % len(sets)]
            fp8_linear(x=x, x_scale=xs, weight=w, weight_scale=ws, out=out, out_dtype=out.dtype,
                       config=config)  # fmt: skip

        return run

    most = max(sets[0][0].shape[0] for sets in inputs)
    return sum(timer(runner(sets)) * most / sets[0][0].shape[0] for sets in inputs)
