"""Shared pieces of the benchmarks: the ragged workload, GEMM peak measurement, table output."""

from __future__ import annotations

import math
import random
import time

import torch

PREAMBLE_TOKENS = 64  # every prompt opens with the same system-prompt-like prefix


def ragged_workload(
    tokenizer, n: int, min_len: int, max_len: int, seed: int = 0
) -> list[list[int]]:
    """`n` prompts, lengths log-uniform in [min_len, max_len], sharing a short common preamble.

    Text is the source of Python's own `argparse` module: natural tokens, long enough that
    slices do not repeat, and fixed for a given Python version (so runs are comparable).
    """
    import argparse
    import inspect

    corpus = tokenizer.encode(inspect.getsource(argparse))
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = round(math.exp(rng.uniform(math.log(min_len), math.log(max_len))))
        head = corpus[: min(PREAMBLE_TOKENS, length)]
        start = rng.randrange(PREAMBLE_TOKENS, len(corpus) - max_len)
        prompts.append(head + corpus[start : start + length - len(head)])
    return prompts


def gemm_peak(dtype: torch.dtype, size: int = 2048, seconds: float = 1.0) -> float:
    """Best-of GEMM throughput in FLOP/s on this machine, now (the machine is shared and noisy)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)
    best, end = math.inf, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
