// The dense matrix-vector loops of matvec.h, and the operator `matvec` that exposes them (the
// linear layers' decode steps of few rows, tests, benchmarks).
//
// With AVX-512 BF16 a row of x and a weight row are multiplied as bfloat16 pairs into fp32
// lanes (vdpbf16ps); elsewhere both are widened to fp32 (exactly: a bfloat16 is a float's top
// half) in a loop of 16 independent lanes the compiler vectorises for the build's ISA.

#include "matvec.h"

#include <ATen/Parallel.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>

#include "ops_library.h"
#include "row_ops.h"

namespace servelab::matvec {
namespace {

using bf16 = c10::BFloat16;
using servelab::rows::swiglu_value;
using servelab::rows::widen;

// sums[m] = x[m] . w_row for the `M` rows of x (each `k_len` long, `x_stride` apart): the
// weight row is read once, front to back, so a block of rows streams from memory in order.
#if defined(__AVX512BF16__)
constexpr int64_t kDensePrefetch = 1024;  // bytes ahead of the weight loads: DRAM latency

template <int M>
inline void dot_row(const bf16* x, int64_t x_stride, const bf16* w_row, int64_t k_len,
                    float* sums) {
  // bfloat16 pairs multiplied and summed into fp32 lanes (vdpbf16ps); with one row of x, two
  // accumulators alternate so that consecutive products do not wait on each other
  constexpr int kAcc = M == 1 ? 2 : M;
  __m512 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_setzero_ps();
  int64_t k = 0, step = 0;
  for (; k + 32 <= k_len; k += 32, ++step) {
    _mm_prefetch(reinterpret_cast<const char*>(w_row + k) + kDensePrefetch, _MM_HINT_T0);
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w_row + k);
    if constexpr (M == 1) {
      acc[step & 1] = _mm512_dpbf16_ps(acc[step & 1], (__m512bh)_mm512_loadu_si512(x + k), wv);
    } else {
      for (int m = 0; m < M; ++m) {
        acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512(x + m * x_stride + k), wv);
      }
    }
  }
  if (k < k_len) {
    const __mmask32 mask = static_cast<__mmask32>((1ULL << (k_len - k)) - 1);
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w_row + k);
    for (int m = 0; m < M; ++m) {
      acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * x_stride + k), wv);
    }
  }
  if constexpr (M == 1) {
    sums[0] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
  } else {
    for (int m = 0; m < M; ++m) sums[m] = _mm512_reduce_add_ps(acc[m]);
  }
}
#else
template <int M>
inline void dot_row(const bf16* x, int64_t x_stride, const bf16* w_row, int64_t k_len,
                    float* sums) {
  for (int m = 0; m < M; ++m) {
    const bf16* xm = x + m * x_stride;
    float lanes[16] = {0.0f};
    int64_t k = 0;
    for (; k + 16 <= k_len; k += 16) {
      for (int j = 0; j < 16; ++j) lanes[j] += widen(xm[k + j]) * widen(w_row[k + j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < 16; ++j) sum += lanes[j];
    for (; k < k_len; ++k) sum += widen(xm[k]) * widen(w_row[k]);
    sums[m] = sum;
  }
}
#endif

// Products of one x [rows, K] with several weights [N_s, K] at once, y_s [rows, N_s] (q, k and
// v together): one parallel region over all their weight rows, each row read once for up to
// kMaxTile rows of x, fp32 sums rounded to bfloat16.
constexpr int64_t kMaxTile = 4;

template <int M>
void product_rows(const bf16* x, int64_t k_len, const Product& p, int64_t n0, int64_t n1) {
  float sums[M];
  for (int64_t n = n0; n < n1; ++n) {
    dot_row<M>(x, k_len, p.weight + n * k_len, k_len, sums);
    for (int m = 0; m < M; ++m) p.y[m * p.n_len + n] = bf16(sums[m]);
  }
}

template <int M>
void gated_rows(const bf16* x, int64_t k_len, const bf16* gate, const bf16* up, int64_t n_len,
                int64_t n0, int64_t n1, bf16* y) {
  float g[M], u[M];
  for (int64_t n = n0; n < n1; ++n) {
    dot_row<M>(x, k_len, gate + n * k_len, k_len, g);
    dot_row<M>(x, k_len, up + n * k_len, k_len, u);
    for (int m = 0; m < M; ++m) y[m * n_len + n] = swiglu_value(g[m], u[m]);
  }
}

// Calls body.template operator()<M>(m) for each tile of at most kMaxTile rows of x.
template <typename Body>
void for_each_tile(int64_t rows, Body&& body) {
  for (int64_t m = 0; m < rows; m += kMaxTile) {
    switch (std::min(kMaxTile, rows - m)) {
      case 1: body.template operator()<1>(m); break;
      case 2: body.template operator()<2>(m); break;
      case 3: body.template operator()<3>(m); break;
      default: body.template operator()<4>(m); break;
    }
  }
}

}  // namespace

void products(const at::Tensor& x, const std::vector<Product>& outs) {
  const int64_t rows = x.size(0), k_len = x.size(1);
  const bf16* xp = x.data_ptr<bf16>();
  int64_t total = 0;
  for (const auto& p : outs) total += p.n_len;
  at::parallel_for(0, total, 64, [&](int64_t begin, int64_t end) {
    int64_t first = 0;  // the current product's row 0 in the joint row range
    for (const auto& p : outs) {
      const int64_t n0 = std::max(begin, first) - first;
      const int64_t n1 = std::min(end, first + p.n_len) - first;
      first += p.n_len;
      if (n0 >= n1) continue;
      for_each_tile(rows, [&]<int M>(int64_t m) {
        const Product tile{p.weight, p.n_len, p.y + m * p.n_len};
        product_rows<M>(xp + m * k_len, k_len, tile, n0, n1);
      });
    }
  });
}

void gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                    at::Tensor& y) {
  const int64_t rows = x.size(0), k_len = x.size(1), n_len = gate.size(0);
  const bf16* xp = x.data_ptr<bf16>();
  const bf16* gp = gate.data_ptr<bf16>();
  const bf16* upp = up.data_ptr<bf16>();
  bf16* yp = y.data_ptr<bf16>();
  at::parallel_for(0, n_len, 32, [&](int64_t n0, int64_t n1) {
    for_each_tile(rows, [&]<int M>(int64_t m) {
      gated_rows<M>(xp + m * k_len, k_len, gp, upp, n_len, n0, n1, yp + m * n_len);
    });
  });
}


namespace {

// The dense product alone: x [M, K] w [N, K]^T, bfloat16, any M.
at::Tensor matvec_op(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16");
  const at::Tensor rows = x.contiguous(), weight = w.contiguous();
  auto y = at::empty({rows.size(0), weight.size(0)}, rows.options());
  products(rows, {{weight.data_ptr<bf16>(), weight.size(0), y.data_ptr<bf16>()}});
  return y;
}

}  // namespace
}  // namespace servelab::matvec

SERVELAB_FRAGMENT(m) { m.def("matvec(Tensor x, Tensor w) -> Tensor"); }

SERVELAB_IMPL(CPU, m) { m.impl("matvec", &servelab::matvec::matvec_op); }
