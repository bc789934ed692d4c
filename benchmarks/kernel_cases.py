"""The cases `benchmarks/kernel_speed.py` times, one function per kind of row: decode attention
(`decode_row`), decode batches in batch-invariant mode (`invariant_decode_rows`), prefill per
path (the Triton kernel's, and the non-invariant backend's SDPA prefill) and over `pagoda tune`'s candidates (`prefill_rows`), fused MoE (`moe_row`) and the FP8
GEMM (`fp8_row`). Each builds its random inputs, times the kernel (`bench_us`, or `graph_us`
for CUDA-graph replays) and its reference, and returns the numbers; the script chooses the
cases from its flags and prints the tables.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SWEEP_TOL = 0.05  # --prefill-sweep: largest |diff| from SDPA a candidate may show (bf16 outputs)


@dataclass
class Row:
    case: str
    batch: int
    new_tokens: int
    context: int
    splits: str
    triton_us: float
    gbps: float
    tflops: float
    sdpa_us: float | None
    max_err: float | None


def bench_us(fn) -> float:
    """Median time in µs; do_bench flushes L2 between runs, so small cases hit HBM too."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def graph_us(fn) -> float:
    """Median time in µs of `fn` replayed from a CUDA graph: the launches of a multi-kernel
    operator as the engine's graphed steps see them, without Python's launch overhead."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")) * 1e3


def make_paged(
    batch: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous K/V ``[B, Hkv, ctx, D]`` and the same data scattered over shuffled pages."""
    bs, hkv, d = args.block_size, args.kv_heads, args.head_dim
    per_seq = math.ceil(ctx / bs)
    num_blocks = batch * per_seq
    k = torch.randn((batch, hkv, ctx, d), device=device, dtype=dtype)
    v = torch.randn_like(k)
    table = torch.randperm(num_blocks, device=device).view(batch, per_seq).to(torch.int32)
    k_cache = torch.zeros((num_blocks, bs, hkv, d), device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    pad = per_seq * bs - ctx
    for b in range(batch):  # one sequence at a time keeps temporaries small
        for src, dst in ((k, k_cache), (v, v_cache)):
            rows = F.pad(src[b].transpose(0, 1), (0, 0, 0, 0, 0, pad))  # [per_seq*bs, Hkv, D]
            dst[table[b].long()] = rows.reshape(per_seq, bs, hkv, d)
    return k, v, k_cache, v_cache, table


def fits(batch: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype) -> bool:
    kv = 2 * batch * ctx * args.kv_heads * args.head_dim * dtype.itemsize
    return 2.2 * kv < torch.cuda.mem_get_info()[0]  # paged + contiguous copies + headroom


def vs_sdpa(run, out, sdpa, as_out, what: str) -> tuple[float | None, float | None]:
    """SDPA's time on the same case and the kernel's largest difference from it (`as_out` lays
    SDPA's result out as `out`); (None, None) where torch has no SDPA kernel for the shape or
    dtype (it raises RuntimeError, ValueError or NotImplementedError for those)."""
    try:
        sdpa_us = bench_us(sdpa)
        run()
        return sdpa_us, float((out.float() - as_out(sdpa()).float()).abs().max())
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        print(f"  SDPA failed for {what}: {exc}", file=sys.stderr)
        return None, None


# --prefill-paths / --invariant-decodes: paged_attention's arguments per path
PATHS = {
    "flash": {"batch_invariant": False},
    "flash-invariant": {"batch_invariant": True},
    "unified": {"batch_invariant": False, "flash_prefill": False},
    "unified-invariant": {"batch_invariant": True, "flash_prefill": False},
}
# --prefill-paths: the non-invariant Triton backend's prompt rows (not a `paged_attention` path):
# torch SDPA per sequence over K/V gathered from the paged cache (``sdpa_prefill``; a fresh
# prompt attends over its own k/v, as the backend does)
SDPA_PREFILL = "sdpa-prefill"


@dataclass
class PagedCase:
    """``batch`` sequences of ``new`` query tokens over ``ctx`` keys each (the queries are the
    last ``new``): K/V contiguous for SDPA and the same data over shuffled pages for the
    kernels, random queries and the output the kernels write."""

    batch: int
    new: int
    ctx: int
    k: torch.Tensor  # [B, Hkv, ctx, D]
    v: torch.Tensor
    k_cache: torch.Tensor  # [blocks, block size, Hkv, D]
    v_cache: torch.Tensor
    table: torch.Tensor  # block table [B, blocks per sequence]
    q: torch.Tensor  # [B * new, H, D]
    out: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float

    @classmethod
    def make(
        cls,
        batch: int,
        new: int,
        ctx: int,
        args: argparse.Namespace,
        dtype: torch.dtype,
        device: str = "cuda",
    ) -> PagedCase:
        h, d = args.heads, args.head_dim
        k, v, k_cache, v_cache, table = make_paged(batch, ctx, args, dtype, device)
        q = torch.randn((batch * new, h, d), device=device, dtype=dtype)
        seq_lens = torch.full((batch,), ctx, device=device, dtype=torch.int32)
        qsl = torch.arange(0, batch * new + 1, new, device=device, dtype=torch.int32)
        return cls(batch, new, ctx, k, v, k_cache, v_cache, table, q, torch.empty_like(q),
                   seq_lens, qsl, d**-0.5)  # fmt: skip

    def runner(self, *, num_decodes: int = 0, **path: bool) -> Callable[[], None]:
        """``paged_attention`` on this case (``path``: a `PATHS` entry), as a call to time."""
        from pagoda.kernels import paged_attention

        kwargs = dict(
            q=self.q, k_cache=self.k_cache, v_cache=self.v_cache, block_tables=self.table,
            seq_lens=self.seq_lens, query_start_loc=self.query_start_loc,
            max_query_len=self.new, max_seq_len=self.ctx, scale=self.scale, out=self.out,
            num_decodes=num_decodes, **path,
        )  # fmt: skip

        def run() -> None:
            paged_attention(**kwargs)

        return run

    def sdpa_prefill_runner(self) -> Callable[[], None]:
        """The non-invariant backend's prefill path (``sdpa_prefill``) on this case, as a call
        to time: the step's k/v are the last ``new`` positions of each sequence."""
        from pagoda.runtime.attention.base import AttentionMetadata
        from pagoda.runtime.attention.sdpa_prefill import sdpa_prefill

        b, hkv, d = self.batch, self.k.shape[1], self.k.shape[3]
        k_new, v_new = (
            t[:, :, self.ctx - self.new :].transpose(1, 2).reshape(b * self.new, hkv, d)
            for t in (self.k, self.v)
        )
        meta = AttentionMetadata(
            num_seqs=b, num_decodes=0, num_tokens=b * self.new, max_query_len=self.new,
            max_seq_len=self.ctx, query_start_loc=self.query_start_loc, seq_lens=self.seq_lens,
            block_tables=self.table, slot_mapping=torch.empty(0, dtype=torch.int64),
            block_size=self.k_cache.shape[1], query_lens_host=[self.new] * b,
            seq_lens_host=[self.ctx] * b,
        )  # fmt: skip

        def run() -> None:
            sdpa_prefill(self.q, k_new, v_new, self.k_cache, self.v_cache, meta, self.scale,
                         self.out)  # fmt: skip

        return run

    def decode_sdpa(self) -> torch.Tensor:
        """SDPA on the contiguous K/V, one query per sequence (``[B, H, 1, D]``)."""
        return F.scaled_dot_product_attention(
            self.q[:, :, None, :], self.k, self.v, scale=self.scale, enable_gqa=True
        )

    def row(self, case: str, splits: str, us: float, flops: float, sdpa_us, err) -> Row:
        """The table row of a kernel that took ``us`` on this case."""
        moved = (self.k.numel() + self.v.numel() + self.q.numel() + self.out.numel()) * (
            self.k.element_size()
        )
        return Row(case, self.batch, self.new, self.ctx, splits, us, moved / us / 1e3,
                   flops / us / 1e6, sdpa_us, err)  # fmt: skip


def decode_row(batch: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype) -> Row:
    from pagoda.kernels.config import get_kernel_config, num_sms
    from pagoda.kernels.decode_attention import choose_num_splits

    case = PagedCase.make(batch, 1, ctx, args, dtype)
    run = case.runner(num_decodes=batch)
    t = bench_us(run)
    cfg = get_kernel_config(
        "decode_attention",
        {"head_dim": args.head_dim, "num_seqs": batch, "max_seq_len": ctx},
        case.q.device,
    )
    splits = choose_num_splits(
        num_decodes=batch,
        num_kv_heads=args.kv_heads,
        max_seq_len=ctx,
        num_sms=num_sms(case.q.device),
        config=cfg,
    )
    flops = 4 * batch * args.heads * ctx * args.head_dim
    sdpa_us, err = vs_sdpa(
        run, case.out, case.decode_sdpa, lambda r: r[:, :, 0], f"batch {batch} ctx {ctx}"
    )
    return case.row("decode", str(splits), t, flops, sdpa_us, err)


def invariant_decode_rows(
    batch: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype, device: str = "cuda"
) -> list[Row]:
    """A decode batch in batch-invariant mode: the prefill kernel's one-token launch and the
    unified kernel, on the same cache, each against SDPA."""
    case = PagedCase.make(batch, 1, ctx, args, dtype, device)
    flops = 4 * batch * args.heads * ctx * args.head_dim
    rows = []
    for path in ("flash-invariant", "unified-invariant"):
        run = case.runner(num_decodes=batch, **PATHS[path])
        t = bench_us(run)
        sdpa_us, err = vs_sdpa(
            run, case.out, case.decode_sdpa, lambda r: r[:, :, 0], f"batch {batch} ctx {ctx}"
        )
        rows.append(case.row(f"decode ({path})", "1", t, flops, sdpa_us, err))
    return rows


def prefill_rows(
    batch: int,
    new: int,
    ctx: int,
    args: argparse.Namespace,
    dtype: torch.dtype,
    device: str = "cuda",
) -> list[Row]:
    """``batch`` sequences of ``new`` tokens on top of ``ctx - new`` cached ones, one row per
    path of ``--prefill-paths`` (SDPA timed once), then ``--prefill-sweep``'s fastest configs."""
    case = PagedCase.make(batch, new, ctx, args, dtype, device)
    past = ctx - new
    pairs = batch * (new * past + new * (new + 1) / 2)  # visible (query, key) pairs
    flops = 4 * args.heads * args.head_dim * pairs
    label = "prefill" if new == ctx else "prefill chunk"
    rows, sdpa_us, want = _path_rows(case, label, flops, args.prefill_paths)
    if not args.prefill_sweep:
        return rows
    swept = _swept_rows(case, label, flops, sdpa_us, want)
    return rows + swept[: args.prefill_sweep]


def _prefill_sdpa(case: PagedCase) -> Callable[[], torch.Tensor]:
    """SDPA on the case's contiguous K/V, causal from the bottom right (``[B, H, new, D]``)."""
    _, h, d = case.q.shape
    q4 = case.q.view(case.batch, case.new, h, d).transpose(1, 2)
    if case.new == case.ctx:
        mask = None
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(case.new, case.ctx)
    k, v, scale = case.k, case.v, case.scale

    def sdpa() -> torch.Tensor:
        if mask is None:
            return F.scaled_dot_product_attention(
                q4, k, v, is_causal=True, scale=scale, enable_gqa=True
            )
        return F.scaled_dot_product_attention(
            q4, k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )

    return sdpa


def _path_rows(
    case: PagedCase, label: str, flops: float, paths: str
) -> tuple[list[Row], float | None, torch.Tensor | None]:
    """One row per path in ``paths`` (comma-separated); SDPA is timed until it runs once, and
    its output is what every path is compared with. Returns (rows, SDPA µs, SDPA's output)."""
    sdpa = _prefill_sdpa(case)
    out = case.out

    def as_out(r: torch.Tensor) -> torch.Tensor:
        return r.transpose(1, 2).reshape(out.shape)

    rows, sdpa_us, want = [], None, None
    for path in filter(None, paths.split(",")):
        run = case.sdpa_prefill_runner() if path == SDPA_PREFILL else case.runner(**PATHS[path])
        t = bench_us(run)
        if sdpa_us is None:
            where = f"prefill {case.batch}x{case.new}/{case.ctx}"
            sdpa_us, err = vs_sdpa(run, out, sdpa, as_out, where)
            want = as_out(sdpa()) if sdpa_us is not None else None
        run()
        err = float((out.float() - want.float()).abs().max()) if want is not None else None
        rows.append(case.row(f"{label} ({path})", "-", t, flops, sdpa_us, err))
    return rows, sdpa_us, want


def _swept_rows(
    case: PagedCase, label: str, flops: float, sdpa_us: float | None, want: torch.Tensor | None
) -> list[Row]:
    """The prefill kernel over `pagoda tune`'s candidate configs, fastest first; a config the
    compiler refuses, or whose output is off SDPA's by more than `SWEEP_TOL`, is left out."""
    from pagoda.kernels.prefill_attention import launch_prefill_attention
    from pagoda.runtime.tune.kernels import PREFILL, candidate_space

    out = case.out
    kwargs = dict(
        q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_tables=case.table,
        seq_lens=case.seq_lens, query_start_loc=case.query_start_loc, scale=case.scale, out=out,
        first_seq=0, last_seq=case.batch, first_token=0, last_token=case.batch * case.new,
    )  # fmt: skip
    swept = []
    for config in candidate_space(PREFILL):
        name = "M{BLOCK_M} T{TILE_SIZE} w{num_warps} s{num_stages}".format(**config)
        try:
            t = bench_us(lambda config=config: launch_prefill_attention(**kwargs, config=config))
        except Exception as exc:  # a config the compiler refuses (shared memory, registers)
            print(f"  {label} {name}: {type(exc).__name__}", file=sys.stderr)
            continue
        err = float((out.float() - want.float()).abs().max()) if want is not None else None
        if err is not None and err > SWEEP_TOL:
            print(f"  {label} {name}: wrong output ({err:.2e})", file=sys.stderr)
            continue
        swept.append(case.row(f"{label} (swept {name})", "-", t, flops, sdpa_us, err))
    return sorted(swept, key=lambda r: r.triton_us)


@dataclass
class MoeRow:
    tokens: int
    active: int  # experts with at least one token
    invariant_us: float
    by_tokens_us: float
    gbps: float  # of the invariant config
    tflops: float
    reference_us: float
    max_err: float


def moe_row(
    tokens: int, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str = "cuda"
) -> MoeRow:
    from pagoda.kernels import fused_experts
    from pagoda.kernels import fused_moe_reference as reference

    E, N, K, top_k = shape
    x = torch.randn((tokens, K), device=device, dtype=dtype)
    w13 = torch.randn((E, 2 * N, K), device=device, dtype=dtype) * K**-0.5
    w2 = torch.randn((E, K, N), device=device, dtype=dtype) * N**-0.5
    ids = torch.rand((tokens, E), device=device).topk(top_k, dim=1).indices.to(torch.int32)
    weights = torch.rand((tokens, top_k), device=device).softmax(dim=-1)
    args = (x, w13, w2, weights, ids)
    inv = graph_us(lambda: fused_experts(*args))
    by_tokens = graph_us(lambda: fused_experts(*args, batch_invariant=False))
    ref = bench_us(lambda: reference.fused_experts(*args))  # reads counts on the host
    err = float((fused_experts(*args).float() - reference.fused_experts(*args).float()).abs().max())
    active = int(torch.unique(ids).numel())
    moved = (active * 3 * N * K + 2 * tokens * K) * dtype.itemsize
    flops = 2 * tokens * top_k * 3 * N * K
    return MoeRow(tokens, active, inv, by_tokens, moved / inv / 1e3, flops / inv / 1e6, ref, err)


FP8_SHAPES = {  # name -> {weight: (N, K)}
    "llama3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                  "down": (4096, 14336)},
    "llama3.2-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
                    "down": (2048, 8192)},
}  # fmt: skip


@dataclass
class Fp8Row:
    weight: str
    n: int
    k: int
    tokens: int
    fp8_us: float  # per-token quantization + FP8 GEMM
    gemm_us: float  # FP8 GEMM on FP8 activations
    bf16_us: float  # batch-invariant bf16 `linear`
    cublas_us: float | None  # torch.matmul, bf16
    scaled_mm_us: float | None  # torch._scaled_mm, FP8 row-wise
    gbps: float  # of fp8_us
    tflops: float  # of fp8_us
    max_err: float  # fp8_linear vs its reference, relative to the output's max


def _scaled_mm_us(xq, xs, wq, ws) -> float | None:
    """cuBLAS FP8 with row-wise scales; None where this torch/GPU has no such kernel."""
    try:
        run = lambda: torch._scaled_mm(  # noqa: E731
            xq, wq.T, scale_a=xs[:, None], scale_b=ws[None, :], out_dtype=torch.bfloat16
        )
        run()
        return graph_us(run)
    except (RuntimeError, AttributeError, TypeError) as exc:
        print(f"  torch._scaled_mm unavailable: {str(exc).splitlines()[0]}", file=sys.stderr)
        return None


def fp8_row(weight: str, n: int, k: int, tokens: int, device: str = "cuda") -> Fp8Row:
    from pagoda.kernels import fp8, fp8_linear, linear

    w = torch.randn((n, k), device=device) / k**0.5
    wq, ws = fp8.quantize_weight(w)
    wb = w.to(torch.bfloat16)
    x = torch.randn((tokens, k), device=device, dtype=torch.bfloat16)
    xq, xs = fp8.quantize_per_token(x)
    out = torch.empty((tokens, n), device=device, dtype=torch.bfloat16)
    dyn = graph_us(lambda: fp8_linear(x=x, weight=wq, weight_scale=ws, out=out))
    gemm = graph_us(lambda: fp8_linear(x=xq, x_scale=xs, weight=wq, weight_scale=ws, out=out))
    bf16 = graph_us(lambda: linear(x=x, weight=wb, out=out))
    cublas = scaled = None
    if device == "cuda":
        cublas = graph_us(lambda: torch.matmul(x, wb.T, out=out))
        scaled = _scaled_mm_us(xq, xs, wq, ws)
    got = fp8_linear(x=x, weight=wq, weight_scale=ws).float()
    want = fp8.fp8_linear(x=x, weight=wq, weight_scale=ws, out_dtype=torch.float32)
    err = float((got - want).abs().max() / want.abs().max())
    moved = n * k + tokens * k * 2 + tokens * n * 2  # FP8 weight, bf16 in and out
    flops = 2 * tokens * n * k
    return Fp8Row(weight, n, k, tokens, dyn, gemm, bf16, cublas, scaled, moved / dyn / 1e3,
                  flops / dyn / 1e6, err)  # fmt: skip
