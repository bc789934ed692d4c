/* The sampler's row helpers: chunked row maxima and exp2 sums, one-uniform sampling of a whole
   row (`sample_row`), the greedy argmax (`row_argmax`), and what the top-k/top-p (filter.h),
   logit-code (codes.h) and logprob (logprobs.h) kernels share (chunk, span_*, claim, ROW_AT).

   A row is read once per draw: per CH-entry chunk, its maximum and its sum of exp2 relative to
   the running maximum while the chunk is in L1 (rescaled to the row maximum at the end, as
   online softmax does), then a walk of the cumulative sums picks the chunk and the token. Rows
   are float32 or bfloat16 (bf16 widens exactly, so the tokens are the same as from the float32
   copy). The greedy argmax reads each row once with AVX-512 where the build has it (span
   maxima in four registers, then the first equal entry of the best span). */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#define CH 256 /* entries per chunk; at 128, per-chunk reductions cost ~25% more */
#define NEG_INF (-__builtin_inff())
#include "claim.h"
/* 2^y to ~1e-7 relative error for y <= 0 (0 below 2^-127): 2^round(y) from the exponent bits
   times a minimax polynomial of the fraction in [-0.5, 0.5]. Inline, so the loops vectorise. */
static inline float exp2_neg(float y) {
    y = y > -127.0f ? y : -127.0f;
    float n = __builtin_floorf(y + 0.5f), f = y - n;
    float p = 1.5345810970757157e-04f;
    p = p * f + 1.3399930903688073e-03f;
    p = p * f + 9.6184890717267990e-03f;
    p = p * f + 5.5503286421298980e-02f;
    p = p * f + 2.4022646248340607e-01f;
    p = p * f + 6.9314718246459961e-01f;
    p = p * f + 1.0f;
    union { int32_t i; float f; } scale = {((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* Entries [lo, lo + len) of a float32 row, or of a bfloat16 row widened into buf (bfloat16 is
   the upper half of a float32: exact). Everything below works on float32 chunks. */
static const float *chunk(const void *row, int bf16, int64_t lo, int64_t len, float *buf) {
    if (!bf16) return (const float *)row + lo;
    const uint16_t *h = (const uint16_t *)row + lo;
#pragma omp simd
    for (int64_t j = 0; j < len; j++) {
        union { uint32_t i; float f; } u = {(uint32_t)h[j] << 16};
        buf[j] = u.f;
    }
    return buf;
}

/* +inf, in a register the optimiser cannot see into: `x < top ? x : top` then compiles to one
   min instruction (a NaN compares false: +inf), where GCC rewrites `x < +inf` as
   `x <= FLT_MAX` and emits a compare and a blend (float32 draws ~3 % slower). */
static inline float opaque_inf(void) {
    float top = -NEG_INF;
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(top));
#endif
    return top;
}

/* The maximum of x[0, n), a NaN counting as +inf: PyTorch's maxima propagate NaN, so a row
   holding one has no finite maximum here too (its token: -1), for one min per vector. */
static float span_max(const float *x, int64_t n) {
    float m = NEG_INF, top = opaque_inf();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; j++) {
        float y = x[j] < top ? x[j] : top;
        m = y > m ? y : m;
    }
    return m;
}

static float span_sum(const float *x, int64_t n, float s, float b) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; j++) acc += exp2_neg(x[j] * s + b);
    return acc;
}

/* w = 2^(x*s + b), zeroed below mp; returns their sum. */
static float span_weights(const float *restrict x, int64_t n, float s, float b, float mp,
                          float *restrict w) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; j++) {
        float e = exp2_neg(x[j] * s + b);
        w[j] = e >= mp ? e : 0.0f;
        acc += w[j];
    }
    return acc;
}

static inline int64_t span_len(int64_t v, int64_t lo) { return v - lo < CH ? v - lo : CH; }

#ifdef __AVX512F__
#include <immintrin.h>
#define ARGMAX_SPAN 2048  /* entries per maximum: horizontal reductions stay rare */
/* x with NaN lanes as +inf: min returns its second operand when either is NaN (max would drop
   the NaN the same way, so it goes through this first). */
#define NAN_AS_INF(x) _mm512_min_ps((x), _mm512_set1_ps(-NEG_INF))
/* Maximum of entries [lo, lo + n) of a row, widened in registers: four accumulators, and a
   bfloat16 pair per 32-bit lane split by a shift and a mask (max ignores the order); a NaN
   counts as +inf (`span_max`). */
static float span_max_raw(const void *row, int bf16, int64_t lo, int64_t n) {
    __m512 a = _mm512_set1_ps(NEG_INF), b = a, c = a, d = a;
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    int64_t j = 0;
    if (bf16) {
        const uint16_t *h = (const uint16_t *)row + lo;
        for (; j + 64 <= n; j += 64) {
            __m512i x = _mm512_loadu_si512(h + j), y = _mm512_loadu_si512(h + j + 32);
            a = _mm512_max_ps(NAN_AS_INF(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16))), a);
            b = _mm512_max_ps(NAN_AS_INF(_mm512_castsi512_ps(_mm512_and_si512(x, hi))), b);
            c = _mm512_max_ps(NAN_AS_INF(_mm512_castsi512_ps(_mm512_slli_epi32(y, 16))), c);
            d = _mm512_max_ps(NAN_AS_INF(_mm512_castsi512_ps(_mm512_and_si512(y, hi))), d);
        }
    } else {
        const float *f = (const float *)row + lo;
        for (; j + 64 <= n; j += 64) {
            a = _mm512_max_ps(NAN_AS_INF(_mm512_loadu_ps(f + j)), a);
            b = _mm512_max_ps(NAN_AS_INF(_mm512_loadu_ps(f + j + 16)), b);
            c = _mm512_max_ps(NAN_AS_INF(_mm512_loadu_ps(f + j + 32)), c);
            d = _mm512_max_ps(NAN_AS_INF(_mm512_loadu_ps(f + j + 48)), d);
        }
    }
    float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a, b), _mm512_max_ps(c, d)));
    float buf[64];
    const float *t = chunk(row, bf16, lo + j, n - j, buf);
    float tm = span_max(t, n - j);
    return tm > m ? tm : m;
}
/* First index in [lo, lo + n) whose entry equals x, or -1. */
static int64_t span_find(const void *row, int bf16, int64_t lo, int64_t n, float x) {
    const __m512 want = _mm512_set1_ps(x);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                              _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + lo + j))), 16))
                        : _mm512_loadu_ps((const float *)row + lo + j);
        __mmask16 k = _mm512_cmp_ps_mask(v, want, _CMP_EQ_OQ);
        if (k) return j + __builtin_ctz(k);
    }
    float buf[16];
    const float *t = chunk(row, bf16, lo + j, n - j, buf);
    for (int64_t i = 0; i < n - j; i++)
        if (t[i] == x) return j + i;
    return -1;
}
#else
#define ARGMAX_SPAN CH
static float span_max_raw(const void *row, int bf16, int64_t lo, int64_t n) {
    float buf[CH];
    return span_max(chunk(row, bf16, lo, n, buf), n);
}
static int64_t span_find(const void *row, int bf16, int64_t lo, int64_t n, float x) {
    float buf[CH];
    const float *c = chunk(row, bf16, lo, n, buf);
    for (int64_t j = 0; j < n; j++)
        if (c[j] == x) return j;
    return -1;
}
#endif

/* First index of the row maximum (as torch.argmax): span maxima, then inside the best span.
   A row with no finite maximum (a NaN anywhere, counted as +inf as PyTorch's maxima propagate
   it; all -inf; a +inf: an overflow) gives -1, which the engine reads as "no token" and ends
   the request with an error. */
static int64_t row_argmax(const void *row, int bf16, int64_t v) {
    float best = NEG_INF;
    int64_t at = 0;
    for (int64_t lo = 0; lo < v; lo += ARGMAX_SPAN) {
        float m = span_max_raw(row, bf16, lo, v - lo < ARGMAX_SPAN ? v - lo : ARGMAX_SPAN);
        if (m > best) { best = m; at = lo; }
    }
    if (!(best > NEG_INF && best < -NEG_INF)) return -1;
    int64_t j = span_find(row, bf16, at, v - at < ARGMAX_SPAN ? v - at : ARGMAX_SPAN, best);
    return j < 0 ? 0 : at + j;
}

/* Chunk sums of 2^((x - max) * s) in one pass over the row (no min-p): each chunk is summed
   relative to the running maximum while it is in L1, and rescaled to the row maximum at the
   end; a chunk whose best weight underflows (2^-127 and below are 0 here) sums to 0. */
static double online_sums(const void *row, int bf16, int64_t v, float s, float *sums,
                          float *maxes, float *row_max) {
    float buf[CH], m = NEG_INF;
    int64_t nc = 0;
    for (int64_t lo = 0; lo < v; lo += CH, nc++) {
        int64_t len = span_len(v, lo);
        const float *c = chunk(row, bf16, lo, len, buf);
        float cm = span_max(c, len);
        m = cm > m ? cm : m;
        maxes[nc] = m;
        sums[nc] = (cm - m) * s > -127.0f ? span_sum(c, len, s, -m * s) : 0.0f;
    }
    double total = 0.0;
    for (int64_t k = 0; k < nc; k++) {
        sums[k] *= exp2_neg((maxes[k] - m) * s);
        total += sums[k];
    }
    *row_max = m;
    return total;
}

/* With min-p: the row maximum first (the threshold is relative to it), then weights and sums. */
static double min_p_sums(const void *row, int bf16, int64_t v, float s, float mp, float *w,
                         float *sums, float *row_max) {
    float buf[CH], m = NEG_INF;
    for (int64_t lo = 0; lo < v; lo += CH) {
        float cm = span_max(chunk(row, bf16, lo, span_len(v, lo), buf), span_len(v, lo));
        m = cm > m ? cm : m;
    }
    double total = 0.0;
    for (int64_t lo = 0, c = 0; lo < v; lo += CH, c++) {
        int64_t len = span_len(v, lo);
        sums[c] = span_weights(chunk(row, bf16, lo, len, buf), len, s, -m * s, mp, w + lo);
        total += sums[c];
    }
    *row_max = m;
    return total;
}

/* The entry whose cumulative interval holds target (acc: the mass before w[0]); rounding never
   picks an entry of weight zero; -1 when every weight is zero. */
static int64_t pick(const float *w, int64_t n, double target, double *acc) {
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (w[j] > 0.0f) {
            last = j;
            if (*acc + w[j] > target) return j;
            *acc += w[j];
        }
    }
    return last;
}

/* A token from weights 2^((x - max) * s) (weights below mp dropped) with the uniform u; a row
   with no finite maximum gets -1 (`row_argmax`). w: v + 2 * chunks floats of scratch. */
static int64_t sample_row(const void *row, int bf16, int64_t v, float s, float mp, float u,
                          float *w) {
    int64_t nc = (v + CH - 1) / CH;
    float *sums = w + v, *maxes = sums + nc, m, buf[CH];
    double total = mp > 0.0f ? min_p_sums(row, bf16, v, s, mp, w, sums, &m)
                             : online_sums(row, bf16, v, s, sums, maxes, &m);
    if (!(m > NEG_INF && m < -NEG_INF)) return -1;
    double acc = 0.0, target = u * total;
    int64_t c = total > 0.0 && total < __builtin_inf() ? pick(sums, nc, target, &acc) : -1;
    int64_t at = -1;
    if (c >= 0) {
        int64_t lo = c * CH, len = span_len(v, lo);
        if (mp <= 0.0f) /* the online pass stored no weights: the chosen chunk's, now */
            span_weights(chunk(row, bf16, lo, len, buf), len, s, -m * s, 0.0f, w + lo);
        at = pick(w + lo, len, target, &acc);
    }
    return at < 0 ? row_argmax(row, bf16, v) : c * CH + at;
}

/* x [., v] float32 (bf16 = 0) or bfloat16 (bf16 = 1); item r is the row rows[r] of x (rows
   NULL: row r), the other arrays [n] per item. */
#define ROW_AT(x, rows, r, row_bytes) ((const char *)(x) + ((rows) ? (rows)[r] : (r)) * (row_bytes))
