"""C source of the native top-k / top-p / min-p sampling kernel (built with `sampler_native`).

Why not `torch.topk`: on CPU, `topk(1024)` over [256, 32000] logits costs ~110 ms per step, 40x a
whole-vocabulary draw. Here no row is sorted. One pass takes the maxima of 32-entry blocks and
256-entry chunks; the maxima of disjoint groups are distinct entries, so they bound the answer:

* top-k: the k-th largest chunk (or block) maximum is at most the k-th largest entry, so only
  the entries at or above it (blocks whose maximum reaches it) are gathered, ~k of them, and a
  quickselect keeps the k best. k > 512: a count histogram over log2-weight bins gives the bin
  of the k-th entry instead (the block bound gets loose as k nears the block count).
* top-p without top-k (exact for any top_p): the row's mass Z; the kept set lies within the best
  64 entries iff their mass exceeds p * Z (the usual, peaked case). Otherwise (a flat row) a
  histogram of the mass over log2-weight bins (1/64 wide) locates the bin where the cut falls and
  the bin the draw falls in; only their entries are gathered and ordered, bins above the cut are
  kept whole. Small vocabularies (<= 4096) simply take every entry as a candidate.
* the cut and the draw: "keep tokens whose mass strictly above them is <= top_p * total" and "the
  token whose cumulative interval holds u * kept mass" are weighted selections in sorted order,
  done by quickselect (`sampler_native_select`); a flat row's cut bin of more than 256 entries
  is first counting-sorted into 256 ranges of logits, so whole ranges are passed by their mass.

The order of candidates (logit descending, then index ascending) is `sampler_native_select`'s.
Weights are 2^((x - max) * s) relative to the row's best token, as in `sampler_ops`; min-p drops
weights below min_p before top-k/top-p, as `apply_top_k_top_p_min_p` does (top-k of the min-p
survivors is the same set either way: min-p is a threshold on the logit). Sums are in double,
so picks match the float32 PyTorch path except where u falls within rounding of a boundary.
The source expects the helpers of `sampler_native.SOURCE` (chunk, span_*, sample_row, claim)
and `sampler_native_select.SOURCE` (cand_t, rank_key, select_*, sort_ranges).
"""

from __future__ import annotations

SOURCE = r"""
#define BLK 32 /* entries per block: block maxima bound the candidates */
#define HR 64 /* histogram bins per unit of log2 weight (flat top-p rows) */
#define NBINS 4096 /* the last bin holds the weights below 2^-63.98 */
#define FLAT_CANDIDATES 4096 /* top-p on a larger vocabulary: the histogram path when flat */
#define TOP_P_FIRST 64 /* top-p first tries the best 64 entries */
#define TOP_K_BOUNDED 512 /* larger top-k: by the count histogram, not block maxima */
typedef struct { float *w, *bm, *hist; double *cum; cand_t *c; } scratch_t; /* one thread's */

/* Maxima of the row's BLK-entry blocks into bm and of its CH-entry chunks into cm; returns the
   row maximum. With `mass`, also the row's mass of 2^((x - max) s), summed relative to the
   running maximum while each chunk is in L1 (as online softmax does). */
static float block_maxima(const void *row, int bf16, int64_t v, float *bm, float *cm, float s,
                          double *mass) {
    float buf[CH], m = NEG_INF;
    double z = 0.0;
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        const float *x = chunk(row, bf16, lo, len, buf);
        float cmax = NEG_INF;
        for (int64_t b = 0; b < len; b += BLK) {
            float bmax = span_max(x + b, len - b < BLK ? len - b : BLK);
            bm[(lo + b) / BLK] = bmax;
            cmax = bmax > cmax ? bmax : cmax;
        }
        cm[lo / CH] = cmax;
        if (cmax > m) {
            z *= exp2_neg((m - cmax) * s); /* 0 while m is -inf */
            m = cmax;
        }
        if (mass && cmax > NEG_INF) z += span_sum(x, len, s, -m * s);
    }
    if (mass) *mass = z;
    return m;
}

/* Mass of the weights 2^(x s + b) that reach mp, over the row. */
static double row_mass(const void *row, int bf16, int64_t v, float s, float b, float mp) {
    float buf[CH];
    double z = 0.0;
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        const float *x = chunk(row, bf16, lo, len, buf);
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < len; j++) {
            float e = exp2_neg(x[j] * s + b);
            acc += e >= mp ? e : 0.0f;
        }
        z += acc;
    }
    return z;
}

/* Every entry x >= lo_x (from the blocks whose maximum reaches it) as a candidate, logit in .w. */
static int64_t gather_floor(const void *row, int bf16, int64_t v, const float *bm, float lo_x,
                            cand_t *c) {
    float buf[BLK];
    int64_t n = 0;
    for (int64_t b = 0; b * BLK < v; b++) {
        if (!(bm[b] >= lo_x)) continue;
        int64_t lo = b * BLK, len = v - lo < BLK ? v - lo : BLK;
        const float *x = chunk(row, bf16, lo, len, buf);
        for (int64_t j = 0; j < len; j++)
            if (x[j] >= lo_x) { c[n].key = rank_key(x[j], lo + j); c[n++].w = x[j]; }
    }
    return n;
}

/* The finite group maxima as candidates (logit in .w, group number in the key). */
static int64_t block_candidates(const float *bm, int64_t nb, cand_t *c) {
    int64_t n = 0;
    for (int64_t b = 0; b < nb; b++)
        if (bm[b] > NEG_INF) { c[n].key = rank_key(bm[b], b); c[n++].w = bm[b]; }
    return n;
}

/* Candidates' logits into weights 2^((x - m) s), dropping those below mp or zero; returns how
   many remain, *total their mass. */
static int64_t to_weights(cand_t *c, int64_t n, float s, float m, float mp, double *total) {
    int64_t kept = 0;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float w = exp2_neg(c[i].w * s - m * s);
        if (w > 0.0f && w >= mp) { c[kept].key = c[i].key; c[kept++].w = w; sum += w; }
    }
    *total = sum;
    return kept;
}

/* The k-th largest of the maxima g of ng disjoint groups (k < ng), a lower bound of the row's
   k-th largest entry: k distinct entries reach it. */
static float kth_largest(const float *g, int64_t ng, int64_t k, cand_t *c) {
    int64_t n = block_candidates(g, ng, c);
    if (k >= n) return NEG_INF; /* too few finite groups: no bound */
    select_rank(c, n, k);
    float lo_x = c[0].w;
    for (int64_t i = 1; i < k; i++) lo_x = c[i].w < lo_x ? c[i].w : lo_x;
    return lo_x;
}

/* The drawn token among n > 0 candidates: top-p's cut (p < 1) against `total`, then u. */
static int64_t pick_candidate(cand_t *c, int64_t n, double total, float p, float u) {
    double before, kept = 0.0;
    if (p < 1.0f) {
        int64_t last = select_mass(c, n, (double)p * total, &before);
        n = last + 1;
        kept = before + c[last].w;
    } else {
        for (int64_t i = 0; i < n; i++) kept += c[i].w;
    }
    return (int64_t)(uint32_t)c[select_mass(c, n, (double)u * kept, &before)].key;
}

/* Bin of each weight 2^(x s + b) <= 1: HR bins per unit of log2 weight, the last one open. */
static void span_bins(const float *x, int64_t n, float s, float b, int32_t *bin) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float d = -(x[j] * s + b) * HR;
        bin[j] = d < (float)(NBINS - 1) ? (int32_t)d : NBINS - 1; /* NaN, -inf: the last */
    }
}

/* cum[i]: the mass (or with `counts`, the number of entries) of the bins below i (the heavier
   weights), i <= NBINS, min-p applied to the mass. Four interleaved histograms (hist: 4 * NBINS
   floats) keep the scatter-adds independent. With `keep` (not with counts), the weights stay
   there [v] for `gather_bins`. */
static void weight_histogram(const void *row, int bf16, int64_t v, float s, float b, float mp,
                             int counts, float *hist, double *cum, float *keep) {
    float buf[CH], wbuf[CH];
    int32_t bin[CH];
    memset(hist, 0, sizeof(float) * 4 * NBINS);
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo), j = 0;
        const float *x = chunk(row, bf16, lo, len, buf);
        float *w = keep && !counts ? keep + lo : wbuf;
        span_weights(x, len, s, b, mp, w);
        span_bins(x, len, s, b, bin);
        if (counts)
            for (int64_t i = 0; i < len; i++) w[i] = 1.0f;
        for (; j + 4 <= len; j += 4)
            for (int q = 0; q < 4; q++) hist[q * NBINS + bin[j + q]] += w[j + q];
        for (; j < len; j++) hist[bin[j]] += w[j];
    }
    cum[0] = 0.0;
    for (int i = 0; i < NBINS; i++)
        cum[i + 1] = cum[i] + ((double)hist[i] + hist[NBINS + i] + hist[2 * NBINS + i] +
                               hist[3 * NBINS + i]);
}

/* The entries (positive weight) of bins [lo_bin, first] into c[0, *n1) and, unless `second` is
   -1, of bin `second` into c[lim - *n2, lim): one pass for both. `kept`: the row's weights as
   `weight_histogram` kept them (else computed again). */
#define IN_BINS(k) ((((k) >= lo_bin) & ((k) <= first)) | ((k) == second))
/* Bit j set iff bin[j] is one of the wanted bins, for 16 entries: three compares into a mask
   register with AVX-512 (the portable loop compiles to a horizontal OR of shifted lanes). */
static inline uint32_t hit_mask16(const int32_t *bin, int32_t lo_bin, int32_t first,
                                  int32_t second) {
#ifdef __AVX512F__
    __m512i b = _mm512_loadu_si512(bin);
    __mmask16 in = _mm512_cmpge_epi32_mask(b, _mm512_set1_epi32(lo_bin));
    in = _mm512_mask_cmple_epi32_mask(in, b, _mm512_set1_epi32(first));
    return (uint32_t)(in | _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(second)));
#else
    uint32_t mask = 0;
#pragma omp simd reduction(| : mask)
    for (int64_t j = 0; j < 16; j++) mask |= (uint32_t)IN_BINS(bin[j]) << j;
    return mask;
#endif
}
static void gather_bins(const void *row, int bf16, int64_t v, float s, float b, float mp,
                        int32_t lo_bin, int32_t first, int32_t second, cand_t *c, int64_t lim,
                        int64_t *n1, int64_t *n2, const float *kept) {
    float buf[CH], wbuf[CH];
    int32_t bin[CH];
    int64_t k1 = 0, k2 = 0; /* counts in registers: stores to c may alias n1 and n2 */
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        const float *x = chunk(row, bf16, lo, len, buf);
        span_bins(x, len, s, b, bin);
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (int64_t j = 0; j < len; j++) hit |= IN_BINS(bin[j]);
        if (!hit) continue;
        const float *w = kept ? kept + lo : wbuf;
        if (!kept) span_weights(x, len, s, b, mp, wbuf);
        for (int64_t g = 0; g < len; g += 16) { /* per 16 entries: a bit mask of the hits */
            int64_t end = g + 16 < len ? g + 16 : len;
            uint32_t mask = end - g == 16 ? hit_mask16(bin + g, lo_bin, first, second) : 0;
            if (end - g < 16)
                for (int64_t j = g; j < end; j++) mask |= (uint32_t)IN_BINS(bin[j]) << (j - g);
            for (; mask; mask &= mask - 1) { /* only the hits: no mispredicted branches */
                int64_t j = g + __builtin_ctz(mask);
                if (!(w[j] > 0.0f)) continue;
                cand_t *to = bin[j] != second ? &c[k1++] : &c[lim - ++k2];
                to->key = rank_key(x[j], lo + j);
                to->w = w[j];
            }
        }
    }
    *n1 = k1, *n2 = k2;
}

/* Top-k by a count histogram: the bin of the k-th best entry, then the entries of that bin and
   above (positive weights only), of which a quickselect keeps the k best. */
static int64_t top_k_by_counts(const void *row, int bf16, int64_t v, int64_t k, float s,
                               float mp, float m, scratch_t *t) {
    int64_t n, n2;
    int32_t cut = 0;
    weight_histogram(row, bf16, v, s, -m * s, mp, 1, t->hist, t->cum, NULL);
    while (cut < NBINS - 1 && t->cum[cut + 1] < (double)k) cut++;
    gather_bins(row, bf16, v, s, -m * s, mp, 0, cut, -1, t->c, v + 1, &n, &n2, NULL);
    return n > k ? (select_rank(t->c, n, k), k) : n;
}

/* Top-k candidates with their weights (min-p and zero weights dropped) into t->c, *total their
   mass, given the row maximum m and the block and chunk maxima (t->bm): the entries at or above
   a lower bound of the k-th best one, from the chunk maxima when k is below their number, else
   the block maxima. A large k (or too few finite groups): the count histogram. */
static int64_t top_k_candidates(const void *row, int bf16, int64_t v, int64_t k, float s,
                                float mp, float m, scratch_t *t, double *total) {
    int64_t nb = (v + BLK - 1) / BLK, nc = (v + CH - 1) / CH, n = 0;
    float lo_x = NEG_INF;
    if (k < nc) lo_x = kth_largest(t->bm + nb, nc, k, t->c);
    if (!(lo_x > NEG_INF) && k < nb && k <= TOP_K_BOUNDED) lo_x = kth_largest(t->bm, nb, k, t->c);
    if (!(lo_x > NEG_INF)) {
        n = top_k_by_counts(row, bf16, v, k, s, mp, m, t);
        *total = 0.0;
        for (int64_t i = 0; i < n; i++) *total += t->c[i].w;
        return n;
    }
    n = gather_floor(row, bf16, v, t->bm, lo_x, t->c);
    if (n > k) { select_rank(t->c, n, k); n = k; }
    return to_weights(t->c, n, s, m, mp, total);
}

/* Top-p over a row with many candidates (a flat distribution): the mass histogram gives the bin
   where the cut falls and, unless u lands near that bin's share, the bin of the draw; one pass
   gathers both, and only their entries are ordered (quickselect). Bins above the cut are kept
   whole. -1: nothing to draw. */
static int64_t flat_top_p(const void *row, int bf16, int64_t v, float s, float m, float mp,
                          float p, float u, scratch_t *t) {
    float b = -m * s;
    double *cum = t->cum, before = 0.0;
    weight_histogram(row, bf16, v, s, b, mp, 0, t->hist, cum, t->w);
    double target = (double)p * cum[NBINS]; /* the row's mass, as the histogram sums it */
    if (!(cum[NBINS] > 0.0 && cum[NBINS] < __builtin_inf())) return -1;
    int32_t cut = 0, at = 0, at_hi = 0;
    while (cut < NBINS - 1 && cum[cut + 1] <= target) cut++;
    /* the kept mass lies in [cum[cut], cum[cut + 1]]: the draw's bin is known unless it moves */
    while (at < cut - 1 && cum[at + 1] <= u * cum[cut]) at++;
    while (at_hi < cut && cum[at_hi + 1] <= u * cum[cut + 1]) at_hi++;
    int64_t n, n2, r = -1;
    gather_bins(row, bf16, v, s, b, mp, cut, cut, at == at_hi && at < cut ? at : -1, t->c, v + 1,
                &n, &n2, t->w);
    ranges_t g; /* many candidates: both selections below skip whole ranges */
    const ranges_t *gr = ranges_if_many(t->c, n, t->c + v + 1, &g);
    if (n > 0) r = select_in(t->c, n, target - cum[cut], &before, gr);
    double draw = u * (cum[cut] + (r >= 0 ? before + t->c[r].w : 0.0));
    if (r >= 0 && draw >= cum[cut])
        return KEY_TOKEN(t->c[select_in(t->c, r + 1, draw - cum[cut], &before, gr)]);
    for (at = 0; at < cut - 1 && cum[at + 1] <= draw;) at++;
    if (n2 == 0) /* the draw's bin was not gathered with the cut's (if it was, it is `at`) */
        gather_bins(row, bf16, v, s, b, mp, 0, -1, at, t->c, v + 1, &n, &n2, t->w);
    if (n2 == 0) return -1;
    cand_t *c2 = t->c + v + 1 - n2;
    gr = ranges_if_many(c2, n2, t->c + v + 1, &g);
    return KEY_TOKEN(c2[select_in(c2, n2, draw - cum[at], &before, gr)]);
}

/* Top-p without top-k. The kept entries are the best ones up to the one where the mass in order
   crosses p * total (total: the row's mass after min-p): within the best k entries iff their
   mass exceeds p * total. Tried with the best TOP_P_FIRST (a cheap top-k selection) unless
   even weights of 1 (the best one's) could not add up to it; else, the histogram path (or all
   entries, for a small vocabulary). -1: nothing finite. */
static int64_t top_p_row(const void *row, int bf16, int64_t v, float s, float p, float mp,
                         float u, scratch_t *t) {
    int64_t nb = (v + BLK - 1) / BLK, n;
    double z = 0.0, mass;
    float m = block_maxima(row, bf16, v, t->bm, t->bm + nb, s, mp > 0.0f ? NULL : &z);
    if (!(m > NEG_INF && m < -NEG_INF)) return -1;
    if (mp > 0.0f) z = row_mass(row, bf16, v, s, -m * s, mp); /* min-p needs the maximum first */
    if (!(z > 0.0 && z < __builtin_inf())) return -1;
    p = p > 0.0f ? p : 0.0f;
    double target = (double)p * z;
    if (TOP_P_FIRST < v && TOP_P_FIRST > target) {
        n = top_k_candidates(row, bf16, v, TOP_P_FIRST, s, mp, m, t, &mass);
        if (mass > target) return n > 0 ? pick_candidate(t->c, n, z, p, u) : -1;
    }
    if (v > FLAT_CANDIDATES) return flat_top_p(row, bf16, v, s, m, mp, p, u, t);
    n = to_weights(t->c, gather_floor(row, bf16, v, t->bm, NEG_INF, t->c), s, m, mp, &mass);
    return n > 0 ? pick_candidate(t->c, n, z, p, u) : -1;
}

static int64_t filtered_row(const void *row, int bf16, int64_t v, float s, int64_t k, float p,
                            float mp, float u, scratch_t *t) {
    if (k >= v && !(p < 1.0f)) return sample_row(row, bf16, v, s, mp, u, t->w);
    double total = 0.0;
    int64_t token = -1;
    if (k < v) {
        float m = block_maxima(row, bf16, v, t->bm, t->bm + (v + BLK - 1) / BLK, s, NULL);
        int64_t n = m > NEG_INF && m < -NEG_INF
                        ? top_k_candidates(row, bf16, v, k > 1 ? k : 1, s, mp, m, t, &total)
                        : 0;
        token = n > 0 ? pick_candidate(t->c, n, total, p, u) : -1;
    } else {
        token = top_p_row(row, bf16, v, s, p, mp, u, t);
    }
    return token >= 0 ? token : row_argmax(row, bf16, v);
}

/* x and rows as in sample_rows; top_k (v or more: off), top_p (1: off)
   and min_p (0: off) per row, each may be NULL. */
int sample_filtered_rows(const void *x, int bf16, int64_t v, const int64_t *rows,
                         const float *scale, const int64_t *top_k, const float *top_p,
                         const float *min_p, const float *u, int64_t *out, int64_t n,
                         int64_t *next, int64_t block) {
    scratch_t t = {
        malloc(sizeof(float) * (size_t)(v + 2 * ((v + CH - 1) / CH))),
        malloc(sizeof(float) * (size_t)((v + BLK - 1) / BLK + (v + CH - 1) / CH)),
        malloc(sizeof(float) * 4 * NBINS),
        malloc(sizeof(double) * (NBINS + 1)),
        malloc(sizeof(cand_t) * (size_t)(2 * (v + 1))), /* the second half: sort_ranges' */
    };
    int rc = t.w && t.bm && t.hist && t.cum && t.c ? 0 : -1;
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r, end; !rc && (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++)
            out[r] = filtered_row(ROW_AT(x, rows, r, row_bytes), bf16, v, scale[r],
                                  top_k ? top_k[r] : v, top_p ? top_p[r] : 1.0f,
                                  min_p ? min_p[r] : 0.0f, u[r], &t);
    free(t.w), free(t.bm), free(t.hist), free(t.cum), free(t.c);
    return rc;
}
"""
