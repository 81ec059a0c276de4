// The panel products of panel_gemm.h: packing, the 6-row tile on vdpbf16ps, the split over
// threads with each thread prefetching the panels it multiplies next, and the operators that
// expose them (`servelab::pack_panels`, `servelab::panel_linear`, `servelab::panel_swiglu`).

#include "panel_gemm.h"

#include <ATen/Parallel.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "ops_library.h"
#include "row_ops.h"

namespace servelab::panels {
namespace {

using bf16 = c10::BFloat16;

constexpr int64_t kPairRow = 2 * kPanelColumns;  // values in one pair row of a panel
constexpr int kTileRows = 6;

int64_t pairs_of(int64_t k_len) { return (k_len + 1) / 2; }
int64_t panels_of(int64_t n_len) { return (n_len + kPanelColumns - 1) / kPanelColumns; }

// What one tile job multiplies: one or two panels, written from y's column `column` on.
struct Job {
  const bf16* a;
  const bf16* b;  // the second panel, or nullptr
  bf16* y;        // row 0, column `column` of the product's output
  int64_t y_stride;
  int64_t columns;         // valid output columns from there (at most 64)
  const bf16* residual;  // added to the output, same place and stride; or nullptr
};

// Calls body.template operator()<M>(m) for each tile of at most kTileRows rows.
template <typename Body>
void for_each_row_tile(int64_t rows, Body&& body) {
  for (int64_t m = 0; m < rows; m += kTileRows) {
    switch (std::min<int64_t>(kTileRows, rows - m)) {
      case 1: body.template operator()<1>(m); break;
      case 2: body.template operator()<2>(m); break;
      case 3: body.template operator()<3>(m); break;
      case 4: body.template operator()<4>(m); break;
      case 5: body.template operator()<5>(m); break;
      default: body.template operator()<6>(m); break;
    }
  }
}

#if defined(__AVX512BF16__)
// The weights a thread multiplies next (one or two panels), asked into L2 one cache line at
// a time.
struct Prefetcher {
  const char* cursor[2] = {nullptr, nullptr};
  const char* end[2] = {nullptr, nullptr};

  void aim(const Job* next, int64_t panel_bytes) {
    const bf16* panels[2] = {next ? next->a : nullptr, next ? next->b : nullptr};
    for (int s = 0; s < 2; ++s) {
      cursor[s] = reinterpret_cast<const char*>(panels[s]);
      end[s] = panels[s] ? cursor[s] + panel_bytes : cursor[s];
    }
  }
};

// acc[m][c] = x[m] . columns 16 c .. 16 c + 15 of the job's panels (a: c = 0, 1; b: 2, 3),
// `lines` cache lines of the next job prefetched per pair of K. The sums live in registers
// (locals the compiler can keep there), copied out once.
template <int M, int P>
inline void tile(const bf16* x, int64_t k_len, const Job& job, Prefetcher& ahead, int lines,
                 __m512 acc[][4]) {
  __m512 sum[M][2 * P];
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < 2 * P; ++c) sum[m][c] = _mm512_setzero_ps();
  }
  const bf16* a = job.a;
  const bf16* b = job.b;
  const char* cursor0 = ahead.cursor[0];
  const char* cursor1 = ahead.cursor[1];
  const char* const end0 = ahead.end[0];
  const char* const end1 = ahead.end[1];
  auto multiply = [&](int64_t j, auto x_pair) {
    __m512bh w[2 * P];
    w[0] = (__m512bh)_mm512_loadu_si512(a + j * kPairRow);
    w[1] = (__m512bh)_mm512_loadu_si512(a + j * kPairRow + 32);
    if constexpr (P == 2) {
      w[2] = (__m512bh)_mm512_loadu_si512(b + j * kPairRow);
      w[3] = (__m512bh)_mm512_loadu_si512(b + j * kPairRow + 32);
    }
    for (int line = 0; line < lines; ++line) {
      if (cursor0 < end0) {
        _mm_prefetch(cursor0, _MM_HINT_T1);
        cursor0 += 64;
      } else if (cursor1 < end1) {
        _mm_prefetch(cursor1, _MM_HINT_T1);
        cursor1 += 64;
      }
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xm = (__m512bh)_mm512_set1_epi32(x_pair(m));
      for (int c = 0; c < 2 * P; ++c) sum[m][c] = _mm512_dpbf16_ps(sum[m][c], w[c], xm);
    }
  };
  const int64_t full_pairs = k_len / 2;
  for (int64_t j = 0; j < full_pairs; ++j) {
    multiply(j, [&](int m) {
      int32_t pair;
      std::memcpy(&pair, x + m * k_len + 2 * j, sizeof(pair));
      return pair;
    });
  }
  if (k_len % 2 != 0) {  // the last pair is x[K - 1] and a zero (the padding's weight is 0)
    multiply(full_pairs, [&](int m) {
      uint16_t last;
      std::memcpy(&last, x + m * k_len + k_len - 1, sizeof(last));
      return static_cast<int32_t>(last);
    });
  }
  ahead.cursor[0] = cursor0;
  ahead.cursor[1] = cursor1;
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < 2 * P; ++c) acc[m][c] = sum[m][c];
  }
}

template <int M, int P>
inline void store_products(const __m512 acc[][4], const Job& job, int64_t m0) {
  for (int m = 0; m < M; ++m) {
    const int64_t offset = (m0 + m) * job.y_stride;
    for (int c = 0; c < 2 * P; ++c) {
      const __mmask16 mask = tail_mask(job.columns - 16 * c);
      if (mask == 0) continue;
      __m512 value = acc[m][c];
      if (job.residual != nullptr) {
        value = _mm512_add_ps(rows::round16(value),
                              rows::load16(job.residual + offset + 16 * c, mask));
      }
      rows::store16(job.y + offset + 16 * c, value, mask);
    }
  }
}

// silu(gate) * up as the eager SwiGLU rounds it: gate and up to bfloat16, silu rounded.
template <int M>
inline void store_gated(const __m512 acc[][4], const Job& job, int64_t m0) {
  for (int m = 0; m < M; ++m) {
    bf16* row = job.y + (m0 + m) * job.y_stride;
    for (int c = 0; c < 2; ++c) {
      const __mmask16 mask = tail_mask(job.columns - 16 * c);
      if (mask == 0) continue;
      const __m512 silu = rows::round16(rows::silu16(rows::round16(acc[m][c])));
      rows::store16(row + 16 * c, _mm512_mul_ps(silu, rows::round16(acc[m][c + 2])), mask);
    }
  }
}

// Runs a thread's jobs in order, every row tile of one before the next; while multiplying a
// job it prefetches the next one's panels, spread over the job's first tiles.
template <bool Gated>
void run_jobs(const at::Tensor& x, const std::vector<Job>& jobs) {
  const int64_t rows = x.size(0), k_len = x.size(1);
  const bf16* xp = x.data_ptr<bf16>();
  const int64_t pair_count = pairs_of(k_len);
  const int64_t panel_bytes = pair_count * kPairRow * static_cast<int64_t>(sizeof(bf16));
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t lines_per_panel = panel_bytes / 64;
  const int lines = static_cast<int>((2 * lines_per_panel + tiles * pair_count - 1) /
                                     (tiles * pair_count));
  Prefetcher ahead;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    ahead.aim(i + 1 < jobs.size() ? &jobs[i + 1] : nullptr, panel_bytes);
    __m512 acc[kTileRows][4];
    for_each_row_tile(rows, [&]<int M>(int64_t m) {
      if (Gated || job.b != nullptr) {
        tile<M, 2>(xp + m * k_len, k_len, job, ahead, lines, acc);
        if constexpr (Gated) {
          store_gated<M>(acc, job, m);
        } else {
          store_products<M, 2>(acc, job, m);
        }
      } else {
        tile<M, 1>(xp + m * k_len, k_len, job, ahead, lines, acc);
        store_products<M, 1>(acc, job, m);
      }
    });
  }
}
#else
template <bool Gated>
void run_jobs(const at::Tensor&, const std::vector<Job>&) {
  TORCH_CHECK(false, "the panel products need a build with AVX-512 BF16");
}
#endif

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16,
              "x is contiguous bfloat16 [rows, K]");
}

}  // namespace

void check_packed(const at::Tensor& panels, int64_t k_len, int64_t n_len) {
  TORCH_CHECK(panels.dim() == 4 && panels.is_contiguous() &&
                  panels.scalar_type() == at::kBFloat16 && panels.size(0) == panels_of(n_len) &&
                  panels.size(1) == pairs_of(k_len) && panels.size(2) == kPanelColumns &&
                  panels.size(3) == 2,
              "panels are `pack_panels` of a bfloat16 weight [", n_len, ", ", k_len, "]");
}

bool available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16,
              "the weight is bfloat16 [N, K]");
  const at::Tensor w = weight.contiguous();
  const int64_t n_len = w.size(0), k_len = w.size(1);
  const int64_t pair_count = pairs_of(k_len);
  auto out = at::zeros({panels_of(n_len), pair_count, kPanelColumns, 2}, w.options());
  const bf16* src = w.data_ptr<bf16>();
  bf16* dst = out.data_ptr<bf16>();
  at::parallel_for(0, panels_of(n_len), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t c = 0; c < kPanelColumns && p * kPanelColumns + c < n_len; ++c) {
        const bf16* row = src + (p * kPanelColumns + c) * k_len;
        bf16* column = dst + p * pair_count * kPairRow + 2 * c;
        for (int64_t k = 0; k < k_len; ++k) column[(k / 2) * kPairRow + k % 2] = row[k];
      }
    }
  });
  return out;
}

void products(const at::Tensor& x, const std::vector<servelab::Product>& outs) {
  check_x(x);
  const int64_t panel_values = pairs_of(x.size(1)) * kPairRow;
  int64_t total = 0;
  for (const auto& p : outs) total += panels_of(p.n_len);
  at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
    std::vector<Job> jobs;
    int64_t first = 0;  // the current product's panel 0 in the joint panel range
    for (const auto& p : outs) {
      const int64_t count = panels_of(p.n_len);
      for (int64_t q = std::max(begin, first) - first; q < std::min(end, first + count) - first;
           q += 2) {
        const bool pair = q + 1 < std::min(end, first + count) - first;
        jobs.push_back({p.weight + q * panel_values,
                        pair ? p.weight + (q + 1) * panel_values : nullptr,
                        p.y + q * kPanelColumns, p.n_len, p.n_len - q * kPanelColumns,
                        p.residual ? p.residual + q * kPanelColumns : nullptr});
      }
      first += count;
    }
    run_jobs<false>(x, jobs);
  });
}

void gated(const at::Tensor& x, const at::Tensor& gate_panels, const at::Tensor& up_panels,
           int64_t n_len, at::Tensor& y) {
  check_x(x);
  check_packed(gate_panels, x.size(1), n_len);
  check_packed(up_panels, x.size(1), n_len);
  const int64_t panel_values = pairs_of(x.size(1)) * kPairRow;
  const bf16* gate = gate_panels.data_ptr<bf16>();
  const bf16* up = up_panels.data_ptr<bf16>();
  bf16* yp = y.data_ptr<bf16>();
  at::parallel_for(0, panels_of(n_len), 1, [&](int64_t begin, int64_t end) {
    std::vector<Job> jobs;
    for (int64_t q = begin; q < end; ++q) {
      jobs.push_back({gate + q * panel_values, up + q * panel_values, yp + q * kPanelColumns,
                      n_len, n_len - q * kPanelColumns, nullptr});
    }
    run_jobs<true>(x, jobs);
  });
}

namespace {

// x [rows, K] times a packed weight with `n_len` outputs, plus `residual` [rows, n_len] if
// given, alone (tests, benchmarks).
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, int64_t n_len,
                        const std::optional<at::Tensor>& residual) {
  check_x(x);
  check_packed(panels, x.size(1), n_len);
  auto y = at::empty({x.size(0), n_len}, x.options());
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == y.sizes() && residual->is_contiguous() &&
                    residual->scalar_type() == at::kBFloat16,
                "the residual is contiguous bfloat16 [rows, n]");
  }
  products(x, {{panels.data_ptr<bf16>(), n_len, y.data_ptr<bf16>(),
                residual.has_value() ? residual->data_ptr<bf16>() : nullptr}});
  return y;
}

at::Tensor panel_swiglu(const at::Tensor& x, const at::Tensor& gate_panels,
                        const at::Tensor& up_panels, int64_t n_len) {
  auto y = at::empty({x.size(0), n_len}, x.options());
  gated(x, gate_panels, up_panels, n_len, y);
  return y;
}

}  // namespace
}  // namespace servelab::panels

SERVELAB_FRAGMENT(m) {
  m.def("panel_products_available() -> bool", &servelab::panels::available);
  m.def("pack_panels(Tensor weight) -> Tensor");
  m.def("panel_linear(Tensor x, Tensor panels, int n, Tensor? residual=None) -> Tensor");
  m.def("panel_swiglu(Tensor x, Tensor gate_panels, Tensor up_panels, int n) -> Tensor");
}

SERVELAB_IMPL(CPU, m) {
  m.impl("pack_panels", &servelab::panels::pack);
  m.impl("panel_linear", &servelab::panels::panel_linear);
  m.impl("panel_swiglu", &servelab::panels::panel_swiglu);
}
