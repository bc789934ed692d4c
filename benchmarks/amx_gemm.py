"""The row-invariant AMX GEMM (`runtime/cpu/amx_gemm.py`) against oneDNN's packed bf16 GEMM.

For each SmolLM2-135M weight shape and row count M, calls alternate between the two (the
machine is shared: A/B in one run) and the medians are compared (one weight called again and
again stays in cache when it fits: its "GB/s" can exceed memory bandwidth); then a whole-model
pass (the 121 weights in order, each from memory as in a forward pass) at a few M. Run: ``OMP_WAIT_POLICY=PASSIVE python -P benchmarks/amx_gemm.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from pagoda.runtime.cpu import amx_gemm, gemv
from pagoda.runtime.model.linear import _pack

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]  # (N, K)
MODEL = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ROWS = [1, 4, 8, 32, 128, 512, 2048]


def onednn(packed: torch.Tensor):
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def alternate(fns: list, x_for, reps: int) -> list[float]:
    """Median seconds of each of `fns` (each a list of (fn, key) calls), run alternately."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for i, calls in enumerate(fns):
            t = time.perf_counter()
            for fn, key in calls:
                fn(x_for[key])
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def reps_for(flops: float) -> int:
    return max(5, min(200, int(2e10 / max(flops, 1.0))))


def shape_table(gemm: amx_gemm.AmxGemm, rows: list[int]) -> str:
    out = []
    for n, k in SHAPES:
        w = (torch.randn(n, k) * 0.05).to(torch.bfloat16)
        packed = _pack(w)
        ours = gemm.bind(packed, None)
        for m in rows:
            x = {k: torch.randn(m, k).to(torch.bfloat16)}
            flops = 2.0 * m * n * k
            ref, mine = alternate([[(onednn(packed), k)], [(ours, k)]], x, reps_for(flops))
            gb = n * k * 2 / 1e9
            row = [f"{n}x{k}", m, f"{flops / ref / 1e9:.0f}", f"{flops / mine / 1e9:.0f}"]
            out.append([*row, f"{gb / ref:.1f}", f"{gb / mine:.1f}", f"{ref / mine:.2f}"])
    head = ["N x K", "M", "oneDNN GFLOP/s", "AMX GFLOP/s", "oneDNN GB/s", "AMX GB/s"]
    return markdown_table([*head, "speedup"], out)


def model_table(gemm: amx_gemm.AmxGemm, rows: list[int]) -> str:
    """All weights in order (each from memory, as in a forward pass); the lead's decode GEMV
    (`gemv.py`, not M-invariant) too where it takes the rows."""
    packs = [_pack((torch.randn(n, k) * 0.05).to(torch.bfloat16)) for n, k in MODEL]
    ref = [(onednn(p), k) for p, (n, k) in zip(packs, MODEL)]
    mine = [(gemm.bind(p, None), k) for p, (n, k) in zip(packs, MODEL)]
    fast = gemv.load(_pack)
    other = None if fast is None else [(fast.bind(p, None), k) for p, (n, k) in zip(packs, MODEL)]
    out = []
    for m in rows:
        x = {k: torch.randn(m, k).to(torch.bfloat16) for k in (576, 1536)}
        flops = sum(2.0 * m * n * k for n, k in MODEL)
        calls = [ref, mine] + ([other] if other and m <= gemv.MAX_ROWS else [])
        a, b, *c = alternate(calls, x, max(3, min(20, int(3e11 / flops))))
        row = [m, f"{a * 1e3:.2f}", f"{b * 1e3:.2f}", f"{flops / b / 1e9:.0f}", f"{a / b:.2f}"]
        out.append([*row, f"{c[0] * 1e3:.2f}" if c else "-"])
    head = ["M", "oneDNN ms", "AMX ms", "AMX GFLOP/s", "speedup", "GEMV ms"]
    return markdown_table(head, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=ROWS)
    parser.add_argument("--model-rows", type=int, nargs="*", default=[1, 4, 32, 2048])
    args = parser.parse_args()
    print(machine())
    gemm = amx_gemm.load(_pack)
    if gemm is None:
        print("no AMX GEMM here (no AMX, tile state not granted, or another packed layout)")
        return
    torch.manual_seed(0)
    print(shape_table(gemm, args.rows))
    print("\nWhole model (121 weights of SmolLM2-135M in order):")
    print(model_table(gemm, args.model_rows))


if __name__ == "__main__":
    main()
