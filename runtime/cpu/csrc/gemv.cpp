// bf16 GEMV/GEMM over oneDNN's packed weights (AB16b{nb}a2b), read in place, with rows
// independent of M: `pagoda_gemv_bf16`, bound and built by `pagoda.runtime.cpu.gemv` (whose
// docstring tells the why and the layout).
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include "claim.h"
#include "pool.h"
#ifdef __AVX512BF16__
// y[m, n] = bf16(sum_k x[m, k] w[n, k] + bias[n]), weights in oneDNN's AB16b{nb}a2b layout
// (nb = 16 * V outputs per block). Each output is one float accumulator updated pair by pair in
// key order: its bits depend neither on M, nor on the tile a row lands in, nor on the threads.
struct Job {
  const uint16_t *w, *bias; const uint32_t* xp; uint16_t* y;
  int64_t ldxp, ldy, next, claim;  // ldxp: row stride of xp in pairs
  int M, N, K, MC;                 // MC: rows per task
};

#define INLINE static inline __attribute__((always_inline))

// acc += rows m0.. of x by block nb over key pairs [kp0, kp1), pair by pair in key order; the
// first `lines` iterations each prefetch one cache line from `pf`
template <int V, int R>
INLINE void accumulate(const Job& j, int64_t nb, int64_t m0, int kp0, int kp1,
                       __m512 (&acc)[R][V], const char* pf, int lines) {
  const int64_t blk = 32 * 16 * V;  // bf16 values per (n-block, k-block)
  const uint16_t* wb = j.w + nb * ((j.K + 31) / 32) * blk;
  const uint32_t* xp = j.xp + m0 * j.ldxp;
  for (int kp = kp0; kp < kp1; ++kp) {
    const uint16_t* wp = wb + (int64_t)(kp / 16) * blk + (kp % 16) * 32 * V;
    __m512bh b[V];
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(wp + 32 * v);
    if (kp - kp0 < lines) _mm_prefetch(pf + (int64_t)(kp - kp0) * 64, _MM_HINT_T0);
    for (int m = 0; m < R; ++m) {
      __m512bh a = (__m512bh)_mm512_set1_epi32((int)xp[m * j.ldxp + kp]);
      for (int v = 0; v < V; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], a, b[v]);
    }
  }
}

template <int V, int R>  // the tile's outputs: accumulators (+ bias) rounded to bf16
INLINE void store(const Job& j, int64_t nb, int64_t m0, __m512 (&acc)[R][V]) {
  for (int v = 0; v < V; ++v) {
    const int64_t n0 = nb * 16 * V + 16 * v;
    if (n0 >= j.N) break;
    const __mmask16 mask =
        j.N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (j.N - n0)) - 1);
    __m512 bv = _mm512_setzero_ps();
    if (j.bias) bv = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, j.bias + n0)), 16));
    for (int m = 0; m < R; ++m) {
      __m256i o = (__m256i)_mm512_cvtneps_pbh(j.bias ? _mm512_add_ps(acc[m][v], bv) : acc[m][v]);
      _mm256_mask_storeu_epi16(j.y + (m0 + m) * j.ldy + n0, mask, o);
    }
  }
}

// R rows from m0 by the 16 * V outputs of block nb over key pairs [kp0, kp1), accumulating in
// registers: all keys at once (kp0 = 0, kp1 = KP), or one chunk, the accumulators then carried
// in `buf` (float32: exact) from chunk to chunk; the last chunk writes the outputs.
template <int V, int R>
static void tile(const Job& j, int64_t nb, int64_t m0, int kp0, int kp1, float* buf,
                       const char* pf, int lines) {
  __m512 acc[R][V];
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < V; ++v)
      acc[m][v] = kp0 ? _mm512_load_ps(buf + (m * V + v) * 16) : _mm512_setzero_ps();
  accumulate<V, R>(j, nb, m0, kp0, kp1, acc, pf, lines);
  if (kp1 == (j.K + 31) / 32 * 16) return store<V, R>(j, nb, m0, acc);
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < V; ++v) _mm512_store_ps(buf + (m * V + v) * 16, acc[m][v]);
}

constexpr int RMAX = 6;  // rows per tile: 6 x 4 accumulators + 4 weight registers fit in 32
constexpr int KCHUNK = 64;  // key pairs a block's weights are swept in (V = 4: 16 KB, in L1)
// Runs of rows swept chunk by chunk (below: up to three tiles, too little to overlap; above: the
// arithmetic dominates and chunking measured 5 % slower at 64 rows on a Zen 5)
constexpr int CHUNK_MIN_ROWS = 19, CHUNK_MAX_ROWS = 48;

#include "row_tiles.h"

// tasks = (n-block, run of MC rows), n-block major: its weights stay in L2. Tile by tile, a
// block's first tile waits on memory for all its weights and the others compute from L2 with
// memory idle; a run of CHUNK_MIN_ROWS..CHUNK_MAX_ROWS rows instead sweeps the keys in chunks,
// every tile through a chunk before the next while they prefetch the next chunk (the next
// block's first at the end), so the weights stream in step with the arithmetic (decode steps of
// 24-32 sequences 7-10 % faster on a Zen 5). The bits are the same either way.
template <int V>
static void run(void* arg) {
  Job& j = *(Job*)arg;
  const int64_t nblk = (j.N + 16 * V - 1) / (16 * V), mch = (j.M + j.MC - 1) / j.MC;
  const int64_t tasks = nblk * mch;
  const int KP = (j.K + 31) / 32 * 16;
  const int64_t block = (int64_t)KP * 64 * V;  // bytes of a block's weights
  alignas(64) float buf[16 * RMAX * 16 * V];  // MC rows by 16 V outputs
  for (int64_t t, end; (t = claim(&j.next, j.claim, tasks, &end)) < tasks;)
    for (; t < end; ++t) {
      const int64_t nb = t / mch, lo = t % mch * j.MC, hi = lo + j.MC < j.M ? lo + j.MC : j.M;
      if (hi - lo < CHUNK_MIN_ROWS || hi - lo > CHUNK_MAX_ROWS) {
#define WHOLE(R) tile<V, R>(j, nb, m, 0, KP, nullptr, nullptr, 0)
        ROW_TILES(WHOLE)
        continue;
      }
      const int tiles = (int)((hi - lo + RMAX - 1) / RMAX);
      const char* wb = (const char*)j.w + nb * block;
      for (int kp0 = 0; kp0 < KP; kp0 += KCHUNK) {
        const int kp1 = kp0 + KCHUNK < KP ? kp0 + KCHUNK : KP;
        const bool last = kp1 == KP;  // then prefetch the next block's first chunk, if any
        const char* next = last ? wb + block : wb + (int64_t)kp1 * 64 * V;
        const int per_tile = last && nb + 1 == nblk ? 0 : (KCHUNK * V + tiles - 1) / tiles;  // lines
        int ti = 0;
#define CHUNK(R) tile<V, R>(j, nb, m, kp0, kp1, buf + (m - lo) * 16 * V, \
                                  next + (int64_t)(ti++) * per_tile * 64, per_tile)
        ROW_TILES(CHUNK)
      }
    }
}
#endif

// y [M, N] = x [M, K] @ w^T (+ bias) on `threads` threads of the pool (pool.h).
extern "C" int pagoda_gemv_bf16(const uint16_t* w, int nb, const uint16_t* x, int64_t ldx,
                                uint16_t* y, int64_t ldy, const uint16_t* bias, int M, int N,
                                int K, int threads) {
#ifdef __AVX512BF16__
  if (M < 1 || (nb != 16 && nb != 32 && nb != 64)) return 1;
  const int KP = (K + 31) / 32 * 16;
  const int64_t nblocks = (N + nb - 1) / nb;
  const uint32_t* xp = (const uint32_t*)x;
  uint32_t* copy = nullptr;
  int64_t ldxp = ldx / 2;
  if (K % 32 || ldx % 2 || (uintptr_t)x % 4) {  // rows as pairs, zero-padded to whole blocks
    copy = (uint32_t*)malloc((size_t)M * KP * 4);
    if (!copy) return 3;
    for (int m = 0; m < M; ++m) {
      uint16_t* row = (uint16_t*)(copy + (int64_t)m * KP);
      memcpy(row, x + m * ldx, (size_t)K * 2);
      memset(row + K, 0, (size_t)(KP * 2 - K) * 2);
    }
    xp = copy, ldxp = KP;
  }
  const int MC = M <= 4 * RMAX ? M : 16 * RMAX;
  const int64_t tasks = nblocks * ((M + MC - 1) / MC);
  // ~8 claims a thread: a late or descheduled helper leaves little for the others
  const int64_t claim_tasks = tasks / (8 * (threads > 0 ? threads : 1));
  Job job{w, bias, xp, y, ldxp, ldy, 0, claim_tasks > 0 ? claim_tasks : 1, M, N, K, MC};
  pool_run(nb == 16 ? run<1> : nb == 32 ? run<2> : run<4>, &job, threads);
  free(copy);
  return 0;
#else
  return 2;
#endif
}
