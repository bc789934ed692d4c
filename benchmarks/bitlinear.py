"""BitNet's BitLinear (`runtime/model/bitlinear.py`) against a dense `Linear` of the same shape.

The BitLinear is the engine's dense `Linear` over the unpacked ternary matrix plus the per-token
int8 rounding of its input and the scale on its output, so the ratio is what those cost beside
the GEMM. Shapes: microsoft/bitnet-b1.58-2B-4T's fused gate/up [2 x 6912, 2560] and down
[2560, 6912]; rows 1 (a decode step), 16 and 256. The two layers alternate within each round
(the machine is shared); medians are reported. CPU by default, CUDA with --device cuda.

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/bitlinear.py [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from pagoda.runtime.model.bitlinear import bit_linear
from pagoda.runtime.model.linear import Linear

SHAPES = {"gate_up": (2 * 6912, 2560), "down": (2560, 6912)}


class _Weights:
    """The two `DeviceWeights` calls `bit_linear` makes, over packed random matrices."""

    def __init__(self, packed, scale, device, dtype):
        self.stored = {"w.weight": packed}
        self._scale, self.device, self.dtype = scale, device, dtype

    def __contains__(self, name):
        return name == "w.weight_scale"

    def __getitem__(self, name):
        return self._scale.to(self.device, self.dtype)


def _time(fn, x, sync) -> float:
    sync()
    t = time.perf_counter()
    fn(x)
    sync()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(machine(), f"| device {device}, {args.dtype}")
    rows_out = []
    g = torch.Generator().manual_seed(0)
    for name, (n, k) in SHAPES.items():
        packed = torch.randint(0, 256, (n // 4, k), dtype=torch.uint8, generator=g)
        ctx = SimpleNamespace(linear=Linear)
        bit = bit_linear(ctx, _Weights(packed, torch.tensor([0.02]), device, dtype),
                         ["w.weight"], "offline")  # fmt: skip
        dense = Linear(torch.randn(n, k, generator=g).to(device, dtype) * 0.02)
        for m in (1, 16, 256):
            x = torch.randn(m, k, generator=g).to(device, dtype)
            for _ in range(3):  # warm-up (packing, CUDA kernels)
                bit(x), dense(x)
            a, b = [], []
            for _ in range(args.rounds):
                a.append(_time(dense, x, sync))
                b.append(_time(bit, x, sync))
            da, db = statistics.median(a), statistics.median(b)
            rows_out.append([name, f"{n}x{k}", m, f"{da * 1e3:.3f}", f"{db * 1e3:.3f}",
                             f"{db / da:.2f}"])  # fmt: skip
    print(markdown_table(["layer", "N x K", "rows", "dense ms", "BitLinear ms", "ratio"],
                         rows_out))  # fmt: skip


if __name__ == "__main__":
    main()
