// The quantized float32 GEMM (`pagoda.runtime.cpu.qgemm`): units of 16 outputs by 32 keys,
// dequantized exactly as `gguf.quants` does (16-bit kinds: widened), swept by AVX2 FMA row
// tiles; the sampling mode's code is qgemm_sample.h.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "claim.h"
#include "pool.h"
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ALWAYS inline __attribute__((always_inline))
#define INLINE static ALWAYS
enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q4_K = 3, Q6_K = 4, Q5_K = 5, F16 = 6, BF16 = 7, Q5_1 = 8 };
constexpr int NKINDS = 9;
// F's instance for each kind, in the enum's order: the table a kind number indexes
#define BY_KIND(F) {F<Q4_0>, F<Q4_1>, F<Q8_0>, F<Q4_K>, F<Q6_K>, F<Q5_K>, F<F16>, F<BF16>, F<Q5_1>}
constexpr int NB = 16;      // outputs per unit: two vectors of 8
constexpr int QK = 32;      // keys per unit (GGUF's block)
constexpr int KC = 256;     // keys dequantized at a time: 16 KB of float32, in L1
constexpr int RMAX = 6;     // rows per tile: 12 accumulators + 2 weights + 1 broadcast
constexpr int MC_MAX = 96;  // rows per task
constexpr int PF = 2;  // units prefetched ahead: 2 measured best (decode 1.45x faster)
constexpr int LEAN_ROWS = 4;  // up to this many rows: `lean`

// per unit: integers (two outputs a byte for the 4-bit kinds), then 16 scales and, but for Q4_0
// and Q8_0, 16 more: Q4_1/Q5_1's m, Q4/5_K's min, Q6_K's scale for keys 16-31; float16 as GGUF
// stores them for the 32-blocks, float32 for the K kinds (products GGUF forms in float32). F16
// and BF16 units are the 16-bit values themselves, no scales. Other GGUF kinds come in one of
// these layouts (`qgemm.KINDS`): Q5_0 and IQ4_NL as Q8_0, Q3_K and IQ4_XS as Q6_K.
template <int QT> constexpr bool half16() { return QT == F16 || QT == BF16; }
template <int QT> constexpr bool bytes8() {
  return QT == Q8_0 || QT == Q6_K || QT == Q5_K || QT == Q5_1;
}
template <int QT> constexpr bool wide() { return QT == Q4_K || QT == Q6_K || QT == Q5_K; }
template <int QT> constexpr int qbytes() { return half16<QT>() ? 1024 : bytes8<QT>() ? 512 : 256; }
template <int QT> constexpr int unit() {
  if (half16<QT>()) return qbytes<QT>();
  return qbytes<QT>() + (QT == Q4_0 || QT == Q8_0 ? 1 : 2) * 16 * (wide<QT>() ? 4 : 2);
}

// y null: sampling mode (qgemm_sample.h): per row and output block, its maximum and its
// sum of exponentials in `stats` (rows of sstride floats) instead of the outputs
struct Job {
  const uint8_t* w; const float *x, *bias; float* y;
  float* stats; const float* scale;
  int64_t ldx, ldy, next, claim, nbp, sstride;
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
    if (QT == Q4_1 || QT == Q5_1) w0 = _mm256_add_ps(w0, m0), w1 = _mm256_add_ps(w1, m1);
    if (QT == Q4_K || QT == Q5_K) w0 = _mm256_sub_ps(w0, m0), w1 = _mm256_sub_ps(w1, m1);
  }
};

template <int QT>
INLINE const uint8_t* unit_at(const Job& j, int64_t nb, int k) {
  return j.w + (nb * (j.K / QK) + k / QK) * (int64_t)unit<QT>();
}

#include "qgemm_sample.h"  // the sampling mode's kernels

// rows [m0, m0 + R) of y at output block nb from staged float32 sums [R][16] (+ bias)
INLINE void emit(const Job& j, int64_t nb, int64_t m0, int R, const float* out) {
  const int64_t n0 = nb * NB;
  if (n0 >= j.N) return;
  const int valid = j.N - n0 < NB ? (int)(j.N - n0) : NB;
  if (!j.y) return block_stats(j, nb, m0, R, valid, out);
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

#include "row_tiles.h"

// tasks = (output block, run of MC rows), block-major; each chunk of keys is dequantized once
// per task and swept by all its row tiles while it sits in L1. With up to 4 rows, tasks are
// output blocks (pairs of them for one or two rows) dequantized in registers (`lean`).
template <int QT>
static void run(void* arg) {
  Job& shared = *(Job*)arg;
  const Job j = shared;  // a copy in this thread's registers and stack; `next` stays shared
  const int64_t nblk = (j.N + NB - 1) / NB, mch = (j.M + j.MC - 1) / j.MC;
  const int64_t lu = lean_units(j.M);
  const int64_t tasks = j.M <= LEAN_ROWS ? (nblk + lu - 1) / lu : nblk * mch;
  alignas(32) float wb[KC * NB];
  alignas(32) float acc_buf[MC_MAX * NB];
  for (int64_t t, end; (t = claim(&shared.next, j.claim, tasks, &end)) < tasks;)
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

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static int64_t tasks_for(int M, int N, int MC) {
  const int64_t blocks = (N + NB - 1) / NB, lu = lean_units(M);
  return M <= LEAN_ROWS ? (blocks + lu - 1) / lu : blocks * ((M + MC - 1) / MC);
}

static int launch(Job& job, int kind, int threads) {
  if (job.M < 1 || job.N < 1 || job.K < QK || job.K % QK || kind < 0 || kind >= NKINDS) return 1;
  const int64_t per_claim = tasks_for(job.M, job.N, job.MC) / (8 * threads);  // ~8 a thread
  job.claim = per_claim > 0 ? per_claim : 1;
  pool_fn fns[] = BY_KIND(run);
  pool_run(fns[kind], &job, threads);
  return 0;
}
#endif

// y [M, N] = x [M, K] @ w^T (+ bias), w in this module's units, on `threads` pool threads
extern "C" int pagoda_qgemm(int kind, const uint8_t* w, const float* x, int64_t ldx, float* y,
                            int64_t ldy, const float* bias, int M, int N, int K, int threads) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (threads < 1) threads = 1;
  Job job{w, x, bias, y, nullptr, nullptr, ldx, ldy, 0, 1, 0, 0, M, N, K,
          M <= MC_MAX ? M : MC_MAX};
  return launch(job, kind, threads);
#else
  (void)kind, (void)w, (void)x, (void)ldx, (void)y, (void)ldy, (void)bias;
  (void)M, (void)N, (void)K, (void)threads;
  return 2;
#endif
}

// out [n, K]: rows ids[0..n) of the weight [N, K] in float32, each weight the value the GEMM
// multiplies by: an embedding table read from the units (an LM head's, when tied)
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
template <int QT>
static void rows_of(const Job& j, const int64_t* ids, int64_t n, float* out) {
  alignas(32) float v[NB];
  for (int64_t i = 0; i < n; ++i) {
    const int lane = (int)(ids[i] % NB);
    const uint8_t* u = unit_at<QT>(j, ids[i] / NB, 0);
    for (int kb = 0; kb < j.K; kb += QK, u += unit<QT>()) {
      const Unit<QT> w(u);
      for (int k = 0; k < QK; ++k) {
        __m256 w0, w1;
        w.at(k, w0, w1);
        _mm256_store_ps(v, w0), _mm256_store_ps(v + 8, w1);
        out[i * j.K + kb + k] = v[lane];
      }
    }
  }
}
#endif

extern "C" int pagoda_qgemm_rows(int kind, const uint8_t* w, int N, int K, const int64_t* ids,
                                 int64_t n, float* out) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (N < 1 || K < QK || K % QK || kind < 0 || kind >= NKINDS) return 1;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= N) return 4;
  Job job{w, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, 0, 1, 0, 0, N, N, K, 1};
  void (*fns[])(const Job&, const int64_t*, int64_t, float*) = BY_KIND(rows_of);
  fns[kind](job, ids, n, out);
  return 0;
#else
  (void)kind, (void)w, (void)N, (void)K, (void)ids, (void)n, (void)out;
  return 2;
#endif
}

#define QGEMM_SAMPLE_API  // the sampling mode's entry points
#include "qgemm_sample.h"
