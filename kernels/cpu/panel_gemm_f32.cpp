// fp32 products x [M, K] w [N, K]^T at every row count on weights packed once into 16-column
// panels: the operators `pack_panels_f32` and `panel_linear_f32`, and `int4_panel_linear_f32`
// for int4 weights held as nibbles on the same panels.
//
// Where bfloat16 is not multiplied natively fp32 is the dtype a CPU serves in. Measured on a
// Zen 5 at level avx2 (`python -m benchmarks.bench_linear_f32`; MKL ran as fast capped at AVX2
// as at AVX-512 there), one thread, the decoder's projections: torch's product (MKL) 54-66
// GFLOP/s at 8 rows, 86-96 at 64 and 1,900, these panels 85-90, 117-120 and 107-114; the
// 49152 x 576 LM head at 64 rows 73 against 112; two threads at 64 rows 159-171 against
// 221-233.
//
// Layout: a weight [N, K] becomes [ceil(N / 16), K, 16], zero-padded: panel p, line k holds
// w[16 p + c][k] for its 16 columns c, one 64-byte cache line. A tile is 6 rows of x by one
// panel, 12 sums of 8 lanes kept in registers over the whole of K (AVX2 and FMA: per k two
// panel loads, six broadcasts, twelve FMAs; a portable loop of the same shape elsewhere). Rows
// go in blocks whose part of x stays in L2 while each panel of the thread's share passes by;
// the first tile of a panel asks for the next panel's line k into L2 as it reads its own.
//
// Each output is one chain of multiply-adds over k = 0 .. K - 1 in order: it does not depend
// on how many rows the call has, where a row sits in it, or how threads split the panels.
//
// Int4 weights (AutoAWQ's values, zero points and scales; `kernels/int4_matmul_cpu.py` packs
// them): nibbles [P, K, 8], byte c of line k holding column c's value in its low nibble and
// column c + 8's in its high one, and float32 zero points and scales [P, G, 16] per group of
// `group` inputs. A thread dequantises each of its panels once per call into a buffer of K x 16
// floats, (q - z) s, both steps exact in fp32 as `kernels.int4_layout.dequantize` computes
// them, and multiplies it as a dense panel; with AVX2, up to 8 rows dequantise each line in
// registers as the tile reads it instead. Either way the outputs are bit for bit those of the
// dense panels of the dequantised weight, at an eighth of its weight bytes.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops_library.h"
#include "vector_math.h"

namespace servelab::panels_f32 {
namespace {

constexpr int64_t kColumns = 16;            // a panel's columns: one cache line of each k
constexpr int kTileRows = 6;                // rows of x per tile
constexpr int64_t kBlockBytes = 256 << 10;  // x rows per block: about this much of x

int64_t panels_of(int64_t n_len) { return (n_len + kColumns - 1) / kColumns; }

#if defined(__AVX2__) && defined(__FMA__)
// y[m][0 .. columns) = x[m] . the panel's columns, for M rows of x; `next` (or nullptr) is the
// panel to ask into L2, a line per k. The sums are named variables, two per row: GCC 12 stored
// every element of a sums array to the stack at each k (about 60% of this speed).
// Line k's weights w0 (columns 0-7) and w1 (8-15) into the sums of rows 0 .. M - 1.
#define SERVELAB_ROW(i)                                       \
  if constexpr (M > i) {                                      \
    const __m256 xm = _mm256_broadcast_ss(x + i * k_len + k); \
    l##i = _mm256_fmadd_ps(xm, w0, l##i);                     \
    r##i = _mm256_fmadd_ps(xm, w1, r##i);                     \
  }
#define SERVELAB_ROWS \
  SERVELAB_ROW(0) SERVELAB_ROW(1) SERVELAB_ROW(2) SERVELAB_ROW(3) SERVELAB_ROW(4) SERVELAB_ROW(5)

template <int M>
inline void store_rows(float* y, int64_t y_stride, int64_t columns, __m256 l0, __m256 r0,
                       __m256 l1, __m256 r1, __m256 l2, __m256 r2, __m256 l3, __m256 r3,
                       __m256 l4, __m256 r4, __m256 l5, __m256 r5) {
  const __m256i mask0 = servelab::lanes_below(columns);
  const __m256i mask1 = servelab::lanes_below(columns - 8);
  const __m256 sums[kTileRows][2] = {{l0, r0}, {l1, r1}, {l2, r2}, {l3, r3}, {l4, r4}, {l5, r5}};
  for (int m = 0; m < M; ++m) {
    _mm256_maskstore_ps(y + m * y_stride, mask0, sums[m][0]);
    _mm256_maskstore_ps(y + m * y_stride + 8, mask1, sums[m][1]);
  }
}

template <int M>
void tile(const float* x, int64_t k_len, const float* panel, const float* next, float* y,
          int64_t y_stride, int64_t columns) {
  static_assert(M >= 1 && M <= kTileRows);
  __m256 l0, r0, l1, r1, l2, r2, l3, r3, l4, r4, l5, r5;
  l0 = r0 = l1 = r1 = l2 = r2 = l3 = r3 = l4 = r4 = l5 = r5 = _mm256_setzero_ps();
  const float* ahead = next != nullptr ? next : panel;  // no branch in the loop
  for (int64_t k = 0; k < k_len; ++k) {
    const __m256 w0 = _mm256_loadu_ps(panel + k * kColumns);
    const __m256 w1 = _mm256_loadu_ps(panel + k * kColumns + 8);
    __builtin_prefetch(ahead + k * kColumns, 0, 2);
    SERVELAB_ROWS
  }
  store_rows<M>(y, y_stride, columns, l0, r0, l1, r1, l2, r2, l3, r3, l4, r4, l5, r5);
}

// Int4 lines, dequantised in registers: (q - z) s for the 16 columns of line k, as
// `dequantize_panel` computes them; the group's zero points and scales held over its lines.
// At most 4 rows (the 8 sums, 4 group vectors and the line fit the 16 registers), for the few
// rows of decode steps; more rows dequantise a panel once into a buffer (`dequantize_panel`).
constexpr int kInt4TileRows = 4;
constexpr int64_t kInt4DirectRows = 8;  // beyond: a buffer, the dequantising shared by more rows

template <int M>
void int4_tile(const float* x, int64_t k_len, const uint8_t* nibbles, const float* zeros,
               const float* scales, int64_t group, float* y, int64_t y_stride,
               int64_t columns) {
  static_assert(M >= 1 && M <= kInt4TileRows);
  __m256 l0, r0, l1, r1, l2, r2, l3, r3, l4, r4, l5, r5;
  l0 = r0 = l1 = r1 = l2 = r2 = l3 = r3 = l4 = r4 = l5 = r5 = _mm256_setzero_ps();
  const __m256i low_nibble = _mm256_set1_epi32(0x0F);
  for (int64_t g0 = 0; g0 < k_len; g0 += group) {
    const float* z = zeros + (g0 / group) * kColumns;
    const float* s = scales + (g0 / group) * kColumns;
    const __m256 z0 = _mm256_loadu_ps(z), z1 = _mm256_loadu_ps(z + 8);
    const __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8);
    for (int64_t k = g0; k < std::min(k_len, g0 + group); ++k) {
      const __m256i bytes = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(nibbles + k * (kColumns / 2))));
      const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, low_nibble));
      const __m256 q1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
      const __m256 w0 = _mm256_mul_ps(_mm256_sub_ps(q0, z0), s0);
      const __m256 w1 = _mm256_mul_ps(_mm256_sub_ps(q1, z1), s1);
      SERVELAB_ROWS
    }
  }
  store_rows<M>(y, y_stride, columns, l0, r0, l1, r1, l2, r2, l3, r3, l4, r4, l5, r5);
}
#undef SERVELAB_ROWS
#else
// The same tile in plain loops (one sum per output, over k in order), which the compiler
// vectorises across the 16 columns for the build's ISA.
template <int M>
void tile(const float* x, int64_t k_len, const float* panel, const float* next, float* y,
          int64_t y_stride, int64_t columns) {
  float acc[M][kColumns] = {};
  for (int64_t k = 0; k < k_len; ++k) {
    const float* line = panel + k * kColumns;
    if (next != nullptr) __builtin_prefetch(next + k * kColumns, 0, 2);
    for (int m = 0; m < M; ++m) {
      const float xm = x[m * k_len + k];
      for (int64_t c = 0; c < kColumns; ++c) acc[m][c] += xm * line[c];
    }
  }
  for (int m = 0; m < M; ++m) std::copy(acc[m], acc[m] + columns, y + m * y_stride);
}
#endif

// Rows [first, first + count) of x by panel `p` (and `next` asked into L2 by its first tile).
void rows_by_panel(const float* x, int64_t first, int64_t count, int64_t k_len,
                   const float* panel, const float* next, float* y, int64_t n_len, int64_t p) {
  const int64_t columns = std::min(kColumns, n_len - p * kColumns);
  for (int64_t m = first; m < first + count; m += kTileRows) {
    const float* xm = x + m * k_len;
    float* ym = y + m * n_len + p * kColumns;
    const float* ahead = m == first ? next : nullptr;
    switch (std::min<int64_t>(kTileRows, first + count - m)) {
      case 1: tile<1>(xm, k_len, panel, ahead, ym, n_len, columns); break;
      case 2: tile<2>(xm, k_len, panel, ahead, ym, n_len, columns); break;
      case 3: tile<3>(xm, k_len, panel, ahead, ym, n_len, columns); break;
      case 4: tile<4>(xm, k_len, panel, ahead, ym, n_len, columns); break;
      case 5: tile<5>(xm, k_len, panel, ahead, ym, n_len, columns); break;
      default: tile<6>(xm, k_len, panel, ahead, ym, n_len, columns); break;
    }
  }
}

void check_packed(const at::Tensor& panels, int64_t k_len, int64_t n_len) {
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panels.scalar_type() == at::kFloat &&
                  panels.size(0) == panels_of(n_len) && panels.size(1) == k_len &&
                  panels.size(2) == kColumns,
              "panels are `pack_panels_f32` of a float32 weight [", n_len, ", ", k_len, "]");
}

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat,
              "the weight is float32 [N, K]");
  const at::Tensor w = weight.contiguous();
  const int64_t n_len = w.size(0), k_len = w.size(1);
  auto out = at::zeros({panels_of(n_len), k_len, kColumns}, w.options());
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, panels_of(n_len), 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t c = 0; c < kColumns && p * kColumns + c < n_len; ++c) {
        const float* row = src + (p * kColumns + c) * k_len;
        float* column = dst + p * k_len * kColumns + c;
        for (int64_t k = 0; k < k_len; ++k) column[k * kColumns] = row[k];
      }
    }
  });
  return out;
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, int64_t n_len) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x is float32 [rows, K]");
  const at::Tensor xs = x.contiguous();
  const int64_t rows = xs.size(0), k_len = xs.size(1);
  check_packed(panels, k_len, n_len);
  auto y = at::empty({rows, n_len}, xs.options());
  const float* xp = xs.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t panel_values = k_len * kColumns;
  const int64_t bytes_per_row = k_len * static_cast<int64_t>(sizeof(float));
  const int64_t block = std::max<int64_t>(
      kTileRows, kBlockBytes / bytes_per_row / kTileRows * kTileRows);
  at::parallel_for(0, panels_of(n_len), 1, [&](int64_t begin, int64_t end) {
    for (int64_t first = 0; first < rows; first += block) {
      const int64_t count = std::min(block, rows - first);
      for (int64_t p = begin; p < end; ++p) {
        const float* next = p + 1 < end ? wp + (p + 1) * panel_values : nullptr;
        rows_by_panel(xp, first, count, k_len, wp + p * panel_values, next, yp, n_len, p);
      }
    }
  });
  return y;
}

// out [K, 16] = (q - z) s of one int4 panel, written for the compiler to vectorise.
void dequantize_panel(const uint8_t* nibbles, const float* zeros, const float* scales,
                      int64_t k_len, int64_t group, float* out) {
  constexpr int64_t kHalf = kColumns / 2;
  for (int64_t k = 0; k < k_len; ++k) {
    const uint8_t* line = nibbles + k * kHalf;
    const float* z = zeros + (k / group) * kColumns;
    const float* s = scales + (k / group) * kColumns;
    float* dst = out + k * kColumns;
    for (int64_t c = 0; c < kHalf; ++c) {
      dst[c] = (static_cast<float>(line[c] & 0x0F) - z[c]) * s[c];
      dst[c + kHalf] = (static_cast<float>(line[c] >> 4) - z[c + kHalf]) * s[c + kHalf];
    }
  }
}

at::Tensor int4_panel_linear(const at::Tensor& x, const at::Tensor& nibbles,
                             const at::Tensor& zeros, const at::Tensor& scales, int64_t group,
                             int64_t n_len) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x is float32 [rows, K]");
  const at::Tensor xs = x.contiguous();
  const int64_t rows = xs.size(0), k_len = xs.size(1), panels = panels_of(n_len);
  const int64_t groups = (k_len + group - 1) / group;
  TORCH_CHECK(group > 0 && nibbles.is_contiguous() && nibbles.scalar_type() == at::kByte &&
                  nibbles.dim() == 3 && nibbles.size(0) == panels && nibbles.size(1) == k_len &&
                  nibbles.size(2) == kColumns / 2,
              "nibbles are uint8 [ceil(", n_len, " / 16), ", k_len, ", 8]");
  for (const at::Tensor* t : {&zeros, &scales}) {
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat && t->dim() == 3 &&
                    t->size(0) == panels && t->size(1) == groups && t->size(2) == kColumns,
                "zero points and scales are float32 [ceil(", n_len, " / 16), ", groups, ", 16]");
  }
  auto y = at::empty({rows, n_len}, xs.options());
  const float* xp = xs.data_ptr<float>();
  const uint8_t* np = nibbles.data_ptr<uint8_t>();
  const float* zp = zeros.data_ptr<float>();
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> panel;
    for (int64_t p = begin; p < end; ++p) {
      const uint8_t* nibbles_p = np + p * k_len * (kColumns / 2);
      const float* zeros_p = zp + p * groups * kColumns;
      const float* scales_p = sp + p * groups * kColumns;
#if defined(__AVX2__) && defined(__FMA__)
      if (rows <= kInt4DirectRows) {
        const int64_t columns = std::min(kColumns, n_len - p * kColumns);
        const auto rows_from = [&]<int M>(int64_t m) {
          int4_tile<M>(xp + m * k_len, k_len, nibbles_p, zeros_p, scales_p, group,
                       yp + m * n_len + p * kColumns, n_len, columns);
        };
        for (int64_t m = 0; m < rows; m += kInt4TileRows) {
          switch (std::min<int64_t>(kInt4TileRows, rows - m)) {
            case 1: rows_from.template operator()<1>(m); break;
            case 2: rows_from.template operator()<2>(m); break;
            case 3: rows_from.template operator()<3>(m); break;
            default: rows_from.template operator()<4>(m); break;
          }
        }
        continue;
      }
#endif
      panel.resize(k_len * kColumns);
      dequantize_panel(nibbles_p, zeros_p, scales_p, k_len, group, panel.data());
      rows_by_panel(xp, 0, rows, k_len, panel.data(), nullptr, yp, n_len, p);
    }
  });
  return y;
}

}  // namespace
}  // namespace servelab::panels_f32

SERVELAB_FRAGMENT(m) {
  m.def("pack_panels_f32(Tensor weight) -> Tensor");
  m.def("panel_linear_f32(Tensor x, Tensor panels, int n) -> Tensor");
  m.def(
      "int4_panel_linear_f32(Tensor x, Tensor nibbles, Tensor zeros, Tensor scales, int group, "
      "int n) -> Tensor");
}

SERVELAB_IMPL(CPU, m) {
  m.impl("pack_panels_f32", &servelab::panels_f32::pack);
  m.impl("panel_linear_f32", &servelab::panels_f32::panel_linear);
  m.impl("int4_panel_linear_f32", &servelab::panels_f32::int4_panel_linear);
}
