"""The quantized float32 GEMM (`runtime/cpu/qgemm.py`) against oneDNN's packed float32 GEMM.

A whole-model pass of SmolLM2-135M's weight shapes (each weight from memory, as in a forward:
121 weights, 540 MB in float32; `--layers N`: the first N layers and the LM head) at several
row counts, in the formats the embedded GGUF stores
(Q4_1 layers, a Q8_0 vocabulary projection; ``--layer-kind``/``--head-kind`` for others of
block 32: SmolLM2's width 576 is not a multiple of the K kinds' 256); the two passes
alternate (the machine is shared).
This is what a float32 CPU model (AVX2 only, no native bf16) runs with and without
``PAGODA_CPU_QGEMM``. Prints weight bytes streamed per pass and the effective rates.

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/cpu_qgemm.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from amx_gemm import MODEL, alternate, onednn
from common import machine, markdown_table
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.cpu.quantized import BLOCKS
from pagoda.runtime.model.linear import _pack

LAYERS = (len(MODEL) - 1) // 4  # SmolLM2's 30


def compare(rows: list[int], layer_kind: str, head_kind: str, layers: int = LAYERS) -> str:
    kernel = qgemm.load()
    shapes = MODEL[: 4 * layers] + MODEL[-1:]  # the first `layers` layers and the LM head
    kinds = [layer_kind] * (len(shapes) - 1) + [head_kind]
    weights = [
        qgemm.probe_weight(kind, n, k, seed=i)
        for i, (kind, (n, k)) in enumerate(zip(kinds, shapes))
    ]
    ref = [(_as_linear(onednn(_pack(w.dequantize()))), w.cols) for w in weights]
    mine = [(kernel.bind(w, None), w.cols) for w in weights]
    f32_mb = sum(4 * n * k for n, k in shapes) / 1e6
    q_mb = sum(x.nbytes for x, _ in mine) / 1e6
    out = []
    for m in rows:
        x = {k: torch.randn(m, k) for k in (576, 1536)}
        flops = sum(2.0 * m * n * k for n, k in shapes)
        reps = max(3, min(20, int(2e11 / flops)))
        agree = all(
            torch.allclose(f(x[k]), g(x[k]), rtol=1e-3, atol=1e-4)
            for (f, k), (g, _) in zip(ref, mine)
        )  # and warm: the same products, other summation orders
        a, b = alternate([ref, mine], x, reps)
        out.append([m, f"{a * 1e3:.2f}", f"{b * 1e3:.2f}", f"{a / b:.2f}x",
                    f"{f32_mb / 1e3 / a:.1f}", f"{q_mb / 1e3 / b:.1f}", f"{flops / b / 1e9:.0f}", agree])  # fmt: skip
    head = ["M", "oneDNN f32 ms", "qgemm ms", "speedup", "oneDNN GB/s", "qgemm GB/s",
            "qgemm GFLOP/s", "agree"]  # fmt: skip
    return f"weights per pass: float32 {f32_mb:.0f} MB, quantized {q_mb:.0f} MB\n" + markdown_table(
        head, out
    )


def _as_linear(fn):
    """A lone row computed as two, as `Linear` does (oneDNN's GEMV path rounds otherwise)."""
    return lambda x: fn(x.expand(2, -1))[:1] if x.shape[0] == 1 else fn(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 32, 128, 512])
    ap.add_argument("--layer-kind", choices=sorted(qgemm.KINDS), default="Q4_1",
                    help="the layers' format (the embedded GGUF's: Q4_1; llama.cpp's Q4_K_M: Q4_K)")  # fmt: skip
    ap.add_argument("--head-kind", choices=sorted(qgemm.KINDS), default="Q8_0")
    ap.add_argument(
        "--layers", type=int, default=LAYERS, help="the first N layers (and the LM head)"
    )
    args = ap.parse_args(argv)
    print(machine())
    if any(k % BLOCKS[kind][0] for kind in (args.layer_kind, args.head_kind) for _, k in MODEL):
        ap.error("SmolLM2's width 576 is not a whole number of the K kinds' 256-weight blocks")
    if not 1 <= args.layers <= LAYERS:
        ap.error(f"--layers: SmolLM2 has 1 to {LAYERS}")
    if qgemm.load() is None:
        print("the quantized GEMM is unavailable here (needs AVX2 + FMA and a C++ compiler)")
        return 1
    print(f"layers {args.layer_kind}, LM head {args.head_kind}")
    print(compare(args.rows, args.layer_kind, args.head_kind, args.layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
