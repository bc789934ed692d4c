"""Attention kernel benchmark on a CUDA device: achieved bandwidth and speed against SDPA.

Decode: ``paged_attention`` for batch × context (default 1/16/64/256 × 512/4k/32k) with K/V
scattered over a paged cache, against ``torch.nn.functional.scaled_dot_product_attention`` on
contiguous K/V of the same shapes. Bandwidth = bytes of K/V read + q + out, over the time.
Prefill: a from-scratch causal prefill and a chunk on top of cached context.

    python benchmarks/kernel_speed.py                  # Llama-3-8B attention shapes, bf16
    python benchmarks/kernel_speed.py --output table.md

Fused MoE (``--moe E,N,K,TOPK``, default Qwen3-30B-A3B's 128,768,2048,8; ``--moe ''`` skips it):
``fused_experts`` at ``--moe-tokens`` tokens with uniform random top-k routing, in its
batch-invariant config and in the per-token-count one (timed as CUDA-graph replays, as in the
engine's decode steps), against the torch reference (one matmul pair per expert with tokens,
launched from Python: it reads the expert counts on the host). Bandwidth = bytes of the active
experts' weights + tokens in and out, over the time.

FP8 GEMM (``--fp8 SHAPE``, default ``llama3-8b``: its qkv, o, gate_up and down weights; ``--fp8 ''``
skips it): `fp8_linear` at ``--fp8-tokens`` rows, with the per-token activation quantization
(what serving runs) and on activations already in FP8 (the GEMM alone), against the batch-invariant
bf16 `linear` on the same weight in bf16, and, as ceilings that are not batch-invariant, cuBLAS
bf16 (``torch.matmul``) and cuBLAS FP8 with row-wise scales (``torch._scaled_mm``, n/a where
torch lacks it). All timed as CUDA-graph replays (decode-sized GEMMs are shorter than a Python
launch). Bandwidth = weight bytes + activations in and out, over the time of the FP8 GEMM.

Prints a markdown table (paste into docs/benchmarks.md with the device name). Exits with a
message on machines without CUDA: the CPU interpreter checks correctness, not speed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine

# Peak HBM bandwidth in TB/s by device-name fragment (vendor data sheets); --peak-tbps overrides.
PEAK_TBPS = {
    "H200": 4.8,
    "H100 NVL": 3.9,
    "H100 PCIe": 2.0,
    "H100": 3.35,
    "GH200": 4.0,
    "A100-SXM4-80GB": 2.039,
    "A100 80GB PCIe": 1.935,
    "A100": 1.555,
    "L40S": 0.864,
    "L4": 0.3,
    "A10G": 0.6,
    "RTX 4090": 1.008,
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


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


def peak_tbps(name: str, override: float | None) -> float | None:
    if override:
        return override
    for fragment, tbps in PEAK_TBPS.items():  # dict order: specific names first
        if fragment in name:
            return tbps
    return None


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
    batch: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contiguous K/V ``[B, Hkv, ctx, D]`` and the same data scattered over shuffled pages."""
    bs, hkv, d = args.block_size, args.kv_heads, args.head_dim
    per_seq = math.ceil(ctx / bs)
    num_blocks = batch * per_seq
    k = torch.randn((batch, hkv, ctx, d), device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    table = torch.randperm(num_blocks, device="cuda").view(batch, per_seq).to(torch.int32)
    k_cache = torch.zeros((num_blocks, bs, hkv, d), device="cuda", dtype=dtype)
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


def decode_row(batch: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype) -> Row:
    from pagoda.kernels import paged_attention
    from pagoda.kernels.config import get_kernel_config, num_sms
    from pagoda.kernels.decode_attention import choose_num_splits

    h, d = args.heads, args.head_dim
    k, v, k_cache, v_cache, table = make_paged(batch, ctx, args, dtype)
    q = torch.randn((batch, h, d), device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    seq_lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
    scale = d**-0.5

    def run() -> None:
        paged_attention(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            block_tables=table,
            seq_lens=seq_lens,
            query_start_loc=qsl,
            max_query_len=1,
            max_seq_len=ctx,
            scale=scale,
            out=out,
            num_decodes=batch,
        )

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q[:, :, None, :], k, v, scale=scale, enable_gqa=True)

    t = bench_us(run)
    cfg = get_kernel_config(
        "decode_attention", {"head_dim": d, "num_seqs": batch, "max_seq_len": ctx}, q.device
    )
    splits = choose_num_splits(
        num_decodes=batch,
        num_kv_heads=args.kv_heads,
        max_seq_len=ctx,
        num_sms=num_sms(q.device),
        config=cfg,
    )
    bytes_moved = (k.numel() + v.numel() + q.numel() + out.numel()) * dtype.itemsize
    flops = 4 * batch * h * ctx * d
    sdpa_us, err = vs_sdpa(run, out, sdpa, lambda r: r[:, :, 0], f"batch {batch} ctx {ctx}")
    return Row(
        "decode",
        batch,
        1,
        ctx,
        str(splits),
        t,
        bytes_moved / t / 1e3,
        flops / t / 1e6,
        sdpa_us,
        err,
    )


def prefill_row(
    batch: int, new: int, ctx: int, args: argparse.Namespace, dtype: torch.dtype
) -> Row:
    """``batch`` sequences of ``new`` tokens on top of ``ctx - new`` cached ones."""
    from pagoda.kernels import paged_attention

    h, d = args.heads, args.head_dim
    k, v, k_cache, v_cache, table = make_paged(batch, ctx, args, dtype)
    q = torch.randn((batch * new, h, d), device="cuda", dtype=dtype)
    out = torch.empty_like(q)
    seq_lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    qsl = torch.arange(0, batch * new + 1, new, device="cuda", dtype=torch.int32)
    scale = d**-0.5

    def run() -> None:
        paged_attention(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            block_tables=table,
            seq_lens=seq_lens,
            query_start_loc=qsl,
            max_query_len=new,
            max_seq_len=ctx,
            scale=scale,
            out=out,
            num_decodes=0,
        )

    q4 = q.view(batch, new, h, d).transpose(1, 2)
    if new == ctx:
        mask = None
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(new, ctx)

    def sdpa() -> torch.Tensor:
        if mask is None:
            return F.scaled_dot_product_attention(
                q4, k, v, is_causal=True, scale=scale, enable_gqa=True
            )
        return F.scaled_dot_product_attention(
            q4, k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )

    t = bench_us(run)
    past = ctx - new
    pairs = batch * (new * past + new * (new + 1) / 2)  # visible (query, key) pairs
    flops = 4 * h * d * pairs
    bytes_moved = (k.numel() + v.numel() + q.numel() + out.numel()) * dtype.itemsize
    sdpa_us, err = vs_sdpa(
        run,
        out,
        sdpa,
        lambda r: r.transpose(1, 2).reshape(out.shape),
        f"prefill {batch}x{new}/{ctx}",
    )
    case = "prefill" if new == ctx else "prefill chunk"
    return Row(case, batch, new, ctx, "-", t, bytes_moved / t / 1e3, flops / t / 1e6, sdpa_us, err)


def table(rows: list[Row], peak: float | None) -> str:
    head = (
        "| case | batch | new tokens | context | KV splits | Triton µs | GB/s | % of peak | "
        "TFLOP/s | SDPA µs | SDPA time / Triton time | max abs diff vs SDPA |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        pct = f"{100 * r.gbps / (peak * 1e3):.0f}%" if peak else "n/a"
        sdpa = f"{r.sdpa_us:.1f}" if r.sdpa_us is not None else "n/a"
        ratio = f"{r.sdpa_us / r.triton_us:.2f}×" if r.sdpa_us is not None else "n/a"
        err = f"{r.max_err:.1e}" if r.max_err is not None else "n/a"
        lines.append(
            f"| {r.case} | {r.batch} | {r.new_tokens} | {r.context} | {r.splits} | "
            f"{r.triton_us:.1f} | {r.gbps:.0f} | {pct} | {r.tflops:.1f} | {sdpa} | {ratio} | {err} |"
        )
    return "\n".join(lines)


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


def moe_table(rows: list[MoeRow], peak: float | None) -> str:
    head = (
        "| tokens | active experts | fused µs (invariant) | fused µs (by tokens) | GB/s | "
        "% of peak | TFLOP/s | torch reference µs | reference / fused | max abs diff |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        pct = f"{100 * r.gbps / (peak * 1e3):.0f}%" if peak else "n/a"
        lines.append(
            f"| {r.tokens} | {r.active} | {r.invariant_us:.1f} | {r.by_tokens_us:.1f} | "
            f"{r.gbps:.0f} | {pct} | {r.tflops:.1f} | {r.reference_us:.1f} | "
            f"{r.reference_us / r.invariant_us:.2f}× | {r.max_err:.1e} |"
        )
    return "\n".join(lines)


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


def fp8_table(rows: list[Fp8Row], peak: float | None) -> str:
    head = (
        "| weight | N×K | tokens | FP8 µs (quant + GEMM) | FP8 GEMM µs | bf16 µs | "
        "bf16 / FP8 | GB/s | % of peak | TFLOP/s | cuBLAS bf16 µs | cuBLAS FP8 µs | "
        "max rel. diff vs reference |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    opt = lambda v: f"{v:.1f}" if v is not None else "n/a"  # noqa: E731
    for r in rows:
        pct = f"{100 * r.gbps / (peak * 1e3):.0f}%" if peak else "n/a"
        lines.append(
            f"| {r.weight} | {r.n}×{r.k} | {r.tokens} | {r.fp8_us:.1f} | {r.gemm_us:.1f} | "
            f"{r.bf16_us:.1f} | {r.bf16_us / r.fp8_us:.2f}× | {r.gbps:.0f} | {pct} | "
            f"{r.tflops:.1f} | {opt(r.cublas_us)} | {opt(r.scaled_mm_us)} | {r.max_err:.1e} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16, choices=(16, 32))
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--batches", default="1,16,64,256")
    p.add_argument("--contexts", default="512,4096,32768")
    p.add_argument(
        "--prefill", default="4x2048,1x512/8192", help="BxNEW (from scratch) or BxNEW/CTX"
    )
    p.add_argument("--moe", default="128,768,2048,8", help="E,N,K,TOPK of the fused-MoE rows")
    p.add_argument("--moe-tokens", default="1,16,64,256,1024,4096")
    p.add_argument(
        "--fp8",
        default="llama3-8b",
        choices=["", *FP8_SHAPES],
        help="the model whose weight shapes the FP8 GEMM rows use ('' skips them)",
    )
    p.add_argument("--fp8-tokens", default="1,16,64,256,1024,4096")
    p.add_argument("--no-attention", action="store_true", help="only the MoE and FP8 rows")
    p.add_argument("--peak-tbps", type=float, default=None, help="peak HBM bandwidth override")
    p.add_argument("--output", default=None, help="also write the markdown table here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "benchmarks/kernel_speed.py needs a CUDA GPU; none is visible here. Kernel correctness "
            "on CPU: TRITON_INTERPRET=1 pytest tests/kernels",
            file=sys.stderr,
        )
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") not in ("0", ""):
        print("unset TRITON_INTERPRET: the interpreter cannot be benchmarked", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    name = torch.cuda.get_device_name()
    peak = peak_tbps(name, args.peak_tbps)
    torch.manual_seed(0)
    rows: list[Row] = []
    if args.no_attention:
        args.batches, args.prefill = "", ""
    for batch in (int(x) for x in filter(None, args.batches.split(","))):
        for ctx in (int(x) for x in args.contexts.split(",")):
            if not fits(batch, ctx, args, dtype):
                print(
                    f"  skip decode batch {batch} ctx {ctx}: not enough GPU memory", file=sys.stderr
                )
                continue
            rows.append(decode_row(batch, ctx, args, dtype))
            torch.cuda.empty_cache()
    for spec in filter(None, args.prefill.split(",")):
        b, rest = spec.split("x")
        new, _, ctx = rest.partition("/")
        rows.append(prefill_row(int(b), int(new), int(ctx or new), args, dtype))
        torch.cuda.empty_cache()
    header = (
        f"{machine()}\nDevice: {name} (peak {peak} TB/s), torch {torch.__version__}, "
        f"heads {args.heads}/{args.kv_heads} (q/kv), head dim {args.head_dim}, "
        f"block size {args.block_size}, {args.dtype}"
    )
    text = header + ("\n\n" + table(rows, peak) if rows else "")
    if args.moe:
        shape = tuple(int(v) for v in args.moe.split(","))
        moe = [moe_row(int(t), shape, dtype) for t in args.moe_tokens.split(",")]
        text += f"\n\nFused MoE, E,N,K,top-k = {args.moe}:\n\n" + moe_table(moe, peak)
    if args.fp8:
        fp8 = [
            fp8_row(weight, n, k, int(t))
            for weight, (n, k) in FP8_SHAPES[args.fp8].items()
            for t in args.fp8_tokens.split(",")
        ]
        text += f"\n\nFP8 GEMM, {args.fp8} weights:\n\n" + fp8_table(fp8, peak)
    target = next(
        (r for r in rows if r.case == "decode" and (r.batch, r.context) == (64, 4096)), None
    )
    if target is not None and peak:
        pct = 100 * target.gbps / (peak * 1e3)
        text += f"\n\nDecode batch 64 × 4k: {pct:.0f}% of peak bandwidth (target ≥ 70%)."
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
