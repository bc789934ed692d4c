"""Warm-up before `/ready`: touch every kernel variant the configured shapes can reach.

Why: Triton compiles a kernel variant the first time it meets new constexprs (launch config,
split count) or a new integer specialisation (an argument equal to 1, or divisible by 16). On
the H200 the first steps after start took 0.4–0.7 s each while that happened, in front of the
first users. Serving decides every variant from host ints (``paged_attention``'s rules), so the
set is enumerable: each decode (batch, context) bucket's config and split count, and each
prefill ``max_query_len`` bucket's config of the prefill kernel (batch-invariant: its decode and
its prefill config), with block-table widths in each specialisation class, with and
without an attention chunk where the model has chunked layers (Llama 4: the kernels' ``CHUNKED``
variants), and with and without image spans where the model's images attend both ways (Gemma 3:
the prefill kernel's ``HAS_SPANS`` variants).
Everything runs on a scratch cache of a few blocks, never on the engine's KV cache.

Then a few small engine steps (prefills of 16k and odd lengths, decodes) cover the other
kernels and the torch paths. On a CPU (torch backend) only those steps run: cheap.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from pagoda.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from pagoda.runtime.engine.core import EngineCore

log = logging.getLogger(__name__)
SCRATCH_BLOCKS = 16


@dataclass(frozen=True)
class Geometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    device: torch.device
    cache_dtype: torch.dtype | None = None  # an FP8 cache's (None: `dtype`)
    kv_scale_size: int = 1  # an FP8 cache's scales: 1 (per tensor) or Hkv (their stride differs)
    chunk: int | None = None  # the chunked layers' attention chunk (Llama 4), None: no such layer
    image_spans: bool = False  # prefills may hold bidirectional image spans (Gemma 3's images)


def _grid(limit: int, start: int = 1) -> list[int]:
    """Powers of two and the points halfway between them (in log scale) from ``start`` up to
    ``limit``, plus ``limit``: nearest-bucket boundaries need not fall on powers of two."""
    out, v = set(), start
    while v < limit:
        out.update({v, min(limit, (3 * v) // 2)})
        v *= 2
    return sorted(out | {limit}) if limit >= start else sorted(out)


def kernel_cases(
    geo: Geometry,
    *,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    batch_invariant: bool = False,
) -> list[tuple[int, int, int]]:
    """(num_decodes, max_seq_len, prefill_len) cases, one per distinct compiled variant.
    Batch-invariant: every row runs in the prefill kernel with two fixed configs, so one decode
    case and one prefill case cover it."""
    from pagoda.kernels.attention import flash_configs
    from pagoda.kernels.config import get_kernel_config, num_sms
    from pagoda.kernels.decode_attention import choose_num_splits

    if batch_invariant:
        return [(1, min(max_model_len, geo.block_size), 0), (0, 2, 2)]
    seen: set = set()
    cases = []
    for n in _grid(max_num_seqs):
        for ctx in _grid(max_model_len, geo.block_size):
            shape = {"head_dim": geo.head_dim, "num_seqs": n, "max_seq_len": ctx}
            cfg = get_kernel_config("decode_attention", shape, geo.device)
            splits = choose_num_splits(
                num_decodes=n,
                num_kv_heads=geo.num_kv_heads,
                max_seq_len=ctx,
                num_sms=num_sms(geo.device),
                config=cfg,
            )
            key = ("decode", cfg["TILE_SIZE"], cfg["num_warps"], cfg["num_stages"], splits)
            if key not in seen:
                seen.add(key)
                cases.append((n, ctx, 0))
    for q in _grid(min(max_num_batched_tokens, max_model_len - 1)):
        cfg = flash_configs(geo.head_dim, q, geo.device, batch_invariant=False)[1]
        key = ("prefill", *sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            cases.append((0, q, q))
    return cases


def _widths(need: int) -> list[int]:
    """Block-table widths in each integer-specialisation class: 1, not /16, /16."""
    odd = need if need % 16 and need > 1 else need + 1 if (need + 1) % 16 else need + 2
    return sorted({w for w in (need if need == 1 else None, odd, -(-need // 16) * 16) if w})


def run_kernel_case(
    geo: Geometry, num_decodes: int, max_seq_len: int, prefill: int, batch_invariant: bool = False
) -> int:
    """Launch one case at every table width (and with the model's attention chunk, if any,
    and a prefill with image spans, if the model has them); returns the number of launches."""
    from pagoda.kernels import paged_attention
    from pagoda.kernels.image_spans import span_table

    bs, dev = geo.block_size, geo.device
    seqs = [(1, min(max_seq_len, bs))] * num_decodes + ([(prefill, prefill)] if prefill else [])
    need = max(-(-s // bs) for _, s in seqs)
    tokens = sum(q for q, _ in seqs)
    q = torch.zeros((tokens, geo.num_heads, geo.head_dim), dtype=geo.dtype, device=dev)
    cache = torch.zeros(
        (SCRATCH_BLOCKS, bs, geo.num_kv_heads, geo.head_dim), dtype=geo.dtype, device=dev
    ).to(geo.cache_dtype or geo.dtype)
    scales = {}
    if cache.dtype != geo.dtype:  # FP8: the kernels' KV_FP8 variants, scales as the layers'
        one = torch.ones(geo.kv_scale_size, dtype=torch.float32, device=dev)
        scales = {"k_scale": one, "v_scale": one}
    qsl = torch.tensor(
        [0, *torch.tensor([q_ for q_, _ in seqs]).cumsum(0).tolist()], dtype=torch.int32
    )
    seq_lens = torch.tensor([s for _, s in seqs], dtype=torch.int32)
    chunks = (None, geo.chunk) if geo.chunk is not None else (None,)
    spans = (None,)
    if geo.image_spans and prefill:  # (no row in an image: the variant is what compiles)
        spans = (None, torch.from_numpy(span_table([], [], [], tokens)).to(dev))
    variants = [(w, c, sp) for w in _widths(need) for c in chunks for sp in spans]
    for width, chunk, image_spans in variants:
        table = (torch.arange(len(seqs) * width, dtype=torch.int32) % SCRATCH_BLOCKS).view(
            len(seqs), width
        )
        paged_attention(
            q=q,
            k_cache=cache,
            v_cache=cache,
            block_tables=table.to(dev),
            seq_lens=seq_lens.to(dev),
            query_start_loc=qsl.to(dev),
            max_query_len=max(q_ for q_, _ in seqs),
            max_seq_len=max_seq_len,
            scale=geo.head_dim**-0.5,
            num_decodes=num_decodes,
            batch_invariant=batch_invariant,
            attention_chunk=chunk,
            image_spans=image_spans,
            **scales,
        )
    return len(variants)


def _kv_scale_size(runner) -> int:
    """The size of the first layer's FP8 KV scales (1 without an FP8 cache)."""
    layers = getattr(runner.model, "layers", None) or [None]
    scales = getattr(layers[0], "kv_scales", None)
    return scales[0].numel() if scales is not None else 1


def _chunk(runner) -> int | None:
    """An attention chunk of the model's chunked layers (`LlamaLayer.chunk`), or None."""
    chunks = [getattr(layer, "chunk", None) for layer in getattr(runner.model, "layers", [])]
    return next((c for c in chunks if c is not None), None)


def _engine_steps(core: EngineCore) -> int:
    """Prefills of 16k and odd lengths, then decodes of two and one sequence."""
    limit = core.max_model_len - 4
    lengths = sorted({max(1, min(n, limit)) for n in (32, 7)})
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    vocab = core.model_config.vocab_size  # (a tiny vocabulary may hold fewer than 98 ids)
    for i, n in enumerate(lengths):
        core.add_request(f"__warmup-{i}", [(1 + j % 97) % vocab for j in range(n)], params)
    steps = 0
    while core.has_unfinished_requests():
        core.step()
        steps += 1
    return steps


def warm_kernels(runner, *, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int):
    """The attention kernel variants of these shapes, compiled on `runner`'s device (this
    rank's heads in a tensor-parallel group); the number of launches (0 off Triton)."""
    if runner.backend.name != "triton":
        return 0
    backend = runner.backend
    geo = Geometry(
        backend.num_heads,
        backend.num_kv_heads,
        runner.model_config.head_dim,
        runner.block_size,
        runner.dtype,
        runner.device,
        next((c[0].dtype for c in runner.kv_caches if c), None),  # (a Mamba layer's: empty)
        _kv_scale_size(runner),
        _chunk(runner),
        backend.image_spans,
    )
    invariant = bool(getattr(backend, "batch_invariant", False))
    cases = kernel_cases(
        geo,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        batch_invariant=invariant,
    )
    launches = sum(run_kernel_case(geo, *case, batch_invariant=invariant) for case in cases)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return launches


def warm_up(core: EngineCore) -> EngineCore:
    """Compile (or touch) every variant serving can hit; returns ``core`` for factory chaining.
    The other ranks of a tensor-parallel group compile their kernels themselves
    (`engine/worker_proc.py`) and run these steps with rank 0."""
    start = time.monotonic()
    sched = core.scheduler.config
    launches = warm_kernels(
        core.runner,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=core.max_model_len,
        max_num_batched_tokens=sched.max_num_batched_tokens,
    )
    steps = _engine_steps(core)
    log.info(
        "warm-up: %d attention launches over the configured shapes, %d engine steps, %.1f s",
        launches,
        steps,
        time.monotonic() - start,
    )
    return core
