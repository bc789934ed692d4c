"""A GGUF weight kept in its quantized blocks (Q4_0, Q4_1, Q8_0), rows in Hugging Face order.

The loader dequantizes every tensor to float32, and on CPUs that compute in float32 (no native
bf16) a decode step then streams 4 bytes per weight; the blocks it came from hold 4.5 to 8.5
bits. `qgemm` multiplies by the blocks directly. Dequantizing here follows `gguf.quants` step by
step (``d * q + m`` rounded twice, ``d * (q - 8)``, ``q * d``), so a weight is the same float32
value either way and only the summation order of a matmul differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

QK = 32  # weights per block in all three formats
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """`blocks`: uint8 [rows, cols // 32 * BLOCK_BYTES[kind]], GGUF's bytes row by row."""

    kind: str
    blocks: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_BYTES:
            raise ValueError(f"quantization {self.kind!r} is not one of {sorted(BLOCK_BYTES)}")
        if self.cols <= 0 or self.cols % QK:
            raise ValueError(f"{self.kind} rows hold whole blocks of {QK}; got {self.cols} cols")
        want = self.cols // QK * BLOCK_BYTES[self.kind]
        b = self.blocks
        if b.dtype != torch.uint8 or b.dim() != 2 or b.shape[1] != want:
            raise ValueError(
                f"{self.kind} blocks must be uint8 [rows, {want}], got {b.dtype} {tuple(b.shape)}"
            )

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    def fields(
        self, raw_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q, d, m): q [rows, cols] the integers each weight is (q - 8 for Q4_0), d and m
        [rows, cols // 32] float32, or float16 as stored with `raw_scales` (m None but for
        Q4_1)."""
        nb = self.cols // QK
        raw = self.blocks.view(self.rows, nb, BLOCK_BYTES[self.kind])
        wide = (lambda t: t) if raw_scales else (lambda t: t.float())
        d = wide(raw[..., :2].contiguous().view(torch.float16)).squeeze(-1)
        m = None
        if self.kind == "Q8_0":
            q = raw[..., 2:].contiguous().view(torch.int8)
        else:
            start = 4 if self.kind == "Q4_1" else 2
            nibbles = raw[..., start:]  # element i low nibble, element i + 16 high
            q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1)
            if self.kind == "Q4_1":
                m = wide(raw[..., 2:4].contiguous().view(torch.float16)).squeeze(-1)
            else:
                q = q.to(torch.int8) - 8
        return q.reshape(self.rows, self.cols), d, m

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols], bit for bit `gguf.quants.dequantize`."""
        q, d, m = self.fields()
        w = q.float().view(self.rows, -1, QK) * d[..., None]
        if m is not None:
            w = w + m[..., None]
        return w.view(self.rows, self.cols)


def from_gguf(kind: str, data: np.ndarray, cols: int) -> QuantizedWeight | None:
    """A GGUF tensor's raw blocks (uint8, one row of blocks per output), or None for a format
    `qgemm` does not read."""
    if kind not in BLOCK_BYTES or cols % QK:
        return None
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, cols // QK * BLOCK_BYTES[kind])
    return QuantizedWeight(kind, torch.from_numpy(raw.copy()), cols)


def concat(parts: Sequence[QuantizedWeight | None]) -> QuantizedWeight | None:
    """Row-wise concatenation (q/k/v, gate/up), or None unless all are quantized alike."""
    if not parts or any(p is None for p in parts):
        return None
    first = parts[0]
    if any(p.kind != first.kind or p.cols != first.cols for p in parts):
        return None
    return QuantizedWeight(first.kind, torch.cat([p.blocks for p in parts]), first.cols)
