"""Calling the native libraries from Python: row indices checked before a kernel reads them,
and Python threads that share a call's work by claiming blocks (``csrc/claim.h``)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="pagoda-native")


def over_blocks(fn: Callable[..., int], n: int, block: int, threads: int, *args) -> list[int]:
    """``fn(*args, n, next, block)`` on `threads` threads (the caller is one) that claim blocks
    of the `n` items through the shared counter `next` (C's ``claim``); returns the codes.

    Unlike an OpenMP region there is no barrier: a helper the OS has not run by the time the
    caller finishes is cancelled, since every item is claimed. With OMP_WAIT_POLICY=PASSIVE on a
    busy core such a barrier costs a scheduler time slice (~8 ms measured) per call.
    ctypes releases the GIL during the call, so the helpers run in parallel."""
    counter = ctypes.c_int64(0)
    call = (*args, n, ctypes.addressof(counter), block)
    futures = [_pool(threads - 1).submit(fn, *call) for _ in range(threads - 1)]
    codes = [fn(*call)]
    return codes + [f.result() for f in futures if not f.cancel()]


def row_count(rows: torch.Tensor | None, n: int) -> int:
    """How many rows a kernel that reads `rows` (int64 indices into n rows, in place; None: all
    n) works on, after checking them: a bad index would read out of bounds."""
    if rows is None:
        return n
    if rows.dtype != torch.int64 or rows.dim() != 1 or not rows.is_contiguous():
        raise ValueError("rows must be a contiguous int64 vector")
    if rows.numel() and not (int(rows.min()) >= 0 and int(rows.max()) < n):
        raise IndexError(f"rows out of range for {n} rows")
    return rows.numel()
