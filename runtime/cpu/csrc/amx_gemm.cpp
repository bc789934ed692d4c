// A bf16 GEMM on AMX tiles whose rows do not depend on the number of rows, over oneDNN's packed
// weights (AB16b32a2b, read in place): `pagoda_amx_gemm_bf16`, bound and built by
// `pagoda.runtime.cpu.amx_gemm` (whose docstring tells the why and the tiling).
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "claim.h"
#include "pool.h"
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#include <sys/syscall.h>
#ifndef AHEAD
#define AHEAD 2  // K-blocks (2 KiB each) fetched ahead when the weight streams
#endif
#define BAND 512  // rows per band: its M-chunks run one after another on each weight block

static bool amx_granted() {  // Linux hands out the tile state only on request
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                 18 /* XFEATURE_XTILEDATA */) == 0;
  return ok;
}

struct alignas(64) TileCfg { uint8_t palette, start; uint8_t pad[14]; uint16_t colsb[16]; uint8_t rows[16]; };

// tmm0-3: C (rows r0, r0, r1, r1 x 16 floats); tmm4-5: A (r0, r1 rows x 32 bf16);
// tmm6-7: B (16 pairs x 16 outputs). r0 = min(rows, 16), r1 = rows - r0 (0: tiles unused).
static void config(int rows) {
  TileCfg c = {};
  c.palette = 1;
  const int r0 = rows < 16 ? rows : 16, r1 = rows - r0 > 0 ? rows - r0 : 1;
  const int rs[8] = {r0, r0, r1, r1, r0, r1, 16, 16};
  for (int i = 0; i < 8; ++i) { c.colsb[i] = 64; c.rows[i] = rs[i]; }
  asm volatile("" : : "r"(&c) : "memory");  // GCC 12 drops the stores to c otherwise
  _tile_loadconfig(&c);
}

struct Job {
  const uint16_t *w, *x, *bias; uint16_t* y; int64_t ldx, ldy, next, claim;
  int M, N, K, chunks, nblocks, tasks, stream;
};

// A finished 32 x 32 block waiting in `c` to be rounded to bf16 (+ bias) and stored: its rows
// are converted a few at a time inside the next block's K loop, where the vector work overlaps
// the tile multiplies (and the tile stores have long reached the cache).
struct Pending {
  alignas(64) float c[32 * 32];
  uint16_t* out;  // row 0 of the block in y
  const uint16_t* bias;  // at the block's first output, or NULL
  uint32_t mask;  // outputs of the block inside N
  int rows, done;
  bool stream;
};

static void finish_rows(const Job& j, Pending& p, int upto) {
  if (upto > p.rows) upto = p.rows;
  if (p.done >= upto) return;
  const __mmask16 k0 = (__mmask16)p.mask, k1 = (__mmask16)(p.mask >> 16);
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (p.bias) {
    b0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k0, p.bias)), 16));
    b1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k1, p.bias + 16)), 16));
  }
  for (int r = p.done; r < upto; ++r) {
    uint16_t* out = p.out + (int64_t)r * j.ldy;
    __m512 v0 = _mm512_load_ps(p.c + r * 32), v1 = _mm512_load_ps(p.c + r * 32 + 16);
    if (p.bias) { v0 = _mm512_add_ps(v0, b0); v1 = _mm512_add_ps(v1, b1); }
    const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(v0)),
                                         (__m256i)_mm512_cvtneps_pbh(v1), 1);
    if (p.stream) _mm512_stream_si512((__m512i*)out, h);
    else _mm512_mask_storeu_epi16(out, (__mmask32)p.mask, h);
  }
  p.done = upto;
}

// Rows [m0, m0 + rows) x outputs [32 nb, 32 nb + 32): C over all K-blocks in order, left in p
// (after finishing the block p held).
template <bool TWO>
static void task(const Job& j, int m0, int rows, int nb, bool fetch, Pending& p) {
  const int KB = (j.K + 31) / 32, step = (p.rows - p.done + KB - 1) / KB;
  const uint16_t* a = j.x + m0 * j.ldx;
  const uint16_t* w = j.w + (int64_t)nb * KB * 1024;
  const int64_t sa = j.ldx * 2;
  _tile_zero(0); _tile_zero(1);
  if (TWO) { _tile_zero(2); _tile_zero(3); }
  for (int kb = 0; kb < KB; ++kb) {
    const uint16_t* wb = w + (int64_t)kb * 1024;
    if (fetch)  // past the weight's end at its last blocks: a prefetch does not fault
      for (int l = 0; l < 1024; l += 32) _mm_prefetch((const char*)(wb + AHEAD * 1024 + l), _MM_HINT_T0);
    _tile_loadd(6, wb, 128);
    _tile_loadd(7, wb + 32, 128);
    _tile_loadd(4, a + kb * 32, sa);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (TWO) {
      _tile_loadd(5, a + 16 * j.ldx + kb * 32, sa);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    finish_rows(j, p, p.done + step);
  }
  finish_rows(j, p, p.rows);
  _tile_stored(0, p.c, 128); _tile_stored(1, p.c + 16, 128);
  if (TWO) { _tile_stored(2, p.c + 16 * 32, 128); _tile_stored(3, p.c + 16 * 32 + 16, 128); }
  const int n0 = nb * 32, left = j.N - n0;
  p.out = j.y + (int64_t)m0 * j.ldy + n0;
  p.bias = j.bias ? j.bias + n0 : NULL;
  p.mask = left >= 32 ? 0xFFFFFFFFu : (1u << left) - 1;
  // a full row of 32 outputs is one aligned cache line: for large outputs store it around the
  // caches (no read for ownership; the result is not read back before it leaves the cache)
  p.stream = j.stream && left >= 32;
  p.rows = rows; p.done = 0;
}

// Task t: its band (all bands before it are full), then N-block, then M-chunk (innermost).
static void run(void* arg) {
  Job& j = *(Job*)arg;
  const int per_band_chunks = BAND / 32;
  int shape = 0;
  Pending p;
  p.rows = p.done = 0;
  for (int64_t t, end; (t = claim(&j.next, j.claim, j.tasks, &end)) < j.tasks;)
    for (; t < end; ++t) {
      const int64_t band_tasks = (int64_t)per_band_chunks * j.nblocks;
      const int band = t / band_tasks, in = t % band_tasks;
      const int band_chunks = j.chunks - band * per_band_chunks < per_band_chunks
                                  ? j.chunks - band * per_band_chunks : per_band_chunks;
      const int nb = in / band_chunks, chunk = band * per_band_chunks + in % band_chunks;
      const int m0 = chunk * 32, rows = j.M - m0 < 32 ? j.M - m0 : 32;
      if (shape != rows) { config(rows); shape = rows; }
      // the band's first chunk brings the weight block in from memory: fetch it ahead
      const bool fetch = in % band_chunks == 0;
      if (rows > 16) task<true>(j, m0, rows, nb, fetch, p);
      else task<false>(j, m0, rows, nb, fetch, p);
    }
  finish_rows(j, p, p.rows);
  if (j.stream) _mm_sfence();  // streamed rows reach memory before the caller reads them
  if (shape) _tile_release();  // hand the tile state back: other kernels configure their own
}
#endif

// y [M, N] = x [M, K] @ w^T (+ bias), w packed AB16b32a2b; x rows at stride ldx (K padded here
// to whole K-blocks when K % 32 != 0). 0: done; 1: bad arguments; 2: not built for AMX;
// 3: no memory; 4: tile state not granted.
extern "C" int pagoda_amx_gemm_bf16(const uint16_t* w, const uint16_t* x, int64_t ldx, uint16_t* y,
                                    int64_t ldy, const uint16_t* bias, int M, int N, int K,
                                    int stream, int threads) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
  if (M < 1 || N < 1 || K < 1 || ldx < K) return 1;
  stream = stream && (uintptr_t)y % 64 == 0 && ldy % 32 == 0;  // whole aligned lines only
  if (!amx_granted()) return 4;
  uint16_t* padded = NULL;
  if (K % 32) {  // the last K-block's A tile reads 32 inputs: give it zeros, not the next row
    const int KP = (K + 31) / 32 * 32;
    padded = (uint16_t*)malloc((size_t)M * KP * 2);
    if (!padded) return 3;
    for (int m = 0; m < M; ++m) {
      memcpy(padded + (int64_t)m * KP, x + m * ldx, (size_t)K * 2);
      memset(padded + (int64_t)m * KP + K, 0, (size_t)(KP - K) * 2);
    }
    x = padded; ldx = KP;
  }
  const int chunks = (M + 31) / 32, nblocks = (N + 31) / 32;
  const int64_t tasks = (int64_t)chunks * nblocks;
  const int th = threads > 0 ? threads : 1;
  const int64_t per = tasks / (8 * th);  // ~8 claims a thread: a late helper leaves little
  Job job{w, x, bias, y, ldx, ldy, 0, per > 0 ? per : 1, M, N, K, chunks, nblocks, (int)tasks, stream};
  pool_run(run, &job, threads);
  free(padded);
  return 0;
#else
  (void)w; (void)x; (void)ldx; (void)y; (void)ldy; (void)bias; (void)M; (void)N; (void)K;
  (void)threads;
  return 2;
#endif
}
