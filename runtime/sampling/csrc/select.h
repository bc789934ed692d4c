/* The sampler's selection primitives: candidates ordered by rank key, and weighted quickselect,
   for the row strategies of filter.h (top-k / top-p / min-p) and logprobs.h.

   The order: by logit descending, then by index ascending (torch.sort's order among equal logits
   is unspecified; any order gives the same distribution over logit values, this one is
   reproducible). A selection by mass ("the candidate whose cumulative interval in key order holds
   a target") is a quickselect: partition, sum the better side's mass, descend where the target
   is. Sums are in double. */
#pragma once
#include <stdint.h>
#include <string.h>
typedef struct { uint64_t key; float w; } cand_t; /* w: the logit until weights are known */

/* Ascending key = descending logit, then ascending index (-0.0 counts as 0.0). */
static inline uint64_t rank_key(float x, int64_t j) {
    union { float f; uint32_t i; } u = {x + 0.0f};
    uint32_t up = u.i ^ ((uint32_t)((int32_t)u.i >> 31) | 0x80000000u); /* ascending with x */
    return ((uint64_t)~up << 32) | (uint32_t)j;
}

static inline void swap_c(cand_t *a, cand_t *b) { cand_t t = *a; *a = *b; *b = t; }

/* Puts a median-of-three pivot of c[lo, hi) (hi - lo >= 2, distinct keys) at its sorted place,
   smaller keys before it and larger after; returns its position, *left the smaller ones' mass.
   Branch-free (Lomuto, always swapping): the comparisons are coin flips to a branch predictor. */
static int64_t partition(cand_t *c, int64_t lo, int64_t hi, double *left) {
    int64_t mid = lo + (hi - lo) / 2, last = hi - 1, i = lo;
    if (c[mid].key < c[lo].key) swap_c(&c[mid], &c[lo]);
    if (c[last].key < c[lo].key) swap_c(&c[last], &c[lo]);
    if (c[mid].key < c[last].key) swap_c(&c[mid], &c[last]);
    uint64_t pk = c[last].key;
    double mass = 0.0;
    for (int64_t j = lo; j < last; j++) {
        cand_t x = c[j];
        int64_t smaller = x.key < pk;
        c[j] = c[i];
        c[i] = x;
        i += smaller;
        mass += smaller ? (double)x.w : 0.0;
    }
    swap_c(&c[i], &c[last]);
    *left = mass;
    return i;
}

/* Reorders c[0, n) so that c[0, k) holds the k smallest keys (0 < k < n). */
static void select_rank(cand_t *c, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n;
    double left;
    while (hi - lo > 1) {
        int64_t p = partition(c, lo, hi, &left);
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
        double left;
        int64_t p = partition(c, lo, hi, &left);
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

#define KEY_TOKEN(cand) ((int64_t)(uint32_t)(cand).key) /* the vocabulary index in a key */
