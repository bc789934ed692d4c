// The CPU paged-attention kernel (built and bound by `pagoda.runtime.cpu.attention`).
//
// Layout (per layer, `P` = 2 bf16 values or 1 float32 per 32-bit word, `NB` blocks of `BS`):
// K `[Hkv, NB, D/P, BS, P]` (a 64-byte load is 16 keys' words: score lanes are keys) and
// V `[Hkv, NB, BS/P, D, P]` (a load is 16 dims of P consecutive keys: output lanes are dims).
//
// Work: a *tile* is up to 12 (AVX-512) or 16 (AMX) row-heads of one sequence and KV head. Its
// scores go to a scratch row per row-head, the softmax runs per row, then `p @ V`. A step whose
// tiles are short, or numerous enough to keep every thread busy, runs each tile as one task;
// otherwise, in waves bounded by `wave` floats of scores, score tasks of `KCHUNK` blocks, then
// the softmax, then `p @ V` by output-dim chunks. The inner loops are in avx512.h (AVX-512,
// float32 caches, CPUs without AMX; avx2.h: float32 caches on AVX2-only CPUs) and amx.h (bf16 on
// CPUs with AMX); a process uses one of them for every row. int8 caches
// (`--kv-cache-dtype int8`) have their own loops and layout, in q8.h.
//
// Threads: the pool of pool.h (no OpenMP). Tasks are claimed one at a time; between the phases of a
// split wave a thread waits only until the tasks already claimed are done, never for every thread
// to arrive (with OMP_WAIT_POLICY=PASSIVE an OpenMP barrier costs a scheduler slice, ~8 ms, when
// another process holds a core).
//
// Invariance: every (query row, head) pair owns its accumulators, and each is updated by the same
// sequence of operations whatever else is in its tile, task, wave or batch: scores by 16-key chunks
// at absolute positions (d in order), a max and a sum over the row's own blocks, `p @ V` over the
// row's own blocks in key order. Tiles and groups of chunks only share the loads. Built with
// `-ffp-contract=off` so that the compiler cannot fuse some multiply-adds and not others (the
// fused ones are written out: `fma`).
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

#include "claim.h"
// This library's own pool (the pool is static in each library): its helpers spin 20 us after a
// job, not 200. Attention runs once a layer, ~1 ms apart in a decode step: a longer spin finds no
// next call and only takes a core from the matmul pool's helper and the caller.
#define POOL_SPIN_NS 20000L
#include "pool.h"
#include "common.h"
#include "avx2.h"
#include "avx512.h"
#include "amx.h"
#include "q8.h"


// Row-head's softmax over its keys [lo, pos] (lo: its window's start, else 0); the scratch holds
// scores from key c0 (a multiple of 16, <= lo: the tile's first block), and p (bf16 or float)
// is written in place there, exact zeros before lo. Keys sit in the same lanes, added in the same
// order, whatever c0 is (leading zeros add nothing), so a row's bits do not depend on its tile.
template <bool BF16>
static void softmax_row(float* s, int lo, int pos, int c0, int nblk_row, int BS) {
#if defined(PAGODA_AVX2_F32)
  if constexpr (!BF16) return softmax_row_f32(s, lo, pos, c0, nblk_row, BS);
#endif
  const int nk = nblk_row * BS;
  vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  vf m0 = splat(-3.0e38f), m1 = m0;  // two chains: a maximum is exact in any order
  // 32-key steps over [start, full), where every key is allowed (lo <= key <= pos)
  const int start = std::max(c0, (lo + 15) & ~15);
  const int full = start + std::max(0, (std::min(nk, pos + 1) - start) / 32 * 32);
  for (int c = start; c < full; c += 32) {
    vf x0 = ld(s + c), x1 = ld(s + c + 16);
    m0 = x0 > m0 ? x0 : m0;
    m1 = x1 > m1 ? x1 : m1;
  }
  for (int c = c0; c < nk; c += 16) {
    if (c >= start && c < full) continue;
    vf x = ld(s + c);
    x = ((lane + c) <= pos) & ((lane + c) >= lo) ? x : splat(-3.0e38f);
    m0 = x > m0 ? x : m0;
  }
  m0 = m1 > m0 ? m1 : m0;
  const float mx = hmax(m0);
  vf l = splat(0.0f);
  for (int c = c0; c < nk; c += 16) {
    vf e = vexp(ld(s + c) - mx);
    if (c + 15 > pos || c < lo) e = ((lane + c) <= pos) & ((lane + c) >= lo) ? e : splat(0.0f);
    l = l + e;
    std::memcpy(s + c, &e, 64);
  }
  const float inv = 1.0f / hsum(l);  // a multiply per 16 keys, not a division
  for (int c = c0; c < nk; c += 16) {
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
  if (g.q8) pv_q8_n<MAXN>(g, pr, stride, vc, bt, t.kvh, dc, du, t.blo, common, acc, t.n);
  else pv_n<BF16, MAXN>(g, pr, vc, bt, t.kvh, dc, du, t.blo, common, acc, t.n);
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

// ALiBi: each score of keys [c0, nk) plus slope * (key - pos), the product rounded then added
// (no FMA: -ffp-contract=off), as the torch path adds it. Keys past `pos` are masked later.
static void add_alibi(float* s, float slope, int pos, int c0, int nk) {
  for (int c = c0; c < nk; ++c) s[c] += slope * (float)(c - pos);
}

// AMX multiplies p by V over all the tile's blocks: p = 0 past each row's own blocks. int8
// caches: p then becomes the 8-bit p * v_scale that `pv_q8` reads (`quantize_p_row`).
template <bool BF16>
static void softmax_tile(const Geo& g, const Tile& t, float* S, const int32_t* bt,
                         const uint32_t* vc) {
  for (int j = 0; j < t.n; ++j) {
    int pos = t.pos0 + (t.rh0 + j) / g.G, nb = pos / g.BS + 1;
    float* s = S + (int64_t)j * t.nblk * g.BS;
    if (g.alibi) add_alibi(s, g.alibi[t.kvh * g.G + (t.rh0 + j) % g.G], pos, t.blo * g.BS, nb * g.BS);
    softmax_row<BF16>(s, first_key(g, pos), pos, t.blo * g.BS, nb, g.BS);
    if (g.q8) QUANTIZE_P(g, s, t.blo * g.BS, nb, t.nblk * g.BS, bt, vc, t.kvh);
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
  tile_scores<BF16>(g, qw, kc, bt, t, t.blo, t.nblk, buf.data());
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

// The threading: the scaled queries, the waves and `run`. Tasks are claimed one at a time, and
// between the phases of a split wave a thread waits only until the tasks already claimed are
// done, never for every thread to arrive.

// q * scale, rounded to the cache's dtype (16 values at a time: D is a multiple of 16).
template <bool BF16>
static void scale_range(const void* q, uint32_t* qw, int64_t i0, int64_t i1, float scale) {
  for (int64_t i = i0; i < i1; i += 16) {
    if (BF16) {
      vh h; std::memcpy(&h, (const uint16_t*)q + i, 32);
      vf x = (vf)(__builtin_convertvector(h, vu) << 16) * scale;
      h = to_bf16v(x); std::memcpy((uint16_t*)qw + i, &h, 32);
    } else {
      vf x = ld((const float*)q + i) * scale;
      std::memcpy((float*)qw + i, &x, 64);
    }
  }
}
struct ScaleJob { const void* q; uint32_t* qw; int64_t n; float scale; int64_t next; };
template <bool BF16>
static void scale_job(void* ctx) {
  ScaleJob& j = *(ScaleJob*)ctx;
  const int64_t block = 1 << 14;  // elements per claim (a multiple of 16)
  for (int64_t i0, i1; (i0 = claim(&j.next, block, j.n, &i1)) < j.n;)
    scale_range<BF16>(j.q, j.qw, i0, i1, j.scale);
}
template <bool BF16>
static void scale_q(const void* q, uint32_t* qw, int64_t n, float scale, int nt) {
  ScaleJob j{q, qw, n, scale, 0};
  pool_run(scale_job<BF16>, &j, n > (1 << 16) ? nt : 1);
}

// Phases of a wave: tasks are claimed one at a time; a thread out of claims for a phase waits
// only for the tasks others claimed (no barrier over threads: a helper that joins late claims
// what is left, one the OS has not run yet holds nothing up). The wait spins ~20 us, then sleeps
// on a futex: a thread whose claimed task is queued behind another process's thread then gets
// the waiter's core instead of a spinning waiter holding it.
struct WaveJob {
  const Geo* g; const uint32_t *qw, *kc, *vc; const int32_t* bt; int64_t bts;
  const Tile* tiles; size_t w0, w1; float* Sp; void* out;
  const std::pair<int, int>* tasks; const std::pair<int, int>* fin;
  int64_t n[3], next[3];  // scores or whole tiles; softmax; p @ V (split waves only)
  int done[3], sleepers[3], phases;
};

// Claims and runs tasks of phase p; waits for all of them if `wait` (a later phase needs them).
template <typename F>
static void phase(WaveJob& j, int p, bool wait, F f) {
  int64_t end;
  for (int64_t k; (k = claim(&j.next[p], 1, j.n[p], &end)) < j.n[p];) {
    f(k);
    if (__atomic_add_fetch(&j.done[p], 1, __ATOMIC_SEQ_CST) == j.n[p] &&
        __atomic_load_n(&j.sleepers[p], __ATOMIC_SEQ_CST))
      syscall(SYS_futex, &j.done[p], FUTEX_WAKE_PRIVATE, POOL_MAX, NULL, NULL, 0);
  }
  if (!wait) return;
  const long until = pool_now_ns() + 20000;
  for (int i = 0, d; (d = __atomic_load_n(&j.done[p], __ATOMIC_SEQ_CST)) < j.n[p]; ++i) {
    if ((i & 63) || pool_now_ns() < until) { __builtin_ia32_pause(); continue; }
    __atomic_add_fetch(&j.sleepers[p], 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &j.done[p], FUTEX_WAIT_PRIVATE, d, NULL, NULL, 0);
    __atomic_sub_fetch(&j.sleepers[p], 1, __ATOMIC_SEQ_CST);
  }
}

template <bool BF16>
static void wave_job(void* ctx) {
  WaveJob& j = *(WaveJob*)ctx;
  const Geo& g = *j.g;
  phase(j, 0, j.phases > 1, [&](int64_t k) {
    const Tile& t = j.tiles[j.tasks[k].first];
    const int b0 = j.tasks[k].second, b1 = std::min(t.nblk, b0 + KCHUNK);
    if (b0 < 0) whole_tile<BF16>(g, j.qw, j.kc, j.vc, j.bt + t.seq * j.bts, t, j.out);
    else tile_scores<BF16>(g, j.qw, j.kc, j.bt + t.seq * j.bts, t, b0, b1, j.Sp + t.scratch);
  });
  if (j.phases > 1) {
    phase(j, 1, true, [&](int64_t k) {
      const Tile& t = j.tiles[j.w0 + k];
      softmax_tile<BF16>(g, t, j.Sp + t.scratch, j.bt + t.seq * j.bts, j.vc);
    });
    phase(j, 2, false, [&](int64_t k) {
      const Tile& t = j.tiles[j.fin[k].first];
      finish<BF16>(g, t, j.bt + t.seq * j.bts, j.vc, j.Sp + t.scratch, j.fin[k].second,
                   dims_at(g, t.n, j.fin[k].second), j.out);
    });
  }
  amx_done();  // hand the tile state back: torch's own AMX kernels configure tiles their way
}

// One wave: whole tiles (one task each) beside split tiles (score tasks, then softmax, then pv).
template <bool BF16>
static void wave(const Geo& g, const uint32_t* qw, const uint32_t* kc, const uint32_t* vc,
                 const int32_t* bt, int64_t bts, const std::vector<Tile>& tiles, size_t w0,
                 size_t w1, bool split, float* Sp, void* out, int nt) {
  const int ndc = g.D / 16;
  std::vector<std::pair<int, int>> tasks, fin;  // (tile, first block; -1: whole), (tile, dc)
  for (size_t i = w0; i < w1; ++i) {
    if (!split) { tasks.push_back({(int)i, -1}); continue; }
    for (int b = tiles[i].blo; b < tiles[i].nblk; b += KCHUNK) tasks.push_back({(int)i, b});
    for (int dc = 0; dc < ndc; dc += dims_at(g, tiles[i].n, dc)) fin.push_back({(int)i, dc});
  }
  WaveJob j{&g, qw, kc, vc, bt, bts, tiles.data(), w0, w1, Sp, out, tasks.data(), fin.data(),
            {(int64_t)tasks.size(), (int64_t)(w1 - w0), (int64_t)fin.size()}, {0, 0, 0},
            {0, 0, 0}, {0, 0, 0}, split ? 3 : 1};
  pool_run(wave_job<BF16>, &j, nt);
}

template <bool BF16>
static int run(const Geo& g, const void* q, void* out, const uint32_t* kc, const uint32_t* vc,
                const int32_t* bt, int64_t bts, const int32_t* qs, const int32_t* sl, int B,
                int T, float scale, int64_t wave_floats, int nt) {
  if (!valid(g, bt, bts, qs, sl, B)) return 2;
  const int W = g.q8 ? q8_q_words(g) : g.D / g.P, ndc = g.D / 16;
  const int per = g.amx ? AMXN : std::max(1, std::min(MAXN, 24 / ndc));
  std::vector<uint32_t> qw((size_t)T * g.H * W);
  if (g.q8) quantize_q((const float*)q, qw.data(), (int64_t)T * g.H, g.D, scale, nt);
  else scale_q<BF16>(q, qw.data(), (int64_t)T * g.H * g.D, scale, nt);
  std::vector<Tile> tiles;
  int maxblk = 0, maxspan = 0;  // the most blocks a tile's scratch holds, and reads
  int64_t work = 0;
  for (int s = 0; s < B; ++s) {
    int ql = qs[s + 1] - qs[s], pos0 = sl[s] - ql;
    for (int h = 0; h < g.HKV; ++h)
      for (int rh = 0; rh < ql * g.G; rh += per) {
        int n = std::min(per, ql * g.G - rh), lastpos = pos0 + (rh + n - 1) / g.G;
        int nblk = lastpos / g.BS + 1, blo = first_key(g, pos0 + rh / g.G) / g.BS;
        tiles.push_back({s, h, rh, n, nblk, 0, qs[s], pos0, blo});
        maxblk = std::max(maxblk, nblk);
        maxspan = std::max(maxspan, nblk - blo);
        work += nblk - blo;
      }
  }
  // Waking a sleeping helper costs more than a small call's work; the thread count never
  // changes a result.
  if (work < SERIAL) nt = 1;
  // Whole tiles when they are short or many enough to keep every thread busy; else split the
  // scores of each tile over several tasks. Either way each row sees the same operations.
  const int64_t most = (int64_t)per * maxblk * g.BS;  // scores of the largest tile
  if (maxspan <= KCHUNK || ((int64_t)tiles.size() >= 8 * nt && most * nt <= wave_floats)) {
    wave<BF16>(g, qw.data(), kc, vc, bt, bts, tiles, 0, tiles.size(), false, nullptr, out, nt);
    return 0;
  }
  static thread_local std::vector<float> S;  // grown, never shrunk: no page faults per call
  size_t w0 = 0;
  while (w0 < tiles.size()) {  // waves of tiles whose scores fit in `wave_floats` floats
    size_t w1 = w0; int64_t used = 0;
    while (w1 < tiles.size() && (w1 == w0 || used + (int64_t)tiles[w1].n * tiles[w1].nblk * g.BS <= wave_floats)) {
      tiles[w1].scratch = used; used += (int64_t)tiles[w1].n * tiles[w1].nblk * g.BS; ++w1;
    }
    if ((int64_t)S.size() < used) S.resize(used);
    // S.data(), not S, inside the region: each thread has its own thread_local
    wave<BF16>(g, qw.data(), kc, vc, bt, bts, tiles, w0, w1, true, S.data(), out, nt);
    w0 = w1;
  }
  return 0;
}

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

// kind: 0 float32 caches, 1 bf16, 2 int8 (float32 q and out). window: the keys a query sees
// (itself included), 0 for all of them; chunk: chunked attention's chunk (`first_key`), 0: none;
// alibi: H float32 slopes (ALiBi), or null.
int pagoda_attention(int kind, const void* q, void* out, const void* kc, const void* vc,
                     const int32_t* bt, int64_t bts, const int32_t* qs, const int32_t* sl, int B,
                     int T, int H, int HKV, int D, int NB, int BS, float scale, int64_t wave,
                     int nt, int window, int chunk, const float* alibi) {
  if (D % 16 || BS % 16 || H % HKV || kind < 0 || kind > 2 || window < 0 || chunk < 0) return 1;
  if (kind == 2 && D > 512) return 1;
  const bool bf16 = kind == 1;
  Geo g{H, HKV, D, NB, BS, bf16 ? 2 : 1, H / HKV, false, kind == 2, window, chunk, alibi};
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
