"""Helpers shared by the launchers: device checks and small host-side maths.

Launchers run inside CUDA-graph capture, so everything here uses shapes and host ints only:
no ``.item()``, no ``.cpu()``, no tensor-valued branching.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=16)
def _optin_shared_memory(index: int) -> int | None:
    props = torch.cuda.get_device_properties(index)
    return getattr(props, "shared_memory_per_block_optin", None)


def shared_memory_limit(device: torch.device) -> int | None:
    """Bytes of shared memory one program may use on ``device`` (opt-in maximum: 227 kB on an
    H100, 163 kB on an A100, 99 kB on an L4); None off CUDA (the interpreter has no limit)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _optin_shared_memory(index)


def fit_stages(
    num_stages: int, stage_bytes: int, device: torch.device, *, unbuffered: int = 0
) -> int:
    """``num_stages``, lowered (to 1 at least) where the shared memory its pipeline holds,
    ``(num_stages - unbuffered) * stage_bytes`` (a GEMM's A and B tiles per stage), would not fit
    ``device``: a config tuned on an H100, or one a file may hold, then still compiles on a
    smaller GPU. ``unbuffered``: stages Triton does not keep in shared memory (measured on sm_90:
    the plain GEMMs keep all ``num_stages``, the MoE GEMM one fewer in float32, all in 16-bit). Stages only overlap loads
    with the MMA, so the result's bits do not change."""
    limit = shared_memory_limit(device)
    if limit is None or stage_bytes <= 0:
        return num_stages
    return max(1, min(num_stages, limit // stage_bytes + unbuffered))
