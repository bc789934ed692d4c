/* One decode step of Mamba2's selective state update, in place in the state slots, float32.
 *
 * For each sequence s (its slot slots[s]) and head h, with the head's group g = h / (H / G):
 *   dA = exp(dt[s,h] * A[h])
 *   state[slot, h, p, n] = state[slot, h, p, n] * dA + (dt[s,h] * x[s,h,p]) * B[s,g,n]
 *   y[s,h,p] = sum_n state[slot, h, p, n] * C[s,g,n] + x[s,h,p] * D[h]
 * (transformers' `mamba2_selective_state_update`; the torch reference is
 * `model/mamba2.recurrent_step`). One pass over the state: the torch version makes three.
 * Built with -ffp-contract=off: each product and sum rounded as the torch ops round them (the
 * read-out's sum runs in n order, where torch's matmul picks its own).
 */
#include <math.h>
#include <stdint.h>

void mamba_ssm_step(float *state, const int64_t *slots, int64_t S, int64_t H, int64_t P,
                    int64_t N, int64_t G, const float *x, const float *dt, const float *A,
                    const float *B, const float *C, const float *D, float *y) {
    const int64_t per_group = H / G;
#pragma omp parallel for collapse(2) schedule(static) if (S * H * P * N > 65536)
    for (int64_t s = 0; s < S; s++) {
        for (int64_t h = 0; h < H; h++) {
            const float d = dt[s * H + h];
            const float dA = expf(d * A[h]);
            const int64_t g = h / per_group;
            const float *b = B + (s * G + g) * N;
            const float *c = C + (s * G + g) * N;
            float *st = state + (slots[s] * H + h) * P * N;
            const float *xs = x + (s * H + h) * P;
            float *ys = y + (s * H + h) * P;
            for (int64_t p = 0; p < P; p++) {
                const float dx = d * xs[p];
                float *row = st + p * N;
                float acc = 0.0f;
                for (int64_t n = 0; n < N; n++) {
                    const float v = row[n] * dA + dx * b[n];
                    row[n] = v;
                    acc += v * c[n];
                }
                ys[p] = acc + xs[p] * D[h];
            }
        }
    }
}
