"""Builds, caches and calls the C++ paged-attention kernel of the CPU backend.

The kernel reads K/V where they lie in the paged cache (no gather copy per step) and is one code
path for decodes and prefill rows alike (see ``cpu_kernel_source.py`` for why it is batch
invariant). It is plain C++ with OpenMP, compiled with the system compiler in about a second and
called through ``ctypes``: ``torch.utils.cpp_extension`` would also work but compiles the torch
headers (~30 s here) for what is two C functions over raw pointers. OpenMP is the ``libgomp``
that torch already loaded, so the kernel uses torch's thread count.

The shared library is cached under ``$PAGODA_CACHE_DIR`` (default ``$XDG_CACHE_HOME/pagoda`` or
``~/.cache/pagoda``), keyed by the source, the flags, the compiler and the CPU (it is built with
``-march=native``). Without a compiler, ``load()`` returns None and the backend keeps its torch
path; ``PAGODA_CPU_ATTENTION=torch`` asks for that path explicitly.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from pagoda.runtime.attention.cpu_kernel_source import SOURCE

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17"]
ENV_SWITCH = "PAGODA_CPU_ATTENTION"  # "kernel" (default when it builds) or "torch"
WAVE = 1 << 23  # float32 scores per wave (32 MiB): long prefill steps go in several waves


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def _cache_dir() -> Path:
    if os.environ.get("PAGODA_CACHE_DIR"):
        return Path(os.environ["PAGODA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagoda"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(cache_dir: Path | None = None) -> Path:
    """Compile the kernel into the cache (once per source, compiler and CPU); returns its path."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, c++ or clang++) on PATH")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE, " ".join(FLAGS), version, _cpu_signature()]).encode())
    out_dir = cache_dir or _cache_dir()
    target = out_dir / f"paged_attention_{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src = Path(tmp) / "paged_attention.cpp"
        src.write_text(SOURCE)
        so = Path(tmp) / target.name
        res = subprocess.run([cxx, *FLAGS, str(src), "-o", str(so)], capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"compiling the CPU attention kernel failed:\n{res.stderr[-2000:]}")
        os.replace(so, target)  # atomic: concurrent builders agree on the file
    return target


class CpuKernel:
    """The two entry points of the shared library, with tensors in and out."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
        lib.pagoda_attention.argtypes = (
            [i32, p, p, p, p, p, i64, p, p] + [i32] * 7 + [f32, i64, i32]
        )
        lib.pagoda_write_kv.argtypes = [i32, p, p, p, p, p] + [i32] * 6
        lib.pagoda_attention.restype = lib.pagoda_write_kv.restype = i32
        self.lib, self.path = lib, path

    def write_kv(self, k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
        """k, v ``[T, Hkv, D]`` into the packed caches at ``slots`` (int64; negative: skipped)."""
        hkv, nb = k_cache.shape[:2]
        bs, d = v_cache.shape[2] * v_cache.shape[4], v_cache.shape[3]
        k, v = k.to(k_cache.dtype).contiguous(), v.to(v_cache.dtype).contiguous()
        slots = slots.to(torch.int64).contiguous()
        bf16 = int(k_cache.dtype == torch.bfloat16)
        args = (k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
        nt = torch.get_num_threads()
        self.lib.pagoda_write_kv(bf16, *args, slots.data_ptr(), k.shape[0], hkv, d, nb, bs, nt)

    def attention(
        self, q, k_cache, v_cache, block_tables, qstart, seq_lens, scale, wave: int = WAVE
    ) -> torch.Tensor:
        """Causal paged attention for every row of ``q [T, H, D]``; returns ``[T, H, D]``.

        ``qstart`` (B + 1) and ``seq_lens`` (B) are int32 CPU tensors built from host lists;
        ``wave`` bounds the float32 scores held at once (tiles are attended in waves)."""
        t, h, d = q.shape
        hkv, nb = k_cache.shape[:2]
        bs = v_cache.shape[2] * v_cache.shape[4]
        q = q.to(k_cache.dtype).contiguous()
        out = torch.empty_like(q)
        bt = block_tables if block_tables.dtype == torch.int32 else block_tables.int()
        bt = bt.contiguous()
        rc = self.lib.pagoda_attention(
            int(k_cache.dtype == torch.bfloat16),
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
            torch.get_num_threads(),  # OpenMP's own count can differ on threads torch never used
        )
        if rc == 1:
            raise ValueError(f"CPU attention kernel: unsupported shape (head_dim {d}, block {bs})")
        if rc:
            raise ValueError("CPU attention kernel: a block table names a block outside the cache")
        return out


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
