"""Matmul part of the kernel sweep: one launch config per weight shape of the served model.

With ``--batch-invariant`` (the default) every matmul on CUDA runs in ``pagoda.kernels.linear``,
whose launch config is chosen from the weight's ``(N, K)`` alone (that is what keeps a row's bits
independent of M). The matmuls are most of a decode step's forward on a GPU (the H200 profile
of docs/benchmarks.md), and the best tile differs by shape and device: narrow weights at decode
sizes want small tiles, prefill chunks large ones. So each weight shape is a bucket, timed at the
engine's decode batch and at its prefill chunk (summed per row, `time_candidate`: a config must
serve both, since it is fixed for every M), and the fastest correct candidate is saved as that
shape's entry. On CUDA the times come from CUDA-graph replays, as in the engine's decode steps.

A candidate is rejected when it raises, when it disagrees with a float32 torch matmul, or when
a row's bits change with the rows around it (the guarantee the kernel exists for).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

MATMUL = "matmul"
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); GROUP_M stays 8. Small N tiles give
# decode-sized M parallelism on narrow weights; 128x128 wins prefill on Hopper.
CANDIDATES = [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 32, 128, 4, 4), (64, 64, 128, 4, 3),
              (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 64, 64, 4, 4)]  # fmt: skip
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
MAX_PREFILL_ROWS = 4096  # longer chunks time like this one (the kernel is compute-bound there)

Timer = Callable[[Callable[[], None]], float]  # returns milliseconds


@dataclass(frozen=True)
class MatmulBucket:
    """One weight shape (its config key ``{"n", "k"}``), timed at ``rows`` = (decode, prefill)."""

    name: str  # which weights have this shape (report only)
    shape: dict[str, int] = field(hash=False)
    rows: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    kernel: str = MATMUL

    @property
    def label(self) -> str:
        return f"matmul {self.name} n={self.shape['n']} k={self.shape['k']}"


def named_weight_shapes(mc: Any) -> dict[str, tuple[int, int]]:
    """(N, K) of each matmul of a Llama-family layer and of the LM head, by name."""
    h, d = mc.hidden_size, mc.head_dim
    q, kv = mc.num_heads * d, mc.num_kv_heads * d
    return {
        "qkv": (q + 2 * kv, h),
        "o": (h, q),
        "gate_up": (2 * mc.intermediate_size, h),
        "down": (h, mc.intermediate_size),
        "lm_head": (mc.vocab_size, h),
    }


def weight_shapes(mc: Any, names: tuple[str, ...] | None = None) -> dict[str, tuple[int, int]]:
    """The shapes of :func:`named_weight_shapes` (those in ``names``, default all); weights of
    one shape share a bucket (and its config), named together."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, nk in named_weight_shapes(mc).items():
        if names is None or name in names:
            shapes.setdefault(nk, []).append(name)
    return {"+".join(names): nk for nk, names in shapes.items()}


def plan_matmul_buckets(
    mc: Any,
    dtype: torch.dtype,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    quick: bool,
    names: tuple[str, ...] | None = None,
) -> list[MatmulBucket]:
    """A bucket per weight shape (of ``names``, default all), timed at the largest decode batch
    and prefill chunk."""
    rows = (max_num_seqs, min(max_num_batched_tokens, MAX_PREFILL_ROWS))
    rows = tuple(sorted(set(rows)))
    buckets = [
        MatmulBucket(name, {"n": n, "k": k}, rows, dtype)
        for name, (n, k) in weight_shapes(mc, names).items()
    ]
    return buckets[:1] if quick else buckets


def candidate_space(quick: bool = False) -> list[dict[str, Any]]:
    configs = [
        dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, num_warps=w, num_stages=s)
        for m, n, k, w, s in CANDIDATES
    ]
    return configs[:2] if quick else configs


def check_candidate(
    bucket: MatmulBucket, config: dict, device: torch.device, gen: torch.Generator
) -> str | None:
    """None when ``config`` matches a float32 matmul and keeps rows independent of M."""
    from pagoda.kernels import linear

    n, k = bucket.shape["n"], bucket.shape["k"]
    w = _randn((n, k), bucket.dtype, device, gen) / k**0.5
    x = _randn((67, k), bucket.dtype, device, gen)  # rows spanning a partial row tile
    try:
        full = linear(x=x, weight=w, config=config)
        alone = linear(x=x[-3:].contiguous(), weight=w, config=config)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a config the compiler or launcher refuses is a rejected candidate
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    want = x.float() @ w.float().T
    got = full.float()
    if not torch.isfinite(got).all():
        return "wrong output: non-finite values"
    err = (got - want).abs().max().item()
    if err > TOL[bucket.dtype] * (1.0 + want.abs().max().item()):
        return f"wrong output: max |diff| {err:.3g} > tolerance"
    if not torch.equal(alone, full[-3:]):
        return "not batch-invariant: rows differ when computed alone"
    return None


def _randn(dims: tuple[int, ...], dtype, device, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(dims, generator=gen).to(device=device, dtype=dtype)


def time_candidate(
    config: dict, inputs: list[list[tuple[torch.Tensor, ...]]], timer: Timer
) -> float:
    """Milliseconds to put the largest row count's rows through at each of the bucket's row
    counts, summed (rotating through weight copies): per generated token, a decode row and a
    prompt row weigh alike when prompts and outputs are about as long, so a config fast on
    prefill chunks cannot win while a decode step (many per prompt chunk) is slow."""
    from pagoda.kernels import linear

    def runner(xs: list[tuple[torch.Tensor, ...]]) -> Callable[[], None]:
        turn = itertools.count()

        def run() -> None:
            x, w, out = xs[next(turn) % len(xs)]
            linear(x=x, weight=w, out=out, config=config)

        return run

    most = max(xs[0][0].shape[0] for xs in inputs)
    return sum(timer(runner(xs)) * most / xs[0][0].shape[0] for xs in inputs)


def timing_inputs(
    bucket: MatmulBucket, device: torch.device, gen: torch.Generator
) -> list[list[tuple[torch.Tensor, ...]]]:
    """Per row count, (x, weight, out) copies; on CUDA enough weights that rotating through
    them exceeds L2, as serving reads each weight once per step."""
    n, k = bucket.shape["n"], bucket.shape["k"]
    copies = 1
    if device.type == "cuda":
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        copies = min(-(-2 * l2 // (n * k * 2)), 8)
    weights = [_randn((n, k), bucket.dtype, device, gen) / k**0.5 for _ in range(copies)]
    out = []
    for m in bucket.rows:
        x = _randn((m, k), bucket.dtype, device, gen)
        out.append([(x, w, torch.empty(m, n, dtype=bucket.dtype, device=device)) for w in weights])
    return out
