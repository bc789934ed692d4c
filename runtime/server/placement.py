"""How the engine holds a checkpoint's weights (`server/weights.py` counts them by it): dtype,
device, ranks, the projections in FP8, float32 matrices kept as `qgemm` blocks, and the CPU
`Linear`s' packed copies; the shapes and bytes of those packed layouts."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pagoda.runtime.server.rank_share import _local

if TYPE_CHECKING:
    from pagoda.runtime.config import EngineConfig, ModelConfig
    from pagoda.runtime.quantization.fp8 import Fp8Scheme
    from pagoda.runtime.server.stored import Stored


@dataclass(frozen=True)
class Placement:
    """How the engine holds weights: dtype, device, ranks, FP8 layers, `qgemm` blocks, packing."""

    dtype: torch.dtype
    device: str = "cpu"  # "cpu" or "cuda"
    tp: int = 1
    fp8: Fp8Scheme | None = None  # the scheme the projections run in FP8 with (None: 16/32-bit)
    blocks: bool = False  # float32 on a CPU with `qgemm`: stored blocks / 16-bit read in place
    packs: bool = False  # CPU `Linear`s hold a packed copy (a tied LM head: a second table)


def placement(
    cfg: EngineConfig, path: Path, tp: int = 1, device: torch.device | None = None
) -> Placement:
    """How `cfg` holds the weights of `path`, by the loader's and the layers' own rules."""
    from pagoda.runtime.config import fp8_runs_on, resolve_dtype
    from pagoda.runtime.quantization.fp8 import engine_scheme

    device = cfg.torch_device() if device is None else device
    dtype = resolve_dtype(cfg.dtype, device)
    scheme = None
    if path.is_dir():
        from pagoda.runtime.model.hf_loader import read_quantization

        scheme = read_quantization(path)
    try:
        fp8 = engine_scheme(cfg.quantization, scheme, fp8_runs_on(device))
    except ValueError:  # --quantization fp8 where it cannot run: refused by the config already
        fp8 = None
    cpu = device.type == "cpu"
    blocks = packs = False
    if cpu and dtype == torch.float32 and tp == 1:  # DeviceWeights: blocks serve float32 only
        from pagoda.runtime.cpu import qgemm

        blocks = qgemm.wanted() and qgemm.load() is not None
    if cpu:
        from pagoda.runtime.model import linear

        packs = dtype in linear.PACKED_DTYPES and linear._can_pack(dtype)
    return Placement(dtype, device.type, tp, fp8, blocks, packs)


def packed_shape(rows: int, cols: int, dtype: torch.dtype) -> tuple[int, int]:
    """The shape of oneDNN's packed copy of a [rows, cols] weight (`linear._pack`): a one-row
    weight (Qwen2-MoE's shared_expert_gate) is kept as it is in float32 (`_one_row_kept`)."""
    if rows == 1 and _one_row_kept(dtype):
        return rows, cols
    a, b = _pad(dtype)
    return -(-rows // a) * a, -(-cols // b) * b


@functools.cache
def _one_row_kept(dtype: torch.dtype) -> bool:
    """Whether `linear._pack` keeps a one-row weight unpadded (float32: a GEMV's layout, where
    2 rows pad to 64; bf16 on AVX-512 pads it as any other)."""
    from pagoda.runtime.model import linear

    try:
        packed = linear._pack(torch.zeros(1, 65, dtype=dtype))
        return torch.ops.mkldnn._nbytes(packed) == 65 * dtype.itemsize
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def _pad(dtype: torch.dtype) -> tuple[int, int]:
    """The row and column multiples `linear._pack` pads to here (probed once: bf16 on AVX-512,
    64 and 32), (1, 1) where a probe says otherwise."""
    from pagoda.runtime.model import linear

    def padded(n: int, k: int) -> int:
        packed = linear._pack(torch.zeros(n, k, dtype=dtype))
        return torch.ops.mkldnn._nbytes(packed) // dtype.itemsize

    try:
        a, b = padded(65, 64) // 64 - 64, padded(64, 65) // 64 - 64
    except (AttributeError, RuntimeError):
        return 1, 1
    return (a, b) if 0 < a <= 64 and 0 < b <= 64 and 64 % a == 0 and 64 % b == 0 else (1, 1)


def packed_bytes(parts: list[tuple[str, int]], cols: int) -> int:
    """Bytes of `qgemm.pack` for row parts (kind, rows) of `cols` keys, stacked as
    `quantized.stack` merges them (neighbours of one kind), each run padded to 16 rows."""
    from pagoda.runtime.cpu import qgemm
    from pagoda.runtime.cpu.quantized import BLOCKS

    runs: list[list] = []
    for kind, rows in parts:
        if runs and runs[-1][0] == kind:
            runs[-1][1] += rows
        else:
            runs.append([kind, rows])
    total = 0
    for kind, rows in runs:
        keys = BLOCKS[kind][0]
        total += -(-rows // qgemm.NB) * (cols // keys) * _unit_bytes(kind)
    return total


@functools.cache
def _unit_bytes(kind: str) -> int:
    """`qgemm.pack`'s bytes for 16 rows by one stored block of keys of `kind`."""
    from pagoda.runtime.cpu import qgemm
    from pagoda.runtime.cpu.quantized import BLOCKS, probe_weight

    return int(qgemm.pack(probe_weight(kind, qgemm.NB, BLOCKS[kind][0])).numel())


def dense_bytes(parts: list[Stored], mc: ModelConfig, lay, p: Placement) -> int:
    """One `Linear` over the parts stacked, in the dtype: a CPU's packed copy in oneDNN's
    blocked layout (rows and columns padded, `_pad`), a CUDA tensor as it is; per expert."""
    shapes = [_local(t.name, t.shape, mc, lay) for t in parts]
    rows, cols = sum(r for r, _ in shapes), shapes[0][1]
    experts = parts[0].shape[0] if len(parts[0].shape) == 3 else 1
    if p.packs:
        rows, cols = packed_shape(rows, cols, p.dtype)
    return experts * rows * cols * p.dtype.itemsize


def float32_router_bytes(t: Stored, p: Placement) -> int:
    """DeepSeek's router weight, a float32 `Linear` (a CPU's packed copy padded), or its
    correction bias, a float32 vector."""
    matrix = len(t.shape) == 2 and not t.name.endswith("bias")  # (ERNIE's bias: [1, E])
    rows, cols = (t.shape[0], t.shape[1]) if matrix else (t.numel, 1)
    if matrix and p.device == "cpu":
        from pagoda.runtime.model import linear

        if linear._can_pack(torch.float32):
            rows, cols = packed_shape(rows, cols, torch.float32)
    return rows * cols * 4
