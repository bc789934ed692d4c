"""bf16 GEMV/GEMM over oneDNN's packed weights, read in place, with rows independent of M.

A decode step of a few sequences multiplies a handful of rows by every weight of the model: it
is bound by memory bandwidth, and oneDNN's GEMM streams the weights slower than a plain AVX-512
BF16 loop (on the 2-core Xeon ~11-16 GB/s on AMX against ~21-25), and each of its calls wakes
OpenMP threads (~50 us, a whole scheduler slice when the other core is busy) where this kernel's
pool (``csrc/pool.h``) wakes no one between back-to-back calls. The loop reads the copy that
`Linear` already packed for oneDNN (layout ``AB16b{nb}a2b``: blocks of nb outputs by 32 inputs,
pairs of inputs interleaved as AVX-512 BF16 wants them), so weights take no extra memory. The
layout is checked on a probe weight when the library loads; anything unexpected turns it off.

Each output is one float32 accumulator updated pair by pair in key order, in tiles of up to 6
rows, so a row's bits depend neither on M, nor on its place in a tile, nor on the threads. On
CPUs without AMX (AMD Zen 4) it therefore takes every bf16 matmul, prefill included: as fast as
oneDNN's ``avx512_core_bf16`` GEMM at large M and faster at decode sizes (docs/benchmarks.md),
and the batch-invariance guarantee holds as with oneDNN. Where oneDNN runs on AMX tiles and the
AMX GEMM (`amx_gemm`) is off, it takes steps of up to `MAX_ROWS` rows only (oneDNN is faster
above, and not M-invariant there anyway). ``PAGODA_CPU_GEMV=0`` turns it off.

Runs of 19-48 rows (decode steps of that many sequences) sweep each weight block in chunks of
keys through all their tiles, prefetching the next chunk, so memory and arithmetic overlap; the
accumulators wait between chunks in float32, so the bits are those of the plain tiles.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch
from pagoda.runtime.cpu import build

log = logging.getLogger(__name__)

ENV_SWITCH = "PAGODA_CPU_GEMV"
MAX_ROWS = 4  # rows the C kernel takes (at 8, oneDNN's AMX tiles were as fast)
K_BLOCK = 32  # inputs per packed block (16 pairs)
SERIAL_BELOW = 1 << 18  # weights of fewer elements run on the calling thread alone
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-ffp-contract=off"]

CSRC = Path(__file__).parent / "csrc"  # gemv.cpp, amx_gemm.cpp, qgemm.cpp


def blocked_offsets(n: int, k: int, nb: int) -> torch.Tensor:
    """Where w[i, j] sits in the ``AB16b{nb}a2b`` layout (padded to whole blocks), as [n, k]."""
    i, j = torch.arange(n)[:, None], torch.arange(k)[None, :]
    kblocks = -(-k // K_BLOCK)
    return (
        ((i // nb) * kblocks + j // K_BLOCK) * K_BLOCK * nb
        + ((j % 32) // 2 * nb + i % nb) * 2
        + j % 2
    )


def packed_nbytes(n: int, k: int, nb: int) -> int:
    return -(-n // nb) * nb * -(-k // K_BLOCK) * K_BLOCK * 2


def _raw(packed: torch.Tensor) -> torch.Tensor:
    """The bytes of an opaque oneDNN tensor, copied into a plain bf16 tensor."""
    size = torch.ops.mkldnn._nbytes(packed)
    out = torch.empty(size // 2, dtype=torch.bfloat16)
    ctypes.memmove(out.data_ptr(), torch.ops.mkldnn.data_ptr(packed), size)
    return out


def probe_layout(pack) -> int | None:
    """The block width nb for which `pack` (weight -> oneDNN packed tensor) lays out an exactly
    representable probe weight as ``AB16b{nb}a2b``; None if it is none of them."""
    n, k = 100, 70  # padded in both dimensions
    want = torch.arange(n * k, dtype=torch.float32).view(n, k) % 251 + 1  # exact in bf16
    raw = _raw(pack(want.to(torch.bfloat16))).float()
    for nb in (16, 32, 64):
        if raw.numel() != packed_nbytes(n, k, nb) // 2:
            continue
        expect = torch.zeros(raw.numel())
        expect[blocked_offsets(n, k, nb).reshape(-1)] = want.reshape(-1)
        if torch.equal(raw, expect):
            return nb
    return None


class Gemv:
    """The compiled GEMV and the packed layout it reads (see the module docstring)."""

    def __init__(self, lib: ctypes.CDLL, nb: int) -> None:
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.pagoda_gemv_bf16.argtypes = [p, i32, p, i64, p, i64, p, i32, i32, i32, i32]
        lib.pagoda_gemv_bf16.restype = i32
        self.fn, self.nb = lib.pagoda_gemv_bf16, nb

    def accepts(self, packed: torch.Tensor, n: int, k: int) -> bool:
        """Whether a packed weight has the layout this GEMV reads (its size says so)."""
        return torch.ops.mkldnn._nbytes(packed) == packed_nbytes(n, k, self.nb)

    def bind(self, packed: torch.Tensor, bias: torch.Tensor | None) -> GemvWeight:
        return GemvWeight(self, packed, bias)


class PackedWeight:
    """One oneDNN-packed bf16 weight (kept alive here) bound to a C kernel, with what each call
    passes for it worked out once; the kernels' wrappers subclass it."""

    __slots__ = ("bias", "bias_ptr", "fn", "k", "n", "packed", "ptr")

    def __init__(self, fn, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.fn, self.packed = fn, packed
        self.n, self.k = packed.shape
        self.ptr = torch.ops.mkldnn.data_ptr(packed)
        self.bias = None if bias is None else bias.to(torch.bfloat16).contiguous()
        self.bias_ptr = None if self.bias is None else self.bias.data_ptr()


class GemvWeight(PackedWeight):
    __slots__ = ("nb",)

    def __init__(self, gemv: Gemv, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(gemv.fn, packed, bias)
        self.nb = gemv.nb

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16."""
        m = x.shape[0]
        if x.stride(1) != 1:
            x = x.contiguous()
        y = torch.empty(m, self.n, dtype=torch.bfloat16)
        # a helper thread costs ~20-50 us to wake: worth it from ~1 MB of weights (at M = 1)
        threads = torch.get_num_threads() if self.n * self.k * m >= SERIAL_BELOW else 1
        args = (self.ptr, self.nb, x.data_ptr(), x.stride(0), y.data_ptr(), self.n)
        args += (self.bias_ptr, m, self.n, self.k)
        rc = self.fn(*args, threads)
        if rc:
            raise RuntimeError(f"CPU GEMV failed (code {rc}) for {m}x{self.k} @ {self.n}x{self.k}")
        return y


def onednn_uses_amx() -> bool:
    """Whether oneDNN runs bf16 GEMMs on AMX tiles here: the CPU has them and oneDNN is not
    limited to an ISA without them (``ONEDNN_MAX_CPU_ISA``). Its rows are then not M-invariant."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    return ("AMX" in isa or isa in ("ALL", "DEFAULT")) and "amx_bf16" in build.cpu_signature()


def wanted() -> bool:
    """``PAGODA_CPU_GEMV``: on unless ``0`` (``1`` and ``auto``, the default, mean on)."""
    choice = os.environ.get(ENV_SWITCH, "auto")
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"{ENV_SWITCH} must be auto, 0 or 1, got {choice!r}")
    return choice != "0"


def max_rows() -> int:
    """The row counts the kernel takes: all of them where oneDNN's bf16 GEMM is M-invariant (no
    AMX), since the kernel is M-invariant too and replaces oneDNN whole; where oneDNN runs on
    AMX tiles (faster from a few rows on, and not M-invariant anyway) decode steps only."""
    return MAX_ROWS if onednn_uses_amx() else 1 << 62


def compile_kernel(name: str, compiler: str) -> Path:
    """Compile ``csrc/{name}.cpp`` (this GEMV, `amx_gemm`'s or `qgemm`'s: one family, with the
    same flags and shared headers) into the cache; returns the library path."""
    return build.build(CSRC / f"{name}.cpp", name=name, compiler=compiler, flags=FLAGS)


@functools.cache
def load(pack) -> Gemv | None:
    """The GEMV for weights packed by `pack`, or None (not buildable, or oneDNN's layout is not
    the one it reads)."""
    compiler = build.find_compiler("CXX", ("g++", "clang++"))
    if compiler is None:
        return None
    try:
        path = compile_kernel("gemv", compiler)
        nb = probe_layout(pack)
        if nb is None:
            log.warning("CPU GEMV off: oneDNN's packed bf16 layout is not AB16b{16,32,64}a2b")
            return None
        gemv = Gemv(ctypes.CDLL(str(path)), nb)
    except (OSError, RuntimeError, AttributeError) as exc:
        log.warning("CPU GEMV unavailable, decode rows use oneDNN: %s", exc)
        return None
    return gemv if agrees_with_onednn(gemv, pack, 3, "CPU GEMV") else None


def agrees_with_onednn(kernel: Gemv, pack, rows: int, what: str) -> bool:
    """`kernel` (anything with ``bind(packed, bias)``) against oneDNN on a shape padded in N and
    K, with `rows` rows (bf16 tolerance: the summation orders differ); a load-time check."""
    g = torch.Generator().manual_seed(0)
    n, k = 200, 100
    w = (torch.randn(n, k, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    packed = pack(w)
    want = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "").float()
    got = kernel.bind(packed, bias)(x)
    if got.shape == want.shape and torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2):
        return True
    log.warning("%s off: it disagrees with oneDNN on a probe (layout changed?)", what)
    return False
