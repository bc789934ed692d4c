/* Apply token bitmasks to logits in place: one pass per constrained row, a word of 32 entries
   at a time. xgrammar's layout: bit j % 32 of int32 word j / 32 is 1 where token j is allowed.
   A word of all ones is skipped, a word of zeros is filled with -inf without looking at bits
   (between JSON values nearly every word is one or the other), only mixed words test each bit.

   x: logits [., v], float32 (bf16 = 0) or bfloat16 (bf16 = 1), rows contiguous;
   mask: [n, words] int32, row r for the logits row rows[r]. */
#include <stdint.h>

#define F32_NEG_INF 0xFF800000u
#define BF16_NEG_INF 0xFF80u

int apply_mask(void *x, int bf16, int64_t v, const int32_t *mask, int64_t words,
               const int64_t *rows, int64_t n) {
    for (int64_t r = 0; r < n; r++) {
        const uint32_t *m = (const uint32_t *)(mask + r * words);
        uint32_t *f = bf16 ? 0 : (uint32_t *)x + rows[r] * v;
        uint16_t *h = bf16 ? (uint16_t *)x + rows[r] * v : 0;
        for (int64_t w = 0; w < words; w++) {
            uint32_t bits = m[w];
            if (bits == 0xFFFFFFFFu) continue;
            int64_t lo = w * 32, hi = lo + 32 < v ? lo + 32 : v;
            if (bf16) {
                for (int64_t j = lo; j < hi; j++)
                    if (!((bits >> (j - lo)) & 1u)) h[j] = BF16_NEG_INF;
            } else {
                for (int64_t j = lo; j < hi; j++)
                    if (!((bits >> (j - lo)) & 1u)) f[j] = F32_NEG_INF;
            }
        }
    }
    return 0;
}
