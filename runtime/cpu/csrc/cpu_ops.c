/* The native CPU elementwise ops (bound by `pagoda.runtime.cpu.ops`): one call per op instead of
   the 5-15 ATen calls the PyTorch versions make, with every rounding step of those calls kept.

   bf16 values are widened to float32 (exact), each operation runs in float32 and its result is
   rounded to bf16 to nearest even, as ATen's bf16 kernels do. The sum of squares of RMSNorm
   follows ATen's `cascade_sum` for a contiguous last-dimension reduction (SumKernel.cpp: lanes of
   `Vectorized<float>`, 4-way ILP, 4 levels of 16-step cascades), so the float32 result is the
   one `torch.sum` gives when its sum kernel has that many float lanes. The float32 silu uses
   Sleef's xexpf with explicit `fmaf` where Sleef's AVX2/AVX-512 builds use FMA. Built with
   -ffp-contract=off: no other FMA contraction changes a rounding (-fno-trapping-math only lets
   the compiler if-convert, so those loops vectorise; it changes no value). */
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

/* ---- silu(gate) * up for bf16: silu from a 65,536-entry table made by torch's own F.silu,
   held as float32 (exact: every entry is a bf16 value) so the loop vectorises to gathers ---- */
static void silu_mul_row(bf16 *restrict g, const bf16 *restrict u, bf16 *restrict o,
                         const float *restrict table, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float s = table[g[j]];
        union { float f; uint32_t i; } v = {s};
        g[j] = (bf16)(v.i >> 16);
        o[j] = f2b(s * b2f(u[j]));
    }
}

void pagoda_silu_mul_bf16(bf16 *x, bf16 *out, const float *table, int64_t t, int64_t n,
                          int64_t x_stride, int64_t out_stride, int nt) {
#pragma omp parallel for PAR(t)
    for (int64_t r = 0; r < t; r++)
        silu_mul_row(x + r * x_stride, x + r * x_stride + n, out + r * out_stride, table, n);
}

/* ---- silu(gate) * up for float32, as ATen computes it: x / (1 + exp(-x)), where exp is
   Sleef_expf{8,16}_u10 (its xexpf, FMA, lane by lane here) for elements ATen's vector loop
   covers and libm's expf for the scalar tail of each contiguous segment it is handed. ---- */
static inline float u2f(uint32_t i) { union { uint32_t i; float f; } u = {i}; return u.f; }

static inline float sleef_expf(float d) {
    const float r_ln2 = 1.442695040888963407359924681001892137426645954152985934135449406931f;
    const float l2u = 0.693145751953125f, l2l = 1.428606765330187045e-06f;
    float y = rintf(d * r_ln2);
    /* out of range or NaN, q cannot change the result (set by the last two lines, or NaN) */
    int32_t q = (int32_t)(y > -1e9f && y < 1e9f ? y : 0.0f);
    float qf = (float)q;
    float s = fmaf(qf, -l2u, d);
    s = fmaf(qf, -l2l, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    int32_t h = q >> 1;
    u = u * u2f((uint32_t)(h + 0x7f) << 23);
    u = u * u2f((uint32_t)(q - h + 0x7f) << 23);
    u = d < -104.0f ? 0.0f : u;
    return 100.0f < d ? INFINITY : u;
}

static void silu_mul_f32_vec(float *restrict g, const float *restrict u, float *restrict o,
                             int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float s = g[j] / (1.0f + sleef_expf(-g[j]));
        g[j] = s;
        o[j] = s * u[j];
    }
}

__attribute__((noinline)) static void silu_mul_f32_libm(float *g, const float *u, float *o,
                                                        int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float s = g[j] / (1.0f + expf(-g[j]));
        g[j] = s;
        o[j] = s * u[j];
    }
}

/* Row r of [t, n]: ATen hands its vector loop the segments between multiples of `chunk` (its
   per-thread ranges over the t*n elements); each runs whole blocks of `block` elements through
   the vector code and the rest through the scalar code. */
static void silu_mul_f32_row(float *g, const float *u, float *o, int64_t r, int64_t n,
                             int64_t chunk, int64_t block) {
    int64_t a = r * n, end = a + n;
    while (a < end) {
        int64_t b = (a / chunk + 1) * chunk;
        b = b < end ? b : end;
        int64_t v = a + (b - a) / block * block, off = a - r * n;
        silu_mul_f32_vec(g + off, u + off, o + off, v - a);
        silu_mul_f32_libm(g + off + (v - a), u + off + (v - a), o + off + (v - a), b - v);
        a = b;
    }
}

void pagoda_silu_mul_f32(float *x, float *out, int64_t t, int64_t n, int64_t x_stride,
                         int64_t out_stride, int64_t chunk, int64_t block, int nt) {
#pragma omp parallel for PAR(t)
    for (int64_t r = 0; r < t; r++)
        silu_mul_f32_row(x + r * x_stride, x + r * x_stride + n, out + r * out_stride, r, n,
                         chunk, block);
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

INL float sum_sq(const void *x, int bf, int64_t n, int lanes) {
    if (bf) return lanes == 16 ? sum_squares(x, 1, n, 16) : sum_squares(x, 1, n, 8);
    return lanes == 16 ? sum_squares(x, 0, n, 16) : sum_squares(x, 0, n, 8);
}

/* One row: residual (if any) += x in place, then out = round(x * inv) * w (bf16). */
static void norm_row_bf16(const bf16 *restrict x, bf16 *restrict res, const bf16 *restrict w,
                          bf16 *restrict o, int64_t n, float eps, int lanes) {
    if (res) {
        for (int64_t j = 0; j < n; j++) res[j] = f2b(b2f(res[j]) + b2f(x[j]));
        x = res;
    }
    float inv = 1.0f / sqrtf(sum_sq(x, 1, n, lanes) / (float)n + eps);
    for (int64_t j = 0; j < n; j++) o[j] = f2b(b2f(f2b(b2f(x[j]) * inv)) * b2f(w[j]));
}

static void norm_row_f32(const float *restrict x, float *restrict res, const float *restrict w,
                         float *restrict o, int64_t n, float eps, int lanes) {
    if (res) {
        for (int64_t j = 0; j < n; j++) res[j] = res[j] + x[j];
        x = res;
    }
    float inv = 1.0f / sqrtf(sum_sq(x, 0, n, lanes) / (float)n + eps);
    for (int64_t j = 0; j < n; j++) o[j] = x[j] * inv * w[j];
}

/* residual (if any) += x in place; out = round(x * rsqrt(mean(x^2) + eps)) * w, per row. */
void pagoda_rms_norm(void *x, void *res, const void *w, void *out, int bf, int64_t t, int64_t n,
                     int64_t x_stride, float eps, int lanes, int nt) {
#pragma omp parallel for PAR(t)
    for (int64_t r = 0; r < t; r++) {
        if (bf)
            norm_row_bf16((const bf16 *)x + r * x_stride, res ? (bf16 *)res + r * n : 0,
                          (const bf16 *)w, (bf16 *)out + r * n, n, eps, lanes);
        else
            norm_row_f32((const float *)x + r * x_stride, res ? (float *)res + r * n : 0,
                         (const float *)w, (float *)out + r * n, n, eps, lanes);
    }
}
