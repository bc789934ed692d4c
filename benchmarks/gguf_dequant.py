"""GGUF dequantization: `gguf.quants` (numpy, float32, then cast) beside `gguf_dequant` (torch).

Two parts, each alternating old and new in one process so load on a shared machine hits both:
the embedded model's every tensor read as the model builder reads it (bf16), and synthetic
4096x4096 Q4_K and Q6_K tensors (ms per tensor, 1 and 2 threads).

    .venv/bin/python -P benchmarks/gguf_dequant.py [--rounds 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import gguf
import numpy as np
import torch
from pagoda.runtime.cpu.quantized import probe_weight
from pagoda.runtime.model import gguf_dequant
from pagoda.runtime.model.gguf_loader import _reader, _shape
from pagoda.runtime.model.loader import resolve_model_path


def old(data, kind: str, shape, dtype, device) -> torch.Tensor:
    """The loader's path before `gguf_dequant`: numpy float32, owned copy, then cast and move."""
    arr = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind]).astype(np.float32)
    t = torch.from_numpy(np.array(arr.reshape(shape), dtype=np.float32, order="C"))
    return t.to(device=device, dtype=dtype)


def new(data, kind: str, shape, dtype, device) -> torch.Tensor:
    return gguf_dequant.dequantize(data, kind, shape, dtype, device)


def timed(fn, tensors, dtype, device) -> float:
    start = time.perf_counter()
    for data, kind, shape in tensors:
        fn(data, kind, shape, dtype, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def alternate(tensors, rounds: int, dtype, device) -> tuple[float, float]:
    """Best of `rounds` seconds (old, new), the two interleaved."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((old, new)):
            best[i] = min(best[i], timed(fn, tensors, dtype, device))
    return best[0], best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, device {device}, load average {os.getloadavg()}")  # fmt: skip
    reader = _reader(resolve_model_path(args.model))
    model = [(t.data, t.tensor_type.name, _shape(t)) for t in reader.tensors]
    kinds = sorted({k for _, k, _ in model})
    o, n = alternate(model, args.rounds, torch.bfloat16, device)
    print(f"embedded model, {len(model)} tensors ({', '.join(kinds)}) to bf16: numpy "
          f"{o * 1e3:.0f} ms, torch {n * 1e3:.0f} ms, {o / n:.1f}x")  # fmt: skip
    for kind in ("Q4_K", "Q6_K"):
        blocks = probe_weight(kind, 4096, 4096).blocks.numpy()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            o, n = alternate([(blocks, kind, (4096, 4096))], args.rounds, torch.bfloat16, device)
            print(f"{kind} 4096x4096 to bf16, {threads} thread(s): numpy {o * 1e3:.0f} ms, "
                  f"torch {n * 1e3:.0f} ms, {o / n:.1f}x")  # fmt: skip
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
