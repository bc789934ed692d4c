"""Fused-MoE part of the kernel sweep: launch configs for the served model's expert shape.

It runs only for a model with MoE layers: the expert count, the expert FFN width, the hidden
size and top-k come from the Hugging Face ``config.json`` (Qwen3-MoE: ``num_experts``,
``moe_intermediate_size``; Mixtral: ``num_local_experts``, ``intermediate_size``; both
``num_experts_per_tok``), or from attributes of those names on the model config (GGUF).

Buckets follow ``pagoda.kernels.fused_moe``'s lookup. With ``--batch-invariant`` (the default)
every batch uses one config per expert shape (the ``INVARIANT_TOKENS`` bucket), so one bucket
is timed at the decode batch and at the prefill chunk, summed per token as the matmuls are (a
config must serve both). Without it, one bucket per token count the engine reaches (decode
batches and the chunk), each timed at its own count. Routing in the timed batches is uniform
random top-k, so a full decode batch touches about every expert, as in serving.

A candidate is rejected when it raises, disagrees with the torch reference
(``pagoda.kernels.fused_moe_reference``) on fresh random inputs that leave some experts empty,
or gives a token different bits alone than among the others.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FUSED_MOE = "fused_moe"
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages). Decode gives ~T*top_k/E rows per
# expert (16 at 256 x 8 / 128): 16-row tiles, wide N for weight streaming; prefill wants 64+.
CANDIDATES = [(16, 64, 64, 8, 4, 3), (16, 128, 64, 1, 4, 3), (16, 64, 128, 1, 4, 4),
              (32, 64, 64, 8, 4, 4), (64, 64, 64, 8, 4, 3), (64, 128, 64, 8, 4, 3),
              (64, 128, 128, 8, 8, 3), (128, 128, 64, 8, 8, 3)]  # fmt: skip
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
MAX_PREFILL_TOKENS = 4096  # longer chunks time like this one (compute-bound)
DECODE_TOKENS = (1, 16, 64, 256)
CHECK_TOKENS = 37  # fresh check batch: partial tiles, some experts empty

Timer = Callable[[Callable[[], None]], float]  # returns milliseconds


@dataclass(frozen=True)
class MoeShape:
    """The expert geometry of one MoE model (every MoE layer shares it)."""

    num_experts: int
    intermediate: int  # N: one expert's FFN width
    hidden: int  # K
    top_k: int

    def __post_init__(self) -> None:
        values = (self.num_experts, self.intermediate, self.hidden, self.top_k)
        if any(not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"MoE shape must be positive integers: {self}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} > num_experts {self.num_experts}")


def moe_shape_from_hf(cfg: Mapping[str, Any]) -> MoeShape | None:
    """The expert shape of a Hugging Face config dict; None for a dense model."""
    cfg = cfg.get("text_config") or cfg
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not experts:
        return None
    inter = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    top_k, hidden = cfg.get("num_experts_per_tok"), cfg.get("hidden_size")
    if not (inter and top_k and hidden):
        raise ValueError(
            f"MoE config with {experts} experts lacks num_experts_per_tok, hidden_size or "
            "moe_intermediate_size/intermediate_size"
        )
    return MoeShape(int(experts), int(inter), int(hidden), int(top_k))


def model_moe_shape(model: str, model_config: Any) -> MoeShape | None:
    """The served model's expert shape: its ``config.json`` when it is a directory, else the
    model config's (`ModelConfig.family`)."""
    from pagoda.runtime.model.loader import resolve_model_path

    path = resolve_model_path(model)
    if path.is_dir() and (path / "config.json").is_file():
        return moe_shape_from_hf(json.loads((path / "config.json").read_text()))
    f = model_config.family  # a GGUF: the loader's reading of its expert keys
    if not f.num_experts:
        return None
    return moe_shape_from_hf({
        "num_experts": f.num_experts, "moe_intermediate_size": f.moe_intermediate_size,
        "hidden_size": model_config.hidden_size, "num_experts_per_tok": f.num_experts_per_tok,
    })  # fmt: skip


@dataclass(frozen=True)
class MoeBucket:
    """One config bucket (``shape`` is its lookup key), timed at ``tokens`` token counts."""

    moe: MoeShape
    shape: dict[str, int] = field(hash=False)
    tokens: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    kernel: str = FUSED_MOE

    @property
    def label(self) -> str:
        m = self.moe
        return (f"fused_moe E={m.num_experts} N={m.intermediate} K={m.hidden} top{m.top_k} "
                f"tokens={self.shape['tokens']}")  # fmt: skip


def plan_moe_buckets(
    moe: MoeShape | None,
    dtype: torch.dtype,
    *,
    batch_invariant: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    quick: bool,
) -> list[MoeBucket]:
    """Nothing for a dense model; else the buckets serving reaches (module docstring)."""
    if moe is None:
        return []
    from pagoda.kernels.fused_moe import INVARIANT_TOKENS, moe_config_shape

    def key(tokens: int) -> dict[str, int]:
        return moe_config_shape(
            num_experts=moe.num_experts, intermediate=moe.intermediate, hidden=moe.hidden,
            dtype=dtype, num_tokens=tokens,
        )  # fmt: skip

    chunk = min(max_num_batched_tokens, MAX_PREFILL_TOKENS)
    if batch_invariant:
        timed = tuple(sorted({max_num_seqs, chunk}))
        return [MoeBucket(moe, key(INVARIANT_TOKENS), timed, dtype)]
    counts = sorted({t for t in DECODE_TOKENS if t <= max_num_seqs} | {max_num_seqs, chunk})
    buckets = [MoeBucket(moe, key(t), (t,), dtype) for t in counts]
    return buckets[:1] if quick else buckets


def candidate_space(quick: bool = False) -> list[dict[str, Any]]:
    configs = [
        dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=g, num_warps=w, num_stages=s)
        for m, n, k, g, w, s in CANDIDATES
    ]
    return configs[:2] if quick else configs


def random_inputs(
    moe: MoeShape,
    tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    *,
    weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    skew: bool = False,
) -> dict[str, torch.Tensor]:
    """``fused_experts`` arguments: scaled random weights (or ``weights``), tokens, and top-k
    routing, uniform or (``skew``) over the first half of the experts so the rest stay empty."""
    E, N, K = moe.num_experts, moe.intermediate, moe.hidden
    dev_gen = gen  # values drawn on the device (a GB of host randn takes seconds), seeded by gen
    if device.type != "cpu":
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        dev_gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*dims: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(dims, generator=dev_gen, device=device) * scale).to(dtype)

    if weights is None:
        weights = (randn(E, 2 * N, K, scale=K**-0.5), randn(E, K, N, scale=N**-0.5))
    span = max(E // 2, moe.top_k) if skew else E
    scores = torch.rand((tokens, span), generator=gen)
    ids = scores.topk(moe.top_k, dim=1).indices.to(torch.int32)
    probs = torch.rand((tokens, moe.top_k), generator=gen).softmax(dim=-1)
    return {
        "hidden_states": randn(tokens, K),
        "w13": weights[0],
        "w2": weights[1],
        "topk_weights": probs.to(device),
        "topk_ids": ids.to(device),
    }


def check_candidate(
    bucket: MoeBucket, config: dict, device: torch.device, gen: torch.Generator
) -> str | None:
    """None when ``config`` matches the torch reference and keeps tokens independent.

    The probe (3 tokens) is computed alone and as the first tokens of the batch, where its rows
    keep their block positions (the interpreter's dot is the host BLAS, which may round a row
    by its place in a tile; a GPU's MMA does not); on CUDA also as the last tokens."""
    from pagoda.kernels import fused_moe_reference as reference
    from pagoda.kernels.fused_moe import fused_experts

    args = random_inputs(bucket.moe, CHECK_TOKENS, bucket.dtype, device, gen, skew=True)

    def rows(sel: slice | torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: (v if k in ("w13", "w2") else v[sel]) for k, v in args.items()}

    last = torch.cat([torch.arange(3, CHECK_TOKENS), torch.arange(3)]).to(device)
    try:
        full = fused_experts(**args, config=config)
        alone = fused_experts(**rows(slice(0, 3)), config=config)
        moved = fused_experts(**rows(last), config=config)[-3:] if device.type == "cuda" else alone
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a config the compiler or launcher refuses is a rejected candidate
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    want = reference.fused_experts(**args).float()
    got = full.float()
    if not torch.isfinite(got).all():
        return "wrong output: non-finite values"
    err = (got - want).abs().max().item()
    if err > TOL[bucket.dtype] * (1.0 + want.abs().max().item()):
        return f"wrong output: max |diff| {err:.3g} > tolerance"
    if not (torch.equal(alone, full[:3]) and torch.equal(moved, full[:3])):
        return "not batch-invariant: tokens differ when computed alone"
    return None


def timing_inputs(
    bucket: MoeBucket, device: torch.device, gen: torch.Generator
) -> list[list[dict[str, torch.Tensor]]]:
    """Per token count, argument sets over weight copies: on CUDA enough that rotating through
    them exceeds L2 (a real model's experts do on their own: one copy)."""
    m = bucket.moe
    copies = 1
    if device.type == "cuda":
        size = 3 * m.num_experts * m.intermediate * m.hidden * bucket.dtype.itemsize
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        copies = min(-(-2 * l2 // size), 8)
    first = [random_inputs(m, 1, bucket.dtype, device, gen) for _ in range(copies)]
    weights = [(a["w13"], a["w2"]) for a in first]
    return [
        [random_inputs(m, t, bucket.dtype, device, gen, weights=w) for w in weights]
        for t in bucket.tokens
    ]


def time_candidate(
    config: dict, inputs: list[list[dict[str, torch.Tensor]]], timer: Timer
) -> float:
    """Milliseconds for the largest token count's tokens at each timed count, summed: a decode
    token and a prompt token weigh alike (as in `tune.matmul.time_candidate`)."""
    from pagoda.kernels.fused_moe import fused_experts

    def runner(sets: list[dict[str, torch.Tensor]]) -> Callable[[], None]:
        turn = itertools.count()

        def run() -> None:
            fused_experts(**sets[next(turn) % len(sets)], config=config)

        return run

    count = [sets[0]["hidden_states"].shape[0] for sets in inputs]
    return sum(timer(runner(sets)) * max(count) / n for sets, n in zip(inputs, count))


def sweep_moe_bucket(
    bucket: MoeBucket,
    candidates: list[dict],
    device: torch.device,
    *,
    timer: Timer,
    seed: int = 0,
) -> Any:
    """Check every candidate, time the survivors; the first candidate is the baseline
    (`matmul.sweep_candidates`, the sweep of every GEMM bucket)."""
    from pagoda.runtime.tune.matmul import sweep_candidates

    return sweep_candidates(
        bucket, candidates, device, timer=timer, seed=seed, check=check_candidate,
        inputs=timing_inputs, time=time_candidate,
    )  # fmt: skip


def write_moe_configs(
    moe: MoeShape,
    dtype: torch.dtype,
    device: torch.device,
    directory: Path,
    *,
    label: str,
    batch_invariant: bool = True,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 4096,
    timer: Timer,
    quick: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """Sweep this shape's buckets alone and save the winners in ``directory/<label>.json``
    (benchmarks: the MoE part of ``pagoda tune`` without the rest). Returns the reports."""
    from pagoda.kernels.config import get_kernel_config, save_kernel_config

    reports = []
    for bucket in plan_moe_buckets(
        moe, dtype, batch_invariant=batch_invariant, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, quick=quick,
    ):  # fmt: skip
        baseline = get_kernel_config(FUSED_MOE, bucket.shape, device)
        space = [baseline, *(c for c in candidate_space(quick) if c != baseline)]
        result = sweep_moe_bucket(bucket, space, device, timer=timer)
        if result.config is not None:
            save_kernel_config(FUSED_MOE, bucket.shape, result.config, device=label,
                               directory=directory, source="fused-MoE sweep (runtime/tune/moe.py)")  # fmt: skip
        reports.append(result.as_json())
        progress(bucket.label)
    return reports
