"""C source of the native CPU elementwise ops (see ``cpu_ops.py``): one call per op instead of
the 5-15 ATen calls the PyTorch versions make, with every rounding step of those calls kept.

bf16 values are widened to float32 (exact), each operation runs in float32 and its result is
rounded to bf16 to nearest even, as ATen's bf16 kernels do. The sum of squares of RMSNorm
follows ATen's ``cascade_sum`` for a contiguous last-dimension reduction (SumKernel.cpp: lanes of
``Vectorized<float>``, 4-way ILP, 4 levels of 16-step cascades), so the float32 result is the
one ``torch.sum`` gives on a CPU whose ATen capability has that many float lanes. Built with
-ffp-contract=off: no FMA contraction changes a rounding.
"""

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>

typedef uint16_t bf16;
#define MAXL 16
#define PAR(n) if ((n) > 64) num_threads(nt)

static inline float b2f(bf16 h) {
    union { uint32_t i; float f; } u = {(uint32_t)h << 16};
    return u.f;
}

/* c10::BFloat16's round-to-nearest-even; NaN -> 0x7FC0 (ATen's scalar path). */
static inline bf16 f2b(float f) {
    union { float f; uint32_t i; } u = {f};
    uint32_t r = (u.i + 0x7FFFu + ((u.i >> 16) & 1u)) >> 16;
    return f != f ? (bf16)0x7FC0 : (bf16)r;
}

static inline float rnd(float v, int bf) { return bf ? b2f(f2b(v)) : v; }

/* ---- silu(gate) * up for bf16: silu from a 65,536-entry table made by torch's own F.silu ---- */
void pagoda_silu_mul_bf16(bf16 *x, bf16 *out, const bf16 *table, int64_t t, int64_t n,
                          int64_t x_stride, int64_t out_stride, int nt) {
#pragma omp parallel for PAR(t)
    for (int64_t r = 0; r < t; r++) {
        bf16 *g = x + r * x_stride, *u = g + n, *o = out + r * out_stride;
        for (int64_t j = 0; j < n; j++) {
            bf16 s = table[g[j]];
            g[j] = s;
            o[j] = f2b(b2f(s) * b2f(u[j]));
        }
    }
}

/* ---- rotate-half rotary, each product, sum and difference rounded as torch rounds it ---- */
static void rope_row(void *xp, const void *cp, int64_t h, int64_t hs, int64_t half, int bf) {
    for (int64_t i = 0; i < h; i++) {
        if (bf) {
            bf16 *x1 = (bf16 *)xp + i * hs, *x2 = x1 + half;
            const bf16 *c = (const bf16 *)cp, *s = c + half;
            for (int64_t j = 0; j < half; j++) {
                float a = b2f(x1[j]), b = b2f(x2[j]), cj = b2f(c[j]), sj = b2f(s[j]);
                float n1 = rnd(rnd(a * cj, 1) - rnd(b * sj, 1), 1);
                float n2 = rnd(rnd(b * cj, 1) + rnd(a * sj, 1), 1);
                x1[j] = f2b(n1);
                x2[j] = f2b(n2);
            }
        } else {
            float *x1 = (float *)xp + i * hs, *x2 = x1 + half;
            const float *c = (const float *)cp, *s = c + half;
            for (int64_t j = 0; j < half; j++) {
                float a = x1[j], b = x2[j];
                float n1 = a * c[j] - b * s[j];
                float n2 = b * c[j] + a * s[j];
                x1[j] = n1;
                x2[j] = n2;
            }
        }
    }
}

/* x [t, h, d] (row stride rs, head stride hs, elements) rotated in place by cs [t, d] rows. */
void pagoda_rope(void *x, const void *cs, int bf, int64_t t, int64_t h, int64_t d, int64_t rs,
                 int64_t hs, int64_t cs_stride, int nt) {
    int64_t es = bf ? 2 : 4;
#pragma omp parallel for PAR(t)
    for (int64_t r = 0; r < t; r++)
        rope_row((char *)x + r * rs * es, (const char *)cs + r * cs_stride * es, h, hs, d / 2, bf);
}

/* ---- RMSNorm ---- */
#define INL static inline __attribute__((always_inline))
INL float sq_at(const void *x, int bf, int64_t i) {
    float v = bf ? b2f(((const bf16 *)x)[i]) : ((const float *)x)[i];
    return v * v;
}

/* acc += the squares of the l-lane vector at element offset o. */
INL void add_vec(float *acc, const void *x, int bf, int64_t o, int l) {
    for (int k = 0; k < l; k++) acc[k] += sq_at(x, bf, o + k);
}

static int64_t ceil_log2(int64_t v) {
    if (v <= 2) return 1;
    int64_t b = 0;
    for (uint64_t u = (uint64_t)(v - 1); u; u >>= 1) b++;
    return b;
}

/* ATen's multi_row_sum<Vectorized<float>, 4>: 4 interleaved l-lane accumulators over
   `size` groups of 4 vectors, with a 4-level cascade of 2^level_power steps. */
INL void multi_row_sum(float ret[4][MAXL], const void *x, int bf, int64_t size, int l) {
    const int64_t levels = 4, lp = ceil_log2(size) / 4 > 4 ? ceil_log2(size) / 4 : 4;
    const int64_t step = (int64_t)1 << lp, mask = step - 1;
    float acc[4][4][MAXL];
    memset(acc, 0, sizeof(acc));
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int r = 0; r < 4; r++) add_vec(acc[0][r], x, bf, (i * 4 + r) * l, l);
        for (int64_t j = 1; j < levels; j++) {
            for (int r = 0; r < 4; r++)
                for (int k = 0; k < l; k++) { acc[j][r][k] += acc[j - 1][r][k]; acc[j - 1][r][k] = 0; }
            if ((i & (mask << (j * lp))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int r = 0; r < 4; r++) add_vec(acc[0][r], x, bf, (i * 4 + r) * l, l);
    for (int64_t j = 1; j < levels; j++)
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < l; k++) acc[0][r][k] += acc[j][r][k];
    memcpy(ret, acc[0], sizeof(float) * 4 * MAXL);
}

/* ATen's vectorized_inner_sum of x*x over one row of n >= l elements (l float lanes). */
INL float sum_squares(const void *x, int bf, int64_t n, int l) {
    int64_t nvec = n / l, nilp = nvec / 4;
    float part[4][MAXL];
    multi_row_sum(part, x, bf, nilp, l);
    for (int64_t i = nilp * 4; i < nvec; i++) add_vec(part[0], x, bf, i * l, l);
    for (int r = 1; r < 4; r++)
        for (int k = 0; k < l; k++) part[0][k] += part[r][k];
    float acc = 0.0f;
    for (int64_t i = nvec * l; i < n; i++) acc += sq_at(x, bf, i);
    for (int k = 0; k < l; k++) acc += part[0][k];
    return 0.0f + acc;  /* the output starts at 0 and is accumulated into */
}

/* residual (if any) += x in place; out = round(x * rsqrt(mean(x^2) + eps)) * w, per row. */
void pagoda_rms_norm(void *x, void *res, const void *w, void *out, int bf, int64_t t, int64_t n,
                     int64_t x_stride, float eps, int lanes, int nt) {
    int64_t es = bf ? 2 : 4;
#pragma omp parallel for PAR(t)
    for (int64_t r = 0; r < t; r++) {
        char *xr = (char *)x + r * x_stride * es, *o = (char *)out + r * n * es;
        if (res) {
            char *rr = (char *)res + r * n * es;
            for (int64_t j = 0; j < n; j++) {
                if (bf) ((bf16 *)rr)[j] = f2b(b2f(((bf16 *)rr)[j]) + b2f(((bf16 *)xr)[j]));
                else ((float *)rr)[j] = ((float *)rr)[j] + ((float *)xr)[j];
            }
            xr = rr;
        }
        float ss = bf ? (lanes == 16 ? sum_squares(xr, 1, n, 16) : sum_squares(xr, 1, n, 8))
                      : (lanes == 16 ? sum_squares(xr, 0, n, 16) : sum_squares(xr, 0, n, 8));
        float mean = ss / (float)n;
        float inv = 1.0f / sqrtf(mean + eps);
        for (int64_t j = 0; j < n; j++) {
            if (bf) {
                float y = b2f(f2b(b2f(((bf16 *)xr)[j]) * inv));
                ((bf16 *)o)[j] = f2b(y * b2f(((const bf16 *)w)[j]));
            } else {
                ((float *)o)[j] = ((float *)xr)[j] * inv * ((const float *)w)[j];
            }
        }
    }
}
"""
