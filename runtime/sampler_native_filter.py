"""C source of the native top-k / top-p / min-p sampling kernel (built with `sampler_native`).

Why not `torch.topk`: on CPU, `topk(1024)` over [256, 32000] logits costs ~110 ms per step, 40x a
whole-vocabulary draw. Here each row is reduced to a small candidate set by one scan and the
sorted order is never materialised:

* top-k: a scan keeps the best entries in a buffer of 2k + 64; when it fills, a quickselect
  keeps the k best and raises the entry threshold to the k-th value. A 256-entry chunk whose
  maximum is below the threshold is skipped after one vectorised max, so after the first few
  chunks a row costs about one pass at memory speed.
* top-p without top-k: the exact filtered mass Z comes from the same one-pass chunk sums as a
  whole-vocabulary draw. A kept token has at most mass (1 - p) Z at and below it, spread over at
  most V tokens, so it weighs at least (1 - p) Z / V: only entries above half that bound (and
  only chunks whose sum reaches it) become candidates. Exact for every top_p; a flat row simply
  yields many candidates.
* the cut and the draw: "keep tokens whose mass strictly above them is <= top_p * total" and
  "the token whose cumulative interval holds u * kept mass" are both a weighted selection in
  sorted order, done by quickselect on the candidates (partition around a pivot, sum the mass of
  the better side, descend into the side that holds the target): O(candidates), no sort.

Order: by logit descending, then by index ascending (torch.sort's order among equal logits is
unspecified; any order gives the same distribution over logit values, this one is reproducible).
Weights are 2^((x - max) * s) relative to the row's best token, as in `sampler_ops`; min-p drops
weights below min_p, applied before top-k/top-p as in `apply_top_k_top_p_min_p` (top-k of the
min-p survivors is the same set either way, since min-p is a threshold on the logit).
The source expects the helpers of `sampler_native.SOURCE` (chunk, span_*, online_sums, ...).
"""

from __future__ import annotations

SOURCE = r"""
#define BLK 32 /* entries per block: block maxima bound the candidates */
typedef struct { uint64_t key; float w; } cand_t; /* w: the logit while gathering top-k */

/* Ascending key = descending logit, then ascending index (-0.0 counts as 0.0). */
static inline uint64_t rank_key(float x, int64_t j) {
    union { float f; uint32_t i; } u = {x + 0.0f};
    uint32_t up = u.i ^ ((uint32_t)((int32_t)u.i >> 31) | 0x80000000u); /* ascending with x */
    return ((uint64_t)~up << 32) | (uint32_t)j;
}

static inline void swap_c(cand_t *a, cand_t *b) { cand_t t = *a; *a = *b; *b = t; }

/* Puts a median-of-three pivot of c[lo, hi) (hi - lo >= 2, distinct keys) at its sorted place,
   smaller keys before it and larger after; returns its position. */
static int64_t partition(cand_t *c, int64_t lo, int64_t hi) {
    int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (c[mid].key < c[lo].key) swap_c(&c[mid], &c[lo]);
    if (c[last].key < c[lo].key) swap_c(&c[last], &c[lo]);
    if (c[mid].key < c[last].key) swap_c(&c[mid], &c[last]);
    uint64_t pk = c[last].key;
    int64_t i = lo;
    for (int64_t j = lo; j < last; j++)
        if (c[j].key < pk) swap_c(&c[i++], &c[j]);
    swap_c(&c[i], &c[last]);
    return i;
}

/* Reorders c[0, n) so that c[0, k) holds the k smallest keys (0 < k < n). */
static void select_rank(cand_t *c, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n;
    while (hi - lo > 1) {
        int64_t p = partition(c, lo, hi);
        if (p == k) return;
        if (p < k) lo = p + 1; else hi = p;
    }
}

static void insertion_sort(cand_t *c, int64_t lo, int64_t hi) {
    for (int64_t i = lo + 1; i < hi; i++)
        for (int64_t j = i; j > lo && c[j].key < c[j - 1].key; j--) swap_c(&c[j], &c[j - 1]);
}

/* The position r of the candidate (weights w > 0) whose cumulative interval in key order holds
   target, after reordering c[0, n) so that c[0, r) are exactly the candidates before it;
   *before gets their mass. Past the total mass (rounding): the last candidate. n > 0. */
static int64_t select_mass(cand_t *c, int64_t n, double target, double *before) {
    int64_t lo = 0, hi = n;
    double acc = 0.0;
    while (hi - lo > 16) {
        int64_t p = partition(c, lo, hi);
        double left = 0.0;
        for (int64_t j = lo; j < p; j++) left += c[j].w;
        if (acc + left > target) { hi = p; continue; }
        acc += left;
        if (acc + c[p].w > target || p == hi - 1) { *before = acc; return p; }
        acc += c[p].w;
        lo = p + 1;
    }
    insertion_sort(c, lo, hi);
    int64_t j = lo;
    for (; j < hi - 1 && acc + c[j].w <= target; j++) acc += c[j].w;
    *before = acc;
    return j;
}

/* The k best entries of a row (finite keys) into c (capacity cap >= k + 1), logits in .w. */
static int64_t gather_top_k(const void *row, int bf16, int64_t v, int64_t k, cand_t *c,
                            int64_t cap) {
    float buf[CH], thr = NEG_INF; /* entries must beat the k-th best so far */
    int64_t n = 0;
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        const float *x = chunk(row, bf16, lo, len, buf);
        if (!(span_max(x, len) > thr)) continue;
        for (int64_t j = 0; j < len; j++) {
            if (!(x[j] > thr)) continue; /* an equal logit later in the row ranks after */
            if (n == cap) {
                select_rank(c, n, k);
                n = k;
                thr = c[0].w;
                for (int64_t i = 1; i < k; i++) thr = c[i].w < thr ? c[i].w : thr;
                if (!(x[j] > thr)) continue;
            }
            c[n].key = rank_key(x[j], lo + j);
            c[n++].w = x[j];
        }
    }
    if (n > k) { select_rank(c, n, k); n = k; }
    return n;
}

/* Maxima of the row's BLK-entry blocks into bm; returns the row maximum. */
static float block_maxima(const void *row, int bf16, int64_t v, float *bm) {
    float buf[CH], m = NEG_INF;
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        const float *x = chunk(row, bf16, lo, len, buf);
        for (int64_t b = 0; b < len; b += BLK) {
            float bmax = span_max(x + b, len - b < BLK ? len - b : BLK);
            bm[(lo + b) / BLK] = bmax;
            m = bmax > m ? bmax : m;
        }
    }
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

/* The finite block maxima as candidates (logit in .w, block number in the key). */
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

/* Top-k candidates with their weights (min-p and zero weights dropped). When k is below the
   number of blocks, the k-th best block maximum bounds the k-th best entry from below (k
   distinct entries reach it): only entries at or above it are gathered. Else one streaming pass. */
static int64_t top_k_candidates(const void *row, int bf16, int64_t v, int64_t k, float s,
                                float mp, float *bm, cand_t *c, double *total) {
    float m = block_maxima(row, bf16, v, bm);
    if (!(m > NEG_INF && m < -NEG_INF)) return 0;
    int64_t n = block_candidates(bm, (v + BLK - 1) / BLK, c);
    if (k < n) {
        select_rank(c, n, k);
        float lo_x = c[0].w;
        for (int64_t i = 1; i < k; i++) lo_x = c[i].w < lo_x ? c[i].w : lo_x;
        n = gather_floor(row, bf16, v, bm, lo_x, c);
    } else {
        n = gather_top_k(row, bf16, v, k, c, 2 * k + 64 < v ? 2 * k + 64 : v);
    }
    if (n > k) { select_rank(c, n, k); n = k; }
    return to_weights(c, n, s, m, mp, total);
}

/* Top-p candidates (no top-k): every entry that can be kept, with its weight; *total: the row's
   mass after min-p (top-p's reference). The kept entries are the best ones up to the one where
   the mass in order crosses p * total. The best block maxima whose mass crosses it are entries
   too, so that crossing comes no later than the last of them: nothing below it is kept. A flat
   row whose block maxima hold too little mass falls back to the bound (1 - p) * total / v on a
   kept entry's weight (the entries at or below it, at most v, carry the remaining mass). */
static int64_t top_p_candidates(const void *row, int bf16, int64_t v, float s, float p, float mp,
                                float *bm, cand_t *c, double *total) {
    float m = block_maxima(row, bf16, v, bm), lo_x;
    if (!(m > NEG_INF && m < -NEG_INF)) return 0;
    double z = row_mass(row, bf16, v, s, -m * s, mp), bmass, before;
    if (!(z > 0.0 && z < __builtin_inf())) return 0;
    p = p > 0.0f ? p : 0.0f;
    int64_t n = to_weights(c, block_candidates(bm, (v + BLK - 1) / BLK, c), s, m, mp, &bmass);
    if (bmass > (double)p * z) {
        lo_x = bm[(uint32_t)c[select_mass(c, n, (double)p * z, &before)].key];
    } else {
        double cut = 0.5 * (1.0 - p) * z / (double)v; /* halved: float rounding of z */
        lo_x = cut > 0.0 ? m + ((float)__builtin_log2(cut) - 1.0f) / s : NEG_INF;
    }
    *total = z;
    return to_weights(c, gather_floor(row, bf16, v, bm, lo_x, c), s, m, mp, &bmass);
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

static int64_t filtered_row(const void *row, int bf16, int64_t v, float s, int64_t k, float p,
                            float mp, float u, float *w, cand_t *c) {
    if (k >= v && !(p < 1.0f)) return sample_row(row, bf16, v, s, mp, u, w);
    double total = 0.0;
    int64_t n = k < v ? top_k_candidates(row, bf16, v, k > 1 ? k : 1, s, mp, w, c, &total)
                      : top_p_candidates(row, bf16, v, s, p, mp, w, c, &total);
    return n > 0 ? pick_candidate(c, n, total, p, u) : row_argmax(row, bf16, v);
}

/* x [n, v] float32 (bf16 = 0) or bfloat16 (bf16 = 1); top_k (v or more: off), top_p (1: off)
   and min_p (0: off) per row, each may be NULL. */
int sample_filtered_rows(const void *x, int bf16, int64_t v, const float *scale,
                         const int64_t *top_k, const float *top_p, const float *min_p,
                         const float *u, int64_t *out, int64_t n, int64_t *next, int64_t block) {
    float *w = malloc(sizeof(float) * (size_t)(v + 2 * ((v + CH - 1) / CH)));
    cand_t *c = malloc(sizeof(cand_t) * (size_t)(v + 1));
    int rc = w && c ? 0 : -1;
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r, end; !rc && (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++)
            out[r] = filtered_row((const char *)x + r * row_bytes, bf16, v, scale[r],
                                  top_k ? top_k[r] : v, top_p ? top_p[r] : 1.0f,
                                  min_p ? min_p[r] : 0.0f, u[r], w, c);
    free(w);
    free(c);
    return rc;
}
"""
