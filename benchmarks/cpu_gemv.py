"""The CPU GEMV (`runtime/cpu/gemv.py`) of this tree against that of a git revision.

A whole-model pass (SmolLM2-135M's 121 weight shapes, each from memory as in a forward pass) at
several row counts, the two kernels' passes alternating in this process (the machine is shared:
alternation keeps load changes from favouring one side); medians are compared, and the outputs
of the two kernels are checked bit for bit. Needs AVX-512 BF16.

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/cpu_gemv.py --old-ref HEAD~1
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from amx_gemm import MODEL
from common import machine, markdown_table
from long_context import library_at
from pagoda.runtime.cpu import build, gemv
from pagoda.runtime.model.linear import _pack

# prints the GEMV library as a commit builds it
BUILD = """
try:
    from pagoda.runtime.cpu import build, gemv
    print(gemv.compile_kernel("gemv", build.find_compiler("CXX", ("g++", "clang++"))))
except ImportError:  # a commit from before runtime/cpu/
    from pagoda.runtime import native
    from pagoda.runtime.model import gemv
    print(gemv.build(gemv.SOURCE, "gemv", native.find_compiler("CXX", ("g++", "clang++"))))
"""


def kernel(path: Path) -> gemv.Gemv:
    """The GEMV of the library at `path`, for this oneDNN's packed layout."""
    return gemv.Gemv(ctypes.CDLL(str(path)), gemv.probe_layout(_pack))


def compare(kernels: dict[str, gemv.Gemv], rows: list[int], reps: int) -> list[list]:
    """Per row count: median ms of a model pass for each kernel, their ratio, equal bits."""
    packed = [_pack((torch.randn(n, k) * 0.05).to(torch.bfloat16)) for n, k in MODEL]
    weights = {name: [g.bind(p, None) for p in packed] for name, g in kernels.items()}
    table = []
    for m in rows:
        xs = {k: torch.randn(m, k).to(torch.bfloat16) for k in {k for _, k in MODEL}}
        outs = {name: [w(xs[w.k]) for w in ws] for name, ws in weights.items()}
        same = all(map(torch.equal, outs["before"], outs["after"]))
        times: dict[str, list[float]] = {name: [] for name in weights}
        for r in range(reps):
            for name in sorted(weights, reverse=r % 2 == 1):
                t = time.perf_counter()
                for w in weights[name]:
                    w(xs[w.k])
                times[name].append(time.perf_counter() - t)
        before, after = (statistics.median(times[k]) * 1e3 for k in ("before", "after"))
        table.append([m, f"{before:.2f}", f"{after:.2f}", f"{before / after:.2f}x", same])
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", default="HEAD", help="git revision whose kernel is 'before'")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 24, 32, 48, 64, 128])
    ap.add_argument("--reps", type=int, default=9, help="passes per kernel and row count")
    args = ap.parse_args(argv)
    print(machine())
    if gemv.load(_pack) is None:
        print("the CPU GEMV is unavailable here (needs AVX-512 BF16 and a C++ compiler)")
        return 1
    compiler = build.find_compiler("CXX", ("g++", "clang++"))
    kernels = {
        "before": kernel(library_at(args.old_ref, BUILD)),
        "after": kernel(gemv.compile_kernel("gemv", compiler)),
    }
    heads = ["rows", f"ms before ({args.old_ref})", "ms after", "ratio", "same bits"]
    print(markdown_table(heads, compare(kernels, args.rows, args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
