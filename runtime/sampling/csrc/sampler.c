/* The native sampler: one library of C kernels over [n, v] float32 or bfloat16 logits, called
   through ctypes by `pagoda.runtime.sampling.native` (which builds this file). Exported:
   sample_rows (whole-vocabulary draws, min-p), argmax_rows, sample_filtered_rows (top-k /
   top-p / min-p, filter.h) and logprob_rows (logprobs.h). Each takes the row range to work on
   through the shared counter of claim.h: the caller's threads claim blocks of rows. */
#include "rows.h"
int sample_rows(const void *x, int bf16, int64_t v, const int64_t *rows, const float *scale,
                const float *min_p, const float *u, int64_t *out, int64_t n, int64_t *next,
                int64_t block) {
    float *w = malloc(sizeof(float) * (size_t)(v + 2 * ((v + CH - 1) / CH)));
    if (!w) return -1;
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r, end; (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++)
            out[r] = sample_row(ROW_AT(x, rows, r, row_bytes), bf16, v, scale[r],
                                min_p ? min_p[r] : 0.0f, u[r], w);
    free(w);
    return 0;
}

int argmax_rows(const void *x, int bf16, int64_t v, int64_t *out, int64_t n, int64_t *next,
                int64_t block) {
    size_t row_bytes = (size_t)v * (bf16 ? 2 : 4);
    for (int64_t r, end; (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++) out[r] = row_argmax((const char *)x + r * row_bytes, bf16, v);
    return 0;
}

#include "filter.h"
#include "logprobs.h"
