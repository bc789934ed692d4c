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
MAX_ROWS = 4  # rows the C kernel takes (at 8, oneDNN's AMX tiles were as fast)
K_BLOCK = 32  # inputs per packed block (16 pairs)
SERIAL_BELOW = 1 << 18  # weights of fewer elements run on the calling thread alone

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
@CLAIM@
@POOL@
#ifdef __AVX512BF16__
// y[m, n] = bf16(sum_k x[m, k] w[n, k] + bias[n]) for M <= 4 rows, weights in oneDNN's
// AB16b{nb}a2b layout (nb = 16 * V outputs per block). Each output is one float accumulator
// updated pair by pair in key order: its bits do not depend on M or on the thread count.
struct Job {
  const uint16_t *w, *bias; const uint32_t* xp; uint16_t* y; int64_t ldy, next, claim;
  int M, N, K;
};

template <int V, int M>  // compile-time sizes: the accumulators stay in registers
static void run(void* arg) {
  Job& j = *(Job*)arg;
  const uint16_t *w = j.w, *bias = j.bias;
  const uint32_t* xp = j.xp;
  uint16_t* y = j.y;
  const int64_t ldy = j.ldy;
  const int N = j.N, K = j.K;
  const int NBLK = (N + 16 * V - 1) / (16 * V), KB = (K + 31) / 32, KP = KB * 16;
  const int64_t blk = 32 * 16 * V;  // bf16 values per (n-block, k-block)
  for (int64_t nb, end; (nb = claim(&j.next, j.claim, NBLK, &end)) < NBLK;)
  for (; nb < end; ++nb) {
    __m512 acc[M][V];
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
}
#endif

// y [M, N] = x [M, K] @ w^T (+ bias) on `threads` threads of the pool (see native.POOL_C).
extern "C" int pagoda_gemv_bf16(const uint16_t* w, int nb, const uint16_t* x, int64_t ldx,
                                uint16_t* y, int64_t ldy, const uint16_t* bias, int M, int N,
                                int K, int threads) {
#ifdef __AVX512BF16__
  if (M < 1 || M > 4 || (nb != 16 && nb != 32 && nb != 64)) return 1;
  const int KP = (K + 31) / 32 * 16, nblocks = (N + nb - 1) / nb;
  uint32_t* xp = (uint32_t*)malloc((size_t)M * KP * 4);  // rows as pairs, zero-padded
  if (!xp) return 3;
  for (int m = 0; m < M; ++m) {
    uint16_t* row = (uint16_t*)(xp + (int64_t)m * KP);
    memcpy(row, x + m * ldx, (size_t)K * 2);
    memset(row + K, 0, (size_t)(KP * 2 - K) * 2);
  }
  // ~8 claims a thread: a late or descheduled helper leaves little for the others
  int64_t claim_blocks = nblocks / (8 * (threads > 0 ? threads : 1));
  Job job{w, bias, xp, y, ldy, 0, claim_blocks > 0 ? claim_blocks : 1, M, N, K};
  static const pool_fn fns[3][4] = {{run<1, 1>, run<1, 2>, run<1, 3>, run<1, 4>},
                                    {run<2, 1>, run<2, 2>, run<2, 3>, run<2, 4>},
                                    {run<4, 1>, run<4, 2>, run<4, 3>, run<4, 4>}};
  pool_run(fns[nb == 16 ? 0 : nb == 32 ? 1 : 2][M - 1], &job, threads);
  free(xp);
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
        lib.pagoda_gemv_bf16.argtypes = [p, i32, p, i64, p, i64, p, i32, i32, i32, i32]
        lib.pagoda_gemv_bf16.restype = i32
        self.fn, self.nb = lib.pagoda_gemv_bf16, nb

    def accepts(self, packed: torch.Tensor, n: int, k: int) -> bool:
        """Whether a packed weight has the layout this GEMV reads (its size says so)."""
        return torch.ops.mkldnn._nbytes(packed) == packed_nbytes(n, k, self.nb)

    def bind(self, packed: torch.Tensor, bias: torch.Tensor | None) -> GemvWeight:
        return GemvWeight(self, packed, bias)


class GemvWeight:
    """One packed weight (kept alive here) and what a call passes for it, worked out once."""

    __slots__ = ("bias", "bias_ptr", "fn", "k", "n", "nb", "packed", "ptr")

    def __init__(self, gemv: Gemv, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.fn, self.nb, self.packed = gemv.fn, gemv.nb, packed
        self.n, self.k = packed.shape
        self.ptr = torch.ops.mkldnn.data_ptr(packed)
        self.bias = None if bias is None else bias.contiguous()
        self.bias_ptr = None if self.bias is None else self.bias.data_ptr()

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
        rc = self.fn(*args, threads)
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
        flags = ["-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-ffp-contract=off"]
        source = SOURCE.replace("@CLAIM@", native.CLAIM_C).replace("@POOL@", native.POOL_C)
        path = native.build(source, name="gemv", compiler=compiler, flags=flags, language="c++")
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
