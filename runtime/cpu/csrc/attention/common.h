// What every part of the attention kernel uses: the 16-lane vector types and their helpers, the
// register budget, and the call's geometry (`Geo`) and work unit (`Tile`).
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif
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

// P: q and p words (q8: float); W: the sliding window (keys a query sees, itself included), 0: none;
// C: chunked attention's chunk (the query at p sees the keys p - p % C .. p: Llama 4), 0: none
// alibi: ALiBi's slope per head (nullptr: none), added as slope * (key - pos) to the scores
struct Geo { int H, HKV, D, NB, BS, P, G; bool amx, q8; int W, C; const float* alibi = nullptr; };
struct Tile {  // row-heads rh = r * G + j of one sequence and kv head; rows r0.. of that sequence
  int seq, kvh, rh0, n, nblk;   // first flattened row-head, count, blocks the tile reads
  int64_t scratch;              // offset of its [n][nblk * BS] scores (from key 0)
  int t0, pos0;                 // step row and context position of row 0 of the sequence
  int blo;                      // first block any of its rows sees (0 without a window or chunk)
};
// The first key the query at `pos` sees: the later of its window's start and its chunk's, or 0.
// Monotone in `pos`, so a tile's first row bounds the blocks any of its rows reads.
static inline int first_key(const Geo& g, int pos) {
  const int lo = g.W ? std::max(0, pos - g.W + 1) : 0;
  return g.C ? std::max(lo, pos - pos % g.C) : lo;
}
