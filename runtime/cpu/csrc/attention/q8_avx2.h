// AVX2 loops of the CPU attention kernel for int8 caches: a part of q8.h, included between its
// generic loops (whose layout helpers it uses) and their dispatch.
//
// The generic int8 loops work on 64-byte vector types and an emulated `vpdpbusd`; on a CPU whose
// registers hold 32 bytes GCC lowers them through the stack, which made `--kv-cache-dtype int8`
// slower than float32 caches on AVX2 machines (Zen 3, 5k context: 27 vs 43 tok/s) although it reads
// a quarter of the bytes. These loops hold 8-lane halves in `__m256i` registers and multiply
// with `vpmaddwd` (16-bit products, pairs summed into 32-bit lanes, exact):
//
// - scores: K's signed bytes are widened in place (even dims, odd dims of each 4-byte word) and
//   multiplied by q's two planes folded into one 16-bit value, `Q = 254 hi + lo`
//   (`|Q| <= 32385`), so one pass replaces the generic two; `sum(k * Q)` is the generic
//   `dot - bias` exactly (the same integer), so every score has the generic path's bits;
// - `p @ V`: V's signed bytes widened the same way (even keys, odd keys), p's unsigned bytes
//   split likewise; the per-group integer sums and the float32 multiply-add are the generic ones;
//   p's rounding to bytes (`quantize_p_row`) does the generic float operations on halves.
//
// Each half is a pass of its own (8 keys or 8 dims), which keeps the accumulators in registers.
#pragma once
#if defined(PAGODA_AVX2_F32)
#define PAGODA_AVX2_Q8 1
static inline __m256i even16(__m256i x) { return _mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8); }
static inline __m256i odd16(__m256i x) { return _mm256_srai_epi16(x, 8); }
static inline uint32_t pair16(int32_t lo, int32_t hi) {
  return (uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16;
}

// Scores of 16-key chunks [j0, j1), U at a time, for N rows (see the top).
template <int N, int U>
static void scores_q8_avx2(const Geo& g, const uint32_t* const* q, const uint32_t* kc,
                           const int32_t* bt, int kvh, int stride, int j0, int j1, float* S) {
  const int W = g.D / 4, cpb = g.BS / 16;
  const int64_t bw = q8_block_words(g);
  const uint32_t* base = kc + (int64_t)kvh * g.NB * bw;
  auto blk = [&](int j) { return base + (int64_t)bt[j / cpb] * bw; };
  // Q of dims (0, 2) and (1, 3) of each word, broadcast; word-major, so the rows' values of a
  // word are neighbours (row-major at D = 512 strides put them 4 KiB apart: one L1 set)
  __m256i qv[128 * 2 * N];
  float qs[N];
  for (int i = 0; i < N; ++i) {
    const int8_t *hi = (const int8_t*)q[i], *lo = hi + g.D;
    for (int w = 0; w < W; ++w) {
      int32_t Q[4];
      for (int d = 0; d < 4; ++d) Q[d] = 254 * hi[4 * w + d] + lo[4 * w + d];
      qv[(w * N + i) * 2] = _mm256_set1_epi32((int32_t)pair16(Q[0], Q[2]));
      qv[(w * N + i) * 2 + 1] = _mm256_set1_epi32((int32_t)pair16(Q[1], Q[3]));
    }
    std::memcpy(&qs[i], q[i] + 2 * W, 4);
  }
  for (int j = j0; j + U <= j1; j += U) {
    const uint32_t* kp[U];
    k_chunks<U>(g, blk, j, j1, kp);
    PAGODA_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m256i acc[N][U];
      PAGODA_UNROLL
      for (int i = 0; i < N; ++i)
        PAGODA_UNROLL
        for (int u = 0; u < U; ++u) acc[i][u] = _mm256_setzero_si256();
      for (int w = 0; w < W; ++w) {
        __m256i ke[U], ko[U];
        PAGODA_UNROLL
        for (int u = 0; u < U; ++u) {
          const __m256i k = _mm256_loadu_si256((const __m256i*)(kp[u] + (int64_t)w * g.BS + 8 * h));
          ke[u] = even16(k), ko[u] = odd16(k);
        }
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i)
          PAGODA_UNROLL
          for (int u = 0; u < U; ++u)
            acc[i][u] = _mm256_add_epi32(acc[i][u], _mm256_add_epi32(_mm256_madd_epi16(ke[u], qv[(w * N + i) * 2]),
                                                                     _mm256_madd_epi16(ko[u], qv[(w * N + i) * 2 + 1])));
      }
      PAGODA_UNROLL
      for (int u = 0; u < U; ++u) {
        const float* sc = (const float*)(blk(j + u) + (int64_t)W * g.BS) + ((j + u) % cpb) * 16 + 8 * h;
        const __m256 scale = _mm256_loadu_ps(sc);
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i) {
          const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][u]), _mm256_mul_ps(scale, _mm256_set1_ps(qs[i])));
          _mm256_storeu_ps(S + (int64_t)i * stride + (j + u) * 16 + 8 * h, s);
        }
      }
    }
  }
}

// acc[i * DU + u] += p_i @ V over blocks [b0, b1), as `pv_q8` (see the top).
template <int N, int DU>
static void pv_q8_avx2(const Geo& g, const float* const* pr, int width, const uint32_t* vc,
                       const int32_t* bt, int kvh, int dc, int b0, int b1, vf* acc) {
  const int KW = g.BS / 4;
  const int64_t bw = q8_block_words(g);
  const uint32_t* base = vc + (int64_t)kvh * g.NB * bw;
  const __m256i low = _mm256_set1_epi32(0x00FF00FF);
  for (int b = b0; b < b1; ++b) {
    const uint32_t* vb = base + (int64_t)bt[b] * bw + dc * 16;
    const uint32_t* nx = base + (int64_t)bt[std::min(b + Q8_AHEAD, b1 - 1)] * bw + dc * 16;
    for (int k0 = 0; k0 < KW; k0 += 4) {  // a group: 4 words of 4 keys
      const int grp = (b * g.BS) / 16 + k0 / 4;
      PAGODA_UNROLL
      for (int h = 0; h < 2; ++h) {
        __m256i ia[N][DU];
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i)
          PAGODA_UNROLL
          for (int u = 0; u < DU; ++u) ia[i][u] = _mm256_setzero_si256();
        for (int k = k0; k < k0 + 4; ++k) {
          __m256i ve[DU], vo[DU];
          PAGODA_UNROLL
          for (int u = 0; u < DU; ++u) {
            if (h == 0) __builtin_prefetch(nx + (int64_t)k * g.D + u * 16);
            const __m256i v = _mm256_loadu_si256((const __m256i*)(vb + (int64_t)k * g.D + u * 16 + 8 * h));
            ve[u] = even16(v), vo[u] = odd16(v);
          }
          PAGODA_UNROLL
          for (int i = 0; i < N; ++i) {
            const __m256i p = _mm256_set1_epi32((int32_t)((const uint32_t*)pr[i])[b * KW + k]);
            const __m256i pe = _mm256_and_si256(p, low), po = _mm256_and_si256(_mm256_srli_epi32(p, 8), low);
            PAGODA_UNROLL
            for (int u = 0; u < DU; ++u)
              ia[i][u] = _mm256_add_epi32(ia[i][u], _mm256_add_epi32(_mm256_madd_epi16(ve[u], pe),
                                                                     _mm256_madd_epi16(vo[u], po)));
          }
        }
        PAGODA_UNROLL
        for (int i = 0; i < N; ++i) {
          const __m256 st = _mm256_set1_ps(((const float*)((const uint8_t*)pr[i] + width))[grp]);
          PAGODA_UNROLL
          for (int u = 0; u < DU; ++u) {
            float* a = (float*)&acc[i * DU + u] + 8 * h;
            _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[i][u]), st, _mm256_loadu_ps(a)));
          }
        }
      }
    }
  }
}

static inline float hmax8(__m256 v) {  // a maximum: exact in any order
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// `quantize_p_row` on 8-float halves: the same products, maxima, divisions and rounding, so the
// same bytes and steps.
static void quantize_p_row_avx2(const Geo& g, float* s, int c0, int nb, int width,
                                const int32_t* bt, const uint32_t* vc, int kvh) {
  static thread_local std::vector<float> steps;
  if ((int)steps.size() < width / 16 + 16) steps.resize(width / 16 + 16);
  const int64_t bw = q8_block_words(g);
  const uint32_t* base = vc + (int64_t)kvh * g.NB * bw;
  uint8_t* bytes = (uint8_t*)s;
  const int nk = nb * g.BS;
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // round_even
  for (int k0 = c0; k0 < nk; k0 += 256) {  // 16 groups at a time
    const int k1 = std::min(nk, k0 + 256);
    float mx[16] = {}, inv[16];
    for (int k = k0; k < k1; k += 16) {  // p * v_scale in place, and each group's maximum
      const int ahead = std::min(nb - 1, k / g.BS + 8);  // scales are one line a block
      __builtin_prefetch(base + (int64_t)bt[ahead] * bw + (int64_t)g.BS / 4 * g.D);
      const float* sc = (const float*)(base + (int64_t)bt[k / g.BS] * bw + (int64_t)g.BS / 4 * g.D);
      const __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(s + k), _mm256_loadu_ps(sc + k % g.BS));
      const __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(s + k + 8), _mm256_loadu_ps(sc + k % g.BS + 8));
      _mm256_storeu_ps(s + k, x0), _mm256_storeu_ps(s + k + 8, x1);
      mx[(k - k0) / 16] = hmax8(_mm256_max_ps(x0, x1));  // p >= 0
    }
    for (int i = 0; i < 16; ++i) {
      inv[i] = mx[i] > 0.0f ? 255.0f / mx[i] : 0.0f;
      steps[k0 / 16 + i] = mx[i] / 255.0f;
    }
    for (int k = k0; k < k1; k += 16) {  // reads floats at 4k.., writes bytes at k..: behind
      const __m256 f = _mm256_set1_ps(inv[(k - k0) / 16]);
      const __m256 y0 = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + k), f), magic), magic);
      const __m256 y1 = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + k + 8), f), magic), magic);
      const __m256i w = _mm256_permute4x64_epi64(
          _mm256_packus_epi32(_mm256_cvttps_epi32(y0), _mm256_cvttps_epi32(y1)), 0xD8);  // 0..255
      _mm_storeu_si128((__m128i*)(bytes + k),
                       _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    }
  }
  std::memcpy(bytes + width, steps.data(), (size_t)nk / 16 * 4);
}
#endif
