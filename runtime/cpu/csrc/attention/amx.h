// AMX tile path of the CPU attention kernel.
//
// On CPUs with AMX (Sapphire Rapids and later) one `tdpbf16ps` does the work of 16 AVX-512
// `vdpbf16ps`: the scores and `p @ V` of bf16 caches run on tiles when the kernel is built for
// such a CPU and Linux grants the tile state; elsewhere (AMD Zen 4, float32 caches, head_dim not a
// multiple of 32) the AVX-512 loops run. A process uses one path for every row.
//
// The packed cache layout is already the AMX operand layout: 32 dims of a 16-key chunk of K are a
// B tile (16 rows = pairs of dims, 16 keys per row) and 16 dims of a block of V (16 or 32 keys) are
// a B tile (8 or 16 rows = pairs of keys, 16 dims per row); the A tiles are query rows (pairs of
// dims) and probability rows (pairs of keys). The scores tile is stored, the softmax runs on it as
// on the AVX-512 path, and `p @ V` keeps up to four 16-dim accumulator tiles over the blocks.
//
// Invariance: AMX computes every row of a tile on its own (the rows of A never mix), so a query
// row's result does not depend on which rows share its tile (`test_cpu_attention` checks a row
// at every place of a tile, and `test_row_invariance` whole steps). Each row sees the same
// operations whatever the tile: scores per 16-key chunk over d in fixed 32-dim steps; `p @ V`
// over the tile's blocks in order, where a row whose keys end before the tile's last block has
// p = 0 there: those steps add exact zeros (the instruction flushes denormals, so an accumulator
// is never one that a zero addend would change).
#pragma once
#include "common.h"
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define PAGODA_AMX 1

// Linux hands out the tile state only on request (once per process; false: no AMX here).
static bool amx_granted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                 18 /* XFEATURE_XTILEDATA */) == 0;
  return ok;
}

struct alignas(64) TileCfg { uint8_t palette, start; uint8_t pad[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static thread_local int amx_shape = 0;
static const int AHEAD = 2;  // chunks or blocks fetched ahead of the tile loads  // (rows, key words per p@V step) of this thread's config

// tmm0-1: C (n rows of 16 floats); tmm2: A = q (n x 32 dims); tmm3: B = K chunk (32 dims x
// 16 keys); tmm4: A = p (n x 2ks keys); tmm5: B = V (2ks keys x 16 dims); tmm6-7: more C.
static void amx_config(int n, int ks) {
  if (amx_shape == n * 64 + ks) return;
  TileCfg c = {};
  c.palette = 1;
  const int cs[8] = {64, 64, 64, 64, ks * 4, 64, 64, 64}, rs[8] = {n, n, n, 32 / 2, n, ks, n, n};
  for (int i = 0; i < 8; ++i) { c.colsb[i] = cs[i]; c.rows[i] = rs[i]; }
  asm volatile("" : : "r"(&c) : "memory");  // GCC 12 drops the stores to c otherwise
  _tile_loadconfig(&c);
  amx_shape = n * 64 + ks;
}
static void amx_done() { if (amx_shape) { _tile_release(); amx_shape = 0; } }

// Scores of chunks [j0, j1) for the tile's n rows (q rows copied to a dense A operand).
static void amx_scores(const Geo& g, const uint32_t* qw, const uint32_t* kc, const int32_t* bt,
                       const Tile& t, int j0, int j1, float* S) {
  const int W = g.D / 2, cpb = g.BS / 16;
  alignas(64) uint32_t qa[16 * 256];  // n <= 16 rows, D <= 512
  for (int i = 0; i < t.n; ++i) {
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    std::memcpy(qa + i * W, qw + ((int64_t)row * g.H + head) * W, W * 4);
  }
  amx_config(t.n, std::min(16, g.BS / 2));
  const uint32_t* base = kc + (int64_t)t.kvh * g.NB * W * g.BS;
  const int64_t stride = (int64_t)t.nblk * g.BS * 4;
  for (int j = j0; j < j1; ++j) {
    const uint32_t* kp = base + (int64_t)bt[j / cpb] * W * g.BS + (j % cpb) * 16;
    if (j + AHEAD < j1) {  // later chunks' blocks are elsewhere: fetch them now
      const int f = j + AHEAD;
      const uint32_t* nx = base + (int64_t)bt[f / cpb] * W * g.BS + (f % cpb) * 16;
      for (int w = 0; w < W; ++w) __builtin_prefetch(nx + (int64_t)w * g.BS);
    }
    _tile_zero(0);
    for (int w = 0; w < W; w += 16) {
      _tile_loadd(2, qa + w, W * 4);
      _tile_loadd(3, kp + (int64_t)w * g.BS, g.BS * 4);
      _tile_dpbf16ps(0, 2, 3);
    }
    _tile_stored(0, S + j * 16, stride);
  }
}

// acc tile += p (rows of S, bf16) @ V over blocks [blo, nblk) for output dims dc * 16..
#define PAGODA_PV_STEP(C, DC)                                                   \
  if (DC < du) { _tile_loadd(5, vb + (int64_t)k * g.D + (dc + DC) * 16, g.D * 4); \
                 _tile_dpbf16ps(C, 4, 5); }

// Output dims [dc * 16, (dc + du) * 16), du <= 4, of a tile whose p rows are in S.
static void amx_finish(const Geo& g, const Tile& t, const int32_t* bt, const uint32_t* vc,
                       const float* S, int dc, int du, void* out) {
  const int KW = g.BS / 2, ks = std::min(16, KW);
  const int64_t stride = (int64_t)t.nblk * g.BS * 4;
  amx_config(t.n, ks);
  _tile_zero(0); _tile_zero(1); _tile_zero(6); _tile_zero(7);
  const uint32_t* base = vc + (int64_t)t.kvh * g.NB * KW * g.D;
  for (int b = t.blo; b < t.nblk; ++b) {
    const uint32_t* vb = base + (int64_t)bt[b] * KW * g.D;
    if (b + AHEAD < t.nblk) {
      const uint32_t* nx = base + (int64_t)bt[b + AHEAD] * KW * g.D + dc * 16;
      for (int k = 0; k < KW; ++k) for (int u = 0; u < du; ++u) __builtin_prefetch(nx + (int64_t)k * g.D + u * 16);
    }
    for (int k = 0; k < KW; k += ks) {
      _tile_loadd(4, (const uint16_t*)S + (int64_t)b * g.BS + 2 * k, stride);
      PAGODA_PV_STEP(0, 0) PAGODA_PV_STEP(1, 1) PAGODA_PV_STEP(6, 2) PAGODA_PV_STEP(7, 3)
    }
  }
  alignas(64) float acc[4][16 * 16];
  _tile_stored(0, acc[0], 64); _tile_stored(1, acc[1], 64);
  _tile_stored(6, acc[2], 64); _tile_stored(7, acc[3], 64);
  for (int i = 0; i < t.n; ++i) {
    int rh = t.rh0 + i, row = t.t0 + rh / g.G, head = t.kvh * g.G + rh % g.G;
    for (int u = 0; u < du; ++u) {
      int64_t o = ((int64_t)row * g.H + head) * g.D + (dc + u) * 16;
      vh h = to_bf16v(ld(acc[u] + i * 16));
      std::memcpy((uint16_t*)out + o, &h, 32);
    }
  }
}
#else
static bool amx_granted() { return false; }
static void amx_done() {}
static void amx_scores(const Geo&, const uint32_t*, const uint32_t*, const int32_t*, const Tile&,
                       int, int, float*) {}
static void amx_finish(const Geo&, const Tile&, const int32_t*, const uint32_t*, const float*,
                       int, int, void*) {}
#endif
