"""Helpers shared by the launchers: device checks and small host-side maths.

Launchers run inside CUDA-graph capture, so everything here uses shapes and host ints only:
no ``.item()``, no ``.cpu()``, no tensor-valued branching.
"""

from __future__ import annotations

import os

import torch

# Triton decides at decoration time whether a kernel is interpreted, and the kernel modules are
# decorated right after importing this one, so reading the switch once here matches them.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def interpreter_enabled() -> bool:
    """True when the kernels run on the CPU (``TRITON_INTERPRET=1`` set before import)."""
    return _INTERPRETED


def check_device(*tensors: torch.Tensor) -> torch.device:
    """All tensors share one device that Triton can run on; return it.

    CPU tensors only work under the interpreter; failing here gives a clear message instead of
    Triton's "Pointer argument cannot be accessed from Triton".
    """
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"tensors on different devices: {device} and {t.device}")
    if device.type != "cuda" and not interpreter_enabled():
        raise RuntimeError(
            f"Triton kernels need CUDA tensors (got {device}); set TRITON_INTERPRET=1 before "
            "importing triton to run them on the CPU, or use the torch attention backend"
        )
    return device


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (block shapes in Triton must be powers of two)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def prev_pow2(n: int) -> int:
    """Largest power of two <= n (n >= 1)."""
    return 1 << (max(int(n), 1).bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
