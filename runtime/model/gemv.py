"""bf16 GEMV for decode-sized batches on AMX CPUs, reading oneDNN's packed weights in place.

A decode step of a few sequences multiplies a handful of rows by every weight of the model: it
is bound by memory bandwidth, and oneDNN's AMX GEMM streams the weights at ~11-16 GB/s there
while a plain AVX-512 BF16 loop reaches ~21-25 GB/s on the same 2-core Xeon (single-stream
decode ~1.25x faster). The loop reads the copy that `Linear` already packed for oneDNN (layout
``AB16b{nb}a2b``: blocks of nb outputs by 32 inputs, pairs of inputs interleaved as AVX-512 BF16
wants them), so weights take no extra memory. The layout is checked on a probe weight when the
library loads; anything unexpected turns the GEMV off.

Its summation order is not oneDNN's, so a row's bits depend on whether its step had few rows or
many: it is used with ``--no-batch-invariant``, and by default only where oneDNN's bf16 GEMM does
not give a row the same bits for every row count anyway (CPUs with AMX, docs/runtime.md "What is
guaranteed"). ``PAGODA_CPU_GEMV=0`` turns it off, ``=1`` forces it on.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch
from pagoda.runtime import native

log = logging.getLogger(__name__)

ENV_SWITCH = "PAGODA_CPU_GEMV"
MAX_ROWS = 4  # measured: at 8 rows oneDNN's AMX tiles are as fast (the loop turns compute-bound)
K_BLOCK = 32  # inputs per packed block (16 pairs)
SERIAL_BELOW = 1 << 18  # weights of fewer elements run on the calling thread alone

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
@CLAIM@
#ifdef __AVX512BF16__
// y[m, n] = bf16(sum_k x[m, k] w[n, k] + bias[n]) for M <= 8 rows, weights in oneDNN's
// AB16b{nb}a2b layout (nb = 16 * V outputs per block). Each output is one float accumulator
// updated pair by pair in key order: its bits do not depend on M or on the thread count.
template <int V>
static void run(const uint16_t* w, const uint16_t* x, int64_t ldx, uint16_t* y, int64_t ldy,
                const uint16_t* bias, int M, int N, int K, int64_t* next, int64_t claim_blocks) {
  const int NBLK = (N + 16 * V - 1) / (16 * V), KB = (K + 31) / 32, KP = KB * 16;
  uint32_t* xp = (uint32_t*)aligned_alloc(64, (size_t)M * KP * 4 + 64);
  for (int m = 0; m < M; ++m) {  // rows as pairs, zero-padded to whole blocks
    uint16_t* row = (uint16_t*)(xp + (int64_t)m * KP);
    memcpy(row, x + m * ldx, (size_t)K * 2);
    memset(row + K, 0, (size_t)(KP * 2 - K) * 2);
  }
  const int64_t blk = 32 * 16 * V;  // bf16 values per (n-block, k-block)
  for (int64_t nb, end; (nb = claim(next, claim_blocks, NBLK, &end)) < NBLK;)
  for (; nb < end; ++nb) {
    __m512 acc[8][V];
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < V; ++v) acc[m][v] = _mm512_setzero_ps();
    const uint16_t* wb = w + (int64_t)nb * KB * blk;
    for (int kp = 0; kp < KP; ++kp) {
      const uint16_t* wp = wb + (int64_t)(kp / 16) * blk + (kp % 16) * 32 * V;
      __m512bh b[V];
      for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(wp + 32 * v);
      for (int m = 0; m < M; ++m) {
        __m512bh a = (__m512bh)_mm512_set1_epi32((int)xp[(int64_t)m * KP + kp]);
        for (int v = 0; v < V; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], a, b[v]);
      }
    }
    for (int v = 0; v < V; ++v) {
      const int n0 = nb * 16 * V + 16 * v;
      if (n0 >= N) break;
      const __mmask16 mask = N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n0)) - 1);
      __m512 bv = _mm512_setzero_ps();
      if (bias) bv = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + n0)), 16));
      for (int m = 0; m < M; ++m) {
        __m256i o = (__m256i)_mm512_cvtneps_pbh(bias ? _mm512_add_ps(acc[m][v], bv) : acc[m][v]);
        _mm256_mask_storeu_epi16(y + m * ldy + n0, mask, o);
      }
    }
  }
  free(xp);
}
#endif

// `nblocks` (the number of nb-wide output blocks), `next` and `block`: see native.over_blocks.
extern "C" int pagoda_gemv_bf16(const uint16_t* w, int nb, const uint16_t* x, int64_t ldx,
                                uint16_t* y, int64_t ldy, const uint16_t* bias, int M, int N,
                                int K, int64_t nblocks, int64_t* next, int64_t block) {
#ifdef __AVX512BF16__
  if (M < 1 || M > 8 || nblocks != (N + nb - 1) / nb) return 1;
  if (nb == 16) run<1>(w, x, ldx, y, ldy, bias, M, N, K, next, block);
  else if (nb == 32) run<2>(w, x, ldx, y, ldy, bias, M, N, K, next, block);
  else if (nb == 64) run<4>(w, x, ldx, y, ldy, bias, M, N, K, next, block);
  else return 1;
  return 0;
#else
  return 2;
#endif
}
"""


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
        lib.pagoda_gemv_bf16.argtypes = [p, i32, p, i64, p, i64, p, i32, i32, i32, i64, p, i64]
        lib.pagoda_gemv_bf16.restype = i32
        self.fn, self.nb = lib.pagoda_gemv_bf16, nb

    def accepts(self, packed: torch.Tensor, n: int, k: int) -> bool:
        """Whether a packed weight has the layout this GEMV reads (its size says so)."""
        return torch.ops.mkldnn._nbytes(packed) == packed_nbytes(n, k, self.nb)

    def bind(self, packed: torch.Tensor, bias: torch.Tensor | None) -> GemvWeight:
        return GemvWeight(self, packed, bias)


class GemvWeight:
    """One packed weight (kept alive here) and what a call passes for it, worked out once."""

    __slots__ = ("bias", "bias_ptr", "blocks", "claim", "fn", "k", "n", "nb", "packed", "ptr")

    def __init__(self, gemv: Gemv, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.fn, self.nb, self.packed = gemv.fn, gemv.nb, packed
        self.n, self.k = packed.shape
        self.ptr = torch.ops.mkldnn.data_ptr(packed)
        self.bias = None if bias is None else bias.contiguous()
        self.bias_ptr = None if self.bias is None else self.bias.data_ptr()
        self.blocks = -(-self.n // self.nb)
        # ~8 claims a thread: a late or descheduled helper leaves little for the others
        self.claim = max(1, self.blocks // 16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M <= MAX_ROWS, K] bf16 -> [M, N] bf16."""
        m = x.shape[0]
        if x.stride(1) != 1:
            x = x.contiguous()
        y = torch.empty(m, self.n, dtype=torch.bfloat16)
        # a helper thread costs ~20-50 us to wake: worth it from ~1 MB of weights
        threads = torch.get_num_threads() if self.n * self.k >= SERIAL_BELOW else 1
        args = (self.ptr, self.nb, x.data_ptr(), x.stride(0), y.data_ptr(), self.n)
        args += (self.bias_ptr, m, self.n, self.k)
        rc = max(native.over_blocks(self.fn, self.blocks, self.claim, threads, *args))
        if rc:
            raise RuntimeError(f"CPU GEMV failed (code {rc}) for {m}x{self.k} @ {self.n}x{self.k}")
        return y


def onednn_uses_amx() -> bool:
    """Whether oneDNN runs bf16 GEMMs on AMX tiles here: the CPU has them and oneDNN is not
    limited to an ISA without them (``ONEDNN_MAX_CPU_ISA``). Its rows are then not M-invariant."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    return ("AMX" in isa or isa in ("ALL", "DEFAULT")) and "amx_bf16" in native.cpu_signature()


def wanted(invariant: bool = True) -> bool:
    """``PAGODA_CPU_GEMV``: auto (default) means when the engine does not ask for batch-invariant
    rows (``--no-batch-invariant``), or where oneDNN cannot give them anyway (AMX)."""
    choice = os.environ.get(ENV_SWITCH, "auto")
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"{ENV_SWITCH} must be auto, 0 or 1, got {choice!r}")
    if choice != "auto":
        return choice == "1"
    return not invariant or onednn_uses_amx()


@functools.cache
def load(pack) -> Gemv | None:
    """The GEMV for weights packed by `pack`, or None (not buildable, or oneDNN's layout is not
    the one it reads)."""
    compiler = native.find_compiler("CXX", ("g++", "clang++"))
    if compiler is None:
        return None
    try:
        flags = ["-O3", "-march=native", "-shared", "-fPIC", "-ffp-contract=off"]
        source = SOURCE.replace("@CLAIM@", native.CLAIM_C)
        path = native.build(source, name="gemv", compiler=compiler, flags=flags, language="c++")
        nb = probe_layout(pack)
        if nb is None:
            log.warning("CPU GEMV off: oneDNN's packed bf16 layout is not AB16b{16,32,64}a2b")
            return None
        gemv = Gemv(ctypes.CDLL(str(path)), nb)
    except (OSError, RuntimeError, AttributeError) as exc:
        log.warning("CPU GEMV unavailable, decode rows use oneDNN: %s", exc)
        return None
    return gemv if _self_check(gemv, pack) else None


def _self_check(gemv: Gemv, pack) -> bool:
    """Compare with oneDNN on a padded random shape (summation orders differ: bf16 tolerance)."""
    g = torch.Generator().manual_seed(0)
    n, k = 200, 100
    w = (torch.randn(n, k, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    packed = pack(w)
    want = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "").float()
    got = gemv.bind(packed, bias)(x)
    if got.shape == want.shape and torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2):
        return True
    log.warning("CPU GEMV off: it disagrees with oneDNN on a probe (layout changed?)")
    return False
