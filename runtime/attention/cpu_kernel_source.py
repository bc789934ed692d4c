"""C++ source of the CPU paged-attention kernel (built and loaded by ``cpu_kernel.py``).

It lives in a Python string so that it ships inside the wheel with no package-data set-up.

Layout (per layer, ``P`` = 2 bf16 values or 1 float32 per 32-bit word, ``NB`` blocks of ``BS``):
K ``[Hkv, NB, D/P, BS, P]`` (a 64-byte load is 16 keys' words: score lanes are keys) and
V ``[Hkv, NB, BS/P, D, P]`` (a load is 16 dims of P consecutive keys: output lanes are dims).

Invariance: every (query row, head) pair owns its accumulators, and each is updated by the same
sequence of operations whatever else is in its tile, wave or batch: scores by 16-key chunks at
absolute positions (d in order), a max and a sum over the row's own blocks, ``p @ V`` over the
row's own blocks in key order. Tiles only share the loads. Built with ``-ffp-contract=off`` so
that the compiler cannot fuse some multiply-adds and not others.
"""

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

static const int MAXN = 12;            // row-heads per tile (accumulators held in registers)
static const int KCHUNK = 32;          // blocks per score task

static inline vf ld(const void* p) { vf v; std::memcpy(&v, p, 64); return v; }
static inline vu ldu(const void* p) { vu v; std::memcpy(&v, p, 64); return v; }
static inline vf splat(float x) { vf v = {}; return v + x; }
static inline vu splatu(uint32_t x) { vu v = {}; return v + x; }

// acc + a . b over word pairs: bf16 pairs (P = 2) or single floats (P = 1).
template <bool BF16> static inline vf dp(vf acc, vu a, vu b);
template <> inline vf dp<true>(vf acc, vu a, vu b) {
#if defined(__AVX512BF16__)
  return (vf)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
#else
  vf alo = (vf)(a << 16), ahi = (vf)(a & 0xFFFF0000u);
  vf blo = (vf)(b << 16), bhi = (vf)(b & 0xFFFF0000u);
  return (acc + ahi * bhi) + alo * blo;
#endif
}
template <> inline vf dp<false>(vf acc, vu a, vu b) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#else
  return acc + (vf)a * (vf)b;
#endif
}

static inline uint16_t to_bf16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static inline vh to_bf16v(vf f) {
  vu u = (vu)f;
  return __builtin_convertvector((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16, vh);
}
static inline float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; std::memcpy(&f, &u, 4); return f; }

// exp for x <= 0 (Cephes expf polynomial, ~1 ulp); x below -87 gives ~0.
static inline vf vexp(vf x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  vf r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  vf p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f; p = p * r + 8.3334519073E-3f; p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f; p = p * r + 5.0000001201E-1f;
  vf e = (p * (r * r) + r) + 1.0f;
  vi k = (__builtin_convertvector(n, vi) + 127) << 23;
  return e * (vf)k;
}
static inline float hmax(vf v) { float m = v[0]; for (int i = 1; i < 16; ++i) m = v[i] > m ? v[i] : m; return m; }
static inline float hsum(vf v) {  // a fixed tree
  for (int w = 8; w >= 1; w >>= 1) for (int i = 0; i < w; ++i) v[i] = v[i] + v[i + w];
  return v[0];
}

struct Geo { int H, HKV, D, NB, BS, P, G; };
struct Tile {  // row-heads rh = r * G + j of one sequence and kv head; rows r0.. of that sequence
  int seq, kvh, rh0, n, nblk;   // first flattened row-head, count, blocks the tile reads
  int64_t scratch;              // offset of its [n][nblk * BS] scores
  int t0, pos0;                 // step row and context position of row 0 of the sequence
};

template <bool BF16, int N>
static void scores(const Geo& g, const uint32_t* qw, const uint32_t* kc, const int32_t* bt,
                   const Tile& t, int b0, int b1, float* S) {
  const int W = g.D / g.P, stride = t.nblk * g.BS;
  const uint32_t* q[N];
  for (int i = 0; i < N; ++i) {
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    q[i] = qw + ((int64_t)row * g.H + head) * W;
  }
  for (int b = b0; b < b1; ++b) {
    const uint32_t* kb = kc + ((int64_t)t.kvh * g.NB + bt[b]) * W * g.BS;
    for (int c = 0; c < g.BS; c += 16) {
      vf acc[N];
      for (int i = 0; i < N; ++i) acc[i] = splat(0.0f);
      for (int w = 0; w < W; ++w) {
        vu kv = ldu(kb + (int64_t)w * g.BS + c);
        for (int i = 0; i < N; ++i) acc[i] = dp<BF16>(acc[i], kv, splatu(q[i][w]));
      }
      for (int i = 0; i < N; ++i) std::memcpy(S + (int64_t)i * stride + b * g.BS + c, &acc[i], 64);
    }
  }
}

// Row-head's softmax over its keys [0, pos]; p (bf16 or float) written in place at the start.
template <bool BF16>
static void softmax_row(float* s, int pos, int nblk_row, int BS) {
  const int nk = nblk_row * BS;
  vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  vf m = splat(-3.0e38f);
  for (int c = 0; c < nk; c += 16) {
    vf x = ld(s + c);
    x = (lane + c) <= pos ? x : splat(-3.0e38f);
    m = x > m ? x : m;
  }
  const float mx = hmax(m);
  vf l = splat(0.0f);
  for (int c = 0; c < nk; c += 16) {
    vf e = vexp(ld(s + c) - mx);
    e = (lane + c) <= pos ? e : splat(0.0f);
    l = l + e;
    std::memcpy(s + c, &e, 64);
  }
  const float sum = hsum(l);
  for (int c = 0; c < nk; c += 16) {
    vf p = ld(s + c) / sum;
    if (BF16) { vh h = to_bf16v(p); std::memcpy((uint16_t*)s + c, &h, 32); }
    else std::memcpy(s + c, &p, 64);
  }
}

template <bool BF16, int N>
static void pv(const Geo& g, const float* const* pr, const uint32_t* vc, const int32_t* bt,
               int kvh, int dc, int b0, int b1, vf* acc) {
  const int KW = g.BS / g.P, W = g.D;  // key words per block, words per key word
  for (int b = b0; b < b1; ++b) {
    const uint32_t* vb = vc + ((int64_t)kvh * g.NB + bt[b]) * KW * W + dc * 16;
    for (int k = 0; k < KW; ++k) {
      vu vv = ldu(vb + (int64_t)k * W);
      for (int i = 0; i < N; ++i) {
        uint32_t pw; std::memcpy(&pw, (const uint32_t*)pr[i] + b * KW + k, 4);
        acc[i] = dp<BF16>(acc[i], vv, splatu(pw));
      }
    }
  }
}

template <bool BF16, int N>
static void scores_n(const Geo& g, const uint32_t* qw, const uint32_t* kc, const int32_t* bt,
                     const Tile& t, int b0, int b1, float* S, int n) {
  if constexpr (N > 1) { if (n < N) return scores_n<BF16, N - 1>(g, qw, kc, bt, t, b0, b1, S, n); }
  scores<BF16, N>(g, qw, kc, bt, t, b0, b1, S);
}
template <bool BF16, int N>
static void pv_n(const Geo& g, const float* const* pr, const uint32_t* vc, const int32_t* bt,
                 int kvh, int dc, int b0, int b1, vf* acc, int n) {
  if constexpr (N > 1) { if (n < N) return pv_n<BF16, N - 1>(g, pr, vc, bt, kvh, dc, b0, b1, acc, n); }
  pv<BF16, N>(g, pr, vc, bt, kvh, dc, b0, b1, acc);
}

template <bool BF16>
static void finish(const Geo& g, const Tile& t, const int32_t* bt, const uint32_t* vc,
                   const float* S, int dc, void* out) {
  const int stride = t.nblk * g.BS;
  const float* pr[MAXN];
  int last[MAXN], common = t.nblk;
  for (int i = 0; i < t.n; ++i) {
    pr[i] = S + (int64_t)i * stride;
    last[i] = (t.pos0 + (t.rh0 + i) / g.G) / g.BS + 1;
    common = std::min(common, last[i]);
  }
  vf acc[MAXN];
  for (int i = 0; i < t.n; ++i) acc[i] = splat(0.0f);
  pv_n<BF16, MAXN>(g, pr, vc, bt, t.kvh, dc, 0, common, acc, t.n);
  for (int i = 0; i < t.n; ++i) {  // each row's own last blocks, one row at a time
    if (last[i] > common) pv<BF16, 1>(g, pr + i, vc, bt, t.kvh, dc, common, last[i], acc + i);
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    int64_t o = ((int64_t)row * g.H + head) * g.D + dc * 16;
    if (BF16) { vh h = to_bf16v(acc[i]); std::memcpy((uint16_t*)out + o, &h, 32); }
    else std::memcpy((float*)out + o, &acc[i], 64);
  }
}

// Every block a sequence reads must exist: a bad table would read outside the cache.
static bool valid(const Geo& g, const int32_t* bt, int64_t bts, const int32_t* qs,
                  const int32_t* sl, int B) {
  for (int s = 0; s < B; ++s) {
    int ql = qs[s + 1] - qs[s], nblk = (sl[s] + g.BS - 1) / g.BS;
    if (ql < 1 || ql > sl[s] || nblk > bts) return false;
    for (int b = 0; b < nblk; ++b)
      if (bt[s * bts + b] < 0 || bt[s * bts + b] >= g.NB) return false;
  }
  return true;
}

template <bool BF16>
static int run(const Geo& g, const void* q, void* out, const uint32_t* kc, const uint32_t* vc,
                const int32_t* bt, int64_t bts, const int32_t* qs, const int32_t* sl, int B,
                int T, float scale, int64_t wave, int nt) {
  if (!valid(g, bt, bts, qs, sl, B)) return 2;
  const int W = g.D / g.P, ndc = g.D / 16, per = std::max(1, std::min(MAXN, 24 / ndc));
  std::vector<uint32_t> qw((size_t)T * g.H * W);
  #pragma omp parallel for schedule(static) num_threads(nt) if (T > 64)
  for (int64_t i = 0; i < (int64_t)T * g.H; ++i) {
    for (int d = 0; d < g.D; ++d) {
      float x = BF16 ? from_bf16(((const uint16_t*)q)[i * g.D + d]) : ((const float*)q)[i * g.D + d];
      x = x * scale;
      if (BF16) ((uint16_t*)qw.data())[i * g.D + d] = to_bf16(x);
      else std::memcpy((float*)qw.data() + i * g.D + d, &x, 4);
    }
  }
  std::vector<Tile> tiles;
  for (int s = 0; s < B; ++s) {
    int ql = qs[s + 1] - qs[s], pos0 = sl[s] - ql;
    for (int h = 0; h < g.HKV; ++h)
      for (int rh = 0; rh < ql * g.G; rh += per) {
        int n = std::min(per, ql * g.G - rh), lastpos = pos0 + (rh + n - 1) / g.G;
        tiles.push_back({s, h, rh, n, lastpos / g.BS + 1, 0, qs[s], pos0});
      }
  }
  static thread_local std::vector<float> S;  // grown, never shrunk: no page faults per call
  size_t w0 = 0;
  while (w0 < tiles.size()) {  // waves of tiles whose scores fit in `wave` floats
    size_t w1 = w0; int64_t used = 0;
    while (w1 < tiles.size() && (w1 == w0 || used + (int64_t)tiles[w1].n * tiles[w1].nblk * g.BS <= wave)) {
      tiles[w1].scratch = used; used += (int64_t)tiles[w1].n * tiles[w1].nblk * g.BS; ++w1;
    }
    if ((int64_t)S.size() < used) S.resize(used);
    float* const Sp = S.data();  // not S inside the region: each thread has its own thread_local
    std::vector<std::pair<int, int>> tasks;  // (tile, first block) score tasks
    for (size_t i = w0; i < w1; ++i)
      for (int b = 0; b < tiles[i].nblk; b += KCHUNK) tasks.push_back({(int)i, b});
    #pragma omp parallel num_threads(nt)
    {
      #pragma omp for schedule(dynamic, 1)
      for (size_t k = 0; k < tasks.size(); ++k) {
        const Tile& t = tiles[tasks[k].first];
        int b0 = tasks[k].second, b1 = std::min(t.nblk, b0 + KCHUNK);
        scores_n<BF16, MAXN>(g, qw.data(), kc, bt + t.seq * bts, t, b0, b1, Sp + t.scratch, t.n);
      }
      #pragma omp for schedule(dynamic, 1)
      for (size_t i = w0; i < w1; ++i) {
        const Tile& t = tiles[i];
        for (int j = 0; j < t.n; ++j) {
          int pos = t.pos0 + (t.rh0 + j) / g.G;
          softmax_row<BF16>(Sp + t.scratch + (int64_t)j * t.nblk * g.BS, pos, pos / g.BS + 1, g.BS);
        }
      }
      #pragma omp for schedule(dynamic, 1)
      for (int64_t k = 0; k < (int64_t)(w1 - w0) * ndc; ++k) {
        const Tile& t = tiles[w0 + k / ndc];
        finish<BF16>(g, t, bt + t.seq * bts, vc, Sp + t.scratch, (int)(k % ndc), out);
      }
    }
    w0 = w1;
  }
  return 0;
}

extern "C" {

int pagoda_attention(int bf16, const void* q, void* out, const void* kc, const void* vc,
                     const int32_t* bt, int64_t bts, const int32_t* qs, const int32_t* sl, int B,
                     int T, int H, int HKV, int D, int NB, int BS, float scale, int64_t wave,
                     int nt) {
  if (D % 16 || BS % 16 || H % HKV) return 1;
  Geo g{H, HKV, D, NB, BS, bf16 ? 2 : 1, H / HKV};
  const uint32_t *k = (const uint32_t*)kc, *v = (const uint32_t*)vc;
  nt = std::max(1, nt);
  if (bf16) return run<true>(g, q, out, k, v, bt, bts, qs, sl, B, T, scale, wave, nt);
  return run<false>(g, q, out, k, v, bt, bts, qs, sl, B, T, scale, wave, nt);
}

// Store token t's k/v at slot[t] (skipped when negative) in the packed layout.
int pagoda_write_kv(int bf16, const void* k, const void* v, void* kc, void* vc,
                    const int64_t* slots, int T, int HKV, int D, int NB, int BS, int nt) {
  const int P = bf16 ? 2 : 1, E = bf16 ? 2 : 4;
  #pragma omp parallel for schedule(static) num_threads(std::max(1, nt)) if (T > 64)
  for (int t = 0; t < T; ++t) {
    int64_t s = slots[t];
    if (s < 0 || s >= (int64_t)NB * BS) continue;
    int64_t b = s / BS, o = s % BS;
    for (int h = 0; h < HKV; ++h) {
      int64_t blk = ((int64_t)h * NB + b) * BS * D;
      for (int d = 0; d < D; ++d) {
        int64_t src = ((int64_t)t * HKV + h) * D + d;
        int64_t ko = blk + ((d / P) * BS + o) * P + d % P;
        int64_t vo = blk + ((o / P) * D + d) * P + o % P;
        std::memcpy((char*)kc + ko * E, (const char*)k + src * E, E);
        std::memcpy((char*)vc + vo * E, (const char*)v + src * E, E);
      }
    }
  }
  return 0;
}

}
"""
