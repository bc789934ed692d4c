"""Builds, caches and calls the C++ paged-attention kernel of the CPU attention backend.

The kernel (``csrc/attention/``) reads K/V where they lie in the paged cache (no gather copy per
step) and is one code path for decodes and prefill rows alike (see ``attention.cpp`` for why it
is batch invariant). It is plain C++ on the thread pool of ``csrc/pool.h``, compiled with the
system compiler in about a second and called through ``ctypes``: ``torch.utils.cpp_extension``
would also work but compiles the torch headers (~30 s here) for what is a few C functions over
raw pointers. It is called with torch's thread count.

The shared library is cached by ``pagoda.runtime.cpu.build`` (keyed by the sources, the flags,
the compiler and the CPU: it is built with ``-march=native``). Without a compiler, ``load()``
returns None and the backend keeps its torch path; ``PAGODA_CPU_ATTENTION=torch`` asks for that
path explicitly.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch
from pagoda.runtime.cpu import build as builder

log = logging.getLogger(__name__)

# -fopenmp: unused since the kernel has its own pool; kept so that the built library stays the
# one measured (dropping it is a change to measure on its own).
FLAGS = ["-O3", "-march=native", "-pthread", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
FLAGS += ["-std=c++17"]
SOURCE = Path(__file__).parent / "csrc" / "attention" / "attention.cpp"
ENV_SWITCH = "PAGODA_CPU_ATTENTION"  # "kernel" (default when it builds) or "torch"
AMX_SWITCH = "PAGODA_CPU_AMX"  # "0": the AVX-512 loops even where AMX runs (read once per process)
WAVE = 1 << 23  # float32 scores per wave (32 MiB): long prefill steps go in several waves


def build(cache_dir: Path | None = None) -> Path:
    """Compile the kernel into the cache (once per source, compiler and CPU); returns its path."""
    cxx = builder.find_compiler("CXX", ["g++", "c++", "clang++"])
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, c++ or clang++) on PATH")
    return builder.build(
        SOURCE, name="paged_attention", compiler=cxx, flags=FLAGS, directory=cache_dir
    )


class CpuKernel:
    """The entry points of the shared library, with tensors in and out."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
        lib.pagoda_attention.argtypes = (
            [i32, p, p, p, p, p, i64, p, p] + [i32] * 7 + [f32, i64, i32, i32, i32, p]
        )
        lib.pagoda_write_kv.argtypes = [i32, p, p, p, p, p] + [i32] * 6
        lib.pagoda_attention.restype = lib.pagoda_write_kv.restype = i32
        self.lib, self.path = lib, path

    @property
    def uses_amx(self) -> bool:
        """bf16 caches go through AMX tiles (built for a CPU with AMX, granted by Linux, and
        not turned off by ``PAGODA_CPU_AMX=0``); else through the AVX-512 loops."""
        probe = getattr(self.lib, "pagoda_uses_amx", None)  # absent from builds before AMX
        return probe is not None and bool(probe())

    def write_kv(self, k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
        """k, v ``[T, Hkv, D]`` into the packed caches at ``slots`` (int64; negative: skipped)."""
        kind, hkv, nb, bs, d = geometry(k_cache, v_cache)
        elem = torch.float32 if kind == INT8 else k_cache.dtype  # int8: quantized in the call
        k, v = k.to(elem).contiguous(), v.to(elem).contiguous()
        slots = slots.to(torch.int64).contiguous()
        args = (k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
        nt = torch.get_num_threads()
        rc = self.lib.pagoda_write_kv(kind, *args, slots.data_ptr(), k.shape[0], hkv, d, nb, bs, nt)
        if rc:
            raise ValueError(f"CPU KV write: unsupported shape (head_dim {d}, block {bs})")

    def attention(
        self, q, k_cache, v_cache, block_tables, qstart, seq_lens, scale, wave: int = WAVE,
        window: int | None = None, chunk: int | None = None,
        alibi: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Causal paged attention for every row of ``q [T, H, D]``; returns ``[T, H, D]``.

        ``qstart`` (B + 1) and ``seq_lens`` (B) are int32 CPU tensors built from host lists;
        ``wave`` bounds the float32 scores held at once (tiles are attended in waves);
        ``window``: a sliding window of that many keys (the query's own included), whose
        blocks alone are read; ``chunk``: chunked attention's chunk (the query at p sees the
        keys p - p % chunk .. p, Llama 4's), read from the first row's chunk on; ``alibi``:
        float32 ``[H]`` slopes, each score plus ``slope * (key_pos - query_pos)`` (ALiBi)."""
        t, h, d = q.shape
        kind, hkv, nb, bs, _ = geometry(k_cache, v_cache)
        if alibi is not None:
            alibi = alibi.to(device="cpu", dtype=torch.float32).contiguous()
            if alibi.shape != (h,):
                raise ValueError(f"CPU attention kernel: {h} heads need {h} ALiBi slopes")
        dtype = q.dtype
        q = q.to(torch.float32 if kind == INT8 else k_cache.dtype).contiguous()
        out = torch.empty_like(q)
        bt = block_tables if block_tables.dtype == torch.int32 else block_tables.int()
        bt = bt.contiguous()
        rc = self.lib.pagoda_attention(
            kind,
            q.data_ptr(),
            out.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            bt.data_ptr(),
            bt.stride(0),
            qstart.data_ptr(),
            seq_lens.data_ptr(),
            seq_lens.numel(),
            t,
            h,
            hkv,
            d,
            nb,
            bs,
            float(scale),
            wave,
            torch.get_num_threads(),  # the pool's size
            int(window or 0),
            int(chunk or 0),
            None if alibi is None else alibi.data_ptr(),
        )
        if rc == 1:
            raise ValueError(f"CPU attention kernel: unsupported shape (head_dim {d}, block {bs})")
        if rc:
            raise ValueError("CPU attention kernel: a block table names a block outside the cache")
        return out if kind != INT8 else out.to(dtype)


FLOAT32, BF16, INT8 = 0, 1, 2  # the kernel's cache kinds


def packed_shapes(
    num_kv_heads: int, num_blocks: int, block_size: int, head_dim: int, dtype: torch.dtype
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of one layer's (K, V) caches in the kernel's layout (``attention.cpp``).

    int8 caches are ``[Hkv, NB, BS, D + 4]`` bytes: the shape only sizes a block (D values and a
    float32 scale per token); inside a block the bytes follow ``q8.h``'s layout."""
    hkv, nb, bs, d = num_kv_heads, num_blocks, block_size, head_dim
    if dtype == torch.int8:
        return (hkv, nb, bs, d + 4), (hkv, nb, bs, d + 4)
    p = 4 // dtype.itemsize  # values per 32-bit word
    return (hkv, nb, d // p, bs, p), (hkv, nb, bs // p, d, p)


def geometry(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(kind, Hkv, num_blocks, block_size, head_dim) of caches shaped by ``packed_shapes``."""
    hkv, nb = k_cache.shape[:2]
    if k_cache.dtype == torch.int8:
        return INT8, hkv, nb, k_cache.shape[2], k_cache.shape[3] - 4
    kind = BF16 if k_cache.dtype == torch.bfloat16 else FLOAT32
    return kind, hkv, nb, v_cache.shape[2] * v_cache.shape[4], v_cache.shape[3]


def load() -> CpuKernel | None:
    """The kernel, built on first use; None when asked not to or when it cannot be built."""
    choice = os.environ.get(ENV_SWITCH, "kernel")
    if choice not in ("kernel", "torch"):
        raise ValueError(f"{ENV_SWITCH} must be kernel or torch, got {choice!r}")
    return None if choice == "torch" else _load()


@functools.cache
def _load() -> CpuKernel | None:
    try:
        return CpuKernel(build())
    except (OSError, RuntimeError) as exc:
        log.warning("CPU attention kernel unavailable, using the torch path: %s", exc)
        return None
