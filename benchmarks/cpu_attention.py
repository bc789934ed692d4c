"""CPU paged-attention kernel timings: decode and prefill per layer, optionally against an older build.

One layer of SmolLM2-135M attention by default (9 heads, 3 KV heads, head_dim 64, block 16,
bf16; ``--dtype float32`` for what CPUs without native bf16 run). Decode: B sequences of one new
token on `context` cached tokens, their blocks scattered over the cache; prefill: one fresh
prompt of n tokens. With ``--old-ref REF`` the kernel as git revision REF builds it is built too and
both are timed alternating call by call in this process (the machine is shared: alternation
keeps load changes from favouring one side); medians are printed.

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/cpu_attention.py --old-ref HEAD
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from long_context import library_at
from pagoda.runtime.cpu import attention as cpu_attention

# prints the attention kernel's library as a commit builds it
BUILD = """
try:
    from pagoda.runtime.cpu import attention
except ImportError:  # a commit from before runtime/cpu/
    from pagoda.runtime.attention import cpu_kernel as attention
print(attention.build())
"""


def old_kernel(ref: str) -> cpu_attention.CpuKernel:
    """The kernel as git revision `ref` builds it (its sources, flags and build code)."""
    return cpu_attention.CpuKernel(library_at(ref, BUILD))


def make_case(h, hkv, d, bs, batch, context, new, seed=0, dtype=torch.bfloat16):
    """Caches, a scattered block table, query and step tensors for one call."""
    g = torch.Generator().manual_seed(seed)
    nblk = -(-context // bs)
    nb = batch * nblk + 1
    k_shape, v_shape = cpu_attention.packed_shapes(hkv, nb, bs, d, dtype)
    kc = torch.randn(k_shape, generator=g).to(dtype)
    vc = torch.randn(v_shape, generator=g).to(dtype)
    perm = np.random.default_rng(seed).permutation(nb - 1) + 1
    bt = torch.from_numpy(perm.reshape(batch, nblk).astype(np.int32))
    q = torch.randn(batch * new, h, d, generator=g).to(dtype)
    qs = torch.arange(0, batch * new + 1, new, dtype=torch.int32)
    sl = torch.full((batch,), context, dtype=torch.int32)
    return q, kc, vc, bt, qs, sl


def time_case(kernels, case, budget_s: float) -> list[float]:
    """Median seconds per call of each kernel, calls alternating until the budget is spent."""
    q, kc, vc, bt, qs, sl = case
    scale = q.shape[-1] ** -0.5
    times: list[list[float]] = [[] for _ in kernels]
    outs = [k.attention(q, kc, vc, bt, qs, sl, scale) for k in kernels]  # warm-up
    for o in outs[1:]:
        assert torch.allclose(o.float(), outs[0].float(), atol=2e-2, rtol=2e-2)
    end = time.perf_counter() + budget_s
    while time.perf_counter() < end or len(times[0]) < 5:
        for i, k in enumerate(kernels):
            t = time.perf_counter()
            k.attention(q, kc, vc, bt, qs, sl, scale)
            times[i].append(time.perf_counter() - t)
    return [float(np.median(t)) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", help="git revision whose kernel is timed beside this one")
    ap.add_argument("--heads", type=int, nargs=3, default=[9, 3, 64], metavar=("H", "HKV", "D"))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[300, 1000, 5000])
    ap.add_argument("--prefill", type=int, nargs="*", default=[512, 1024])
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="cache and query dtype (float32: what CPUs without native bf16 run)")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=1.0, help="time budget per case")
    args = ap.parse_args()
    print(machine())
    kernels = [cpu_attention.load()]
    names = ["new ms"]
    if args.old_ref:
        kernels.append(old_kernel(args.old_ref))
        names.append(f"{args.old_ref} ms")
    h, hkv, d = args.heads
    dtype = getattr(torch, args.dtype)
    cases = [(f"decode B={b} ctx={c}", b, c, 1) for b in args.batches for c in args.contexts]
    cases += [(f"prefill {n}", 1, n, n) for n in args.prefill]
    rows = []
    for name, b, c, n in cases:
        med = time_case(kernels, make_case(h, hkv, d, 16, b, c, n, dtype=dtype), args.seconds)
        if n == 1:  # decode reads every cached K/V byte once
            rate = f"{2 * b * c * hkv * d * dtype.itemsize / 1e9 / med[0]:.1f} GB/s K/V"
        else:  # prefill: q @ K^T and p @ V over the causal half
            rate = f"{4 * h * d * n * (n + 1) / 2 / 1e9 / med[0]:.0f} GFLOP/s"
        row = [name, *(f"{m * 1e3:.3f}" for m in med), rate]
        if len(med) > 1:
            row.append(f"{med[1] / med[0]:.2f}x")
        rows.append(row)
    headers = ["case", *names, "new rate"] + (["speed-up"] if args.old_ref else [])
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()
