// AVX2 loops of the CPU attention kernel for float32 caches (used by avx512.h's generic loops).
//
// CPUs with AVX2 and no AVX-512 (AMD Zen 1-3, older Intel) run the model in float32 (`--dtype
// auto`), so their caches are float32. The generic loops in avx512.h work on 16-float
// vector types; GCC lowers a 64-byte vector on a CPU whose registers hold 32 bytes through the
// stack (each fused multiply-add a load, a store and a few shuffles), which measured 7 GFLOP/s on
// a prefill where the CPU's GEMM peak is 68. These loops do the same sums on 8-float halves held in
// `__m256` registers: the scores of a 16-key chunk are two halves of 8 keys, `p @ V` two halves
// of 8 output dims.
//
// Invariance is that of the generic loops: every accumulator belongs to one (row, head, 8 keys or
// 8 dims), starts at zero (scores) or at the caller's value (`p @ V`), and sees one fused
// multiply-add per word, in order, whatever N, U or DU.
#pragma once
#include "common.h"
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define PAGODA_AVX2_F32 1

// Scores of 16-key chunks j in [j0, j1) for N rows (float32 words), U chunks at a time.
template <int N, int U>
static void scores_f32(const Geo& g, const uint32_t* const* q, const uint32_t* kc,
                       const int32_t* bt, int kvh, int stride, int j0, int j1, float* S) {
  const int W = g.D, cpb = g.BS / 16;
  const float* base = (const float*)kc + (int64_t)kvh * g.NB * W * g.BS;
  auto chunk = [&](int j) { return base + (int64_t)bt[j / cpb] * W * g.BS + (j % cpb) * 16; };
  for (int j = j0; j + U <= j1; j += U) {
    const float *kp[U], *nx[U];
    PAGODA_UNROLL
    for (int u = 0; u < U; ++u) kp[u] = chunk(j + u), nx[u] = chunk(std::min(j + U + u, j1 - 1));
    __m256 acc[N][U][2];
    PAGODA_UNROLL
    for (int i = 0; i < N; ++i)
      PAGODA_UNROLL
      for (int u = 0; u < U; ++u) acc[i][u][0] = acc[i][u][1] = _mm256_setzero_ps();
    for (int w = 0; w < W; ++w) {
      __m256 k0[U], k1[U];
      PAGODA_UNROLL
      for (int u = 0; u < U; ++u) {
        __builtin_prefetch(nx[u] + (int64_t)w * g.BS);
        k0[u] = _mm256_loadu_ps(kp[u] + (int64_t)w * g.BS);
        k1[u] = _mm256_loadu_ps(kp[u] + (int64_t)w * g.BS + 8);
      }
      PAGODA_UNROLL
      for (int i = 0; i < N; ++i) {
        const __m256 qv = _mm256_broadcast_ss((const float*)q[i] + w);
        PAGODA_UNROLL
        for (int u = 0; u < U; ++u) {
          acc[i][u][0] = _mm256_fmadd_ps(k0[u], qv, acc[i][u][0]);
          acc[i][u][1] = _mm256_fmadd_ps(k1[u], qv, acc[i][u][1]);
        }
      }
    }
    PAGODA_UNROLL
    for (int i = 0; i < N; ++i)
      PAGODA_UNROLL
      for (int u = 0; u < U; ++u) {
        _mm256_storeu_ps(S + (int64_t)i * stride + (j + u) * 16, acc[i][u][0]);
        _mm256_storeu_ps(S + (int64_t)i * stride + (j + u) * 16 + 8, acc[i][u][1]);
      }
  }
}

// acc[i * DU + u] += p_i @ V over blocks [b0, b1) for output dims (dc + u) * 16.. (float32).
template <int N, int DU>
static void pv_f32(const Geo& g, const float* const* pr, const uint32_t* vc, const int32_t* bt,
                   int kvh, int dc, int b0, int b1, vf* acc) {
  const int KW = g.BS, W = g.D;
  const float* base = (const float*)vc + (int64_t)kvh * g.NB * KW * W + dc * 16;
  __m256 a[N * DU][2];  // registers: loaded and stored by value (an address taken spills them)
  PAGODA_UNROLL
  for (int c = 0; c < N * DU; ++c)
    a[c][0] = _mm256_loadu_ps((const float*)&acc[c]), a[c][1] = _mm256_loadu_ps((const float*)&acc[c] + 8);
  for (int b = b0; b < b1; ++b) {
    const float* vb = base + (int64_t)bt[b] * KW * W;
    const float* nx = base + (int64_t)bt[std::min(b + 1, b1 - 1)] * KW * W;
    for (int k = 0; k < KW; ++k) {
      __m256 v0[DU], v1[DU];
      PAGODA_UNROLL
      for (int u = 0; u < DU; ++u) {
        __builtin_prefetch(nx + (int64_t)k * W + u * 16);
        v0[u] = _mm256_loadu_ps(vb + (int64_t)k * W + u * 16);
        v1[u] = _mm256_loadu_ps(vb + (int64_t)k * W + u * 16 + 8);
      }
      PAGODA_UNROLL
      for (int i = 0; i < N; ++i) {
        const __m256 p = _mm256_broadcast_ss(pr[i] + b * KW + k);
        PAGODA_UNROLL
        for (int u = 0; u < DU; ++u) {
          a[i * DU + u][0] = _mm256_fmadd_ps(v0[u], p, a[i * DU + u][0]);
          a[i * DU + u][1] = _mm256_fmadd_ps(v1[u], p, a[i * DU + u][1]);
        }
      }
    }
  }
  PAGODA_UNROLL
  for (int c = 0; c < N * DU; ++c)
    _mm256_storeu_ps((float*)&acc[c], a[c][0]), _mm256_storeu_ps((float*)&acc[c] + 8, a[c][1]);
}

typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
static inline vf8 ld8(const float* p) { return (vf8)_mm256_loadu_ps(p); }
static inline vf8 splat8(float x) { vf8 v = {}; return v + x; }
static inline vf8 fma8(vf8 a, vf8 b, vf8 c) { return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }

// `vexp` on 8 lanes: the same operations (this build's `fma` is `_mm256_fmadd_ps` too).
static inline vf8 vexp8(vf8 x) {
  x = x < -87.0f ? splat8(-87.0f) : x;
  vf8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  vf8 r = fma8(n, splat8(2.12194440e-4f), fma8(n, splat8(-0.693359375f), x));
  vf8 p = splat8(1.9875691500E-4f);
  for (float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
    p = fma8(p, r, splat8(c));
  vf8 e = fma8(p, r * r, r) + 1.0f;
  vi8 k = (__builtin_convertvector(n, vi8) + 127) << 23;
  return e * (vf8)k;
}

// `softmax_row` for float32 p on 8-float halves; the sum keeps the 16-lane order (lanes 0-7 and
// 8-15 in two vectors, then `hsum`'s tree), so p is what the generic loop computes.
static void softmax_row_f32(float* s, int lo, int pos, int c0, int nblk_row, int BS) {
  const int nk = nblk_row * BS;
  const vi8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  vf8 m[4] = {splat8(-3.0e38f), splat8(-3.0e38f), splat8(-3.0e38f), splat8(-3.0e38f)};
  // 32-key steps over [start, full), where every key is allowed (lo <= key <= pos)
  const int start = std::max(c0, (lo + 15) & ~15);
  const int full = start + std::max(0, (std::min(nk, pos + 1) - start) / 32 * 32);
  for (int c = start; c < full; c += 32)
    for (int i = 0; i < 4; ++i) { vf8 x = ld8(s + c + 8 * i); m[i] = x > m[i] ? x : m[i]; }
  for (int c = c0; c < nk; c += 8) {
    if (c >= start && c < full) continue;
    vf8 x = ld8(s + c);
    x = ((lane + c) <= pos) & ((lane + c) >= lo) ? x : splat8(-3.0e38f);
    m[0] = x > m[0] ? x : m[0];
  }
  for (int i = 1; i < 4; ++i) m[0] = m[i] > m[0] ? m[i] : m[0];
  float mx = m[0][0];
  for (int i = 1; i < 8; ++i) mx = m[0][i] > mx ? m[0][i] : mx;
  vf8 l0 = splat8(0.0f), l1 = l0;
  for (int c = c0; c < nk; c += 16) {
    vf8 e0 = vexp8(ld8(s + c) - mx), e1 = vexp8(ld8(s + c + 8) - mx);
    if (c + 15 > pos || c < lo) {
      e0 = ((lane + c) <= pos) & ((lane + c) >= lo) ? e0 : splat8(0.0f);
      e1 = ((lane + c + 8) <= pos) & ((lane + c + 8) >= lo) ? e1 : splat8(0.0f);
    }
    l0 = l0 + e0, l1 = l1 + e1;
    _mm256_storeu_ps(s + c, (__m256)e0), _mm256_storeu_ps(s + c + 8, (__m256)e1);
  }
  vf8 t = l0 + l1;  // hsum: lanes i + 8, then 4, 2, 1
  for (int w = 4; w >= 1; w >>= 1) for (int i = 0; i < w; ++i) t[i] = t[i] + t[i + w];
  const vf8 inv = splat8(1.0f / t[0]);
  for (int c = c0; c < nk; c += 8) _mm256_storeu_ps(s + c, (__m256)(ld8(s + c) * inv));
}
#endif
