"""Checking and timing kernel candidates, and the per-bucket sweep that saves the winners.

A candidate is rejected (never timed, never saved) when it raises or disagrees with the torch
reference on fresh random inputs; the first candidate of a bucket is the config the runtime would
use without tuning, so the report says how much tuning gained.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pagoda.runtime.tune import fp8_matmul, matmul, moe
from pagoda.runtime.tune.kernels import (
    DECODE,
    TOL,
    AttentionShape,
    Bucket,
    PagedBatch,
    Timer,
    candidate_space,
    launch,
    make_batch,
    num_splits_for,
)
from pagoda.runtime.tune.results import BucketResult


def _check_seqs(bucket: Bucket, gen: torch.Generator) -> list[tuple[int, int]]:
    """A small ragged batch that compiles to the same kernel variant as the bucket."""
    if bucket.kernel == DECODE or bucket.shape.get("max_query_len") == 1:  # decodes
        n, top = min(len(bucket.seqs), 4), min(max(s for _, s in bucket.seqs), 1024)
        lens = torch.randint(1, top + 1, (n,), generator=gen).tolist()
        return [(1, int(s)) for s in [top, *lens[1:]]]
    q = min(bucket.shape["max_query_len"], max(n for n, _ in bucket.seqs), 128)
    short = max(q // 3, 1)
    return [(q, max(q, min(bucket.seqs[0][1], 2 * q))), (short, short + 7)]


def check_candidate(
    bucket: Bucket,
    shape: AttentionShape,
    config: dict,
    device: torch.device,
    gen: torch.Generator,
    decode_config: dict | None = None,
) -> str | None:
    """None when ``config`` matches the torch reference on fresh random inputs, else why not.
    With ``decode_config`` (a batch-invariant prefill bucket), the last row of every sequence
    must also equal, bit for bit, that row computed alone by the decode launch."""
    from pagoda.kernels import reference

    batch = make_batch(shape, _check_seqs(bucket, gen), device, gen)
    out = torch.full_like(batch.args["q"], float("nan"))
    try:
        splits = num_splits_for(bucket, shape, config, device) if bucket.kernel == DECODE else 1
        launch(bucket.kernel, batch, config, splits, out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a config the compiler or launcher refuses is a rejected candidate
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    want = reference.paged_attention(**batch.args).float()
    got = out.float()
    tol = TOL[shape.dtype]
    if not torch.isfinite(got).all():
        return "wrong output: non-finite values"
    err = (got - want).abs().max().item()
    if err > tol * (1.0 + want.abs().max().item()):
        return f"wrong output: max |diff| {err:.3g} > tolerance"
    if decode_config is not None:
        return _check_row_invariance(batch, out, decode_config)
    return None


def _check_row_invariance(batch: PagedBatch, out: torch.Tensor, decode_config: dict) -> str | None:
    """Each sequence's last row against the same row as a decode (the prefill kernel's one-token
    launch with ``decode_config``): a prefill config whose MMA rounds a row differently from
    the decode config's would break batch-invariant serving."""
    from pagoda.kernels.prefill_attention import launch_prefill_attention

    a = batch.args
    n = a["seq_lens"].shape[0]
    last = (a["query_start_loc"][1:] - 1).long()
    q = a["q"][last].contiguous()
    alone = torch.full_like(q, float("nan"))
    launch_prefill_attention(
        q=q, k_cache=a["k_cache"], v_cache=a["v_cache"], block_tables=a["block_tables"],
        seq_lens=a["seq_lens"], query_start_loc=torch.arange(n + 1, device=q.device).int(),
        scale=a["scale"], out=alone, first_seq=0, last_seq=n, first_token=0, last_token=n,
        config=decode_config, one_token_per_seq=True,
    )  # fmt: skip
    if not torch.equal(alone, out[last]):
        return "not batch-invariant: a row's bits differ from its decode's"
    return None


def wall_timer(fn: Callable[[], None], repeats: int = 3) -> float:
    """Median wall-clock milliseconds after one warm-up call (the interpreter, tests)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cuda_timer(fn: Callable[[], None]) -> float:
    """``triton.testing.do_bench`` median in milliseconds."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def cuda_graph_timer(fn: Callable[[], None], calls: int = 16, replays: int = 10) -> float:
    """Median milliseconds per call over replays of a CUDA graph of ``calls`` calls: what a
    kernel costs inside the engine's graphed decode steps. ``do_bench`` launches each call from
    Python, and a kernel shorter than that launch (~20-40 us for Triton) times as the launch, so
    every decode-sized matmul config would tie. ``fn`` must be capturable (no host syncs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm up off the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()  # first replay uploads the graph
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


def timing_inputs(
    bucket: Bucket, shape: AttentionShape, device: torch.device, gen: torch.Generator
) -> list[PagedBatch]:
    """The bucket's batch, in enough copies (on CUDA) that rotating through them exceeds L2; every
    candidate of the bucket is timed on the same inputs."""
    first = make_batch(shape, bucket.seqs, device, gen)
    if device.type != "cuda":
        return [first]
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    size = sum(t.numel() * t.element_size() for t in first.args.values() if torch.is_tensor(t))
    extra = min(-(-2 * l2 // size), 8) - 1
    return [first, *(make_batch(shape, bucket.seqs, device, gen) for _ in range(extra))]


def time_candidate(
    bucket: Bucket,
    shape: AttentionShape,
    config: dict,
    device: torch.device,
    copies: list[PagedBatch],
    timer: Timer,
) -> float:
    """Milliseconds per launch, rotating through ``copies``."""
    outs = [torch.empty_like(b.args["q"]) for b in copies]
    splits = num_splits_for(bucket, shape, config, device) if bucket.kernel == DECODE else 1
    turn = itertools.count()

    def run() -> None:
        i = next(turn) % len(copies)
        launch(bucket.kernel, copies[i], config, splits, outs[i])

    return timer(run)


def _launch_key(bucket: Bucket, shape: AttentionShape, config: dict, device: torch.device) -> tuple:
    """Configs that launch the same compiled variant with the same grid are timed once."""
    from pagoda.kernels._common import next_pow2

    tile = next_pow2(max(int(config.get("TILE_SIZE", 16)), 16))
    base = (tile, config.get("num_warps"), config.get("num_stages"))
    if bucket.kernel == DECODE:
        try:
            return (*base, num_splits_for(bucket, shape, config, device))
        except (KeyError, ValueError, TypeError):
            return (*base, repr(sorted(config.items())))
    qpk = shape.num_heads // shape.num_kv_heads
    return (*base, next_pow2(max(int(config.get("BLOCK_M", 16)), 16, qpk)))


def sweep_bucket(
    bucket: Bucket,
    shape: AttentionShape,
    candidates: list[dict],
    device: torch.device,
    *,
    timer: Timer,
    seed: int = 0,
    decode_config: dict | None = None,
) -> BucketResult:
    """Check every candidate, time the survivors; the first candidate is the baseline.
    ``decode_config``: also check each candidate's rows against it (`check_candidate`)."""
    gen = torch.Generator().manual_seed(seed)
    rejected: list[str] = []
    timed: dict[tuple, tuple[float, dict]] = {}
    baseline_ms = None
    copies: list[PagedBatch] = []
    for i, config in enumerate(candidates):
        why = check_candidate(bucket, shape, config, device, gen, decode_config)
        if why is not None:
            rejected.append(f"{config}: {why}")
            continue
        key = _launch_key(bucket, shape, config, device)
        if key not in timed:
            copies = copies or timing_inputs(bucket, shape, device, gen)
            timed[key] = (time_candidate(bucket, shape, config, device, copies, timer), config)
        if i == 0:
            baseline_ms = timed[key][0]
    if not timed:
        return BucketResult(bucket, None, None, baseline_ms, len(candidates), rejected)
    best_ms, best = min(timed.values(), key=lambda x: x[0])
    return BucketResult(
        bucket,
        dict(best),
        round(best_ms, 4),
        baseline_ms and round(baseline_ms, 4),
        len(candidates),
        rejected,
    )


def sweep_matmul_bucket(
    bucket: matmul.MatmulBucket,
    candidates: list[dict],
    device: torch.device,
    *,
    timer: Timer,
    seed: int = 0,
) -> BucketResult:
    """Check every candidate of the bucket's GEMM (16-bit or FP8: `matmul.Gemm`), time the
    survivors; the first candidate is the baseline (`matmul.sweep_candidates`)."""
    return matmul.sweep_candidates(
        bucket, candidates, device, timer=timer, seed=seed, check=matmul.check_candidate,
        inputs=matmul.timing_inputs,
        time=lambda config, inputs, t: matmul.time_candidate(bucket, config, inputs, t),
    )  # fmt: skip


def invariant_decode_config(bucket: Bucket, reports: list[dict], device: torch.device) -> dict:
    """The config of the batch-invariant decode launch a prefill bucket must agree with: as
    chosen earlier in this sweep, else as configured now. Its ``TILE_SIZE`` is imposed on the
    prefill launch."""
    from pagoda.kernels.config import get_kernel_config

    decode_shape = {**bucket.shape, "max_query_len": 1}
    for r in reports:
        if r["kernel"] == bucket.kernel and r["shape"] == decode_shape and r.get("config"):
            return dict(r["config"])
    return get_kernel_config(bucket.kernel, decode_shape, device)


def _with_tile(candidates: list[dict], tile: int) -> list[dict]:
    """``candidates`` with ``TILE_SIZE`` set to ``tile``, duplicates dropped, order kept."""
    out: list[dict] = []
    for c in candidates:
        forced = {**c, "TILE_SIZE": tile}
        if forced not in out:
            out.append(forced)
    return out


def _sweep_one(
    bucket: Bucket | matmul.MatmulBucket | moe.MoeBucket,
    shape: AttentionShape,
    reports: list[dict],
    device: torch.device,
    timer: Timer,
    matmul_timer: Timer,
    space: Callable[[str], list[dict]],
) -> BucketResult:
    """One bucket's sweep: the current config first, then `space`'s; a batch-invariant prefill
    bucket only with the tile its decode bucket (swept before it, in `reports`) chose."""
    from pagoda.kernels.config import get_kernel_config

    baseline = get_kernel_config(bucket.kernel, bucket.shape, device)
    candidates = [baseline, *(c for c in space(bucket.kernel) if c != baseline)]
    decode_config = None
    if getattr(bucket, "invariant", False) and bucket.shape["max_query_len"] != 1:
        decode_config = invariant_decode_config(bucket, reports, device)
        candidates = _with_tile(candidates, int(decode_config["TILE_SIZE"]))
        if device.type != "cuda":  # the interpreter's dot is the host BLAS: its rounding
            decode_config = None  # of a row may follow the row's place in a micro-tile
    if bucket.kernel in (matmul.MATMUL, fp8_matmul.FP8_MATMUL):
        return sweep_matmul_bucket(bucket, candidates, device, timer=matmul_timer)
    if bucket.kernel == moe.FUSED_MOE:
        return moe.sweep_moe_bucket(bucket, candidates, device, timer=matmul_timer)
    return sweep_bucket(bucket, shape, candidates, device, timer=timer, decode_config=decode_config)


def tune_kernels(
    shape: AttentionShape,
    buckets: list[Bucket | matmul.MatmulBucket | moe.MoeBucket],
    *,
    device: torch.device,
    device_label: str,
    out_dir: Path,
    previous: list[dict] | None = None,
    deadline: float = float("inf"),
    timer: Timer = cuda_timer,
    matmul_timer: Timer | None = None,
    space: Callable[[str], list[dict]] = candidate_space,
    progress: Callable[[str], None] = lambda _: None,
    checkpoint: Callable[[list[dict]], None] = lambda _: None,
) -> tuple[list[dict], bool]:
    """Sweep every bucket not already in ``previous``; save each winner as soon as it is known.

    Returns (bucket reports, complete). ``device_label`` names ``out_dir/<device_label>.json``.
    """
    from pagoda.kernels.config import DEFAULT_DEVICE, save_kernel_config

    if device_label == DEFAULT_DEVICE:
        raise ValueError("tuned configs need a device name; 'default' is the packaged fallback")
    done = {(b["kernel"], tuple(sorted(b["shape"].items()))): b for b in previous or []}
    reports, complete = [], True
    for bucket in buckets:
        key = (bucket.kernel, tuple(sorted(bucket.shape.items())))
        if key in done:
            reports.append(done[key])
            progress(f"{bucket.label} (kept)")
            continue
        if time.monotonic() > deadline:
            complete = False
            progress(f"{bucket.label} (out of time)")
            continue
        result = _sweep_one(bucket, shape, reports, device, timer, matmul_timer or timer, space)
        if result.config is not None:
            save_kernel_config(
                bucket.kernel,
                bucket.shape,
                result.config,
                device=device_label,
                directory=out_dir,
                source="pagoda tune: fastest candidate that matched the torch reference",
            )
        reports.append(result.as_json())
        checkpoint(reports)  # an interrupted sweep resumes after this bucket
        progress(bucket.label)
    return reports, complete
