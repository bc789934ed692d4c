"""What batch invariance costs on CUDA, and whether the fast kernels are invariant at all.

For Llama-3.2-1B's weight shapes it times cuBLAS (`F.linear`) against Pagoda's batch-invariant
`linear` at decode and prefill row counts, and counts the row counts at which cuBLAS gives the
last rows other bits than when they are computed among more rows. For decode attention it times
the fast path (split-KV chosen from the batch) against the batch-invariant one (every row
through the prefill kernel, decodes in its one-token launch) and checks the fast path's rows the same way.

    python -P benchmarks/invariance_cost.py            # on a GPU node
    TRITON_INTERPRET=1 python -P benchmarks/invariance_cost.py --tiny   # CPU smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table

SHAPES_1B = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
             "down": (2048, 8192), "lm_head": (32000, 2048)}  # fmt: skip
ROWS = [1, 16, 64, 256, 1024, 4096, 16384]


def bench_us(fn, device: torch.device, reps: int = 20) -> float:
    """Median microseconds per call (CUDA events via triton's do_bench; a host timer on CPU)."""
    if device.type == "cuda":
        import triton.testing

        return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def gemm_rows(args, device, dtype) -> list[list[object]]:
    from pagoda.kernels import linear

    rows = []
    for name, (n, k) in args.shapes.items():
        w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
        x = torch.randn(max(args.rows), k, device=device).to(dtype)
        full = F.linear(x, w)
        for m in args.rows:
            xm = x[-m:]
            same = torch.equal(F.linear(xm, w), full[-m:])
            t_blas = bench_us(lambda xm=xm, w=w: F.linear(xm, w), device, args.reps)
            t_inv = bench_us(lambda xm=xm, w=w: linear(x=xm, weight=w), device, args.reps)
            flops = 2 * m * n * k / (t_inv * 1e-6) / 1e12
            rows.append([name, f"{n}x{k}", m, f"{t_blas:.1f}", f"{t_inv:.1f}",
                         f"{t_inv / t_blas:.2f}", f"{flops:.1f}", "yes" if same else "NO"])  # fmt: skip
    return rows


def sweep_rows(args, device, dtype) -> list[list[object]]:
    """Per weight shape: the matmul config with the least summed time over args.sweep_rows."""
    from pagoda.kernels import linear
    from pagoda.runtime.tune.matmul import candidate_space

    rows = []
    for name, (n, k) in args.shapes.items():
        w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
        xs = [torch.randn(m, k, device=device).to(dtype) for m in args.sweep_rows]
        timed = []
        for cfg in candidate_space():  # the space `pagoda tune` sweeps per weight shape
            try:
                t = [bench_us(lambda x=x, w=w, c=cfg: linear(x=x, weight=w, config=c), device,
                              args.reps) for x in xs]  # fmt: skip
            except Exception as e:
                print(f"{name} {cfg}: {type(e).__name__}")
                continue
            timed.append((sum(t), t, cfg))
        best = min(timed, key=lambda r: r[0])
        blas = [bench_us(lambda x=x, w=w: F.linear(x, w), device, args.reps) for x in xs]
        rows.append([name, f"{n}x{k}", " / ".join(f"{v:.1f}" for v in best[1]),
                     " / ".join(f"{v:.1f}" for v in blas), best[2]])  # fmt: skip
    return rows


def attention_rows(args, device, dtype) -> list[list[object]]:
    from pagoda.kernels import paged_attention

    h, hkv, d, bs = args.heads
    rows = []
    for batch, ctx in args.attention:
        per = -(-ctx // bs)
        k_cache = torch.randn(batch * per + 1, bs, hkv, d, device=device).to(dtype)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(batch * per + 1, device=device)[: batch * per].view(batch, per)
        table = table.to(torch.int32).contiguous()
        q = torch.randn(batch, h, d, device=device).to(dtype)
        meta = dict(k_cache=k_cache, v_cache=v_cache, max_query_len=1, scale=d**-0.5)

        def run(n: int, invariant: bool, q=q, table=table, ctx=ctx, meta=meta) -> torch.Tensor:
            return paged_attention(
                q=q[-n:], block_tables=table[-n:], max_seq_len=ctx, batch_invariant=invariant,
                seq_lens=torch.full((n,), ctx, dtype=torch.int32, device=device),
                query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=device), **meta,
            )  # fmt: skip

        same = torch.equal(run(1, False)[-1], run(batch, False)[-1])
        t_fast = bench_us(lambda b=batch: run(b, False), device, args.reps)
        t_inv = bench_us(lambda b=batch: run(b, True), device, args.reps)
        kv_gb = batch * ctx * hkv * d * 2 * k_cache.element_size() / 1e9
        rows.append([batch, ctx, f"{t_fast:.1f}", f"{t_inv:.1f}", f"{t_inv / t_fast:.2f}",
                     f"{kv_gb / (t_inv * 1e-6):.0f}", "yes" if same else "NO"])  # fmt: skip
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run (TRITON_INTERPRET=1)")
    ap.add_argument("--sweep", action="store_true", help="also sweep matmul launch configs")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per case on the CPU (median)")
    args = ap.parse_args(argv)
    args.sweep_rows = [256, 4096]
    if args.tiny:
        args.shapes, args.rows = {"tiny": (96, 80)}, [1, 5]
        args.heads, args.attention = (4, 2, 32, 16), [(3, 40)]
    else:
        args.shapes, args.rows = SHAPES_1B, ROWS
        args.heads, args.attention = (32, 8, 64, 16), [(1, 8192), (32, 2048), (256, 1024)]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    print(f"machine: {machine()}")
    gemm = gemm_rows(args, device, dtype)
    print(markdown_table(["weight", "N x K", "M", "cuBLAS us", "invariant us", "ratio",
                          "invariant TFLOP/s", "cuBLAS rows same at every M"], gemm))  # fmt: skip
    attn = attention_rows(args, device, dtype)
    print(markdown_table(["decodes", "context", "fast us", "invariant us", "ratio",
                          "invariant KV GB/s", "fast path row same alone"], attn))  # fmt: skip
    res = {"gemm": gemm, "attention": attn}
    if args.sweep:
        res["sweep"] = sweep_rows(args, device, dtype)
        print(markdown_table(["weight", "N x K", f"best us at M={args.sweep_rows}",
                              "cuBLAS us", "best config"], res["sweep"]))  # fmt: skip
    return res


if __name__ == "__main__":
    main()
