"""DiffLlama's tensor-parallel shapes (torch-free: `distributed/tp_families.py` asks
`tp_problem` before anything loads; `model/diffllama.py` splits q/k/v by `halves`).

Differential attention pairs query head i with head i + H/2, and each query head reads a value
head of both halves of the KV heads (module `diffllama`), so a rank holds its share of *each
half*: rank r of N the query heads [r H/2N, (r+1) H/2N) and H/2 + those, the KV heads
[r G/2N, (r+1) G/2N) and G/2 + those (keys and values alike). Locally that is a DiffLlama of
H/N heads over G/N KV heads, whose pairs are o_proj's even share of input columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout


def halves(lay: TPLayout, n: int) -> list[tuple[int, int]]:
    """This rank's [start, stop) of each half of `n` heads: its share of the first half, then
    the same share of the second."""
    a, b = lay.even(n // 2)
    return [(a, b), (n // 2 + a, n // 2 + b)]


def tp_problem(c: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split DiffLlama's heads (one line), or None: each half of the
    query heads and of the KV heads must divide by `size` (KV heads are not replicated)."""
    if not c.family.diff_attention:
        return None
    for key, n in (("num_attention_heads", c.num_heads), ("num_key_value_heads", c.num_kv_heads)):
        if (n // 2) % size:
            return (f"--tensor-parallel-size {size} does not divide half of DiffLlama's heads "
                    f"({key} {n}: differential attention pairs head i with head i + {n // 2} "
                    "on one rank)")  # fmt: skip
    return None
