"""C++ source of the CPU paged-attention kernel (built and loaded by ``cpu_kernel.py``).

It lives in a Python string so that it ships inside the wheel with no package-data set-up.

Layout (per layer, ``P`` = 2 bf16 values or 1 float32 per 32-bit word, ``NB`` blocks of ``BS``):
K ``[Hkv, NB, D/P, BS, P]`` (a 64-byte load is 16 keys' words: score lanes are keys) and
V ``[Hkv, NB, BS/P, D, P]`` (a load is 16 dims of P consecutive keys: output lanes are dims).

Work: a *tile* is up to 12 (AVX-512) or 16 (AMX) row-heads of one sequence and KV head. Its
scores go to a scratch row per row-head, the softmax runs per row, then ``p @ V``. A step whose
tiles are short, or numerous enough to keep every thread busy, runs each tile as one task;
otherwise, in waves bounded by ``wave`` floats of scores, score tasks of ``KCHUNK`` blocks, then the softmax, then ``p @ V`` by output-dim chunks. The inner loops are in
``cpu_kernel_avx`` (AVX-512, float32 caches, CPUs without AMX) and ``cpu_kernel_amx`` (bf16 on
CPUs with AMX); a process uses one of them for every row. int8 caches (``--kv-cache-dtype int8``)
have their own loops and layout, in ``cpu_kernel_q8``.

Threads: ``native.POOL_C`` (no OpenMP). Tasks are claimed one at a time; between the phases of a
split wave a thread waits only until the tasks already claimed are done, never for every thread
to arrive (with OMP_WAIT_POLICY=PASSIVE an OpenMP barrier costs a scheduler slice, ~8 ms, when
another process holds a core).

Invariance: every (query row, head) pair owns its accumulators, and each is updated by the same
sequence of operations whatever else is in its tile, task, wave or batch: scores by 16-key chunks
at absolute positions (d in order), a max and a sum over the row's own blocks, ``p @ V`` over the
row's own blocks in key order. Tiles and groups of chunks only share the loads. Built with
``-ffp-contract=off`` so that the compiler cannot fuse some multiply-adds and not others (the
fused ones are written out: ``fma``).
"""

from pagoda.runtime.attention.cpu_kernel_amx import AMX_SOURCE
from pagoda.runtime.attention.cpu_kernel_avx import AVX_SOURCE
from pagoda.runtime.attention.cpu_kernel_avx2 import AVX2_SOURCE
from pagoda.runtime.attention.cpu_kernel_q8 import Q8_SOURCE
from pagoda.runtime.attention.cpu_kernel_waves import WAVES_SOURCE
from pagoda.runtime.native import CLAIM_C, POOL_C

# This library's own pool (POOL_C is static in each library): its helpers spin 20 us after a
# job, not 200. Attention runs once a layer, ~1 ms apart in a decode step: a longer spin finds no
# next call and only takes a core from the matmul pool's helper and the caller.
ATTENTION_POOL_C = "#define POOL_SPIN_NS 20000L\n" + POOL_C

SOURCE = (
    r"""
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>
#include <cmath>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif
"""
    + CLAIM_C
    + ATTENTION_POOL_C
    + r"""

typedef float vf __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

// 16-float accumulator chains a loop keeps in registers: AVX-512 has 32 of them; with AVX2 a
// vector is two of the 16 ymm registers, and 12 chains would spill to the stack on every step.
#if defined(__AVX512F__)
static const int CHAINS = 12;
#else
static const int CHAINS = 6;
#endif
static const int MAXN = CHAINS;        // row-heads per vector tile (accumulators in registers)
// Register loops: GCC leaves some rolled, and then keeps their accumulator arrays in memory.
#define PAGODA_UNROLL _Pragma("GCC unroll 16")
static const int AMXN = 16;            // row-heads per AMX tile (rows of a tile register)
static const int KCHUNK = 32;          // blocks per score task
static const int SERIAL = 96;          // tile-blocks (~20 us) under which one thread runs a call

static inline vf ld(const void* p) { vf v; std::memcpy(&v, p, 64); return v; }
static inline vu ldu(const void* p) { vu v; std::memcpy(&v, p, 64); return v; }
static inline vf splat(float x) { vf v = {}; return v + x; }
static inline vu splatu(uint32_t x) { vu v = {}; return v + x; }

// a * b + c, fused where the CPU has it (-ffp-contract=off: the compiler never fuses on its own;
// AVX2 + FMA: two 8-float halves).
static inline vf fma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  __m256 x[2], y[2], z[2];
  std::memcpy(x, &a, 64); std::memcpy(y, &b, 64); std::memcpy(z, &c, 64);
  z[0] = _mm256_fmadd_ps(x[0], y[0], z[0]);
  z[1] = _mm256_fmadd_ps(x[1], y[1], z[1]);
  std::memcpy(&c, z, 64);
  return c;
#else
  return a * b + c;
#endif
}

// acc + a . b over word pairs: bf16 pairs (P = 2) or single floats (P = 1).
template <bool BF16> static inline vf dp(vf acc, vu a, vu b);
template <> inline vf dp<true>(vf acc, vu a, vu b) {
#if defined(__AVX512BF16__)
  return (vf)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
#else
  vf alo = (vf)(a << 16), ahi = (vf)(a & 0xFFFF0000u);
  vf blo = (vf)(b << 16), bhi = (vf)(b & 0xFFFF0000u);
  return fma(alo, blo, fma(ahi, bhi, acc));
#endif
}
template <> inline vf dp<false>(vf acc, vu a, vu b) { return fma((vf)a, (vf)b, acc); }

// float -> bf16, round to nearest even (one instruction with AVX-512 BF16, which also flushes
// denormals to zero: below 1e-38, far under anything attention weights or outputs resolve).
static inline vh to_bf16v(vf f) {
#if defined(__AVX512BF16__)
  return (vh)_mm512_cvtneps_pbh((__m512)f);
#else
  vu u = (vu)f;
  return __builtin_convertvector((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16, vh);
#endif
}


// exp for x <= 0 (Cephes expf polynomial, ~1 ulp); x below -87 gives ~0 (never a denormal:
// those are slow). AVX-512 rounds and scales by 2^n in one instruction each.
static inline vf vexp(vf x) {
  x = x < -87.0f ? splat(-87.0f) : x;
#if defined(__AVX512F__)
  vf n = (vf)_mm512_roundscale_ps((__m512)(x * 1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
#endif
  vf r = fma(n, splat(2.12194440e-4f), fma(n, splat(-0.693359375f), x));
  vf p = splat(1.9875691500E-4f);
  for (float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
    p = fma(p, r, splat(c));
  vf e = fma(p, r * r, r) + 1.0f;
#if defined(__AVX512F__)
  return (vf)_mm512_scalef_ps((__m512)e, (__m512)n);
#else
  vi k = (__builtin_convertvector(n, vi) + 127) << 23;
  return e * (vf)k;
#endif
}
static inline float hmax(vf v) { float m = v[0]; for (int i = 1; i < 16; ++i) m = v[i] > m ? v[i] : m; return m; }
static inline float hsum(vf v) {  // a fixed tree
  for (int w = 8; w >= 1; w >>= 1) for (int i = 0; i < w; ++i) v[i] = v[i] + v[i + w];
  return v[0];
}

struct Geo { int H, HKV, D, NB, BS, P, G; bool amx, q8; };  // P: q and p words (q8: float)
struct Tile {  // row-heads rh = r * G + j of one sequence and kv head; rows r0.. of that sequence
  int seq, kvh, rh0, n, nblk;   // first flattened row-head, count, blocks the tile reads
  int64_t scratch;              // offset of its [n][nblk * BS] scores
  int t0, pos0;                 // step row and context position of row 0 of the sequence
};
"""
    + AVX2_SOURCE
    + AVX_SOURCE
    + AMX_SOURCE
    + Q8_SOURCE
    + r"""

// Row-head's softmax over its keys [0, pos]; p (bf16 or float) written in place at the start.
template <bool BF16>
static void softmax_row(float* s, int pos, int nblk_row, int BS) {
#if defined(PAGODA_AVX2_F32)
  if constexpr (!BF16) return softmax_row_f32(s, pos, nblk_row, BS);
#endif
  const int nk = nblk_row * BS;
  vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  vf m0 = splat(-3.0e38f), m1 = m0;  // two chains: a maximum is exact in any order
  const int full = std::min(nk, pos + 1) & ~31;  // 32-key steps with every key allowed
  for (int c = 0; c < full; c += 32) {
    vf x0 = ld(s + c), x1 = ld(s + c + 16);
    m0 = x0 > m0 ? x0 : m0;
    m1 = x1 > m1 ? x1 : m1;
  }
  for (int c = full; c < nk; c += 16) {
    vf x = ld(s + c);
    x = (lane + c) <= pos ? x : splat(-3.0e38f);
    m0 = x > m0 ? x : m0;
  }
  m0 = m1 > m0 ? m1 : m0;
  const float mx = hmax(m0);
  vf l = splat(0.0f);
  for (int c = 0; c < nk; c += 16) {
    vf e = vexp(ld(s + c) - mx);
    if (c + 15 > pos) e = (lane + c) <= pos ? e : splat(0.0f);
    l = l + e;
    std::memcpy(s + c, &e, 64);
  }
  const float inv = 1.0f / hsum(l);  // a multiply per 16 keys, not a division
  for (int c = 0; c < nk; c += 16) {
    vf p = ld(s + c) * inv;
    if (BF16) { vh h = to_bf16v(p); std::memcpy((uint16_t*)s + c, &h, 32); }
    else std::memcpy(s + c, &p, 64);
  }
}

static inline int dims_at(const Geo& g, int n, int dc) {
  return g.amx ? std::min(4, g.D / 16 - dc) : dims_for(n, g.D / 16);
}

// Output dims [dc * 16, (dc + du) * 16) of a tile whose p rows are in S.
template <bool BF16>
static void finish(const Geo& g, const Tile& t, const int32_t* bt, const uint32_t* vc,
                   const float* S, int dc, int du, void* out) {
  if (BF16 && g.amx) return amx_finish(g, t, bt, vc, S, dc, du, out);
  const int stride = t.nblk * g.BS;
  const float* pr[MAXN];
  int last[MAXN], common = t.nblk;
  for (int i = 0; i < t.n; ++i) {
    pr[i] = S + (int64_t)i * stride;
    last[i] = (t.pos0 + (t.rh0 + i) / g.G) / g.BS + 1;
    common = std::min(common, last[i]);
  }
  vf acc[MAXN * 4];
  for (int i = 0; i < t.n * du; ++i) acc[i] = splat(0.0f);
  if (g.q8) pv_q8_n<MAXN>(g, pr, stride, vc, bt, t.kvh, dc, du, 0, common, acc, t.n);
  else pv_n<BF16, MAXN>(g, pr, vc, bt, t.kvh, dc, du, 0, common, acc, t.n);
  for (int i = 0; i < t.n; ++i) {  // each row's own last blocks, one row at a time
    if (last[i] > common && g.q8) pv_q8_n<1>(g, pr + i, stride, vc, bt, t.kvh, dc, du, common, last[i], acc + i * du, 1);
    else if (last[i] > common) pv_n<BF16, 1>(g, pr + i, vc, bt, t.kvh, dc, du, common, last[i], acc + i * du, 1);
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    for (int u = 0; u < du; ++u) {
      int64_t o = ((int64_t)row * g.H + head) * g.D + (dc + u) * 16;
      if (BF16) { vh h = to_bf16v(acc[i * du + u]); std::memcpy((uint16_t*)out + o, &h, 32); }
      else std::memcpy((float*)out + o, &acc[i * du + u], 64);
    }
  }
}

// AMX multiplies p by V over all the tile's blocks: p = 0 past each row's own blocks. int8
// caches: p then becomes the 8-bit p * v_scale that `pv_q8` reads (`quantize_p_row`).
template <bool BF16>
static void softmax_tile(const Geo& g, const Tile& t, float* S, const int32_t* bt,
                         const uint32_t* vc) {
  for (int j = 0; j < t.n; ++j) {
    int pos = t.pos0 + (t.rh0 + j) / g.G, nb = pos / g.BS + 1;
    float* s = S + (int64_t)j * t.nblk * g.BS;
    softmax_row<BF16>(s, pos, nb, g.BS);
    if (g.q8) QUANTIZE_P(g, s, nb, t.nblk * g.BS, bt, vc, t.kvh);
    if (g.amx && nb < t.nblk) std::memset((uint16_t*)s + nb * g.BS, 0, (t.nblk - nb) * g.BS * 2);
  }
}

template <bool BF16>
static void tile_scores(const Geo& g, const uint32_t* qw, const uint32_t* kc, const int32_t* bt,
                        const Tile& t, int b0, int b1, float* S) {
  if (BF16 && g.amx) return amx_scores(g, qw, kc, bt, t, b0 * g.BS / 16, b1 * g.BS / 16, S);
  if (g.q8) return scores_q8_n<MAXN>(g, qw, kc, bt, t, b0, b1, S, t.n);
  scores_n<BF16, MAXN>(g, qw, kc, bt, t, b0, b1, S, t.n);
}

// A whole tile in one task (scores in this thread's scratch): no barrier between the phases.
template <bool BF16>
static void whole_tile(const Geo& g, const uint32_t* qw, const uint32_t* kc, const uint32_t* vc,
                       const int32_t* bt, const Tile& t, void* out) {
  static thread_local std::vector<float> buf;
  const size_t need = (size_t)t.n * t.nblk * g.BS;
  if (buf.size() < need) buf.resize(need);
  tile_scores<BF16>(g, qw, kc, bt, t, 0, t.nblk, buf.data());
  softmax_tile<BF16>(g, t, buf.data(), bt, vc);
  for (int dc = 0, du; dc < g.D / 16; dc += du) {
    du = dims_at(g, t.n, dc);
    finish<BF16>(g, t, bt, vc, buf.data(), dc, du, out);
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

"""
    + WAVES_SOURCE
    + r"""
// K element d of the token in slot o goes to word d / P, key o; V element d to key-word o / P,
// dim d (P values of consecutive dims, or keys, share a word). Typed copies: no memcpy calls.
template <typename E, int P>
static void write_rows(const E* k, const E* v, E* kc, E* vc, const int64_t* slots, int t0, int t1,
                       int HKV, int D, int NB, int BS) {
  for (int t = t0; t < t1; ++t) {
    const int64_t s = slots[t];
    if (s < 0 || s >= (int64_t)NB * BS) continue;
    const int64_t b = s / BS, o = s % BS;
    for (int h = 0; h < HKV; ++h) {
      const int64_t blk = ((int64_t)h * NB + b) * BS * D, src = ((int64_t)t * HKV + h) * D;
      E* kd = kc + blk + o * P;
      E* vd = vc + blk + (o / P) * D * P + o % P;
      for (int d = 0; d < D; d += P)
        for (int i = 0; i < P; ++i) kd[(int64_t)(d / P) * BS * P + i] = k[src + d + i];
      for (int d = 0; d < D; ++d) vd[(int64_t)d * P] = v[src + d];
    }
  }
}
template <typename E>
struct KvJob { const E *k, *v; E *kc, *vc; const int64_t* slots; int T, HKV, D, NB, BS; int64_t next; };
template <typename E, int P>
static void kv_job(void* ctx) {
  KvJob<E>& j = *(KvJob<E>*)ctx;
  for (int64_t t0, t1; (t0 = claim(&j.next, 16, j.T, &t1)) < j.T;)
    write_rows<E, P>(j.k, j.v, j.kc, j.vc, j.slots, (int)t0, (int)t1, j.HKV, j.D, j.NB, j.BS);
}
template <typename E, int P>
static void write_kv(const E* k, const E* v, E* kc, E* vc, const int64_t* slots, int T, int HKV,
                     int D, int NB, int BS, int nt) {
  KvJob<E> j{k, v, kc, vc, slots, T, HKV, D, NB, BS, 0};
  pool_run(kv_job<E, P>, &j, T > 64 ? std::max(1, nt) : 1);
}

// AMX when built for it and granted, unless PAGODA_CPU_AMX=0 (read once: one path per process).
static bool use_amx() {
  static const bool on = amx_granted() && !(std::getenv("PAGODA_CPU_AMX") && std::string(std::getenv("PAGODA_CPU_AMX")) == "0");
  return on;
}

extern "C" {

// Whether bf16 rows take the AMX tile path in this process (1) or the AVX-512 loops (0).
int pagoda_uses_amx() { return use_amx() ? 1 : 0; }

// kind: 0 float32 caches, 1 bf16, 2 int8 (float32 q and out).
int pagoda_attention(int kind, const void* q, void* out, const void* kc, const void* vc,
                     const int32_t* bt, int64_t bts, const int32_t* qs, const int32_t* sl, int B,
                     int T, int H, int HKV, int D, int NB, int BS, float scale, int64_t wave,
                     int nt) {
  if (D % 16 || BS % 16 || H % HKV || kind < 0 || kind > 2) return 1;
  if (kind == 2 && D > 512) return 1;
  const bool bf16 = kind == 1;
  Geo g{H, HKV, D, NB, BS, bf16 ? 2 : 1, H / HKV, false, kind == 2};
  // AMX products: 32 dims of a score, up to 32 keys (whole blocks) of p @ V
  g.amx = bf16 && D % 32 == 0 && D <= 512 && (BS <= 32 || BS % 32 == 0) && use_amx();
  const uint32_t *k = (const uint32_t*)kc, *v = (const uint32_t*)vc;
  nt = std::max(1, nt);
  if (bf16) return run<true>(g, q, out, k, v, bt, bts, qs, sl, B, T, scale, wave, nt);
  return run<false>(g, q, out, k, v, bt, bts, qs, sl, B, T, scale, wave, nt);
}

// Store token t's k/v at slot[t] (skipped when negative) in the packed layout.
int pagoda_write_kv(int kind, const void* k, const void* v, void* kc, void* vc,
                    const int64_t* slots, int T, int HKV, int D, int NB, int BS, int nt) {
  if (kind == 2) {  // float32 k/v in, int8 + scales out
    if (D > 512 || D % 16 || BS % 16) return 1;
    KvJobQ8 j{(const float*)k, (const float*)v, (uint8_t*)kc, (uint8_t*)vc, slots, T, HKV, D, NB, BS, 0};
    pool_run(kv_job_q8, &j, T > 64 ? std::max(1, nt) : 1);
  } else if (kind == 1) write_kv<uint16_t, 2>((const uint16_t*)k, (const uint16_t*)v, (uint16_t*)kc, (uint16_t*)vc, slots, T, HKV, D, NB, BS, nt);
  else write_kv<uint32_t, 1>((const uint32_t*)k, (const uint32_t*)v, (uint32_t*)kc, (uint32_t*)vc, slots, T, HKV, D, NB, BS, nt);
  return 0;
}
}
"""
)
