"""Sampler cost per decode step at large batch: top-k / top-p / min-p rows on CPU, the native
kernel (`runtime/sampling/csrc/filter.h`, no sort or topk) against the PyTorch path (`topk`
candidates), alternating in one run, with whole-vocabulary sampling as the floor.

    .venv/bin/python -P benchmarks/sampler_cost.py                   # 256 x 32000, fp32
    .venv/bin/python -P benchmarks/sampler_cost.py --dtype bfloat16 --scales 1 4

Logits are randn * scale: scale 1 is a flat row (top_p=0.9 keeps ~80% of the vocabulary),
scale 4 a peaked one (entropy ~2.4 nats, top_p=0.9 keeps a few hundred tokens).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from pagoda.runtime.request import Request
from pagoda.runtime.sampling import native as sampler_native
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample

CASES = {
    "whole vocabulary": SamplingParams(temperature=0.8),
    "top_p=0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "top_k=50": SamplingParams(temperature=0.8, top_k=50),
    "top_k=50, top_p=0.9": SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    "top_p=0.9, min_p=0.05": SamplingParams(temperature=0.8, top_p=0.9, min_p=0.05),
}


def time_sample(logits: torch.Tensor, batch: SamplingBatch, native: bool, reps: int) -> float:
    """Best-of-`reps` ms of `sample` (the machine is shared: the minimum is the least noisy),
    with or without the native kernels."""
    usable = sampler_native.usable
    if not native:
        sampler_native.usable = lambda x: False
    try:
        sample(logits, batch)  # warm-up (and the one-time build)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            sample(logits, batch)
            times.append(time.perf_counter() - t)
    finally:
        sampler_native.usable = usable
    return 1e3 * min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    print(machine())
    print(f"batch {args.batch} x vocab {args.vocab}, {args.dtype} logits, best of {args.reps} x 3")
    assert sampler_native.available(), "the native kernels did not build"
    rows = []
    for scale in args.scales:
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(args.batch, args.vocab, generator=g) * scale
        logits = logits.to(getattr(torch, args.dtype))
        for name, params in CASES.items():
            reqs = [Request(f"r{i}", [1], params) for i in range(args.batch)]
            batch = SamplingBatch.build(reqs, args.vocab, torch.device("cpu"))
            pairs = [
                (time_sample(logits, batch, True, args.reps), time_sample(logits, batch, False, args.reps))
                for _ in range(3)  # alternate: the machine is shared
            ]  # fmt: skip
            native = min(p[0] for p in pairs)
            torch_ms = min(p[1] for p in pairs)
            speedup = f"{torch_ms / native:.1f}x"
            rows.append([scale, name, f"{torch_ms:.2f}", f"{native:.2f}", speedup])
    print(markdown_table(["scale", "case", "torch ms/step", "native ms/step", "speedup"], rows))


if __name__ == "__main__":
    main()
