// fp32 products x [M, K] w [N, K]^T for decode-sized batches, on the row-major weight as it is:
// the operator `linear_f32`.
//
// Where bfloat16 is not multiplied natively, fp32 is the dtype a CPU serves in, and there
// torch's fp32 product (MKL) runs the shapes of decoding below the machine: measured on an
// AVX2-only Zen 3, one thread, a 1536 x 576 weight read at 7 GB/s for 3 rows (this loop: 19),
// and the 49152 x 576 LM head at 2.0 GB/s for 3 rows (5.3) and 2.5 for 8 rows (4.1). Beyond a
// few rows MKL's blocked kernels win for the decoder's projections (57 against 40 GFLOP/s at
// 64 rows), so the linear layer calls this only for the rows `kernels.linear` names. A tile of
// up to 4 rows of x by 2 weight rows keeps 8 sums of 8 lanes in registers over the whole of K
// (AVX2 and FMA; a portable loop of the same shape elsewhere), each weight row is read from
// memory once per call for all the rows of x, and threads split the weight rows.
//
// Each output is one chain of fused multiply-adds over K in 8 lanes, summed in a fixed order:
// it does not depend on how many rows the call has or where a row sits in it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

#include "ops_library.h"

namespace servelab::linear_f32 {
namespace {

constexpr int kRowTile = 4;     // rows of x per tile
constexpr int kColumnTile = 2;  // weight rows per tile
constexpr int64_t kGrain = 16;  // weight rows per thread at least

#if defined(__AVX2__) && defined(__FMA__)
inline float sum8(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

inline __m256i tail_mask(int64_t left) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lanes);
}

// y[m][c] = x[m] . w[c] for M rows of x and C weight rows.
template <int M, int C>
void tile(const float* x, const float* w, int64_t k_len, float* y, int64_t y_stride) {
  __m256 acc[M][C];
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < C; ++c) acc[m][c] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 8 <= k_len; k += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(w + c * k_len + k);
    for (int m = 0; m < M; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * k_len + k);
      for (int c = 0; c < C; ++c) acc[m][c] = _mm256_fmadd_ps(xv, wv[c], acc[m][c]);
    }
  }
  if (k < k_len) {
    const __m256i mask = tail_mask(k_len - k);
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_maskload_ps(w + c * k_len + k, mask);
    for (int m = 0; m < M; ++m) {
      const __m256 xv = _mm256_maskload_ps(x + m * k_len + k, mask);
      for (int c = 0; c < C; ++c) acc[m][c] = _mm256_fmadd_ps(xv, wv[c], acc[m][c]);
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < C; ++c) y[m * y_stride + c] = sum8(acc[m][c]);
  }
}
#else
// The same tile in plain loops (8 partial sums per output, summed in a fixed order), which
// the compiler vectorises for the build's ISA.
template <int M, int C>
void tile(const float* x, const float* w, int64_t k_len, float* y, int64_t y_stride) {
  float acc[M][C][8] = {};
  for (int64_t k0 = 0; k0 < k_len; k0 += 8) {
    const int64_t width = std::min<int64_t>(8, k_len - k0);
    for (int m = 0; m < M; ++m) {
      for (int c = 0; c < C; ++c) {
        for (int64_t j = 0; j < width; ++j) {
          acc[m][c][j] += x[m * k_len + k0 + j] * w[c * k_len + k0 + j];
        }
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < C; ++c) {
      const float* a = acc[m][c];
      y[m * y_stride + c] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    }
  }
}
#endif

// Every row of x by weight rows c0 .. c0 + C - 1.
template <int C>
void columns(const float* x, int64_t rows, const float* w, int64_t k_len, float* y,
             int64_t n_len) {
  for (int64_t m = 0; m < rows; m += kRowTile) {
    const float* xm = x + m * k_len;
    float* ym = y + m * n_len;
    switch (std::min<int64_t>(kRowTile, rows - m)) {
      case 1: tile<1, C>(xm, w, k_len, ym, n_len); break;
      case 2: tile<2, C>(xm, w, k_len, ym, n_len); break;
      case 3: tile<3, C>(xm, w, k_len, ym, n_len); break;
      default: tile<4, C>(xm, w, k_len, ym, n_len); break;
    }
  }
}

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "float32");
  const at::Tensor xs = x.contiguous(), ws = w.contiguous();
  const int64_t rows = xs.size(0), k_len = xs.size(1), n_len = ws.size(0);
  auto y = at::empty({rows, n_len}, xs.options());
  const float* xp = xs.data_ptr<float>();
  const float* wp = ws.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t pairs = (n_len + kColumnTile - 1) / kColumnTile;
  at::parallel_for(0, pairs, kGrain / kColumnTile, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t n = pair * kColumnTile;
      if (n + kColumnTile <= n_len) {
        columns<kColumnTile>(xp, rows, wp + n * k_len, k_len, yp + n, n_len);
      } else {
        columns<1>(xp, rows, wp + n * k_len, k_len, yp + n, n_len);
      }
    }
  });
  return y;
}

}  // namespace
}  // namespace servelab::linear_f32

SERVELAB_FRAGMENT(m) { m.def("linear_f32(Tensor x, Tensor w) -> Tensor"); }

SERVELAB_IMPL(CPU, m) { m.impl("linear_f32", &servelab::linear_f32::linear_f32); }
