"""float32 matmuls that read GGUF-quantized (Q4_0/1, Q8_0, Q4/5/6_K) and 16-bit weights in place.

On CPUs without native bf16 (AVX2 only: AMD Zen 1-3, older Xeons) the model computes in float32
and a decode step streams every weight from memory: 540 MB for the embedded 135M model, where
its Q4_1/Q8_0 blocks are 96 MB. This kernel keeps the blocks (re-laid out once: 16 outputs by 32
keys per unit, the same bytes per weight) and dequantizes a chunk of keys of one block of 16
outputs into an L1 buffer, exactly as `gguf.quants` does (`quantized`), then sweeps every row
tile of the task over it with FMAs. A weight is thus the same float32 value as in the
dequantized model; each output is one accumulator updated key by key in order, carried between
chunks in float32, so a row's bits depend neither on M, nor on its tile, nor on the threads (the
batch-invariance guarantee of docs/runtime.md holds). AVX2 + FMA + F16C; ``PAGODA_CPU_QGEMM=0``
turns it off (oneDNN's float32 GEMM over the dequantized weights then runs).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence

import torch
from pagoda.runtime import native
from pagoda.runtime.model import gemv
from pagoda.runtime.model.quantized import HALF_KINDS, QK, QuantizedWeight, probe_weight

log = logging.getLogger(__name__)

ENV_SWITCH = "PAGODA_CPU_QGEMM"
NB = 16  # outputs per unit
KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q4_K": 3, "Q6_K": 4, "Q5_K": 5, "F16": 6, "BF16": 7}
SERIAL_BELOW = 1 << 18  # multiply-adds below which the calling thread works alone

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
@CLAIM@
@POOL@
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ALWAYS inline __attribute__((always_inline))
#define INLINE static ALWAYS
enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q4_K = 3, Q6_K = 4, Q5_K = 5, F16 = 6, BF16 = 7 };
constexpr int NB = 16;      // outputs per unit: two vectors of 8
constexpr int QK = 32;      // keys per unit (GGUF's block)
constexpr int KC = 256;     // keys dequantized at a time: 16 KB of float32, in L1
constexpr int RMAX = 6;     // rows per tile: 12 accumulators + 2 weights + 1 broadcast
constexpr int MC_MAX = 96;  // rows per task
constexpr int PF = 2;  // units prefetched ahead: 2 measured best (decode 1.45x faster)
constexpr int LEAN_ROWS = 4;  // up to this many rows: `lean`

// per unit: integers (two outputs a byte for the 4-bit kinds), then 16 scales and, but for Q4_0
// and Q8_0, 16 more: Q4_1's m, Q4/5_K's min, Q6_K's scale for keys 16-31; float16 as GGUF stores
// them for the 32-blocks, float32 for the K kinds (products GGUF forms in float32). F16 and BF16
// units are the 16-bit values themselves, no scales.
template <int QT> constexpr bool half16() { return QT == F16 || QT == BF16; }
template <int QT> constexpr bool bytes8() { return QT == Q8_0 || QT == Q6_K || QT == Q5_K; }
template <int QT> constexpr bool wide() { return QT == Q4_K || QT == Q6_K || QT == Q5_K; }
template <int QT> constexpr int qbytes() { return half16<QT>() ? 1024 : bytes8<QT>() ? 512 : 256; }
template <int QT> constexpr int unit() {
  if (half16<QT>()) return qbytes<QT>();
  return qbytes<QT>() + (QT == Q4_0 || QT == Q8_0 ? 1 : 2) * 16 * (wide<QT>() ? 4 : 2);
}

struct Job {
  const uint8_t* w; const float *x, *bias; float* y;
  int64_t ldx, ldy, next, claim;
  int M, N, K, MC;
};

// One unit's 32 keys x 16 outputs: weight k as two float32 vectors, computed as gguf.quants
// does (d * q rounded, then + m rounded; d * (q - 8); q * d)
template <int QT>
struct Unit {
  const uint8_t* q;
  __m256 d0, d1, m0, m1;
  ALWAYS explicit Unit(const uint8_t* u) : q(u) {
    if constexpr (half16<QT>()) return;  // no scales
    const uint8_t* sc = u + qbytes<QT>();
    const bool two = !(QT == Q4_0 || QT == Q8_0);
    d0 = scales(sc, 0), d1 = scales(sc, 1);
    m0 = two ? scales(sc, 2) : d0, m1 = two ? scales(sc, 3) : d1;
  }
  static ALWAYS __m256 scales(const uint8_t* sc, int i) {  // the i-th 8 scales, as float32
    if (wide<QT>()) return _mm256_loadu_ps((const float*)sc + 8 * i);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)sc + i));
  }
  ALWAYS void at(int k, __m256& w0, __m256& w1) const {
    if constexpr (half16<QT>()) {  // widened exactly: float16 by F16C, bfloat16 by a shift
      const __m128i* h = (const __m128i*)(q + k * 32);
      if (QT == F16) {
        w0 = _mm256_cvtph_ps(_mm_loadu_si128(h)), w1 = _mm256_cvtph_ps(_mm_loadu_si128(h + 1));
      } else {
        w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
        w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + 1)), 16));
      }
      return;
    }
    __m256i q0, q1;
    if (bytes8<QT>()) {
      const __m128i b = _mm_loadu_si128((const __m128i*)(q + k * 16));
      q0 = _mm256_cvtepi8_epi32(b);
      q1 = _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8));
    } else {  // byte j: output j in the low nibble, output j + 8 in the high one
      const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + k * 8)));
      q0 = _mm256_and_si256(b, _mm256_set1_epi32(15));
      q1 = _mm256_srli_epi32(b, 4);
      if (QT == Q4_0) {
        q0 = _mm256_sub_epi32(q0, _mm256_set1_epi32(8));
        q1 = _mm256_sub_epi32(q1, _mm256_set1_epi32(8));
      }
    }
    const bool hi = QT == Q6_K && k >= 16;  // Q6_K: a scale per 16 keys
    w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(q0), hi ? m0 : d0);
    w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(q1), hi ? m1 : d1);
    if (QT == Q4_1) w0 = _mm256_add_ps(w0, m0), w1 = _mm256_add_ps(w1, m1);
    if (QT == Q4_K || QT == Q5_K) w0 = _mm256_sub_ps(w0, m0), w1 = _mm256_sub_ps(w1, m1);
  }
};

template <int QT>
INLINE const uint8_t* unit_at(const Job& j, int64_t nb, int k) {
  return j.w + (nb * (j.K / QK) + k / QK) * (int64_t)unit<QT>();
}

// rows [m0, m0 + R) of y at output block nb from staged float32 sums [R][16] (+ bias)
INLINE void emit(const Job& j, int64_t nb, int64_t m0, int R, const float* out) {
  const int64_t n0 = nb * NB;
  if (n0 >= j.N) return;
  const int valid = j.N - n0 < NB ? (int)(j.N - n0) : NB;
  for (int r = 0; r < R; ++r) {
    float* y = j.y + (m0 + r) * j.ldy + n0;
    if (j.bias)
      for (int i = 0; i < valid; ++i) y[i] = out[r * NB + i] + j.bias[n0 + i];
    else
      memcpy(y, out + r * NB, (size_t)valid * 4);
  }
}

// keys [k0, k1) of output block nb as float32 [k][16]
template <int QT>
INLINE void dequant(const Job& j, int64_t nb, int k0, int k1, float* out) {
  const uint8_t* u = unit_at<QT>(j, nb, k0);
  for (int kb = k0; kb < k1; kb += QK, u += unit<QT>()) {
    const Unit<QT> w(u);
    for (int l = 0; l < unit<QT>(); l += 64)
      _mm_prefetch((const char*)u + PF * unit<QT>() + l, _MM_HINT_T0);
    for (int k = 0; k < QK; ++k, out += NB) {
      __m256 w0, w1;
      w.at(k, w0, w1);
      _mm256_store_ps(out, w0);
      _mm256_store_ps(out + 8, w1);
    }
  }
}

// R rows from m0 by the 16 outputs of block nb over keys [k0, k1) of `wb`; the accumulators
// start at zero (k0 = 0) or from `acc_buf`, and go back there or, at the last key, to y
template <int R>
INLINE void tile(const Job& j, int64_t nb, int64_t m0, int k0, int k1, const float* wb,
                 float* acc_buf) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v)
      acc[r][v] = k0 ? _mm256_load_ps(acc_buf + r * NB + 8 * v) : _mm256_setzero_ps();
  const float* x = j.x + m0 * j.ldx;
  for (int k = k0; k < k1; ++k, wb += NB) {
    const __m256 b0 = _mm256_load_ps(wb), b1 = _mm256_load_ps(wb + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * j.ldx + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  // staged through acc_buf (indexing `acc` in emit's loops would keep it in memory throughout)
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2; ++v) _mm256_store_ps(acc_buf + r * NB + 8 * v, acc[r][v]);
  if (k1 == j.K) emit(j, nb, m0, R, acc_buf);
}

// R rows by U output blocks from nb (U = 2 for one or two rows, else 1: registers), every key,
// dequantizing in registers: with a few rows a buffer's store and reload would cost more than
// the arithmetic. Each output's operations are those of `tile`, so the bits are the same.
template <int QT, int R, int U>
static void lean(const Job& j, int64_t nb, int64_t m0) {
  __m256 acc[R][2 * U];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2 * U; ++v) acc[r][v] = _mm256_setzero_ps();
  const int64_t nb1 = U == 2 && (nb + 1) * NB < j.N ? nb + 1 : nb;  // a lone last block: once
  const uint8_t *ua = unit_at<QT>(j, nb, 0), *ub = unit_at<QT>(j, nb1, 0);
  const float* x = j.x + m0 * j.ldx;
  for (int kb = 0; kb < j.K; kb += QK, ua += unit<QT>(), ub += unit<QT>()) {
    const Unit<QT> a(ua), b(ub);
    for (int l = 0; l < unit<QT>(); l += 64) {
      _mm_prefetch((const char*)ua + PF * unit<QT>() + l, _MM_HINT_T0);
      if (U == 2) _mm_prefetch((const char*)ub + PF * unit<QT>() + l, _MM_HINT_T0);
    }
    for (int k = 0; k < QK; ++k) {
      __m256 w[4];
      a.at(k, w[0], w[1]);
      if (U == 2) b.at(k, w[2], w[3]);
      for (int r = 0; r < R; ++r) {
        const __m256 xr = _mm256_broadcast_ss(x + r * j.ldx + kb + k);
        for (int v = 0; v < 2 * U; ++v) acc[r][v] = _mm256_fmadd_ps(xr, w[v], acc[r][v]);
      }
    }
  }
  alignas(32) float out[U][R * NB];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 2 * U; ++v)
      _mm256_store_ps(out[v / 2] + r * NB + 8 * (v % 2), acc[r][v]);
  emit(j, nb, m0, R, out[0]);
  if (U == 2 && nb1 != nb) emit(j, nb1, m0, R, out[U - 1]);
}

// output blocks per `lean` task
static inline int64_t lean_units(int M) { return M <= 2 ? 2 : 1; }

@ROW_TILES@

// tasks = (output block, run of MC rows), block-major; each chunk of keys is dequantized once
// per task and swept by all its row tiles while it sits in L1. With up to 4 rows, tasks are
// output blocks (pairs of them for one or two rows) dequantized in registers (`lean`).
template <int QT>
static void run(void* arg) {
  Job& j = *(Job*)arg;
  const int64_t nblk = (j.N + NB - 1) / NB, mch = (j.M + j.MC - 1) / j.MC;
  const int64_t lu = lean_units(j.M);
  const int64_t tasks = j.M <= LEAN_ROWS ? (nblk + lu - 1) / lu : nblk * mch;
  alignas(32) float wb[KC * NB];
  alignas(32) float acc_buf[MC_MAX * NB];
  for (int64_t t, end; (t = claim(&j.next, j.claim, tasks, &end)) < tasks;)
    for (; t < end; ++t) {
      switch (j.M <= LEAN_ROWS ? j.M : 0) {
        case 1: lean<QT, 1, 2>(j, 2 * t, 0); continue;
        case 2: lean<QT, 2, 2>(j, 2 * t, 0); continue;
        case 3: lean<QT, 3, 1>(j, t, 0); continue;
        case 4: lean<QT, 4, 1>(j, t, 0); continue;
      }
      const int64_t nb = t / mch, lo = t % mch * j.MC, hi = lo + j.MC < j.M ? lo + j.MC : j.M;
      for (int k0 = 0; k0 < j.K; k0 += KC) {
        const int k1 = k0 + KC < j.K ? k0 + KC : j.K;
        dequant<QT>(j, nb, k0, k1, wb);
#define TILE(R) tile<R>(j, nb, m, k0, k1, wb, acc_buf + (m - lo) * NB)
        ROW_TILES(TILE)
      }
    }
}
#endif

// y [M, N] = x [M, K] @ w^T (+ bias), w in this module's units, on `threads` pool threads
extern "C" int pagoda_qgemm(int kind, const uint8_t* w, const float* x, int64_t ldx, float* y,
                            int64_t ldy, const float* bias, int M, int N, int K, int threads) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (M < 1 || N < 1 || K < QK || K % QK || kind < 0 || kind > 7) return 1;
  const int MC = M <= MC_MAX ? M : MC_MAX;
  const int64_t blocks = (N + NB - 1) / NB;
  const int64_t lu = lean_units(M);
  const int64_t tasks = M <= LEAN_ROWS ? (blocks + lu - 1) / lu : blocks * ((M + MC - 1) / MC);
  const int64_t per_claim = tasks / (8 * (threads > 0 ? threads : 1));  // ~8 claims a thread
  Job job{w, x, bias, y, ldx, ldy, 0, per_claim > 0 ? per_claim : 1, M, N, K, MC};
  pool_fn fns[] = {run<Q4_0>, run<Q4_1>, run<Q8_0>, run<Q4_K>,
                   run<Q6_K>, run<Q5_K>, run<F16>, run<BF16>};
  pool_run(fns[kind], &job, threads);
  return 0;
#else
  (void)kind, (void)w, (void)x, (void)ldx, (void)y, (void)ldy, (void)bias;
  (void)M, (void)N, (void)K, (void)threads;
  return 2;
#endif
}
"""


def pack(weight: QuantizedWeight) -> torch.Tensor:
    """The kernel's layout, uint8: per block of 16 outputs (rows padded with zero weights), per
    32 keys, the integers [key][output] (Q4: output j and j + 8 share byte j) then d[16] and, for
    Q4_1, m[16] as float16 (as GGUF stores them; converted exactly in the kernel); F16/BF16:
    the 16-bit values [key][output]."""
    n, k = weight.rows, weight.cols
    pad = -n % NB
    if weight.kind in HALF_KINDS:
        v = weight.blocks.view(torch.int16)
        v = _pad_rows(v, pad) if pad else v
        v = v.view((n + pad) // NB, NB, k // QK, QK).permute(0, 2, 3, 1).contiguous()
        return v.view(torch.uint8).reshape(-1)
    q, d, m = weight.fields(raw_scales=True)
    if pad:  # zero rows: zero weights, outputs never stored
        q, d = _pad_rows(q, pad), _pad_rows(d, pad)
        m = None if m is None else _pad_rows(m, pad)
    nblk, kb = (n + pad) // NB, k // QK
    q = q.view(nblk, NB, kb, QK).permute(0, 2, 3, 1)  # [block, key block, key, output]
    if weight.kind in ("Q8_0", "Q6_K", "Q5_K"):
        ints = q.to(torch.int8).contiguous().view(torch.uint8).reshape(nblk, kb, QK * NB)
    else:
        if weight.kind == "Q4_0":
            q = q + 8  # back to the stored nibble; the kernel subtracts 8
        q = q.to(torch.uint8)
        ints = (q[..., : NB // 2] | (q[..., NB // 2 :] << 4)).reshape(nblk, kb, QK * NB // 2)
    scales = [s.view(nblk, NB, kb).transpose(1, 2).contiguous() for s in (d, m) if s is not None]
    width = NB * scales[0].element_size()
    parts = [ints] + [s.view(torch.uint8).reshape(nblk, kb, width) for s in scales]
    return torch.cat(parts, dim=-1).reshape(-1).contiguous()


def _pad_rows(t: torch.Tensor, pad: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(pad, t.shape[1])])


class QGemm:
    """The compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.pagoda_qgemm.argtypes = [i32, p, p, i64, p, i64, p, i32, i32, i32, i32]
        lib.pagoda_qgemm.restype = i32
        self.fn = lib.pagoda_qgemm

    def bind(
        self, weight: QuantizedWeight | Sequence[QuantizedWeight], bias: torch.Tensor | None
    ) -> QGemmWeight:
        parts = [weight] if isinstance(weight, QuantizedWeight) else list(weight)
        return QGemmWeight(self, parts, bias)


class QGemmWeight:
    """Row blocks of one weight (q/k/v may be stored in different kinds), packed and bound to
    the kernel: x float32 [M, K] -> [M, N], each part writing its columns of y in place."""

    __slots__ = ("bias", "fn", "k", "kinds", "n", "nbytes", "parts")

    def __init__(
        self, kernel: QGemm, parts: list[QuantizedWeight], bias: torch.Tensor | None
    ) -> None:
        if not parts or any(p.cols != parts[0].cols for p in parts):
            raise ValueError("quantized parts must share their number of columns")
        self.fn, self.k, self.n = kernel.fn, parts[0].cols, sum(p.rows for p in parts)
        self.kinds = tuple(p.kind for p in parts)
        self.bias = None if bias is None else bias.to(torch.float32).contiguous()
        self.parts: list[tuple[int, torch.Tensor, int, int]] = []  # kind, packed, row0, rows
        row0 = 0
        for p in parts:
            self.parts.append((KINDS[p.kind], pack(p), row0, p.rows))
            row0 += p.rows
        self.nbytes = sum(packed.numel() for _, packed, _, _ in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        y = torch.empty(m, self.n, dtype=torch.float32)
        if m == 0:
            return y
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"expected float32 [M, {self.k}], got {x.dtype} {tuple(x.shape)}")
        if x.stride(1) != 1:
            x = x.contiguous()
        threads = torch.get_num_threads() if self.n * self.k * m >= SERIAL_BELOW else 1
        xp, ldx, yp = x.data_ptr(), x.stride(0), y.data_ptr()
        for kind, packed, row0, rows in self.parts:
            bias = None if self.bias is None else self.bias.data_ptr() + 4 * row0
            args = (kind, packed.data_ptr(), xp, ldx, yp + 4 * row0, self.n, bias, m, rows)
            rc = self.fn(*args, self.k, threads)
            if rc:
                raise RuntimeError(f"quantized GEMM failed (code {rc}) for {m}x{self.k} @ {rows}")
        return y


def wanted() -> bool:
    """``PAGODA_CPU_QGEMM``: on unless ``0`` (``1`` and ``auto``, the default, mean on)."""
    choice = os.environ.get(ENV_SWITCH, "auto")
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"{ENV_SWITCH} must be auto, 0 or 1, got {choice!r}")
    return choice != "0"


@functools.cache
def load() -> QGemm | None:
    """The kernel, or None (no compiler, no AVX2 + FMA, or it fails its load-time check)."""
    compiler = native.find_compiler("CXX", ("g++", "clang++"))
    if compiler is None:
        return None
    try:
        path = gemv.build(SOURCE, "qgemm", compiler)  # gemv's flags and shared C pieces
        kernel = QGemm(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError) as exc:
        log.warning("quantized CPU GEMM unavailable, float32 weights are used: %s", exc)
        return None
    return kernel if _agrees(kernel) else None


def _agrees(kernel: QGemm) -> bool:
    """The kernel against float64 on probes of every kind, padded in N, through both paths
    (1 and 3 rows in registers, 7 through the buffer); a load-time check."""
    g = torch.Generator().manual_seed(1)
    for kind in KINDS:
        w = probe_weight(kind, 40, 256)
        x = torch.randn(7, 256, generator=g)
        bias = torch.randn(40, generator=g)
        bound = kernel.bind(w, bias)
        dense = w.dequantize().double()
        want = x.double() @ dense.T + bias.double()
        # float32 sums of 256 terms: off by at most ~256 * 2^-24 of the terms' absolute sum
        tol = 3e-5 * (x.double().abs() @ dense.abs().T + bias.double().abs()) + 1e-6
        try:
            got = [bound(x[:rows]).double() for rows in (1, 3, 7)]
        except RuntimeError as exc:
            log.warning("quantized CPU GEMM off: %s", exc)
            return False
        if not all(((y - want[: len(y)]).abs() <= tol[: len(y)]).all() for y in got):
            log.warning("quantized CPU GEMM off: it disagrees with float64 on a %s probe", kind)
            return False
    return True
