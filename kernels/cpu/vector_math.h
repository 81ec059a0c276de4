// Vector helpers shared by the CPU operators: masks for a loop's last partial vector (AVX2 and
// AVX-512), a softmax exponential, and the transposed sum that turns sixteen vectors of partial
// dot products into sixteen scores (AVX-512).
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>

namespace servelab {

// The first `left` of 8 lanes, as a maskload's or maskstore's mask (none for left <= 0).
inline __m256i lanes_below(int64_t left) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lanes);
}

}  // namespace servelab
#endif

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace servelab {

constexpr float kLog2e = 1.44269504088896341f;

// The first `left` of 16 lanes (none for left <= 0, all for left >= 16).
inline __mmask16 tail_mask(int64_t left) {
  if (left <= 0) return 0;
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// 2^x for x <= 0 (x = -inf gives 0): 2^round(x) by scalef, 2^f for |f| <= 1/2 by a degree-6
// polynomial (relative error ~2e-7).
inline __m512 exp2_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-160.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Lane i of the result is the sum of the 16 lanes of v[i]: 45 instructions for what sixteen
// separate horizontal sums take about 130 for.
inline __m512 transposed_sum16(const __m512 v[16]) {
  __m512 pairs[8];  // each 128-bit lane: partial sums of v[2i], v[2i + 1], v[2i], v[2i + 1]
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 quads[4];  // each 128-bit lane: partial sums of v[4j] .. v[4j + 3]
  for (int j = 0; j < 4; ++j) {
    const __m512d a = _mm512_castps_pd(pairs[2 * j]);
    const __m512d b = _mm512_castps_pd(pairs[2 * j + 1]);
    quads[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  __m512 halves[2];  // 128-bit lanes: v[8h .. 8h + 3] twice, then v[8h + 4 .. 8h + 7] twice
  for (int h = 0; h < 2; ++h) {
    halves[h] = _mm512_add_ps(
        _mm512_shuffle_f32x4(quads[2 * h], quads[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0)),
        _mm512_shuffle_f32x4(quads[2 * h], quads[2 * h + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace servelab

#endif
