// AVX-512 loops of the CPU attention kernel (the generic vector loops).
//
// Used for float32 caches and on CPUs without AMX (AMD Zen 4: `vdpbf16ps`; others: plain vector
// arithmetic the compiler lowers; float32 caches on AVX2-only CPUs: avx2.h).
// `vdpbf16ps` has a latency of several cycles, so both loops keep up to `CHAINS` (12 with
// AVX-512) independent accumulator chains in registers: the scores handle several 16-key chunks at
// once, `p @ V` several 16-dim output chunks at once. Neither grouping changes any sum: every
// accumulator belongs to one (row, head, 16 keys or 16 dims) and sees the same operations, in the
// same order, whatever its neighbours (see attention.cpp on invariance).
#pragma once
#include "common.h"
#include "avx2.h"
// Scores of 16-key chunks j in [j0, j1) (chunk j: keys 16j.. of the row's context), U chunks at
// a time so that N * U independent dpbf16 chains hide the instruction's latency. Each chunk's
// accumulator sees the same operations whatever U is: acc = 0, then d words in order.
template <bool BF16, int N, int U>
static void scores(const Geo& g, const uint32_t* const* q, const uint32_t* kc, const int32_t* bt,
                   int kvh, int stride, int j0, int j1, float* S) {
#if defined(PAGODA_AVX2_F32)
  if constexpr (!BF16) return scores_f32<N, U>(g, q, kc, bt, kvh, stride, j0, j1, S);
#endif
  const int W = g.D / g.P, cpb = g.BS / 16;
  const uint32_t* base = kc + (int64_t)kvh * g.NB * W * g.BS;
  auto chunk = [&](int j) { return base + (int64_t)bt[j / cpb] * W * g.BS + (j % cpb) * 16; };
  for (int j = j0; j + U <= j1; j += U) {
    const uint32_t* kp[U];
    for (int u = 0; u < U; ++u) kp[u] = chunk(j + u);
    const uint32_t* nx[U];  // the next group's chunks: blocks are scattered, so fetch ahead
    for (int u = 0; u < U; ++u) nx[u] = chunk(std::min(j + U + u, j1 - 1));
    vf acc[N][U];
    for (int i = 0; i < N; ++i) for (int u = 0; u < U; ++u) acc[i][u] = splat(0.0f);
    for (int w = 0; w < W; ++w) {
      for (int u = 0; u < U; ++u) __builtin_prefetch(nx[u] + (int64_t)w * g.BS);
      vu kv[U];
      for (int u = 0; u < U; ++u) kv[u] = ldu(kp[u] + (int64_t)w * g.BS);
      for (int i = 0; i < N; ++i) {
        vu qv = splatu(q[i][w]);
        for (int u = 0; u < U; ++u) acc[i][u] = dp<BF16>(acc[i][u], kv[u], qv);
      }
    }
    for (int i = 0; i < N; ++i)
      for (int u = 0; u < U; ++u) std::memcpy(S + (int64_t)i * stride + (j + u) * 16, &acc[i][u], 64);
  }
}

// acc[i * DU + u] += p_i @ V over blocks [b0, b1) for output dims (dc + u) * 16.., key words in
// order; DU dim chunks at a time share each p word (more independent chains, same sums).
template <bool BF16, int N, int DU>
static void pv(const Geo& g, const float* const* pr, const uint32_t* vc, const int32_t* bt,
               int kvh, int dc, int b0, int b1, vf* acc) {
#if defined(PAGODA_AVX2_F32)
  if constexpr (!BF16) return pv_f32<N, DU>(g, pr, vc, bt, kvh, dc, b0, b1, acc);
#endif
  const int KW = g.BS / g.P, W = g.D;  // key words per block, words per key word
  const uint32_t* base = vc + (int64_t)kvh * g.NB * KW * W + dc * 16;
  for (int b = b0; b < b1; ++b) {
    const uint32_t* vb = base + (int64_t)bt[b] * KW * W;
    const uint32_t* nx = base + (int64_t)bt[std::min(b + 1, b1 - 1)] * KW * W;
    for (int k = 0; k < KW; ++k) {
      for (int u = 0; u < DU; ++u) __builtin_prefetch(nx + (int64_t)k * W + u * 16);
      vu vv[DU];
      for (int u = 0; u < DU; ++u) vv[u] = ldu(vb + (int64_t)k * W + u * 16);
      for (int i = 0; i < N; ++i) {
        uint32_t pw; std::memcpy(&pw, (const uint32_t*)pr[i] + b * KW + k, 4);
        vu pv = splatu(pw);
        for (int u = 0; u < DU; ++u) acc[i * DU + u] = dp<BF16>(acc[i * DU + u], vv[u], pv);
      }
    }
  }
}

template <bool BF16, int N>
static void scores_n(const Geo& g, const uint32_t* qw, const uint32_t* kc, const int32_t* bt,
                     const Tile& t, int b0, int b1, float* S, int n) {
  if constexpr (N > 1) { if (n < N) return scores_n<BF16, N - 1>(g, qw, kc, bt, t, b0, b1, S, n); }
  const int W = g.D / g.P, cpb = g.BS / 16, j0 = b0 * cpb, j1 = b1 * cpb;
  const uint32_t* q[N];
  for (int i = 0; i < N; ++i) {
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    q[i] = qw + ((int64_t)row * g.H + head) * W;
  }
  constexpr int U = std::max(1, std::min(4, CHAINS / N));  // N * U chains
  const int stride = t.nblk * g.BS, jm = j0 + (j1 - j0) / U * U;
  scores<BF16, N, U>(g, q, kc, bt, t.kvh, stride, j0, jm, S);
  if (jm < j1) scores<BF16, N, 1>(g, q, kc, bt, t.kvh, stride, jm, j1, S);
}

template <bool BF16, int N>
static void pv_n(const Geo& g, const float* const* pr, const uint32_t* vc, const int32_t* bt,
                 int kvh, int dc, int du, int b0, int b1, vf* acc, int n) {
  if constexpr (N > 1) { if (n < N) return pv_n<BF16, N - 1>(g, pr, vc, bt, kvh, dc, du, b0, b1, acc, n); }
  if (du == 4) pv<BF16, N, (4 * N <= CHAINS ? 4 : 1)>(g, pr, vc, bt, kvh, dc, b0, b1, acc);
  else if (du == 2) pv<BF16, N, (2 * N <= CHAINS ? 2 : 1)>(g, pr, vc, bt, kvh, dc, b0, b1, acc);
  else pv<BF16, N, 1>(g, pr, vc, bt, kvh, dc, b0, b1, acc);
}

// Dim chunks per pv pass for n row-heads: at most CHAINS chains, and a divisor of the chunk count.
static inline int dims_for(int n, int ndc) {
  if (4 * n <= CHAINS && ndc % 4 == 0) return 4;
  return 2 * n <= CHAINS && ndc % 2 == 0 ? 2 : 1;
}
