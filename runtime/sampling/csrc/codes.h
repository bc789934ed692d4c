/* Selection by logit codes: top-p of a large vocabulary and large top-k, for filter.h.

   A row with a large kept set (a flat top-p row keeps thousands of tokens) cannot be ordered
   cheaply, but it need not be: every logit has a 16-bit code (the upper half of its float32 bits,
   sign-ordered), and codes are ordered as the logits are. One pass counts the row's entries per
   code; walking the codes down from the highest, by their mass, finds the code where top-p's cut
   falls, then the code the draw falls in. The entries of a bfloat16 code are equal, so the
   position inside it is arithmetic and the token is one scan for that code's n-th entry: a
   bfloat16 row is read twice, with no other pass (no block maxima, no row mass first). A float32
   code holds different values, so a float32 row comes after the filter's block-maxima pass (and
   its try of the best 64 entries), sums its weights per code, and orders only the cut's and the
   draw's codes' entries (a few dozen on a flat row) by quickselect. Top-k above the block
   bounds walks the counts to the code of the k-th entry.

   Masses are counts times a weight, or sums of weights, in double: exact for equal weights, so a
   bfloat16 row and its float32 widening give the same token. The order inside a code is the
   candidates' (logit descending, then index ascending: select.h). Walks pass 16
   codes at a time by their sum, and jump over the empty codes around zero (the codes of tiny
   magnitudes: half of all codes). Against the mass-bin histogram this replaced (whose cut bin held
   thousands of entries to gather and order), [256, 32000] bf16 rows at top-p 0.9 on a Zen 4:
   2.3-4.9x faster on flat rows, 1.3x on peaked ones; float32 rows within +-6 % (their weights
   are summed per code in double, a scatter of adds the count pass of bf16 rows does not need). */
#pragma once
#include "rows.h"
#include "select.h"
#define CODES 65536 /* 16-bit codes (0xffff, a NaN's, also takes the non-finite entries) */
#define GRP 16 /* codes per group: walks pass whole groups by their sums */
#define INF_CODE 0xff80u /* +inf's code, the highest but NaN's */
enum { BY_COUNT, BY_WEIGHT, BY_MASS }; /* a code's value in a walk: its count, count times its
                                          weight (bfloat16), its summed weights (float32) */
/* Per thread; count and mass are zero between rows (each row clears what it touched). */
typedef struct {
    uint32_t *count, low, high; /* the lowest code, the highest one (+inf's for a NaN) */
    uint32_t gap_lo, gap_hi; /* no entry has a code strictly between: the codes near zero */
    double *mass, *group; /* group: the sums of `group_sums` */
} codes_t;

/* Ascending with x (-0.0 as 0.0): the upper 16 bits of its float32, sign-ordered. */
static inline uint32_t code_of(float x) {
    union { float f; uint32_t i; } u = {x + 0.0f};
    uint32_t h = u.i >> 16;
    return h ^ ((uint32_t)(-(int32_t)(h >> 15)) & 0x7fffu) ^ 0x8000u;
}

/* The bits of the upper half of code o's values (a bfloat16 row's entries of that code). */
static inline uint16_t code_bits(uint32_t o) {
    return (uint16_t)(o ^ 0x8000u ^ (((o >> 15) ^ 1u) * 0x7fffu));
}

static inline float code_value(uint32_t o) {
    union { uint32_t i; float f; } u = {(uint32_t)code_bits(o) << 16};
    return u.f;
}

/* Codes of a bfloat16 span from its raw bits: non-finite entries get 0xffff (a NaN's code,
   above every code read); folds the span into the bounds b[4]: lowest code, highest code with
   a NaN counted as +inf (PyTorch's maxima propagate NaN: such a row has no finite maximum,
   no token), highest negative, lowest non-negative. */
static void bf16_codes_tail(const uint16_t *r, int64_t len, uint16_t *code, uint16_t *b) {
    uint32_t cl = 0xffff, ch = 0, cn = 0, cp = 0xffff;
#pragma omp simd reduction(min : cl, cp) reduction(max : ch, cn)
    for (int64_t i = 0; i < len; i++) {
        uint32_t h = r[i], mag = h & 0x7fffu;
        uint32_t o = mag ? h ^ (0x8000u | ((h >> 15) * 0x7fffu)) : 0x8000u; /* -0.0: 0.0 */
        uint32_t hn = mag <= 0x7f80u ? o : INF_CODE, nn = o < 0x8000u ? o : 0;
        uint32_t pp = o >= 0x8000u ? o : 0xffffu;
        cl = o < cl ? o : cl, ch = hn > ch ? hn : ch, cn = nn > cn ? nn : cn;
        cp = pp < cp ? pp : cp;
        code[i] = (uint16_t)(mag < 0x7f80u ? o : 0xffffu);
    }
    b[0] = cl < b[0] ? cl : b[0], b[1] = ch > b[1] ? ch : b[1];
    b[2] = cn > b[2] ? cn : b[2], b[3] = cp < b[3] ? cp : b[3];
}
#ifdef __AVX512BW__
/* The same, 32 codes to a vector in 16-bit lanes (the portable loop widens to 32-bit lanes). */
static void bf16_codes(const uint16_t *r, int64_t len, uint16_t *code, uint16_t *b) {
    const __m512i top = _mm512_set1_epi16((short)0x8000), ones = _mm512_set1_epi16(-1);
    const __m512i low7 = _mm512_set1_epi16(0x7fff), inf = _mm512_set1_epi16(0x7f80);
    const __m512i pinf = _mm512_set1_epi16((short)INF_CODE);
    __m512i cl = ones, ch = _mm512_setzero_si512(), cn = ch, cp = ones;
    int64_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m512i h = _mm512_loadu_si512(r + i), mag = _mm512_and_si512(h, low7);
        __mmask32 neg = _mm512_cmpge_epu16_mask(h, top), zero = _mm512_testn_epi16_mask(mag, mag);
        __m512i o = _mm512_xor_si512(h, _mm512_mask_blend_epi16(neg, top, ones));
        o = _mm512_mask_mov_epi16(o, zero, top); /* -0.0 and 0.0: 0x8000 */
        __mmask32 below = _mm512_cmplt_epu16_mask(o, top);
        cl = _mm512_min_epu16(cl, o);
        ch = _mm512_max_epu16(ch, _mm512_mask_mov_epi16(pinf, _mm512_cmple_epu16_mask(mag, inf), o));
        cn = _mm512_mask_max_epu16(cn, below, cn, o);
        cp = _mm512_mask_min_epu16(cp, ~below, cp, o);
        __mmask32 finite = _mm512_cmplt_epu16_mask(mag, inf);
        _mm512_storeu_si512(code + i, _mm512_mask_mov_epi16(ones, finite, o));
    }
    uint16_t l[4][32];
    _mm512_storeu_si512(l[0], cl), _mm512_storeu_si512(l[1], ch);
    _mm512_storeu_si512(l[2], cn), _mm512_storeu_si512(l[3], cp);
    for (int k = 0; k < 32; k++) {
        b[0] = l[0][k] < b[0] ? l[0][k] : b[0], b[1] = l[1][k] > b[1] ? l[1][k] : b[1];
        b[2] = l[2][k] > b[2] ? l[2][k] : b[2], b[3] = l[3][k] < b[3] ? l[3][k] : b[3];
    }
    if (i < len) bf16_codes_tail(r + i, len - i, code + i, b);
}
#else
#define bf16_codes bf16_codes_tail
#endif

/* The same for a float32 span (the upper halves' codes), non-finite entries to 0xffff too. */
static void f32_codes(const float *x, int64_t len, uint16_t *code, uint16_t *b) {
    uint32_t cl = 0xffff, ch = 0, cn = 0, cp = 0xffff;
#pragma omp simd reduction(min : cl, cp) reduction(max : ch, cn)
    for (int64_t i = 0; i < len; i++) {
        uint32_t o = code_of(x[i]);
        uint32_t hn = x[i] == x[i] ? o : INF_CODE, nn = o < 0x8000u ? o : 0;
        uint32_t pp = o >= 0x8000u ? o : 0xffffu;
        cl = o < cl ? o : cl, ch = hn > ch ? hn : ch, cn = nn > cn ? nn : cn;
        cp = pp < cp ? pp : cp;
        code[i] = (uint16_t)(x[i] > NEG_INF && x[i] < -NEG_INF ? o : 0xffffu);
    }
    b[0] = cl < b[0] ? cl : b[0], b[1] = ch > b[1] ? ch : b[1];
    b[2] = cn > b[2] ? cn : b[2], b[3] = cp < b[3] ? cp : b[3];
}

/* Counts, or (masses) the weights 2^(x s + b) from mp, per code of the row's finite entries;
   sets low, high and the gap. */
static void code_histogram(const void *row, int bf16, int64_t v, float s, float b, float mp,
                           int masses, codes_t *h) {
    float buf[CH], w[CH];
    uint16_t code[CH], bounds[4] = {0xffff, 0, 0, 0xffff};
    uint32_t *restrict count = h->count;
    double *restrict mass = h->mass;
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo), j = 0;
        const float *x = NULL;
        if (bf16 && !masses) {
            bf16_codes((const uint16_t *)row + lo, len, code, bounds);
        } else {
            x = chunk(row, bf16, lo, len, buf);
            f32_codes(x, len, code, bounds);
        }
        if (!masses) {
            for (; j + 4 <= len; j += 4)
                count[code[j]]++, count[code[j + 1]]++, count[code[j + 2]]++, count[code[j + 3]]++;
            for (; j < len; j++) count[code[j]]++;
            continue;
        }
        span_weights(x, len, s, b, mp, w);
        for (; j < len; j++) mass[code[j]] += w[j];
    }
    h->low = bounds[0], h->high = bounds[1], h->gap_lo = bounds[2], h->gap_hi = bounds[3];
}

static void codes_clear(codes_t *h, int masses) {
    if (h->low > h->high) return; /* nothing finite was counted */
    if (masses) memset(h->mass + h->low, 0, sizeof(double) * (h->high - h->low + 1));
    else memset(h->count + h->low, 0, sizeof(uint32_t) * (h->high - h->low + 1));
}

/* Values of group g's codes into m (see the modes; weights below mp count 0); their sum. */
static double group_values(const codes_t *h, int mode, uint32_t g, float s, float b, float mp,
                           double *m) {
    const uint32_t *count = h->count + (size_t)g * GRP;
    const double *mass = h->mass + (size_t)g * GRP;
    uint32_t any = 0;
    double sum = 0.0;
    if (mode == BY_MASS) {
        for (int i = 0; i < GRP; i++) m[i] = mass[i];
    } else {
#pragma omp simd reduction(| : any)
        for (int i = 0; i < GRP; i++) any |= count[i];
        if (!any) return 0.0;
#pragma omp simd
        for (int i = 0; i < GRP; i++) {
            float e = mode == BY_COUNT ? 1.0f : exp2_neg(code_value(g * GRP + i) * s + b);
            m[i] = e >= mp ? (double)count[i] * e : 0.0;
        }
    }
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < GRP; i++) sum += m[i];
    return sum;
}

/* Whether group g lies in the empty codes around zero; *g then becomes the group above the
   gap's lower end, so that the walk's decrement lands on it. */
static inline int in_gap(const codes_t *h, int64_t *g) {
    if (!((uint32_t)*g * GRP > h->gap_lo && (uint32_t)*g * GRP + GRP - 1 < h->gap_hi)) return 0;
    *g = h->gap_lo / GRP + 1;
    return 1;
}

/* Each group's sum of values into h->group, from the highest code down; their total. */
static double group_sums(codes_t *h, int mode, float s, float b, float mp) {
    double m[GRP], total = 0.0;
    for (int64_t g = h->high / GRP; g >= (int64_t)(h->low / GRP); g--)
        if (!in_gap(h, &g)) total += h->group[g] = group_values(h, mode, g, s, b, mp, m);
    return total;
}

/* Codes from the highest down to `lo`, by value: the first whose cumulative interval holds
   target, *before the values above it, *value its own; past the total (rounding), the last
   code with a value; -1 if none has one. Whole groups are passed by their sums, and the same
   sums are added in the same order on every walk, so walks meet the same boundaries. */
static int32_t walk_codes(const codes_t *h, int mode, uint32_t lo, double target, float s,
                          float b, float mp, double *before, double *value) {
    double acc = 0.0, last_acc = 0.0, m[GRP];
    int64_t last = -1;
    for (int64_t g = h->high / GRP; g >= (int64_t)(lo / GRP); g--) {
        if (in_gap(h, &g) || !(h->group[g] > 0.0)) continue;
        last = g, last_acc = acc;
        if (acc + h->group[g] <= target) { acc += h->group[g]; continue; }
        group_values(h, mode, g, s, b, mp, m);
        for (int i = GRP - 1; i >= 0; i--) {
            if (!(m[i] > 0.0)) continue;
            if (acc + m[i] > target) { *before = acc, *value = m[i]; return (int32_t)g * GRP + i; }
            acc += m[i];
        }
    }
    if (last < 0) return -1;
    group_values(h, mode, last, s, b, mp, m); /* past the total: its last code with a value */
    int32_t o = -1;
    for (int i = GRP - 1; i >= 0; i--)
        if (m[i] > 0.0) *before = last_acc, *value = m[i], o = last * GRP + i, last_acc += m[i];
    return o;
}

/* The entry that is the j-th (from 0) of code o in a bfloat16 row: raw bits compared, 32 to a
   vector (-0.0 is 0.0). */
static int64_t nth_of_code(const uint16_t *row, int64_t v, uint32_t o, int64_t j) {
    uint16_t want = code_bits(o);
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        int32_t hits = 0;
        const uint16_t *r = row + lo;
#pragma omp simd reduction(+ : hits)
        for (int64_t i = 0; i < len; i++) hits += (r[i] == 0x8000u ? 0 : r[i]) == want;
        if (hits <= j) { j -= hits; continue; }
        for (int64_t i = 0; i < len; i++)
            if ((r[i] == 0x8000u ? 0 : r[i]) == want && j-- == 0) return lo + i;
    }
    return -1;
}

/* The candidates (finite, weight 2^(x s + b) >= mp and > 0) whose codes are in [lo_o, hi_o]. */
static int64_t gather_codes(const void *row, int bf16, int64_t v, uint32_t lo_o, uint32_t hi_o,
                            float s, float b, float mp, cand_t *c) {
    float buf[CH];
    int64_t n = 0;
    uint32_t span = hi_o - lo_o;
    for (int64_t lo = 0; lo < v; lo += CH) {
        int64_t len = span_len(v, lo);
        int32_t hits = 0;
        const float *x = chunk(row, bf16, lo, len, buf);
#pragma omp simd reduction(+ : hits)
        for (int64_t i = 0; i < len; i++) hits += code_of(x[i]) - lo_o <= span;
        for (int64_t g = 0; hits && g < len; g += 16) { /* 16 at a time: most hold none */
            int64_t end = g + 16 < len ? g + 16 : len;
            int32_t here = 0;
#pragma omp simd reduction(+ : here)
            for (int64_t i = g; i < end; i++) here += code_of(x[i]) - lo_o <= span;
            for (int64_t i = g; here && i < end; i++) {
                if (code_of(x[i]) - lo_o > span) continue;
                here--, hits--;
                float w = exp2_neg(x[i] * s + b);
                if (x[i] > NEG_INF && x[i] < -NEG_INF && w >= mp && w > 0.0f)
                    c[n].key = rank_key(x[i], lo + i), c[n++].w = w;
            }
        }
    }
    return n;
}

/* Position j in [0, n) of the equal weights w whose cumulative interval holds t (n - 1 past
   them): the first j with (j + 1) w > t, as select_mass finds it (j w is exact in double). */
static int64_t equal_weights_at(double t, float w, int64_t n) {
    double q = __builtin_floor(t / w);
    int64_t j = q > 0.0 ? (q < (double)(n - 1) ? (int64_t)q : n - 1) : 0;
    while (j > 0 && (double)j * w > t) j--;
    while (j < n - 1 && (double)(j + 1) * w <= t) j++;
    return j;
}

/* Inside code o (mass above it `before`), the token whose interval holds target, among the
   first `lim` of the code's entries (all: -1); *kept: the mass up to and including it, *pos
   its place. A float32 code's entries are gathered into c once (*n: -1 until then). */
static int64_t in_code(const void *row, int bf16, int64_t v, uint32_t o, double target,
                       double before, int64_t lim, float s, float b, float mp, const codes_t *h,
                       cand_t *c, int64_t *n, double *kept, int64_t *pos) {
    double inside;
    if (bf16) {
        float w = exp2_neg(code_value(o) * s + b);
        int64_t j = equal_weights_at(target - before, w, lim >= 0 ? lim : h->count[o]);
        *kept = before + (double)j * w + w, *pos = j;
        return nth_of_code(row, v, o, j);
    }
    if (*n < 0) *n = gather_codes(row, 0, v, o, o, s, b, mp, c);
    if (*n == 0) return -1;
    int64_t r = select_mass(c, lim >= 0 ? lim : *n, target - before, &inside);
    *kept = before + inside + c[r].w, *pos = r;
    return KEY_TOKEN(c[r]);
}

/* The cut's code and place by top_p of the row's mass, then the draw's (see the module). */
static int64_t draw_by_codes(const void *row, int bf16, int64_t v, float s, float b, float mp,
                             float p, float u, codes_t *h, cand_t *c) {
    int mode = bf16 ? BY_WEIGHT : BY_MASS;
    double z = group_sums(h, mode, s, b, mp), cut_before, before, value, kept, at;
    int64_t n = -1, cut_pos, pos;
    if (!(z > 0.0 && z < __builtin_inf())) return -1;
    double target = (double)(p > 0.0f ? p : 0.0f) * z;
    int32_t cut = walk_codes(h, mode, h->low, target, s, b, mp, &cut_before, &value), o;
    if (cut < 0 || in_code(row, bf16, v, cut, target, cut_before, -1, s, b, mp, h, c, &n, &kept,
                           &cut_pos) < 0)
        return -1;
    double draw = u * kept;
    o = draw >= cut_before ? cut : walk_codes(h, mode, cut, draw, s, b, mp, &before, &value);
    if (o > cut) /* a code above the cut's: its own entries */
        return n = -1, in_code(row, bf16, v, o, draw, before, -1, s, b, mp, h, c, &n, &at, &pos);
    return in_code(row, bf16, v, cut, draw, cut_before, cut_pos + 1, s, b, mp, h, c, &n, &at,
                   &pos); /* among the cut's kept entries (c holds them first, in order) */
}

/* Top-p (top_p p, min-p mp, uniform u) by codes: -1 when nothing finite can be drawn. A
   bfloat16 row's maximum is its highest code; a float32 row's, m, is the caller's (its
   histogram holds weights relative to it). */
static int64_t code_top_p(const void *row, int bf16, int64_t v, float s, float mp, float p,
                          float u, float m, codes_t *h, cand_t *c) {
    code_histogram(row, bf16, v, s, -m * s, mp, !bf16, h);
    if (bf16) m = code_value(h->high);
    int64_t token = m > NEG_INF && m < -NEG_INF
                        ? draw_by_codes(row, bf16, v, s, -m * s, mp, p, u, h, c)
                        : -1;
    codes_clear(h, !bf16);
    return token;
}

/* Top-k by counts: the code of the k-th best entry, then the candidates of that code and
   above (weights relative to the row maximum m), of which a quickselect keeps the k best. */
static int64_t top_k_by_codes(const void *row, int bf16, int64_t v, int64_t k, float s,
                              float mp, float m, codes_t *h, cand_t *c) {
    double before, count;
    code_histogram(row, bf16, v, s, 0.0f, 0.0f, 0, h);
    group_sums(h, BY_COUNT, 0.0f, 0.0f, 0.0f);
    int32_t o = walk_codes(h, BY_COUNT, h->low, (double)k - 1.0, 0.0f, 0.0f, 0.0f, &before,
                           &count);
    int64_t n = o >= 0 ? gather_codes(row, bf16, v, o, h->high, s, -m * s, mp, c) : 0;
    codes_clear(h, 0);
    return n > k ? (select_rank(c, n, k), k) : n;
}

/* The per-thread histograms, zeroed (a NULL member: out of memory). */
static codes_t codes_alloc(void) {
    codes_t h = {.count = calloc(CODES, sizeof(uint32_t)),
                 .mass = calloc(CODES, sizeof(double)),
                 .group = malloc(sizeof(double) * (CODES / GRP))};
    return h;
}

static void codes_free(codes_t *h) { free(h->count), free(h->mass), free(h->group); }
