/* The logprobs kernel (`logprob_rows`): each row's log-softmax at the chosen token and its k best
   tokens, with filter.h's block maxima and top-k bounds.

   Why: `log_softmax` over [256, 32000] logits writes a 33 MB tensor (after a float32 copy of
   bfloat16 logits) only for `gather` and `topk` to read a few entries of it: ~12 ms a step on a
   2-core Zen 4. Here one pass gives the row maximum, the block maxima and the row's mass (as
   top-p takes them), log Z = max + ln(mass); the k best come from the entries at or above the
   k-th best block (or chunk) maximum, and only those entries are ordered. Values are x - log Z
   with the mass summed by `exp2_neg` (~1e-7 relative): float32 rounding, as PyTorch's. Ties
   rank by index, as everywhere in the sampler. */
#pragma once
#include "filter.h"
#define LOG2E_F 1.44269504f /* block_maxima at this scale: the mass of e^(x - max) */
/* The k best entries of a row (k <= v; logit in .w) into c[0, k), best first. */
static void best_k(const void *row, int bf16, int64_t v, int64_t k, float *bm, cand_t *c) {
    int64_t nb = (v + BLK - 1) / BLK, nc = (v + CH - 1) / CH;
    float lo_x = NEG_INF;
    if (k < nc) lo_x = kth_largest(bm + nb, nc, k, c);
    if (!(lo_x > NEG_INF) && k < nb) lo_x = kth_largest(bm, nb, k, c);
    int64_t n = gather_floor(row, bf16, v, bm, lo_x, c);
    if (n > k) select_rank(c, n, k);
    insertion_sort(c, 0, n < k ? n : k);
    for (int64_t i = n; i < k; i++) c[i].key = 0, c[i].w = NEG_INF; /* NaN rows: token 0 */
}

/* x and rows as in sample_rows; token [n] the chosen tokens; out: chosen [n], and with k > 0
   top_ids / top_lp [n, k], best first. */
int logprob_rows(const void *x, int bf16, int64_t v, const int64_t *rows, const int64_t *token,
                 int64_t k, float *chosen, int64_t *top_ids, float *top_lp, int64_t n,
                 int64_t *next, int64_t block) {
    float *bm = malloc(sizeof(float) * (size_t)((v + BLK - 1) / BLK + (v + CH - 1) / CH));
    cand_t *c = malloc(sizeof(cand_t) * (size_t)(v + 1));
    int rc = bm && c ? 0 : -1;
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r, end; !rc && (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++) {
            const void *row = ROW_AT(x, rows, r, row_bytes);
            double z = 0.0;
            float m = block_maxima(row, bf16, v, bm, bm + (v + BLK - 1) / BLK, LOG2E_F, &z);
            double log_z = m > NEG_INF && m < -NEG_INF ? m + __builtin_log(z) : m;
            float buf[1];
            chosen[r] = (float)(*chunk(row, bf16, token[r], 1, buf) - log_z);
            if (k <= 0) continue;
            best_k(row, bf16, v, k, bm, c);
            for (int64_t i = 0; i < k; i++) {
                top_ids[r * k + i] = KEY_TOKEN(c[i]);
                top_lp[r * k + i] = (float)(c[i].w - log_z);
            }
        }
    free(bm), free(c);
    return rc;
}

/* The chosen or prompt token's rank (`rank_rows`): its place in the row's order, by value and
   ties by index as everywhere in the sampler (1 = the best): the entries above its logit and the
   entries equal to it at or before its index. So it is the token's place in `best_k`'s list
   whatever k is (vLLM's `(x >= t).sum(-1)` ranks a tied token last, below its own top-k place:
   with bf16 logits a sampled token's rank then changed with the logprobs count). The log-softmax
   keeps the order, so the logits are compared as they are. One pass in chunks, rows as in
   logprob_rows; rank [n]. PyTorch's mask sums write [n, v] masks first: ~10x slower on the Xeon. */
int rank_rows(const void *x, int bf16, int64_t v, const int64_t *token, int64_t *rank, int64_t n,
              int64_t *next, int64_t block) {
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    float buf[CH];
    for (int64_t r, end; (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++) {
            const void *row = (const char *)x + r * row_bytes;
            float one[1];
            float t = *chunk(row, bf16, token[r], 1, one);
            int64_t count = 0, own = token[r];
            for (int64_t lo = 0; lo < v; lo += CH) {
                int64_t len = v - lo < CH ? v - lo : CH, last = own - lo; /* ties up to here */
                const float *c = chunk(row, bf16, lo, len, buf);
#pragma omp simd reduction(+ : count)
                for (int64_t j = 0; j < len; j++) count += (c[j] > t) | ((c[j] == t) & (j <= last));
            }
            rank[r] = count;
        }
    return 0;
}
