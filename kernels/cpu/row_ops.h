// The fused decoder layer's element-wise steps on bfloat16 rows: RMSNorm, rotary embedding,
// residual add and SwiGLU, each rounded to bfloat16 where the eager layer's operators round.
//
// At batch 1 they are a few thousand values; for a decode step of 64 sequences they are a few
// hundred thousand per layer, where scalar loops on one thread would cost more than the eager
// operators they replace. So rows are split across threads (above a grain that keeps small
// batches on one thread) and, with AVX-512 BF16, each row runs 16 lanes at a time: bfloat16
// widens exactly to fp32, results round to nearest even (vcvtneps2bf16), and silu's
// exponential is `exp2_nonpositive` (relative error ~2e-7, against libm's ~1e-7 in the
// portable loop). Sums of squares run in another order than the eager mean, as before.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>

#include "vector_math.h"

namespace servelab::rows {

using bf16 = c10::BFloat16;

constexpr int64_t kGrainValues = 16384;  // values per thread below which one thread does all

inline float widen(bf16 value) { return static_cast<float>(value); }
inline float round_bf16(float value) { return static_cast<float>(bf16(value)); }

// silu(gate) * up with each rounded to bfloat16 as the eager operators round it.
inline bf16 swiglu_value(float gate, float up) {
  const float g = round_bf16(gate);
  return bf16(round_bf16(g / (1.0f + std::exp(-g))) * round_bf16(up));
}

// Calls body(first_row, end_row) over `rows` rows of `width` values, in parallel when large.
template <typename Body>
void for_rows(int64_t rows, int64_t width, Body&& body) {
  const int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(1, width));
  at::parallel_for(0, rows, grain, body);
}

#if defined(__AVX512BF16__)
inline __m512 load16(const bf16* src, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, src);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline __m512 round16(__m512 x) {  // to bfloat16 (nearest even) and back
  const __m256i bits = (__m256i)_mm512_cvtneps_pbh(x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline void store16(bf16* dst, __m512 x, __mmask16 mask) {
  _mm256_mask_storeu_epi16(dst, mask, (__m256i)_mm512_cvtneps_pbh(x));
}

// silu(x) = x sigmoid(x), sigmoid from e = exp(-|x|) for either sign
inline __m512 silu16(__m512 x) {
  const __m512 magnitude = _mm512_abs_ps(x);
  const __m512 minus_log2e = _mm512_set1_ps(-kLog2e);
  const __m512 e = exp2_nonpositive(_mm512_mul_ps(magnitude, minus_log2e));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 denominator = _mm512_add_ps(one, e);
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 sigmoid = _mm512_div_ps(_mm512_mask_mov_ps(one, negative, e), denominator);
  return _mm512_mul_ps(x, sigmoid);
}
#endif

// RMSNorm as the eager model computes it: fp32 statistics, the normalised row rounded to
// bfloat16, then multiplied by the bfloat16 weight and rounded again.
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t rows = x.size(0), width = x.size(1);
  auto out = at::empty_like(x);
  const bf16* xp = x.data_ptr<bf16>();
  const bf16* wp = weight.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  for_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bf16* row = xp + t * width;
      bf16* dst = op + t * width;
#if defined(__AVX512BF16__)
      __m512 squares = _mm512_setzero_ps();
      for (int64_t i = 0; i < width; i += 16) {
        const __m512 v = load16(row + i, tail_mask(width - i));
        squares = _mm512_fmadd_ps(v, v, squares);
      }
      const float mean = _mm512_reduce_add_ps(squares) / static_cast<float>(width);
      const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(mean + static_cast<float>(eps)));
      for (int64_t i = 0; i < width; i += 16) {
        const __mmask16 mask = tail_mask(width - i);
        const __m512 normed = round16(_mm512_mul_ps(load16(row + i, mask), inv));
        store16(dst + i, _mm512_mul_ps(normed, load16(wp + i, mask)), mask);
      }
#else
      float squares = 0.0f;
      for (int64_t i = 0; i < width; ++i) squares += widen(row[i]) * widen(row[i]);
      const float inv =
          1.0f / std::sqrt(squares / static_cast<float>(width) + static_cast<float>(eps));
      for (int64_t i = 0; i < width; ++i) {
        dst[i] = bf16(round_bf16(widen(row[i]) * inv) * widen(wp[i]));
      }
#endif
    }
  });
  return out;
}

// Rotate-half rotary embedding in place on `x` [T, heads * D] with bfloat16 `cos`, `sin`
// [T, D / 2], rounding each product and the sum as the eager bfloat16 operators do.
inline void rotate(at::Tensor& x, int64_t heads, int64_t dim, const at::Tensor& cos,
                   const at::Tensor& sin) {
  const int64_t half = dim / 2;
  bf16* xp = x.data_ptr<bf16>();
  const bf16* cp = cos.data_ptr<bf16>();
  const bf16* sp = sin.data_ptr<bf16>();
  for_rows(x.size(0), heads * dim, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        bf16* v = xp + (t * heads + h) * dim;
        int64_t i = 0;
#if defined(__AVX512BF16__)
        for (; i < half; i += 16) {
          const __mmask16 mask = tail_mask(half - i);
          const __m512 c = load16(cp + t * half + i, mask), s = load16(sp + t * half + i, mask);
          const __m512 first = load16(v + i, mask), second = load16(v + i + half, mask);
          store16(v + i, _mm512_sub_ps(round16(_mm512_mul_ps(first, c)),
                                       round16(_mm512_mul_ps(second, s))), mask);
          store16(v + i + half, _mm512_add_ps(round16(_mm512_mul_ps(second, c)),
                                              round16(_mm512_mul_ps(first, s))), mask);
        }
#endif
        for (; i < half; ++i) {
          const float c = widen(cp[t * half + i]), s = widen(sp[t * half + i]);
          const float first = widen(v[i]), second = widen(v[i + half]);
          v[i] = bf16(round_bf16(first * c) - round_bf16(second * s));
          v[i + half] = bf16(round_bf16(second * c) + round_bf16(first * s));
        }
      }
    }
  });
}

// y = f(a, b) value by value over same-shaped bfloat16 tensors [T, N]: `vector_op` on 16
// widened lanes at a time with AVX-512 BF16 (its result rounded at the store), `scalar_op`
// on widened values elsewhere.
template <typename VectorOp, typename ScalarOp>
void combine(const at::Tensor& a, const at::Tensor& b, at::Tensor& y, VectorOp&& vector_op,
             ScalarOp&& scalar_op) {
  const bf16* ap = a.data_ptr<bf16>();
  const bf16* bp = b.data_ptr<bf16>();
  bf16* yp = y.data_ptr<bf16>();
  const int64_t width = a.size(-1);
  for_rows(a.numel() / width, width, [&](int64_t begin, int64_t end) {
    int64_t i = begin * width;
#if defined(__AVX512BF16__)
    for (; i < end * width; i += 16) {
      const __mmask16 mask = tail_mask(end * width - i);
      store16(yp + i, vector_op(load16(ap + i, mask), load16(bp + i, mask)), mask);
    }
#else
    (void)vector_op;
#endif
    for (; i < end * width; ++i) yp[i] = scalar_op(widen(ap[i]), widen(bp[i]));
  });
}

// a + b, rounded (the residual adds).
inline at::Tensor add(const at::Tensor& a, const at::Tensor& b) {
  auto out = at::empty_like(a);
  combine(
      a, b, out,
#if defined(__AVX512BF16__)
      [](__m512 x, __m512 z) { return _mm512_add_ps(x, z); },
#else
      nullptr,
#endif
      [](float x, float z) { return bf16(x + z); });
  return out;
}

// silu(gate) * up for bfloat16 `gate`, `up` [T, N] into `y`.
inline void swiglu(const at::Tensor& gate, const at::Tensor& up, at::Tensor& y) {
  combine(
      gate, up, y,
#if defined(__AVX512BF16__)
      [](__m512 g, __m512 u) { return _mm512_mul_ps(round16(silu16(g)), u); },
#else
      nullptr,
#endif
      [](float g, float u) { return swiglu_value(g, u); });
}

}  // namespace servelab::rows
