/* The top-k / top-p / min-p sampling kernel (`sample_filtered_rows`).

   Why not `torch.topk`: on CPU, `topk(1024)` over [256, 32000] logits costs ~110 ms per step, 40x a
   whole-vocabulary draw. Here no row is sorted. One pass takes the maxima of 32-entry blocks and
   256-entry chunks; the maxima of disjoint groups are distinct entries, so they bound the answer:

   * top-k: the k-th largest chunk (or block) maximum is at most the k-th largest entry, so only
     the entries at or above it (blocks whose maximum reaches it) are gathered, ~k of them, and a
     quickselect keeps the k best. k > 512: counts per logit code give the code of the k-th entry
     instead (the block bound gets loose as k nears the block count; codes.h).
   * top-p without top-k (exact for any top_p), vocabulary above 4096: by logit codes
     (codes.h): a bfloat16 row in one counting pass, a float32 row after the block
     maxima pass, whose best 64 entries are tried first (the usual, peaked case: the kept set
     lies within them iff their mass exceeds p * Z). Smaller vocabularies take the best 64, else
     every entry, as candidates.
   * the cut and the draw: "keep tokens whose mass strictly above them is <= top_p * total" and "the
     token whose cumulative interval holds u * kept mass" are weighted selections in sorted order,
     done by quickselect (select.h).

   The order of candidates (logit descending, then index ascending) is select.h's.
   Weights are 2^((x - max) * s) relative to the row's best token, as in `sampling/ops.py`; min-p
   drops weights below min_p before top-k/top-p, as `apply_top_k_top_p_min_p` does (top-k of the min-p
   survivors is the same set either way: min-p is a threshold on the logit). Sums are in double,
   so picks match the float32 PyTorch path except where u falls within rounding of a boundary. */
#pragma once
#include "rows.h"
#include "select.h"
#include "codes.h"
#define BLK 32 /* entries per block: block maxima bound the candidates */
#define BY_CODES 4096 /* top-p on a larger vocabulary: by codes (codes.h) */
#define TOP_P_FIRST 64 /* top-p first tries the best 64 entries */
#define TOP_K_BOUNDED 512 /* larger top-k: by codes, not block maxima */
typedef struct { float *w, *bm; cand_t *c; codes_t h; } scratch_t; /* one thread's */

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
        n = top_k_by_codes(row, bf16, v, k, s, mp, m, &t->h, t->c);
        *total = 0.0;
        for (int64_t i = 0; i < n; i++) *total += t->c[i].w;
        return n;
    }
    n = gather_floor(row, bf16, v, t->bm, lo_x, t->c);
    if (n > k) { select_rank(t->c, n, k); n = k; }
    return to_weights(t->c, n, s, m, mp, total);
}

/* Top-p without top-k. The kept entries are the best ones up to the one where the mass in order
   crosses p * total (total: the row's mass after min-p): within the best k entries iff their
   mass exceeds p * total. Tried with the best TOP_P_FIRST (a cheap top-k selection) unless
   even weights of 1 (the best one's) could not add up to it; else by codes (or all entries, for
   a small vocabulary). A bfloat16 row of a large vocabulary goes by codes at once: its one
   counting pass costs less than the block maxima. -1: nothing finite. */
static int64_t top_p_row(const void *row, int bf16, int64_t v, float s, float p, float mp,
                         float u, scratch_t *t) {
    if (v > BY_CODES && bf16) return code_top_p(row, 1, v, s, mp, p, u, 0.0f, &t->h, t->c);
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
    if (v > BY_CODES) return code_top_p(row, 0, v, s, mp, p, u, m, &t->h, t->c);
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
        malloc(sizeof(cand_t) * (size_t)(v + 1)),
        codes_alloc(),
    };
    int rc = t.w && t.bm && t.c && t.h.count && t.h.mass && t.h.group ? 0 : -1;
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r, end; !rc && (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++)
            out[r] = filtered_row(ROW_AT(x, rows, r, row_bytes), bf16, v, scale[r],
                                  top_k ? top_k[r] : v, top_p ? top_p[r] : 1.0f,
                                  min_p ? min_p[r] : 0.0f, u[r], &t);
    free(t.w), free(t.bm), free(t.c), codes_free(&t.h);
    return rc;
}
