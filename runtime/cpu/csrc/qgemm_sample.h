// `qgemm`'s sampling mode: a step's tokens from the LM head without its logits.
//
// Per (row, block of 16 outputs) the GEMM keeps two floats instead of sixteen: the block's maximum
// and its sum of 2^((v - max) * s) (s = log2(e) / temperature). A row's token then comes from
// those, one uniform and the 16 outputs of one block, recomputed with the GEMM's own operations
// (same bits): inverse CDF over groups of 16 blocks, over the chosen group's blocks, then over the
// chosen block's weights. Greedy rows (s = 0) take the first block holding the row maximum and the
// first output equal to it: `argmax_rows` exactly. `pagoda_sample_logits` runs the same code over
// stored logits, so a row's token is the same whether the step's logits were written or not.
// Included twice by qgemm.cpp: the kernels inside its AVX2 section, then (QGEMM_SAMPLE_API
// defined) the entry points at its end.
#ifndef QGEMM_SAMPLE_API
constexpr int GROUP = 16;  // blocks per group: the inverse CDF walks groups, blocks, outputs
constexpr float NEG_INF = -__builtin_inff(), POS_INF = __builtin_inff();

// 2^y to ~1e-7 relative error for y <= 0 (0 from -127 down, NaN counts as -127): 2^round(y)
// from the exponent bits times a minimax polynomial of the fraction (the sampler's exp2_neg)
INLINE __m256 exp2_neg8(__m256 y) {
  y = _mm256_max_ps(y, _mm256_set1_ps(-127.0f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(y, _mm256_set1_ps(0.5f)));
  const __m256 f = _mm256_sub_ps(y, n);
  __m256 p = _mm256_set1_ps(1.5345810970757157e-04f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3399930903688073e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6184890717267990e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503286421298980e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022646248340607e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718246459961e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

INLINE float hmax8(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
}

// lanes of v[0..7] reduced, lane i of the result from v[i]: pairs first, as _mm256_hadd_ps does
// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)): one order whatever the other lanes hold
template <bool MAX>
INLINE __m256 reduce8(const __m256* v) {
  auto pair = [](__m256 a, __m256 b) {
    if (!MAX) return _mm256_hadd_ps(a, b);
    return _mm256_max_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xdd));
  };
  const __m256 lo = pair(pair(v[0], v[1]), pair(v[2], v[3]));
  const __m256 hi = pair(pair(v[4], v[5]), pair(v[6], v[7]));
  const __m256 x = _mm256_permute2f128_ps(lo, hi, 0x20), y = _mm256_permute2f128_ps(lo, hi, 0x31);
  return MAX ? _mm256_max_ps(x, y) : _mm256_add_ps(x, y);
}

// n <= 8 blocks of 16 values (a[i]: the first 8, b[i]: the last 8), block i sampled at scale
// lane i of s (0: greedy): each block's maximum, a NaN counting as +inf (PyTorch's maxima
// propagate NaN: a row holding one has no finite maximum, no token; `min(x, +inf)` returns
// +inf for a NaN, one instruction where max(x, -inf) dropped it) and, for s > 0, its sum of
// 2^((v - max) * s) (0 with no value above -inf, +inf when the maximum is +inf); a block's
// results never depend on the others
INLINE void stats8(const __m256* a, const __m256* b, int n, __m256 s, float* bm, float* bs) {
  const __m256 ninf = _mm256_set1_ps(NEG_INF), pinf = _mm256_set1_ps(POS_INF);
  __m256 v[8];
  for (int i = 0; i < 8; ++i)
    v[i] = i < n ? _mm256_max_ps(_mm256_min_ps(b[i], pinf), _mm256_min_ps(a[i], pinf)) : ninf;
  const __m256 m = reduce8<true>(v);
  _mm256_storeu_ps(bm, m);
  const __m256 sampled = _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ);
  if (!_mm256_movemask_ps(sampled)) return _mm256_storeu_ps(bs, _mm256_setzero_ps());
  const __m256 off = _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), m), s);
  for (int i = 0; i < 8; ++i) {
    if (i >= n) { v[i] = _mm256_setzero_ps(); continue; }
    const __m256i at = _mm256_set1_epi32(i);
    const __m256 si = _mm256_permutevar8x32_ps(s, at), oi = _mm256_permutevar8x32_ps(off, at);
    v[i] = _mm256_add_ps(exp2_neg8(_mm256_fmadd_ps(a[i], si, oi)),
                         exp2_neg8(_mm256_fmadd_ps(b[i], si, oi)));
  }
  const __m256 finite = _mm256_and_ps(_mm256_cmp_ps(m, ninf, _CMP_NEQ_OQ),
                                      _mm256_cmp_ps(m, pinf, _CMP_NEQ_OQ));
  __m256 sum = _mm256_and_ps(reduce8<false>(v), _mm256_and_ps(finite, sampled));
  sum = _mm256_blendv_ps(sum, pinf, _mm256_and_ps(_mm256_cmp_ps(m, pinf, _CMP_EQ_OQ), sampled));
  _mm256_storeu_ps(bs, sum);
}

// sampling mode: rows [m0, m0 + R) at output block nb, from staged sums [R][16] (+ bias)
INLINE void block_stats(const Job& j, int64_t nb, int64_t m0, int R, int valid, const float* out) {
  const int64_t n0 = nb * NB;
  alignas(32) float v[NB], scale[8] = {}, bm[8], bs[8];
  __m256 a[8], b[8];
  for (int r = 0; r < R; ++r) {
    const float* o = out + r * NB;
    if (valid < NB) {  // past N: -inf
      for (int i = 0; i < NB; ++i) v[i] = i < valid ? o[i] : NEG_INF;
      o = v;
    }
    a[r] = _mm256_load_ps(o), b[r] = _mm256_load_ps(o + 8);
    if (j.bias) {
      alignas(32) float bias[NB];
      for (int i = 0; i < NB; ++i) bias[i] = i < valid ? j.bias[n0 + i] : 0.0f;
      a[r] = _mm256_add_ps(a[r], _mm256_load_ps(bias));
      b[r] = _mm256_add_ps(b[r], _mm256_load_ps(bias + 8));
    }
  }
  // not `j.scale ? j.scale[m0 + r] : 0` in the loop: GCC makes it a masked load, which from a
  // null address with an empty mask takes a microcode assist on AMD (~40 % of an argmax GEMM)
  if (j.scale) memcpy(scale, j.scale + m0, sizeof(float) * R);
  stats8(a, b, R, _mm256_load_ps(scale), bm, bs);
  for (int r = 0; r < R; ++r) {
    float* st = j.stats + (m0 + r) * j.sstride;
    st[nb] = bm[r], st[j.nbp + nb] = bs[r];
  }
}

// row m's 16 outputs of block nb (-inf past N), with the operations of `tile` and `lean`
template <int QT>
static void recompute(const Job& j, int64_t nb, int64_t m, float* v) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  const uint8_t* u = unit_at<QT>(j, nb, 0);
  const float* x = j.x + m * j.ldx;
  for (int kb = 0; kb < j.K; kb += QK, u += unit<QT>()) {
    const Unit<QT> w(u);
    for (int k = 0; k < QK; ++k) {
      __m256 w0, w1;
      w.at(k, w0, w1);
      const __m256 xr = _mm256_broadcast_ss(x + kb + k);
      a0 = _mm256_fmadd_ps(xr, w0, a0);
      a1 = _mm256_fmadd_ps(xr, w1, a1);
    }
  }
  alignas(32) float o[NB];
  _mm256_store_ps(o, a0), _mm256_store_ps(o + 8, a1);
  const int64_t n0 = nb * NB;
  for (int i = 0; i < NB; ++i) v[i] = n0 + i < j.N ? o[i] : NEG_INF;
  if (j.bias)  // a branch of its own (see block_stats)
    for (int i = 0; i < NB && n0 + i < j.N; ++i) v[i] += j.bias[n0 + i];
}

// the entry of w [n] whose cumulative interval holds target (acc: the mass before w[0]);
// rounding never picks a zero weight; -1 when every weight is zero (the sampler's `pick`)
template <class T>
static int64_t pick(const T* w, int64_t n, double target, double* acc) {
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i)
    if (w[i] > 0) {
      last = i;
      if (*acc + w[i] > target) return i;
      *acc += w[i];
    }
  return last;
}

// inverse CDF from a sampled row's stats (st: maxima [nbp], sums [nbp] then group sums); the
// sums become the blocks' masses relative to the row maximum m; -1: no finite positive mass
template <class Values>
static int64_t draw(float* st, int64_t nbp, float m, float s, float u, Values values) {
  float *bm = st, *c = st + nbp, *gs = c + nbp;
  const __m256 vs = _mm256_set1_ps(s), off = _mm256_set1_ps(-m * s);
  for (int64_t b = 0; b < nbp; b += 8) {
    const __m256 scale = exp2_neg8(_mm256_fmadd_ps(_mm256_loadu_ps(bm + b), vs, off));
    _mm256_storeu_ps(c + b, _mm256_mul_ps(_mm256_loadu_ps(c + b), scale));
  }
  double total = 0.0;
  for (int64_t g = 0; g < nbp / GROUP; ++g) {
    float t = 0.0f;
    for (int i = 0; i < GROUP; ++i) t += c[g * GROUP + i];
    gs[g] = t, total += t;
  }
  if (!(total > 0.0 && total < POS_INF)) return -1;
  const double target = u * total;
  double acc = 0.0;
  const int64_t g = pick(gs, nbp / GROUP, target, &acc);
  const int64_t b = g < 0 ? -1 : pick(c + g * GROUP, GROUP, target, &acc);
  if (b < 0) return -1;
  alignas(32) float v[NB], w[NB];
  values(g * GROUP + b, v);
  _mm256_store_ps(w, exp2_neg8(_mm256_fmadd_ps(_mm256_load_ps(v), vs, off)));
  _mm256_store_ps(w + 8, exp2_neg8(_mm256_fmadd_ps(_mm256_load_ps(v + 8), vs, off)));
  const int64_t at = pick(w, NB, target, &acc);
  return at < 0 ? -1 : (g * GROUP + b) * NB + at;
}

// a row's token from its block stats: drawn (s > 0), else, or when the draw finds no mass, the
// first output equal to the row maximum; -1 when the row has no finite maximum (an output NaN
// or +inf, which the block maxima hold as +inf, or every one -inf), as `argmax_rows`: the
// engine ends that request with an error
template <class Values>
static int64_t choose(float* st, int64_t nbp, float s, float u, Values values) {
  __m256 mv = _mm256_set1_ps(NEG_INF);
  for (int64_t b = 0; b < nbp; b += 8) mv = _mm256_max_ps(_mm256_loadu_ps(st + b), mv);
  const float m = hmax8(mv);
  if (!(m > NEG_INF && m < POS_INF)) return -1;
  if (s > 0.0f) {
    const int64_t at = draw(st, nbp, m, s, u, values);
    if (at >= 0) return at;
  }
  int64_t nb = 0;
  while (st[nb] != m) ++nb;  // m is one of the maxima
  alignas(32) float v[NB];
  values(nb, v);  // the bits the maximum came from, so m is among them (bounded all the same)
  int i = 0;
  while (i < NB - 1 && v[i] != m) ++i;
  return nb * NB + i;
}

// the rows to choose for: from a sampling-mode GEMM's stats (job) or from stored logits (y)
struct Rows {
  const Job* job;
  const float* y;
  const int64_t* idx;  // stored logits: item m is the row idx[m] of y (null: row m)
  float* stats;
  const float *scale, *u;
  int64_t* out;
  int64_t ldy, nbp, sstride, next, claim;
  int M, N;
};

INLINE void stored_block(const float* row, int64_t N, int64_t nb, float* v) {
  const int64_t n0 = nb * NB;
  for (int i = 0; i < NB; ++i) v[i] = n0 + i < N ? row[n0 + i] : NEG_INF;
}

// a row of stored logits' block stats, eight blocks at a time (as the GEMM's, a row at a time)
static void stored_stats(const float* row, int64_t N, int64_t nbp, float s, float* st) {
  alignas(32) float pad[8][NB];
  __m256 a[8], b[8];
  for (int64_t nb = 0; nb < nbp; nb += 8) {
    for (int i = 0; i < 8; ++i) {
      const float* v = row + (nb + i) * NB;
      if ((nb + i + 1) * NB > N) stored_block(row, N, nb + i, pad[i]), v = pad[i];
      a[i] = _mm256_loadu_ps(v), b[i] = _mm256_loadu_ps(v + 8);
    }
    stats8(a, b, 8, _mm256_set1_ps(s), st + nb, st + nbp + nb);
  }
}

// QT < 0: stored logits (their stats first); else recomputed blocks of a weight of kind QT
template <int QT>
static void choose_rows(void* arg) {
  Rows& r = *(Rows*)arg;
  for (int64_t m, end; (m = claim(&r.next, r.claim, r.M, &end)) < r.M;)
    for (; m < end; ++m) {
      float* st = r.stats + m * r.sstride;
      const float s = r.scale ? r.scale[m] : 0.0f, u = r.u ? r.u[m] : 0.0f;
      if constexpr (QT < 0) {
        const float* row = r.y + (r.idx ? r.idx[m] : m) * r.ldy;
        stored_stats(row, r.N, r.nbp, s, st);
        r.out[m] = choose(st, r.nbp, s, u, [&](int64_t nb, float* o) { stored_block(row, r.N, nb, o); });
      } else {
        r.out[m] = choose(st, r.nbp, s, u, [&](int64_t nb, float* o) { recompute<QT>(*r.job, nb, m, o); });
      }
    }
}

static int64_t padded_blocks(int64_t N) {
  const int64_t blocks = (N + NB - 1) / NB;
  return (blocks + GROUP - 1) / GROUP * GROUP;
}

// stats for M rows: maxima and sums of the padded blocks, then group sums; pad blocks empty
static float* new_stats(int M, int N, int64_t* nbp, int64_t* stride) {
  *nbp = padded_blocks(N), *stride = 2 * *nbp + *nbp / GROUP;
  float* st = (float*)malloc((size_t)M * *stride * sizeof(float));
  for (int64_t m = 0; st && m < M; ++m)
    for (int64_t b = (N + NB - 1) / NB; b < *nbp; ++b)
      st[m * *stride + b] = NEG_INF, st[m * *stride + *nbp + b] = 0.0f;
  return st;
}

static void choose_all(Rows& rows, pool_fn fn, int threads) {
  rows.claim = rows.M / (8 * threads) > 0 ? rows.M / (8 * threads) : 1;
  pool_run(fn, &rows, rows.M >= 8 ? threads : 1);
}
#else
// out [M]: one token per row of x @ w^T (+ bias) as `pagoda_sample_logits` would pick it from
// the stored outputs, which are never stored: scale[m] = log2(e) / temperature (0: greedy;
// scale null: every row greedy), u[m] in [0, 1) the row's uniform
extern "C" int pagoda_qgemm_sample(int kind, const uint8_t* w, const float* x, int64_t ldx,
                                   const float* bias, int M, int N, int K, const float* scale,
                                   const float* u, int threads, int64_t* out) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (threads < 1) threads = 1;
  if (M < 1 || N < 1) return 1;
  int64_t nbp, stride;
  float* stats = new_stats(M, N, &nbp, &stride);
  if (!stats) return 3;
  Job job{w, x, bias, nullptr, stats, scale, ldx, 0, 0, 1, nbp, stride, M, N, K,
          M <= MC_MAX ? M : MC_MAX};
  int rc = launch(job, kind, threads);
  if (!rc) {
    pool_fn fns[] = BY_KIND(choose_rows);
    Rows rows{&job, nullptr, nullptr, stats, scale, u, out, 0, nbp, stride, 0, 1, M, N};
    choose_all(rows, fns[kind], threads);
  }
  free(stats);
  return rc;
#else
  (void)kind, (void)w, (void)x, (void)ldx, (void)bias, (void)M, (void)N, (void)K;
  (void)scale, (void)u, (void)threads, (void)out;
  return 2;
#endif
}

// out [M]: one token per row of the float32 logits y [., N] (row stride ldy), as above; item m
// is the row idx[m] of y (idx null: row m), scale and u per item
extern "C" int pagoda_sample_logits(const float* y, int64_t ldy, const int64_t* idx, int M,
                                    int N, const float* scale, const float* u, int threads,
                                    int64_t* out) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (threads < 1) threads = 1;
  if (M < 1 || N < 1) return 1;
  int64_t nbp, stride;
  float* stats = new_stats(M, N, &nbp, &stride);
  if (!stats) return 3;
  Rows rows{nullptr, y, idx, stats, scale, u, out, ldy, nbp, stride, 0, 1, M, N};
  choose_all(rows, choose_rows<-1>, threads);
  free(stats);
  return 0;
#else
  (void)y, (void)ldy, (void)idx, (void)M, (void)N, (void)scale, (void)u, (void)threads;
  (void)out;
  return 2;
#endif
}
#endif
