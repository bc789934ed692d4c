"""C++ of the CPU attention kernel's threading: the scaled queries, the waves and `run` (pasted
into ``cpu_kernel_source.SOURCE`` after the tile routines it calls).

Threads come from ``native.POOL_C`` (no OpenMP): tasks are claimed one at a time, and between the
phases of a split wave a thread waits only until the tasks already claimed are done, never for
every thread to arrive.
"""

WAVES_SOURCE = r"""
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
    for (int b = 0; b < tiles[i].nblk; b += KCHUNK) tasks.push_back({(int)i, b});
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
  int maxblk = 0;
  int64_t work = 0;
  for (int s = 0; s < B; ++s) {
    int ql = qs[s + 1] - qs[s], pos0 = sl[s] - ql;
    for (int h = 0; h < g.HKV; ++h)
      for (int rh = 0; rh < ql * g.G; rh += per) {
        int n = std::min(per, ql * g.G - rh), lastpos = pos0 + (rh + n - 1) / g.G;
        tiles.push_back({s, h, rh, n, lastpos / g.BS + 1, 0, qs[s], pos0});
        maxblk = std::max(maxblk, lastpos / g.BS + 1);
        work += lastpos / g.BS + 1;
      }
  }
  // Waking a sleeping helper costs more than a small call's work; the thread count never
  // changes a result.
  if (work < SERIAL) nt = 1;
  // Whole tiles when they are short or many enough to keep every thread busy; else split the
  // scores of each tile over several tasks. Either way each row sees the same operations.
  const int64_t most = (int64_t)per * maxblk * g.BS;  // scores of the largest tile
  if (maxblk <= KCHUNK || ((int64_t)tiles.size() >= 8 * nt && most * nt <= wave_floats)) {
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

"""
