"""Attention kernel benchmark on a CUDA device: achieved bandwidth and speed against SDPA.

Decode: ``paged_attention`` for batch × context (default 1/16/64/256 × 512/4k/32k) with K/V
scattered over a paged cache, against ``torch.nn.functional.scaled_dot_product_attention`` on
contiguous K/V of the same shapes. Bandwidth = bytes of K/V read + q + out, over the time.
Prefill: a from-scratch causal prefill and a chunk on top of cached context, through each path
of ``--prefill-paths``: the prefill kernel (``flash``, as serving runs it without batch
invariance), the prefill kernel in batch-invariant mode (``flash-invariant``, serving's default),
the unified kernel the prefill kernel replaced (``unified``, ``unified-invariant``), and
``sdpa-prefill``, the prompt-row path the Triton backend takes without batch invariance (torch
SDPA per sequence over K/V gathered from the paged cache; its time is in the "Triton µs"
column), each against raw SDPA on contiguous K/V (the "SDPA µs" column); ``--prefill-sweep N`` adds the N fastest configs of
``pagoda tune``'s candidate space that agree with SDPA. ``--invariant-decodes`` times decode batches in batch-invariant
mode, where decodes run in the prefill kernel's one-token launch, beside the unified kernel
that ran them before.

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

The cases (inputs, timing, references) are `kernel_cases.py`'s; this script picks them from its
flags and prints a markdown table (paste into docs/benchmarks.md with the device name). Exits with a
message on machines without CUDA: the CPU interpreter checks correctness, not speed.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine
from kernel_cases import (
    FP8_SHAPES,
    PATHS,
    SDPA_PREFILL,
    Fp8Row,
    MoeRow,
    Row,
    decode_row,
    fits,
    fp8_row,
    invariant_decode_rows,
    moe_row,
    prefill_rows,
)

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


def peak_tbps(name: str, override: float | None) -> float | None:
    if override:
        return override
    for fragment, tbps in PEAK_TBPS.items():  # dict order: specific names first
        if fragment in name:
            return tbps
    return None


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
    p.add_argument(
        "--prefill-paths",
        default=f"flash,flash-invariant,{SDPA_PREFILL},unified",
        help=f"comma-separated, of {', '.join([*PATHS, SDPA_PREFILL])}",
    )
    p.add_argument(
        "--prefill-sweep",
        type=int,
        default=0,
        metavar="N",
        help="also time the prefill kernel over `pagoda tune`'s candidate configs and show the "
        "N fastest that match SDPA per prefill case (0: off)",
    )
    p.add_argument(
        "--invariant-decodes",
        default="1x4096,64x4096,256x2048",
        help="BxCTX decode batches timed in batch-invariant mode ('' skips them)",
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


def attention_rows(args: argparse.Namespace, dtype: torch.dtype) -> list[Row]:
    """The decode, prefill and batch-invariant decode rows that ``args`` ask for (decode
    batches that do not fit in free GPU memory are skipped)."""
    rows: list[Row] = []
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
        rows += prefill_rows(int(b), int(new), int(ctx or new), args, dtype)
        torch.cuda.empty_cache()
    for spec in filter(None, args.invariant_decodes.split(",")):
        b, ctx = (int(x) for x in spec.split("x"))
        if fits(b, ctx, args, dtype):
            rows += invariant_decode_rows(b, ctx, args, dtype)
            torch.cuda.empty_cache()
    return rows


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
    if args.no_attention:
        args.batches, args.prefill, args.invariant_decodes = "", "", ""
    rows = attention_rows(args, dtype)
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
