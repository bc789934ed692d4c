"""A GGUF tensor's stored bytes → dense torch values, dequantized in torch on the target device.

`gguf.quants.dequantize` walks the blocks in numpy on one CPU core and returns float32: the
embedded Q4_1 model spent most of its build there, and an 8B Q4_K_M model served on a GPU would
spend minutes and 32 GB of float32 temporaries before casting to bf16 and copying 4 bytes a
weight to the device. Here the raw blocks (a uint8 view of the memory map, no copy) go to the
device as stored (3.5-7x fewer bytes than float32) and are dequantized there by the same torch
code `qgemm` uses (`quantized.QuantizedWeight.dequantize`: float32, bit for bit
`gguf.quants`), then cast to the model's dtype: the values today's numpy-then-cast path gives.
F32/F16/BF16 tensors are views. Other kinds (Q2_K, IQ1-3, TQ*, ...), byte orders other than the
machine's, and rows that are not whole blocks keep `gguf.quants.dequantize`.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from pagoda.runtime.cpu.quantized import (
    BLOCK_BYTES,
    BLOCKS,
    HALF_KINDS,
    PER_16,
    QK,
    QuantizedWeight,
)

_PLAIN = {"F32": torch.float32, **HALF_KINDS}
MXFP4_BLOCK, MXFP4_BYTES = 32, 17  # values a block, its bytes (an E8M0 exponent, 16 of nibbles)
# ggml's kvalues_mxfp4: the E2M1 codes' values doubled (its scale is halved to match)
_MXFP4_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def covered(kind: str, cols: int) -> bool:
    """Whether tensors of GGUF type `kind` with rows of `cols` values dequantize in torch."""
    if kind in _PLAIN:
        return True
    if kind == "MXFP4":
        return cols % MXFP4_BLOCK == 0
    return kind in BLOCKS and cols % BLOCKS[kind][0] == 0


def dequantize(
    data: np.ndarray,
    kind: str,
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The tensor of `shape` (row-major, GGUF's dims reversed) stored as `data` (the reader's
    array: uint8 blocks, or F32/F16/BF16 values), as `dtype` on `device` (default: the CPU).
    The result owns its memory (never a view of the file)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    cols = shape[-1] if shape else 1
    if not data.dtype.isnative or not covered(kind, cols):
        return _numpy(data, kind, shape, dtype, device)
    raw = _as_tensor(data)
    if kind in _PLAIN:
        values = raw.view(_PLAIN[kind]).reshape(shape)
        out = values.to(device=device, dtype=dtype)
        return out.clone() if out.data_ptr() == values.data_ptr() else out
    if kind == "MXFP4":
        blocks = raw.reshape(-1, MXFP4_BYTES).to(device)
        return _mxfp4(blocks).reshape(shape).to(dtype)
    blocks = raw.reshape(-1, cols // BLOCKS[kind][0] * BLOCK_BYTES[kind]).to(device)
    return _blocks(QuantizedWeight(kind, blocks, cols)).reshape(shape).to(dtype)


def _blocks(w: QuantizedWeight) -> torch.Tensor:
    """`w.dequantize()` (float32, the same operations in the same order: bit for bit
    `gguf.quants`) computed in place in one float32 buffer: each fresh 4-byte-a-weight temporary
    costs as much as the arithmetic on it (page faults), and a weight holds only one."""
    q, d, m = w.fields()
    out = q.to(torch.float32).view(w.rows, -1, QK)
    if w.kind in PER_16:
        out[..., :16].mul_(d[..., None])
        out[..., 16:].mul_(m[..., None])
    else:
        out.mul_(d[..., None])
    if w.kind in ("Q4_1", "Q5_1"):
        out.add_(m[..., None])
    elif w.kind in ("Q4_K", "Q5_K"):
        out.sub_(m[..., None])
    return out.view(w.rows, w.cols)


def _mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    """[n, 17] MXFP4 blocks -> [n, 32] float32, as ggml's `dequantize_row_mxfp4` (and
    `gguf.quants.MXFP4`): value j = kvalues[qs[j] & 15] x d, value j + 16 = kvalues[qs[j] >> 4] x d,
    d = `ggml_e8m0_to_fp32_half(e)` (0x00200000 << e for e < 2, else (e - 1) << 23, as float32
    bits: 2^(e - 128)). Exact: small integers times a power of two."""
    e, qs = blocks[:, :1].to(torch.int32), blocks[:, 1:]
    bits = torch.where(e < 2, torch.bitwise_left_shift(0x00200000, e), (e - 1) << 23)
    d = bits.view(torch.float32)
    lut = torch.tensor(_MXFP4_DOUBLED, dtype=torch.float32, device=blocks.device)
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=1).long()
    return lut[codes].mul_(d)


def _as_tensor(data: np.ndarray) -> torch.Tensor:
    """A uint8 tensor sharing `data`'s bytes (the read-only memory map: read, never written)."""
    raw = np.ascontiguousarray(data).view(np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable": nothing writes to it
        return torch.from_numpy(raw)


def _numpy(data, kind: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`gguf.quants`' float32, as the loader read every tensor before (the fallback)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    arr = gguf.quants.dequantize(data, qtype).astype(np.float32, copy=False).reshape(shape)
    out = torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))  # own the memory
    return out.to(device=device, dtype=dtype)
