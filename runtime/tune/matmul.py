"""Matmul part of the kernel sweep: one launch config per weight shape of the served model.

With ``--batch-invariant`` (the default) every matmul on CUDA runs in ``pagoda.kernels.linear``,
whose launch config is chosen from the weight's ``(N, K)`` alone (that is what keeps a row's bits
independent of M). The matmuls are most of a decode step's forward on a GPU (the H200 profile
of docs/benchmarks.md), and the best tile differs by shape and device: narrow weights at decode
sizes want small tiles, prefill chunks large ones. So each weight shape is a bucket, timed at the
engine's decode batch and at its prefill chunk (summed per row, `time_candidate`: a config must
serve both, since it is fixed for every M), and the fastest correct candidate is saved as that
shape's entry. On CUDA the times come from CUDA-graph replays, as in the engine's decode steps.

A candidate is rejected when it raises, when it disagrees with a float32 reference, or when
a row's bits change with the rows around it (the guarantee the kernel exists for).

The same sweep serves every GEMM of this kind: a `Gemm` states what differs (the kernel's name,
its candidate tiles, how its operands are made, launched and checked). `LINEAR` is the 16-bit
one (``pagoda.kernels.linear``, reference: a float32 torch matmul); `fp8_matmul.FP8_LINEAR` the
FP8 one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pagoda.runtime.tune.results import BucketResult

MATMUL = "matmul"
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); GROUP_M stays 8. Small N tiles give
# decode-sized M parallelism on narrow weights; 128x128 wins prefill on Hopper.
CANDIDATES = [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 32, 128, 4, 4), (64, 64, 128, 4, 3),
              (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 64, 64, 4, 4)]  # fmt: skip
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
MAX_PREFILL_ROWS = 4096  # longer chunks time like this one (the kernel is compute-bound there)

Timer = Callable[[Callable[[], None]], float]  # returns milliseconds
Operands = dict[str, torch.Tensor]  # keyword arguments of the kernel's launcher


@dataclass(frozen=True, eq=False)
class Gemm:
    """What differs between the GEMMs the matmul sweep tunes. Launchers are looked up in
    `pagoda.kernels` at each call (tests patch them there)."""

    kernel: str  # the configs' key, and the buckets'
    candidates: list[tuple[int, int, int, int, int]]  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
    weight_bytes: int  # per weight element, as counted for the L2-rotation copies
    # (n, k, dtype, device, gen) -> one random weight's operands ({"weight": ...})
    weights: Callable[[int, int, torch.dtype, torch.device, torch.Generator], Operands]
    # (float32 random rows on the device, dtype) -> the rows as serving passes them ({"x": ...})
    rows: Callable[[torch.Tensor, torch.dtype], Operands]
    # (config, out=None, **operands) -> [M, N]; the rows in the bucket's dtype or as `rows` made
    launch: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]  # (**operands) -> the float32 result to match
    tolerance: Callable[[torch.dtype], float]  # of the output dtype, relative to max |result|

    def candidate_space(self, quick: bool = False) -> list[dict[str, Any]]:
        """The configs tried per bucket; ``quick``: the first two (smoke tests)."""
        configs = [
            dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, num_warps=w, num_stages=s)
            for m, n, k, w, s in self.candidates
        ]
        return configs[:2] if quick else configs


def _randn(dims: tuple[int, ...], dtype, device, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(dims, generator=gen).to(device=device, dtype=dtype)


def _linear_weights(n: int, k: int, dtype, device, gen: torch.Generator) -> Operands:
    return {"weight": _randn((n, k), dtype, device, gen) / k**0.5}


def _launch_linear(config: dict, out: torch.Tensor | None = None, **operands) -> torch.Tensor:
    from pagoda.kernels import linear

    return linear(**operands, out=out, config=config)


LINEAR = Gemm(
    kernel=MATMUL,
    candidates=CANDIDATES,
    weight_bytes=2,
    weights=_linear_weights,
    rows=lambda x, dtype: {"x": x.to(dtype=dtype)},
    launch=_launch_linear,
    reference=lambda x, weight: x.float() @ weight.float().T,
    tolerance=TOL.__getitem__,
)


@dataclass(frozen=True)
class MatmulBucket:
    """One weight shape of ``gemm`` (its config key ``{"n", "k"}``), timed at ``rows`` =
    (decode, prefill); ``dtype``: the activations' and output's."""

    name: str  # which weights have this shape (report only)
    shape: dict[str, int] = field(hash=False)
    rows: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    gemm: Gemm = LINEAR

    @property
    def kernel(self) -> str:
        return self.gemm.kernel

    @property
    def label(self) -> str:
        return f"{self.kernel} {self.name} n={self.shape['n']} k={self.shape['k']}"


def named_weight_shapes(mc: Any) -> dict[str, tuple[int, int]]:
    """(N, K) of each matmul of a Llama-family layer and of the LM head, by name; Qwen2-MoE's
    and DeepSeek's shared expert (a dense MLP of its own width) and DeepSeek's latent attention
    projections too."""
    h, d = mc.hidden_size, mc.head_dim
    q, kv = mc.num_heads * d, mc.num_kv_heads * d
    out = {
        "qkv": (q + 2 * kv, h),
        "o": (h, q),
        "gate_up": (2 * mc.intermediate_size, h),
        "down": (h, mc.intermediate_size),
        "lm_head": (mc.vocab_size, h),
    }
    shared = getattr(getattr(mc, "family", None), "shared_expert_intermediate_size", 0)
    if shared:
        out.update(shared_gate_up=(2 * shared, h), shared_down=(h, shared))
    m = getattr(getattr(mc, "family", None), "mla", None)
    if m is not None:  # DeepSeek's latent attention (model/deepseek.py): q (or q_a) with kv_a;
        # kv_b_proj is absorbed (batched matmuls per head, not a Linear)
        heads = mc.num_heads
        first = m.q_lora_rank or heads * m.qk_head_dim
        out.update(qkv=(first + m.kv_lora_rank + m.qk_rope_head_dim, h),
                   o=(h, heads * m.v_head_dim))  # fmt: skip
        if m.q_lora_rank:
            out["q_b"] = (heads * m.qk_head_dim, m.q_lora_rank)
    return out


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
    gemm: Gemm = LINEAR,
) -> list[MatmulBucket]:
    """A bucket per weight shape (of ``names``, default all), timed at the largest decode batch
    and prefill chunk."""
    rows = tuple(sorted({max_num_seqs, min(max_num_batched_tokens, MAX_PREFILL_ROWS)}))
    buckets = [
        MatmulBucket(name, {"n": n, "k": k}, rows, dtype, gemm)
        for name, (n, k) in weight_shapes(mc, names).items()
    ]
    return buckets[:1] if quick else buckets


def candidate_space(quick: bool = False) -> list[dict[str, Any]]:
    """The 16-bit GEMM's configs (`Gemm.candidate_space`)."""
    return LINEAR.candidate_space(quick)


def check_candidate(
    bucket: MatmulBucket, config: dict, device: torch.device, gen: torch.Generator
) -> str | None:
    """None when ``config`` matches the GEMM's reference and keeps rows independent of M."""
    gemm = bucket.gemm
    n, k = bucket.shape["n"], bucket.shape["k"]
    w = gemm.weights(n, k, bucket.dtype, device, gen)
    x = _randn((67, k), bucket.dtype, device, gen)  # rows spanning a partial row tile
    try:
        full = gemm.launch(config, x=x, **w)
        alone = gemm.launch(config, x=x[-3:].contiguous(), **w)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a config the compiler or launcher refuses is a rejected candidate
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    want = gemm.reference(x=x, **w)
    got = full.float()
    if not torch.isfinite(got).all():
        return "wrong output: non-finite values"
    err = (got - want).abs().max().item()
    if err > gemm.tolerance(bucket.dtype) * (1.0 + want.abs().max().item()):
        return f"wrong output: max |diff| {err:.3g} > tolerance"
    if not torch.equal(alone, full[-3:]):
        return "not batch-invariant: rows differ when computed alone"
    return None


TimingSet = tuple[Operands, torch.Tensor]  # a launch's operands and its output buffer


def time_candidate(
    bucket: MatmulBucket, config: dict, inputs: list[list[TimingSet]], timer: Timer
) -> float:
    """Milliseconds to put the largest row count's rows through at each of the bucket's row
    counts, summed (rotating through weight copies): per generated token, a decode row and a
    prompt row weigh alike when prompts and outputs are about as long, so a config fast on
    prefill chunks cannot win while a decode step (many per prompt chunk) is slow."""
    launch = bucket.gemm.launch

    def runner(sets: list[TimingSet]) -> Callable[[], None]:
        turn = itertools.count()

        def run() -> None:
            operands, out = sets[next(turn) % len(sets)]
            launch(config, out=out, **operands)

        return run

    most = max(sets[0][1].shape[0] for sets in inputs)
    return sum(timer(runner(sets)) * most / sets[0][1].shape[0] for sets in inputs)


def timing_inputs(
    bucket: MatmulBucket, device: torch.device, gen: torch.Generator
) -> list[list[TimingSet]]:
    """Per row count, (operands, out) over weight copies: on CUDA enough that rotating through
    them exceeds L2, as serving reads each weight once per step."""
    gemm = bucket.gemm
    n, k = bucket.shape["n"], bucket.shape["k"]
    copies = 1
    if device.type == "cuda":
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        copies = min(-(-2 * l2 // (n * k * gemm.weight_bytes)), 8)
    weights = [gemm.weights(n, k, bucket.dtype, device, gen) for _ in range(copies)]
    out = []
    for m in bucket.rows:
        x = gemm.rows(torch.randn((m, k), generator=gen).to(device), bucket.dtype)
        out.append(
            [({**x, **w}, torch.empty(m, n, dtype=bucket.dtype, device=device)) for w in weights]
        )
    return out


def sweep_candidates(
    bucket: Any,
    candidates: list[dict],
    device: torch.device,
    *,
    timer: Timer,
    check: Callable[[Any, dict, torch.device, torch.Generator], str | None],
    inputs: Callable[[Any, torch.device, torch.Generator], list],
    time: Callable[[dict, list, Timer], float],
    seed: int = 0,
) -> BucketResult:
    """Check every candidate (``check``: None, or why it is rejected), time the survivors on one
    set of ``inputs`` (made once, at the first survivor) with ``time``; the first candidate is
    the baseline. The sweep of every GEMM bucket: 16-bit and FP8 matmuls, fused MoE."""
    gen = torch.Generator().manual_seed(seed)
    rejected: list[str] = []
    timed: list[tuple[float, dict]] = []
    baseline_ms = None
    made: list = []
    for i, config in enumerate(candidates):
        why = check(bucket, config, device, gen)
        if why is not None:
            rejected.append(f"{config}: {why}")
            continue
        made = made or inputs(bucket, device, gen)
        timed.append((time(config, made, timer), config))
        if i == 0:
            baseline_ms = round(timed[-1][0], 4)
    if not timed:
        return BucketResult(bucket, None, None, baseline_ms, len(candidates), rejected)
    best_ms, best = min(timed, key=lambda x: x[0])
    return BucketResult(
        bucket, dict(best), round(best_ms, 4), baseline_ms, len(candidates), rejected
    )
