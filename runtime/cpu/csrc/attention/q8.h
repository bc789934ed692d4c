// int8 K/V loops of the CPU attention kernel.
//
// `--kv-cache-dtype int8` halves the bytes a decode step reads per cached token (llama.cpp's
// `q8_0` K/V cache does the same): every token's K and V of one KV head are stored as `D` int8
// values and one float32 scale (`absmax / 127`, round to nearest even), so a head's token costs
// `D + 4` bytes instead of `2 D`.
//
// Layout per KV head and block (`BS` keys): K `[D/4 words][BS keys][4 dims]` (a 64-byte load
// is 4 dims of 16 keys: score lanes are keys, as on the other paths), then the `BS` float32
// scales; V `[BS/4 words][D dims][4 keys]` (a load is 16 dims of 4 keys: output lanes are
// dims), then its `BS` scales.
//
// Arithmetic: integer dot products of bytes (AVX-512 VNNI `vpdpbusd`; plain vector code with the
// same exact sums elsewhere), so the int8 values are never widened one by one. Scores: q is held
// as two int8 planes (`q ~ step * (254 hi + lo)`, ~15 bits; one plane doubled the error the
// cache adds), K's bytes are read as unsigned (`k + 128`) and the offset is taken out with
// `sum(q)`; then `k_scale * step` in float32. `p @ V`: after the float32 softmax, each key's
// `p * v_scale` is rounded to 8 bits per 16 keys (of the group's largest; `quantize_p_row`,
// once per row), exact integer sums per group, then one float32 multiply-add per group, groups in
// key order.
//
// These loops run on every CPU with or without AMX and keep the invariance of the other paths:
// each accumulator belongs to one (row, head, 16 keys or 16 dims) and sees the same operations in
// the same order whatever shares its tile, step or batch.
#pragma once
#include "common.h"
#include "avx2.h"
// acc + the sum of 4 byte products per 32-bit lane, a unsigned, b signed (AVX-512 VNNI's
// vpdpbusd; elsewhere the same exact integer sums in plain vector code; AVX2 + FMA builds use
// q8_avx2.h instead).
static inline vi dpbusd(vi acc, vu a, vu b) {
#if defined(__AVX512VNNI__)
  return (vi)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
#else
  for (int i = 0; i < 4; ++i) acc += (vi)((a >> (8 * i)) & 0xFFu) * ((vi)(b << (24 - 8 * i)) >> 24);
  return acc;
#endif
}
typedef uint8_t vb16 __attribute__((vector_size(16)));
static const int Q8_AHEAD = 3;  // V blocks fetched ahead (1 KiB each at D = 64, BS = 16)
static inline vf round_even(vf x) { return (x + 12582912.0f) - 12582912.0f; }  // |x| < 2^22
static inline int64_t q8_block_words(const Geo& g) { return (int64_t)g.BS * g.D / 4 + g.BS; }
static inline int q8_q_words(const Geo& g) { return g.D / 2 + 2; }  // hi, lo, step, bias

// The K words of U 16-key chunks from j into kp; the next group's chunks and scales are fetched
// in one burst.
template <int U, typename Blk>
static inline __attribute__((always_inline)) void k_chunks(const Geo& g, Blk blk, int j, int j1,
                                                          const uint32_t** kp) {
  const int W = g.D / 4, cpb = g.BS / 16;
  PAGODA_UNROLL
  for (int u = 0; u < U; ++u) kp[u] = blk(j + u) + ((j + u) % cpb) * 16;
  for (int u = 0; u < U; ++u) {
    const int f = std::min(j + U + u, j1 - 1);
    const uint32_t* nx = blk(f) + (f % cpb) * 16;
    for (int w = 0; w < W; ++w) __builtin_prefetch(nx + (int64_t)w * g.BS);
    __builtin_prefetch(blk(f) + (int64_t)W * g.BS + (f % cpb) * 16);
  }
}

// Scores of 16-key chunks [j0, j1), U at a time. q is two int8 planes, q ~ step * (254 hi + lo)
// (`quantize_q_row`: ~15 bits, so rounding q costs far less than rounding K): the dot products
// with hi, times 254, then those with lo, in one int32 accumulator. K bytes are read as unsigned
// (k + 128, an xor of the sign bit): score = k_scale * step * (dot - bias), bias = 128 sum(q).
template <int N, int U>
static void scores_q8(const Geo& g, const uint32_t* const* q, const uint32_t* kc, const int32_t* bt,
                      int kvh, int stride, int j0, int j1, float* S) {
  const int W = g.D / 4, cpb = g.BS / 16;
  const int64_t bw = q8_block_words(g);
  const uint32_t* base = kc + (int64_t)kvh * g.NB * bw;
  auto blk = [&](int j) { return base + (int64_t)bt[j / cpb] * bw; };
  const vu flip = splatu(0x80808080u);
  alignas(64) uint32_t ql[N][256];  // the rows' q words side by side (D <= 512): one base register
  for (int i = 0; i < N; ++i) std::memcpy(ql[i], q[i], 2 * W * 4);
  for (int j = j0; j + U <= j1; j += U) {
    const uint32_t* kp[U];
    k_chunks<U>(g, blk, j, j1, kp);
    vi acc[N][U];
    PAGODA_UNROLL
    for (int i = 0; i < N; ++i)
      PAGODA_UNROLL
      for (int u = 0; u < U; ++u) acc[i][u] = (vi)splatu(0);
    for (int plane = 0; plane < 2; ++plane) {
      if (plane) {
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i)
          PAGODA_UNROLL
          for (int u = 0; u < U; ++u) acc[i][u] *= 254;
      }
      for (int w = 0; w < W; ++w) {
        vu kv[U];
        PAGODA_UNROLL
        for (int u = 0; u < U; ++u) kv[u] = ldu(kp[u] + (int64_t)w * g.BS) ^ flip;
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i) {
          const vu qv = splatu(ql[i][plane * W + w]);
          PAGODA_UNROLL
          for (int u = 0; u < U; ++u) acc[i][u] = dpbusd(acc[i][u], kv[u], qv);
        }
      }
    }
    PAGODA_UNROLL
    for (int u = 0; u < U; ++u) {
      const vf sc = ld((const float*)(blk(j + u) + (int64_t)W * g.BS) + ((j + u) % cpb) * 16);
      PAGODA_UNROLL
      for (int i = 0; i < N; ++i) {
        float qs; std::memcpy(&qs, q[i] + 2 * W, 4);
        const int32_t bias = (int32_t)q[i][2 * W + 1];
        const vf s = __builtin_convertvector(acc[i][u] - bias, vf) * (sc * qs);
        std::memcpy(S + (int64_t)i * stride + (j + u) * 16, &s, 64);
      }
    }
  }
}

// A row's p (float, its first `nb` blocks) times each key's V scale, as unsigned bytes of
// each 16-key group's maximum / 255 (four keys a word, the order of V's words), written over the
// row's scratch: bytes at its start, the groups' steps (floats) from byte `width` (the tile's
// keys per row). Once per row; `pv_q8` reads them for every slice of output dims.
static void quantize_p_row(const Geo& g, float* s, int c0, int nb, int width, const int32_t* bt,
                           const uint32_t* vc, int kvh) {
  static thread_local std::vector<float> steps;
  if ((int)steps.size() < width / 16 + 16) steps.resize(width / 16 + 16);
  const int64_t bw = q8_block_words(g);
  const uint32_t* base = vc + (int64_t)kvh * g.NB * bw;
  uint8_t* bytes = (uint8_t*)s;
  const int nk = nb * g.BS;
  for (int k0 = c0; k0 < nk; k0 += 256) {  // 16 groups: their divisions in one vector each
    const int k1 = std::min(nk, k0 + 256);
    alignas(64) float mx[16] = {};
    for (int k = k0; k < k1; k += 16) {  // p * v_scale in place, and each group's maximum
      const int ahead = std::min(nb - 1, k / g.BS + 8);  // scales are one line a block: fetch ahead
      __builtin_prefetch(base + (int64_t)bt[ahead] * bw + (int64_t)g.BS / 4 * g.D);
      const float* sc = (const float*)(base + (int64_t)bt[k / g.BS] * bw + (int64_t)g.BS / 4 * g.D);
      const vf x = ld(s + k) * ld(sc + k % g.BS);
      std::memcpy(s + k, &x, 64);
#if defined(__AVX512F__)
      mx[(k - k0) / 16] = _mm512_reduce_max_ps((__m512)x);  // p >= 0
#else
      mx[(k - k0) / 16] = hmax(x);
#endif
    }
    const vf m = ld(mx);
    const vf inv = m > 0.0f ? splat(255.0f) / m : splat(0.0f);
    const vf step = m / 255.0f;
    std::memcpy(steps.data() + k0 / 16, &step, 64);
    for (int k = k0; k < k1; k += 16) {  // reads floats at 4k.., writes bytes at k..: behind
      const vf y = round_even(ld(s + k) * inv[(k - k0) / 16]);
      const vb16 r = __builtin_convertvector(__builtin_convertvector(y, vu), vb16);
      std::memcpy(bytes + k, &r, 16);
    }
  }
  std::memcpy(bytes + width, steps.data(), (size_t)nk / 16 * 4);
}

// acc[i * DU + u] += p_i @ V over blocks [b0, b1) for output dims (dc + u) * 16..: exact integer
// sums of a 16-key group, then one multiply-add by the group's step, groups in key order. p_i is
// the row's scratch as `quantize_p_row` left it (`width` keys a row).
template <int N, int DU>
static void pv_q8(const Geo& g, const float* const* pr, int width, const uint32_t* vc,
                  const int32_t* bt, int kvh, int dc, int b0, int b1, vf* acc) {
  const int KW = g.BS / 4;
  const int64_t bw = q8_block_words(g);
  const uint32_t* base = vc + (int64_t)kvh * g.NB * bw;
  for (int b = b0; b < b1; ++b) {
    const uint32_t* vb = base + (int64_t)bt[b] * bw;
    // blocks are scattered 1 KiB pieces (D = 64, BS = 16): fetch a few blocks ahead
    const uint32_t* nx = base + (int64_t)bt[std::min(b + Q8_AHEAD, b1 - 1)] * bw + dc * 16;
    for (int k0 = 0; k0 < KW; k0 += 4) {  // a group: 4 words of 4 keys
      const int grp = (b * g.BS) / 16 + k0 / 4;
      vi ia[N * DU];
      PAGODA_UNROLL
      for (int i = 0; i < N * DU; ++i) ia[i] = (vi)splatu(0);
      for (int k = k0; k < k0 + 4; ++k) {
        PAGODA_UNROLL
        for (int u = 0; u < DU; ++u) __builtin_prefetch(nx + (int64_t)k * g.D + u * 16);
        vu vv[DU];
        PAGODA_UNROLL
        for (int u = 0; u < DU; ++u) vv[u] = ldu(vb + (int64_t)k * g.D + dc * 16 + u * 16);
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i) {
          const vu pw = splatu(((const uint32_t*)pr[i])[b * KW + k]);
          PAGODA_UNROLL
          for (int u = 0; u < DU; ++u) ia[i * DU + u] = dpbusd(ia[i * DU + u], pw, vv[u]);
        }
      }
      PAGODA_UNROLL
      for (int i = 0; i < N; ++i) {
        const vf st = splat(((const float*)((const uint8_t*)pr[i] + width))[grp]);
        PAGODA_UNROLL
        for (int u = 0; u < DU; ++u)
          acc[i * DU + u] = fma(__builtin_convertvector(ia[i * DU + u], vf), st, acc[i * DU + u]);
      }
    }
  }
}

#include "q8_avx2.h"

#if defined(PAGODA_AVX2_Q8)
#define SCORES_Q8 scores_q8_avx2
#define PV_Q8 pv_q8_avx2
#define QUANTIZE_P quantize_p_row_avx2
#else
#define SCORES_Q8 scores_q8
#define PV_Q8 pv_q8
#define QUANTIZE_P quantize_p_row
#endif
template <int N>
static void scores_q8_n(const Geo& g, const uint32_t* qw, const uint32_t* kc, const int32_t* bt,
                        const Tile& t, int b0, int b1, float* S, int n) {
  if constexpr (N > 1) { if (n < N) return scores_q8_n<N - 1>(g, qw, kc, bt, t, b0, b1, S, n); }
  const int cpb = g.BS / 16, j0 = b0 * cpb, j1 = b1 * cpb;
  const uint32_t* q[N];
  for (int i = 0; i < N; ++i) {
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    q[i] = qw + ((int64_t)row * g.H + head) * q8_q_words(g);
  }
  constexpr int U = std::max(1, std::min(4, CHAINS / N));
  const int stride = t.nblk * g.BS, jm = j0 + (j1 - j0) / U * U;
  SCORES_Q8<N, U>(g, q, kc, bt, t.kvh, stride, j0, jm, S);
  if (jm < j1) SCORES_Q8<N, 1>(g, q, kc, bt, t.kvh, stride, jm, j1, S);
}

template <int N>
static void pv_q8_n(const Geo& g, const float* const* pr, int width, const uint32_t* vc,
                    const int32_t* bt, int kvh, int dc, int du, int b0, int b1, vf* acc, int n) {
  if constexpr (N > 1) { if (n < N) return pv_q8_n<N - 1>(g, pr, width, vc, bt, kvh, dc, du, b0, b1, acc, n); }
  if (du == 4) PV_Q8<N, (4 * N <= CHAINS ? 4 : 1)>(g, pr, width, vc, bt, kvh, dc, b0, b1, acc);  // dims_for
  else if (du == 2) PV_Q8<N, (2 * N <= CHAINS ? 2 : 1)>(g, pr, width, vc, bt, kvh, dc, b0, b1, acc);
  else PV_Q8<N, 1>(g, pr, width, vc, bt, kvh, dc, b0, b1, acc);
}

// D values (times `mul`) -> int8 and their scale (absmax / 127; all zeros: scale 0), 16 at a
// time (D % 16 == 0). Rounds to nearest even, as torch.round in `quantize_rows`.
static inline float absmax(const float* x, int D, float mul) {
  vf m = splat(0.0f);
  for (int d = 0; d < D; d += 16) {
    const vf a = ld(x + d) * mul;
    const vf b = a < 0.0f ? -a : a;
    m = b > m ? b : m;
  }
  return hmax(m);  // a maximum: exact in any order
}
static inline float quantize_row(const float* x, int D, int8_t* q, float mul = 1.0f) {
  const float mx = absmax(x, D, mul);
  const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  for (int d = 0; d < D; d += 16) {
    vf y = (ld(x + d) * mul) * inv;
    y = y > 127.0f ? splat(127.0f) : y;
    y = y < -127.0f ? splat(-127.0f) : y;
    const vb16 r = (vb16)__builtin_convertvector(__builtin_convertvector(round_even(y), vi), vb16);
    std::memcpy(q + d, &r, 16);
  }
  return mx / 127.0f;
}

// Tokens [t0, t1) of float32 k/v [T, HKV, D] into the int8 caches at their slots.
static void write_rows_q8(const float* k, const float* v, uint8_t* kc, uint8_t* vc,
                          const int64_t* slots, int t0, int t1, int HKV, int D, int NB, int BS) {
  const int64_t bb = (int64_t)BS * (D + 4);  // bytes per block of one head
  int8_t kq[512], vq[512];  // D <= 512
  for (int t = t0; t < t1; ++t) {
    const int64_t s = slots[t];
    if (s < 0 || s >= (int64_t)NB * BS) continue;
    const int64_t b = s / BS, o = s % BS;
    for (int h = 0; h < HKV; ++h) {
      const int64_t src = ((int64_t)t * HKV + h) * D;
      const float ks = quantize_row(k + src, D, kq), vs = quantize_row(v + src, D, vq);
      uint8_t* kd = kc + ((int64_t)h * NB + b) * bb;
      uint8_t* vd = vc + ((int64_t)h * NB + b) * bb;
      for (int d = 0; d < D; ++d) kd[(int64_t)(d / 4) * BS * 4 + o * 4 + d % 4] = (uint8_t)kq[d];
      for (int d = 0; d < D; ++d) vd[(o / 4) * D * 4 + (int64_t)d * 4 + o % 4] = (uint8_t)vq[d];
      std::memcpy(kd + (int64_t)BS * D + o * 4, &ks, 4);
      std::memcpy(vd + (int64_t)BS * D + o * 4, &vs, 4);
    }
  }
}
// One row-head of q (float32, times `scale`) as two int8 planes: hi = round(q / step1) as K's
// values are rounded (step1 = absmax / 127), lo = round(254 * the remainder); written as hi
// words, lo words, step1 / 254 and the bias 128 * (254 sum(hi) + sum(lo)) of unsigned K bytes.
static void quantize_q_row(const float* q, int D, float scale, uint32_t* out) {
  const float mx = absmax(q, D, scale);
  const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  vi sum = (vi)splatu(0);
  for (int d = 0; d < D; d += 16) {
    vf y = (ld(q + d) * scale) * inv;
    y = y > 127.0f ? splat(127.0f) : y;
    y = y < -127.0f ? splat(-127.0f) : y;
    const vf hi = round_even(y), lo = round_even((y - hi) * 254.0f);
    const vi h = __builtin_convertvector(hi, vi), l = __builtin_convertvector(lo, vi);
    sum += h * 254 + l;
    const vb16 hb = (vb16)__builtin_convertvector(h, vb16), lb = (vb16)__builtin_convertvector(l, vb16);
    std::memcpy((uint8_t*)out + d, &hb, 16);
    std::memcpy((uint8_t*)out + D + d, &lb, 16);
  }
  int32_t total = 0;
  for (int i = 0; i < 16; ++i) total += sum[i];
  const float step = mx / 127.0f / 254.0f;
  const int32_t bias = 128 * total;
  std::memcpy(out + D / 2, &step, 4);
  std::memcpy(out + D / 2 + 1, &bias, 4);
}
static void quantize_q_rows(const float* q, uint32_t* qw, int64_t r0, int64_t r1, int D, float scale) {
  for (int64_t r = r0; r < r1; ++r) quantize_q_row(q + r * D, D, scale, qw + r * (D / 2 + 2));
}
struct QJob { const float* q; uint32_t* qw; int64_t rows; int D; float scale; int64_t next; };
static void q_job(void* ctx) {
  QJob& j = *(QJob*)ctx;
  for (int64_t r0, r1; (r0 = claim(&j.next, 256, j.rows, &r1)) < j.rows;)
    quantize_q_rows(j.q, j.qw, r0, r1, j.D, j.scale);
}
static void quantize_q(const float* q, uint32_t* qw, int64_t rows, int D, float scale, int nt) {
  QJob j{q, qw, rows, D, scale, 0};
  pool_run(q_job, &j, rows > 1024 ? nt : 1);
}

struct KvJobQ8 { const float *k, *v; uint8_t *kc, *vc; const int64_t* slots; int T, HKV, D, NB, BS; int64_t next; };
static void kv_job_q8(void* ctx) {
  KvJobQ8& j = *(KvJobQ8*)ctx;
  for (int64_t t0, t1; (t0 = claim(&j.next, 16, j.T, &t1)) < j.T;)
    write_rows_q8(j.k, j.v, j.kc, j.vc, j.slots, (int)t0, (int)t1, j.HKV, j.D, j.NB, j.BS);
}
