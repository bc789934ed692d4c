"""Keep freed host memory in the process instead of returning it to the kernel.

Also `zeros`: large zero-filled host tensors (the KV cache) as fresh anonymous mappings.

glibc serves blocks above its mmap threshold (at most 32 MiB by default) with fresh `mmap`s and
unmaps them on free, so every [256, 32k] float32 logits tensor (32.8 MiB) and every large
activation of a CPU step is page-faulted and zeroed again by the kernel, step after step. In a VM
that costs more than the arithmetic: measured on a 2-core KVM guest, the sampler's fused
multiply-add over the logits took 39 ms/step with fresh pages and 4 ms with reused ones (the
1-layer step of benchmarks/step_overhead.py: 130 → 52 ms sampled at 256 sequences). Raising the
mmap and trim thresholds makes glibc reuse the heap, as jemalloc/tcmalloc would.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import mmap

import torch

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # blocks below 1 GiB come from the heap (the KV cache: `zeros`)
LAZY_ZEROS_BYTES = 1 << 20  # `zeros` maps at least this much; smaller tensors: torch.zeros
TRIM_THRESHOLD = (1 << 31) - 1  # never give the heap's top back


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, found once per process (`find_library` runs `ldconfig -p` in a subprocess:
    ~10 ms on a busy 2-core machine, at every engine start before); None where not found."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; False where the C library is not glibc."""
    try:
        mallopt = _libc().mallopt
    except AttributeError:  # (None: no C library found; or one without mallopt)
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not ok:
        log.info("mallopt refused the thresholds; large CPU temporaries stay mmapped")
    return ok


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the kernel once (glibc `malloc_trim`): loading leaves
    hundreds of MB of freed float32 temporaries (a GGUF dequantized before `qgemm` takes its
    blocks, weights before bf16 conversion) that the thresholds above would otherwise keep
    resident for the life of the process. Steps then fault in only what they reuse."""
    try:
        trim = _libc().malloc_trim
    except AttributeError:  # (None: no C library found; or one without malloc_trim)
        return False
    return bool(trim(0))


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.zeros(shape, dtype=dtype, device=device)`, but on the CPU a tensor of at least
    `LAZY_ZEROS_BYTES` is a private anonymous mapping of its own: pages the kernel hands out
    zeroed on first touch, so allocating costs no time and no resident memory until used.

    Why: `torch.zeros` writes every byte, so each page is faulted in and cleared twice (by the
    kernel, then by the memset) at start: the embedded model's 2 GiB KV cache took 1.4-1.7 s on
    2 cores. Fresh mappings never hold earlier data (no NaN in a block's unused slots, which
    kernels may multiply by 0), are page-aligned (any SIMD width), and are unmapped when the
    tensor dies (the tensor holds the mapping). The pages are 4 KiB ones where transparent huge
    pages are `madvise` (the usual default), as the heap's were. Steps then fault in the pages
    they first write (a few per layer and new block), so resident memory grows with use: the
    start-up memory check (`server/memory.py`) counts the whole cache regardless."""
    device = torch.device(device)
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes < LAZY_ZEROS_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)
