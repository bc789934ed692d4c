"""A weight kept as stored: GGUF blocks (Q4_0/1, Q5_0/1, Q8_0, IQ4_NL, Q3/4/5/6_K, IQ4_XS) or
16-bit values (F16, BF16).

The loader dequantizes every tensor to float32, and on CPUs that compute in float32 (no native
bf16) a decode step then streams 4 bytes per weight; the blocks it came from hold 3.4 to 8.5
bits. `qgemm` multiplies by the blocks directly. Dequantizing here follows `gguf.quants` step by
step (``d * q + m`` rounded twice, ``d * (q - 8)``, ``q * d``; for the K kinds the sub-block
scale ``d * sc`` and min ``dmin * m`` formed in float32 first, then ``D * q - M``; IQ4's q is
its 16-entry table's value), so a weight is the same float32 value either way and only the
summation order of a matmul differs. float16 and bfloat16 weights (GGUF F16/BF16 tensors, or a
Hugging Face checkpoint's) widen exactly, so `qgemm` reads them at 2 bytes a weight too. Other
kinds (Q2_K, IQ1-3, TQ*, ...) keep the float32 path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

QK = 32  # weights per scale (Q6_K: per two scales) in every kind read here
# kind: (weights per GGUF block, bytes per block)
BLOCKS = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "IQ4_NL": (32, 18),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_XS": (256, 136),
    "F16": (32, 64),  # 16-bit kinds: plain values, counted in blocks of 32 (the kernel's keys)
    "BF16": (32, 64),
}
HALF_KINDS = {"F16": torch.float16, "BF16": torch.bfloat16}
K_KINDS = ("Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")  # 256-blocks: float32 scales per 32 or 16
PER_16 = ("Q3_K", "Q6_K", "IQ4_XS")  # `fields`' (d, m): the scales of keys 0-15 and 16-31
IQ4_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                          dtype=torch.int8)  # fmt: skip
_HALF_OF_DTYPE = {dtype: kind for kind, dtype in HALF_KINDS.items()}
BLOCK_BYTES = {kind: nbytes for kind, (_, nbytes) in BLOCKS.items()}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """`blocks`: uint8 [rows, cols // block * bytes], GGUF's bytes row by row (`BLOCKS`)."""

    kind: str
    blocks: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in BLOCKS:
            raise ValueError(f"quantization {self.kind!r} is not one of {sorted(BLOCKS)}")
        size, nbytes = BLOCKS[self.kind]
        if self.cols <= 0 or self.cols % size:
            raise ValueError(f"{self.kind} rows hold whole blocks of {size}; got {self.cols} cols")
        want = self.cols // size * nbytes
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
        """(q, d, m): q [rows, cols] the integers each weight is (q - 8 for Q4_0, q - 16 for
        Q5_0, q - 32 for Q6_K, IQ4's table value), d and m [rows, cols // 32] float32 (float16
        as stored with `raw_scales`, for the 32-blocks): the scale and Q4_1/Q5_1's offset
        (added) or Q4/5_K's min (subtracted); the `PER_16` kinds have a scale per 16 keys, d for
        the first 16 of each 32 and m for the others; m is None for Q4_0, Q5_0, Q8_0 and
        IQ4_NL. Not for the 16-bit kinds, which have no integers."""
        if self.kind in HALF_KINDS:
            raise ValueError(f"{self.kind} weights are values, not integers and scales")
        if self.kind in K_KINDS:
            return _k_fields(self)
        nb = self.cols // QK
        raw = self.blocks.view(self.rows, nb, BLOCK_BYTES[self.kind])
        d = _f16(raw[..., :2], raw_scales).squeeze(-1)
        m = None
        if self.kind in ("Q4_1", "Q5_1"):
            m = _f16(raw[..., 2:4], raw_scales).squeeze(-1)
        if self.kind == "Q8_0":
            q = raw[..., 2:].contiguous().view(torch.int8)
        else:
            five = self.kind in ("Q5_0", "Q5_1")
            start = 2 + 2 * (m is not None) + 4 * five
            q = _nibbles(raw[..., start:])
            if five:  # bit i of the 32-bit word before the nibbles: key i's fifth bit
                q = q | (_bits(raw[..., start - 4 : start]) << 4)
            if self.kind == "IQ4_NL":
                q = IQ4_VALUES.to(q.device)[q.long()]
            elif m is None:
                q = q.to(torch.int8) - (16 if five else 8)
        return q.reshape(self.rows, self.cols), d, m

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols], bit for bit `gguf.quants.dequantize`."""
        if self.kind in HALF_KINDS:
            return self.blocks.view(HALF_KINDS[self.kind]).float()
        q, d, m = self.fields()
        q = q.float().view(self.rows, -1, QK)
        if self.kind in PER_16:
            w = torch.cat([q[..., :16] * d[..., None], q[..., 16:] * m[..., None]], dim=-1)
        else:
            w = q * d[..., None]
        if self.kind in ("Q4_1", "Q5_1"):
            w = w + m[..., None]
        elif self.kind in ("Q4_K", "Q5_K"):
            w = w - m[..., None]
        return w.reshape(self.rows, self.cols)


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> [..., 2n]: every byte's low nibbles, then the high ones (GGUF's order)."""
    return torch.cat([b & 15, b >> 4], dim=-1)


def _bits(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> [..., 8n]: bit j of byte i at i * 8 + j (a little-endian word's bits)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device)
    return ((b.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _planes(b: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 32] -> [n, 256]: bit j of byte i at j * 32 + i (Q5_K's fifth bits, Q3_K's
    high bits: one bit plane per sub-block of 32 keys)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    return ((b.reshape(-1, 1, 32) >> shifts) & 1).reshape(-1, 256)


def _f16(pairs: torch.Tensor, keep: bool = False) -> torch.Tensor:
    """Byte pairs as the float16 values they store, widened to float32 unless `keep`."""
    halves = pairs.contiguous().view(torch.float16)
    return halves if keep else halves.float()


def _k_fields(w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fields` of the K kinds, following gguf.quants (scales formed in float32 as it does)."""
    n = w.blocks.shape[0] * (w.cols // 256)
    raw = w.blocks.reshape(n, BLOCK_BYTES[w.kind])
    if w.kind in ("Q4_K", "Q5_K"):
        d, dmin, sc = _f16(raw[:, 0:2]), _f16(raw[:, 2:4]), raw[:, 4:16].view(n, 3, 4)
        lo, hi, mix = sc[:, 0], sc[:, 1], sc[:, 2]
        scale = torch.cat([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
        mins = torch.cat([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], dim=-1)
        start = 16 if w.kind == "Q4_K" else 48  # Q5_K: 32 bytes of fifth bits first
        nibbles = torch.tensor([0, 4], dtype=torch.uint8, device=raw.device).view(1, 1, 2, 1)
        q = ((raw[:, start:].view(n, 4, 1, 32) >> nibbles) & 0x0F).reshape(n, 256)
        if w.kind == "Q5_K":
            q = q | (_planes(raw[:, 16:48]) << 4)
        d_out, m_out = d * scale.float(), dmin * mins.float()  # [n, 8]: a pair per 32 keys
    elif w.kind == "Q3_K":
        return _q3_k_fields(w, raw)
    elif w.kind == "IQ4_XS":
        d = _f16(raw[:, 0:2])
        high = raw[:, 2].int() | (raw[:, 3].int() << 8)  # 2 bits per sub-block of 32
        high = (high.view(n, 1) >> (2 * torch.arange(8, device=raw.device)).view(1, 8)) & 3
        four = torch.tensor([0, 4], dtype=torch.uint8, device=raw.device)
        low = (raw[:, 4:8].view(n, 4, 1) >> four) & 15
        scale = (low.reshape(n, 8).int() | (high << 4)) - 32
        q = _nibbles(raw[:, 8:].view(n, 8, 16)).reshape(n, 256)
        q = IQ4_VALUES.to(q.device)[q.long()]
        d_out = m_out = d * scale.float()  # one scale per 32 keys: the same for both halves
    else:
        ql, qh = raw[:, :128], raw[:, 128:192]
        scales = raw[:, 192:208].contiguous().view(torch.int8).float()
        d = _f16(raw[:, 208:210]) * scales  # [n, 16]: one per 16 keys
        shifts = torch.tensor([0, 4], dtype=torch.uint8, device=raw.device).view(1, 1, 2, 1)
        low = ((ql.reshape(n, 2, 1, 64) >> shifts) & 0x0F).reshape(n, 8, 32)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=raw.device).view(1, 1, 4, 1)
        high = ((qh.reshape(n, 2, 1, 32) >> shifts) & 0x03).reshape(n, 8, 32)
        q = (low | (high << 4)).to(torch.int8).reshape(n, 256) - 32
        d_out, m_out = d[:, 0::2], d[:, 1::2]
    rows = w.blocks.shape[0]
    return q.reshape(rows, w.cols), d_out.reshape(rows, -1), m_out.reshape(rows, -1)


def _q3_k_fields(w: QuantizedWeight, raw: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Q3_K: 2 low bits in `qs`, a high bit in `hmask` (set: no offset, clear: -4), a 6-bit
    signed scale per 16 keys (4 bits + 2 bits), as gguf.quants unpacks them."""
    n = raw.shape[0]
    hmask, qs, sc, d = raw[:, :32], raw[:, 32:96], raw[:, 96:108], _f16(raw[:, 108:110])
    two = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=raw.device)
    high = ((sc[:, 8:12].reshape(n, 1, 4) >> two.view(1, 4, 1)) & 3).reshape(n, 16)
    scale = (_nibbles(sc[:, :8]).to(torch.int8) | (high << 4).to(torch.int8)) - 32
    dl = d * scale.float()  # [n, 16]: one per 16 keys
    low = ((qs.reshape(n, 2, 1, 32) >> two.view(1, 1, 4, 1)) & 3).reshape(n, 256)
    q = low.to(torch.int8) - ((_planes(hmask) ^ 1) << 2).to(torch.int8)
    rows = w.blocks.shape[0]
    return q.reshape(rows, w.cols), dl[:, 0::2].reshape(rows, -1), dl[:, 1::2].reshape(rows, -1)


def readable(kind: str, cols: int) -> bool:
    """Whether `qgemm` reads rows of `cols` weights stored as the GGUF type `kind`."""
    return kind in BLOCKS and cols % BLOCKS[kind][0] == 0


def from_gguf(kind: str, data: np.ndarray, cols: int) -> QuantizedWeight | None:
    """A GGUF tensor's raw blocks (uint8, one row of blocks per output), or None for a format
    `qgemm` does not read."""
    if not readable(kind, cols):
        return None
    raw = np.ascontiguousarray(data).view(np.uint8)  # float16 arrays: their bytes
    raw = raw.reshape(-1, cols // BLOCKS[kind][0] * BLOCK_BYTES[kind])
    return QuantizedWeight(kind, torch.from_numpy(raw.copy()), cols)


def from_dense(t: torch.Tensor) -> QuantizedWeight | None:
    """A float16 or bfloat16 matrix (a checkpoint's weight) as a 16-bit kind sharing its
    memory, or None for other dtypes, shapes and widths `qgemm` cannot take."""
    kind = _HALF_OF_DTYPE.get(t.dtype)
    if kind is None or t.dim() != 2 or t.shape[1] % QK or not t.is_contiguous():
        return None
    return QuantizedWeight(kind, t.view(torch.uint8), t.shape[1])


def probe_weight(kind: str, rows: int, cols: int, seed: int = 0) -> QuantizedWeight:
    """Random blocks of `kind` with modest, finite scales (tests and `qgemm`'s load check)."""
    g = torch.Generator().manual_seed(seed)
    if kind in HALF_KINDS:
        values = (torch.randn(rows, cols, generator=g) * 0.05).to(HALF_KINDS[kind])
        return QuantizedWeight(kind, values.view(torch.uint8), cols)
    nb = cols // BLOCKS[kind][0]
    raw = torch.randint(0, 256, (rows, nb, BLOCK_BYTES[kind]), generator=g, dtype=torch.uint8)
    at = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1),
          "Q3_K": (108, 1)}.get(kind, (0, 1))  # fmt: skip
    halves = (torch.rand(rows, nb, at[1], generator=g) * 0.02 - 0.01).to(torch.float16)
    raw[..., at[0] : at[0] + 2 * at[1]] = halves.view(torch.uint8).view(rows, nb, 2 * at[1])
    return QuantizedWeight(kind, raw.view(rows, -1), cols)


def stack(parts: Sequence[QuantizedWeight | None]) -> list[QuantizedWeight] | None:
    """The rows of `parts` in order (q/k/v, gate/up) as few weights as their kinds allow
    (neighbours of one kind concatenated), or None unless every part is quantized and all have
    the same columns."""
    if not parts or any(p is None for p in parts):
        return None
    if any(p.cols != parts[0].cols for p in parts):
        return None
    out: list[QuantizedWeight] = []
    for p in parts:
        if out and out[-1].kind == p.kind:
            p = QuantizedWeight(p.kind, torch.cat([out.pop().blocks, p.blocks]), p.cols)
        out.append(p)
    return out
