"""The native top-k / top-p kernel of a git commit against this tree's, alternating in one
process: both libraries are built from their commit's C sources and called on the same logits
and uniforms, so machine noise falls on both alike; also says whether they picked the same tokens.
`--kernel whole` times the whole-vocabulary draw (`sample_rows`, min-p with `--min-p`),
`--kernel argmax` the greedy argmax, instead.

    .venv/bin/python -P benchmarks/sampler_ab.py --old-ref fae1d13              # top-p 0.9
    .venv/bin/python -P benchmarks/sampler_ab.py --old-ref HEAD~1 --top-k 700 --top-p 1
    .venv/bin/python -P benchmarks/sampler_ab.py --old-ref HEAD~1 --kernel argmax

Rows are randn * sigma (sigma 0.02: near uniform; 0.3, 1.0: flat; 3.0: spread) and a peaked
row (8 strong tokens over randn * 2.5), in bf16 and float32; kernel milliseconds are the median
over rounds of each round's best of `--reps` calls.
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
from long_context import library_at
from pagoda.runtime.sampling import native

LOG2E = 1.4426950408889634
KERNELS = {"filtered": "sample_filtered_rows", "whole": "sample_rows", "argmax": "argmax_rows"}
# prints the native sampler's library as a commit builds it
BUILD = """
try:
    from pagoda.runtime.sampling.native import _build
except ImportError:  # a commit from before runtime/sampling/
    from pagoda.runtime.sampler_native import _build
print(_build())
"""


def load(path: Path, kernel: str):
    """The kernel's function (`KERNELS`) of the library at `path`."""
    return getattr(native.load(path), KERNELS[kernel])


def call(fn, x: torch.Tensor, params: list[torch.Tensor | None]) -> torch.Tensor:
    """One token per row of x through `fn`, threaded as `native` threads it."""
    n, v = x.shape
    out = torch.empty(n, dtype=torch.long)
    ptrs = [None if t is None else t.data_ptr() for t in params]
    bf16 = int(x.dtype == torch.bfloat16)
    rows = () if fn.__name__ == "argmax_rows" else (None,)  # argmax reads every row
    native._over_rows(fn, n, x.data_ptr(), bf16, v, *rows, *ptrs, out.data_ptr())
    return out


def cases(rows: int, vocab: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    peaked = torch.randn(rows, vocab, generator=g) * 2.5
    peaked[:, :8] += 9
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        for sigma in (0.02, 0.3, 1.0, 3.0):
            out.append(
                (f"{name} σ {sigma}", (torch.randn(rows, vocab, generator=g) * sigma).to(dtype))
            )
        out.append((f"{name} peaked", peaked.to(dtype)))
    return out


def best_ms(fn, x, params, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        call(fn, x, params)
        best = min(best, time.perf_counter() - t)
    return 1e3 * best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", required=True, help="the git commit to compare against")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=0, help="0: off")
    ap.add_argument("--min-p", type=float, default=0.0, help="0: off (filtered, whole)")
    ap.add_argument("--kernel", choices=list(KERNELS), default="filtered")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    path = native._build()
    if path is None:
        sys.exit("the native sampler does not build here")
    old = load(library_at(args.old_ref, BUILD), args.kernel)
    new = load(path, args.kernel)
    n = args.rows
    g = torch.Generator().manual_seed(1)
    scale, u = torch.full((n,), LOG2E / args.temperature), torch.rand(n, generator=g)
    min_p = torch.full((n,), args.min_p) if args.min_p > 0 else None
    params = {
        "filtered": [
            scale,
            torch.full((n,), args.top_k) if args.top_k else None,
            torch.full((n,), args.top_p) if args.top_p < 1 else None,
            min_p,
            u,
        ],
        "whole": [scale, min_p, u],
        "argmax": [],
    }[args.kernel]
    table = []
    for name, x in cases(n, args.vocab):
        times: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds):  # alternating which goes first
            for key, fn in (
                (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))
            ):
                times[key].append(best_ms(fn, x, params, args.reps))
        a, b = statistics.median(times["old"]), statistics.median(times["new"])
        same = torch.equal(call(old, x, params), call(new, x, params))
        table.append([name, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x", "yes" if same else "no"])
    filters = {
        "filtered": f"top-k {args.top_k or 'off'}, top-p {args.top_p}, min-p {args.min_p}",
        "whole": f"whole vocabulary, min-p {args.min_p}",
        "argmax": "greedy argmax",
    }[args.kernel]
    filters += f", T {args.temperature}" if args.kernel != "argmax" else ""
    print(
        f"\nkernel ms, [{n}, {args.vocab}], {filters}; before = {args.old_ref}, after = this tree"
    )
    print(markdown_table(["rows", "before", "after", "speed-up", "same tokens"], table))


if __name__ == "__main__":
    main()
