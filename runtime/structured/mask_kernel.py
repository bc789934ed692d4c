"""CPU mask kernel: `csrc/mask.c` (token bitmasks → -inf in the logits, in place), built once
with the system C compiler and loaded with ctypes.

~5x faster than xgrammar's CPU kernel on the rows a step constrains (it skips words of allowed
tokens whole, where xgrammar tests every bit). Without a compiler `available()` is False and
the caller uses xgrammar's.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from pathlib import Path

import torch
from pagoda.runtime.cpu import build

log = logging.getLogger(__name__)
SOURCE = Path(__file__).parent / "csrc" / "mask.c"
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]


@functools.cache
def _library() -> ctypes.CDLL | None:
    cc = build.find_compiler("CC", ["cc", "gcc"])
    if cc is None:
        return None
    for flags in (FLAGS, [f for f in FLAGS if f != "-march=native"]):
        try:
            path = build.build(SOURCE, name="grammar_mask", compiler=cc, flags=flags,
                               directory=build.cache_dir() / "native")  # fmt: skip
            break
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            log.info("grammar mask kernel build failed (%s): %s", " ".join(flags), e)
    else:
        return None
    lib = ctypes.CDLL(str(path))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.apply_mask.argtypes = [p, ctypes.c_int, i64, p, i64, p, i64]
    lib.apply_mask.restype = ctypes.c_int
    return lib


def available() -> bool:
    return _library() is not None


def apply_mask(logits: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits[rows[i]] = -inf where bit t of mask[i] is 0; logits [N, V] float32 or bfloat16,
    contiguous, on the CPU; mask [len(rows), ceil(V / 32)] int32; rows int64."""
    if logits.dtype not in (torch.float32, torch.bfloat16) or not logits.is_contiguous():
        raise TypeError("logits must be contiguous float32 or bfloat16")
    n, v = logits.shape
    rows = rows.contiguous()
    if rows.numel() and not (int(rows.min()) >= 0 and int(rows.max()) < n):
        raise IndexError(f"rows out of range for {n} rows")
    mask = mask.contiguous()
    words = (v + 31) // 32
    if mask.dtype != torch.int32 or mask.shape != (rows.numel(), words):
        raise ValueError(f"mask must be int32 [{rows.numel()}, {words}]")
    _library().apply_mask(
        logits.data_ptr(), int(logits.dtype == torch.bfloat16), v, mask.data_ptr(), words,
        rows.data_ptr(), rows.numel(),
    )  # fmt: skip
