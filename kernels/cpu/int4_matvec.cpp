// The int4 matrix-vector loops of int4_matvec.h, and the operator `int4_matvec` that exposes
// them (the int4 layers' decode steps of few rows, tests, benchmarks).
//
// torch packs int4 weights for its CPU kernel (`aten._convert_weight_to_int4pack_for_cpu`) in
// blocks of B outputs that follow its own vector ISA: B = 64 with AVX-512, 32 with AVX2
// (`kernels/capabilities.py` finds which by packing a known weight). Block b holds uint8
// [K, B / 2]: byte j of row k has output b B + j in its low nibble and b B + B / 2 + j in its
// high one. Beside them, [K / group, N, 2] (scale, offset) pairs, w = (q - 8) scale + offset.
// For few rows of x these loops read each byte once and sum per group,
// y += scale sum(x q) + (offset - 8 scale) sum(x); torch's kernel (used for more rows, or
// outputs not a multiple of B) reads the same bytes at about half the speed on AVX-512.
// With AVX-512 BF16 and VBMI, blocks of 64 take the byte-permute loop below; every other case
// the portable loop, written for the compiler to vectorise for the build's ISA.

#include "int4_matvec.h"

#include <ATen/Parallel.h>

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "ops_library.h"
#include "row_ops.h"

namespace servelab::int4 {
namespace {

using bf16 = c10::BFloat16;
using servelab::rows::swiglu_value;
using servelab::rows::widen;

constexpr int64_t kTile = 2;            // rows of x per pass over a block's bytes
constexpr int64_t kPrefetch = 1024;     // bytes ahead of the loads: DRAM latency, measured

// total[m][j] += scale_j x . q_j + (offset_j - 8 scale_j) sum(x) over one group of one block
// (B = 2 half outputs; row k's bytes at bytes + k half), any block size.
template <int M>
void group_portable(const bf16* x, int64_t k_len, const uint8_t* bytes, int64_t half,
                    int64_t k0, int64_t k1, const bf16* pairs, const float* x_sums,
                    int64_t x_sums_stride, float total[][kMaxBlock]) {
  float part[M][kMaxBlock] = {};
  for (int64_t k = k0; k < k1; ++k) {
    const uint8_t* row = bytes + k * half;
    for (int m = 0; m < M; ++m) {
      const float xk = widen(x[m * k_len + k]);
      float* low = part[m];
      float* high = part[m] + half;
      for (int64_t j = 0; j < half; ++j) {
        low[j] += xk * static_cast<float>(row[j] & 0x0F);
        high[j] += xk * static_cast<float>(row[j] >> 4);
      }
    }
  }
  for (int64_t j = 0; j < 2 * half; ++j) {
    const float scale = widen(pairs[2 * j]);
    const float bias = widen(pairs[2 * j + 1]) - 8.0f * scale;
    for (int m = 0; m < M; ++m) {
      total[m][j] += bias * x_sums[m * x_sums_stride] + scale * part[m][j];
    }
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
// Two packed rows (k, k + 1; 64 bytes) as bfloat16 pairs (k, k + 1) of 128 + q, the exact
// bfloat16 0x4300 | q, for outputs J .. J + 15 (low nibbles) and 32 + J .. 47 + J (high):
// one byte permutation spreads the bytes into 16-bit lanes, and vdpbf16ps multiplies each
// pair by x[k], x[k + 1]. The sum is then x . (128 + q), and 128 * sum(x) comes off per group.
inline __m512i spread_index(int first) {
  alignas(64) uint8_t index[64] = {};
  for (int lane = 0; lane < 16; ++lane) {
    index[4 * lane] = static_cast<uint8_t>(first + lane);
    index[4 * lane + 2] = static_cast<uint8_t>(32 + first + lane);
  }
  return _mm512_load_si512(index);
}

// total[m][outputs] += scale * x . (128 + q) + (offset - 136 scale) * sum(x) over one group,
// pairs the group's 64 (scale, offset) bfloat16 pairs, x_sums its sum of each row of x.
template <int M>
void group_block64(const bf16* x, int64_t k_len, const uint8_t* bytes, int64_t k0, int64_t k1,
                const bf16* pairs, const float* x_sums, int64_t x_sums_stride,
                float total[][kMaxBlock]) {
  static const __m512i index_low = spread_index(0), index_high = spread_index(16);
  const __m512i nibble = _mm512_set1_epi16(0x000F), exponent = _mm512_set1_epi16(0x4300);
  constexpr __mmask64 kEvenBytes = 0x5555555555555555ULL;
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  }
  for (int64_t k = k0; k < k1; k += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(bytes + k * 32 + kPrefetch), _MM_HINT_T0);
    const __m512i rows = _mm512_loadu_si512(bytes + k * 32);
    const __m512i spread[2] = {_mm512_maskz_permutexvar_epi8(kEvenBytes, index_low, rows),
                               _mm512_maskz_permutexvar_epi8(kEvenBytes, index_high, rows)};
    __m512bh weights[4];
    for (int half = 0; half < 2; ++half) {
      const __m512i low = _mm512_and_si512(spread[half], nibble);
      const __m512i high = _mm512_and_si512(_mm512_srli_epi16(spread[half], 4), nibble);
      weights[half] = (__m512bh)_mm512_or_si512(low, exponent);
      weights[half + 2] = (__m512bh)_mm512_or_si512(high, exponent);
    }
    for (int m = 0; m < M; ++m) {
      uint32_t pair;
      std::memcpy(&pair, x + m * k_len + k, sizeof(pair));
      const __m512bh xk = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pair));
      for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], weights[j], xk);
    }
  }
  const __m512 lifted_eight = _mm512_set1_ps(8.0f + 128.0f);
  for (int j = 0; j < 4; ++j) {  // 16 (scale, offset) pairs: a bfloat16 is a float's top half
    const __m512i raw = _mm512_loadu_si512(pairs + 32 * j);
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    const __m512 offset =
        _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xFFFF0000))));
    const __m512 bias = _mm512_fnmadd_ps(lifted_eight, scale, offset);
    for (int m = 0; m < M; ++m) {
      float* out = total[m] + 16 * j;
      const __m512 with_bias =
          _mm512_fmadd_ps(bias, _mm512_set1_ps(x_sums[m * x_sums_stride]), _mm512_loadu_ps(out));
      _mm512_storeu_ps(out, _mm512_fmadd_ps(scale, acc[m][j], with_bias));
    }
  }
}
#endif

// Outputs block * B .. + B - 1 of `M` rows of x [M, K] (from row m0), written at y with
// row stride y_stride.
template <int M>
void block_rows(const bf16* x, int64_t m0, int64_t k_len, const Product& w, int64_t block,
                bf16* y, int64_t y_stride) {
  const int64_t groups = k_len / w.group, half = w.block / 2;
  const uint8_t* bytes = w.packed + block * k_len * half;
  const float* x_sums = w.x_sums.data() + m0 * groups;
  float total[M][kMaxBlock] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const bf16* pairs = w.pairs + (g * w.n_len + block * w.block) * 2;
    const int64_t k0 = g * w.group, k1 = (g + 1) * w.group;
#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
    if (w.block == kMaxBlock) {
      group_block64<M>(x + m0 * k_len, k_len, bytes, k0, k1, pairs, x_sums + g, groups, total);
      continue;
    }
#endif
    group_portable<M>(x + m0 * k_len, k_len, bytes, half, k0, k1, pairs, x_sums + g, groups,
                      total);
  }
  for (int m = 0; m < M; ++m) {
    for (int64_t j = 0; j < w.block; ++j) y[m * y_stride + j] = bf16(total[m][j]);
  }
}

// All rows of x for one block, in tiles of kTile rows.
void block_all_rows(const bf16* x, int64_t rows, int64_t k_len, const Product& w, int64_t block,
                    bf16* y, int64_t y_stride) {
  for (int64_t m = 0; m < rows; m += kTile) {
    bf16* ym = y + m * y_stride;
    if (rows - m >= 2) {
      block_rows<2>(x, m, k_len, w, block, ym, y_stride);
    } else {
      block_rows<1>(x, m, k_len, w, block, ym, y_stride);
    }
  }
}

}  // namespace

bool fits(int64_t rows, int64_t n_len, int64_t block) {
  return rows <= kMaxRows && (block == 32 || block == kMaxBlock) && n_len % block == 0;
}

Product::Product(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& pairs_,
                 int64_t group_, int64_t block_, c10::BFloat16* y_)
    : packed(packed_weight.data_ptr<uint8_t>()),
      pairs(pairs_.data_ptr<c10::BFloat16>()),
      n_len(pairs_.size(1)),
      group(group_),
      block(block_),
      y(y_) {
  const int64_t rows = x.size(0), k_len = x.size(1), groups = k_len / group;
  const bf16* xp = x.data_ptr<bf16>();
  x_sums.resize(rows * groups);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) sum += widen(xp[m * k_len + k]);
      x_sums[m * groups + g] = sum;
    }
  }
}

void products(const at::Tensor& x, const std::vector<Product>& outs) {
  const int64_t rows = x.size(0), k_len = x.size(1);
  const bf16* xp = x.data_ptr<bf16>();
  int64_t total = 0;
  for (const auto& w : outs) total += w.n_len / w.block;
  at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (const auto& w : outs) {
      const int64_t blocks = w.n_len / w.block;
      for (int64_t b = std::max(begin, first); b < std::min(end, first + blocks); ++b) {
        const int64_t block = b - first;
        block_all_rows(xp, rows, k_len, w, block, w.y + block * w.block, w.n_len);
      }
      first += blocks;
    }
  });
}

void gated(const at::Tensor& x, const Product& gate, const Product& up, c10::BFloat16* y) {
  const int64_t rows = x.size(0), k_len = x.size(1), n_len = gate.n_len, width = gate.block;
  const bf16* xp = x.data_ptr<bf16>();
  at::parallel_for(0, n_len / width, 1, [&](int64_t begin, int64_t end) {
    std::vector<bf16> g(rows * width), u(rows * width);
    for (int64_t block = begin; block < end; ++block) {
      block_all_rows(xp, rows, k_len, gate, block, g.data(), width);
      block_all_rows(xp, rows, k_len, up, block, u.data(), width);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t j = 0; j < width; ++j) {
          y[m * n_len + block * width + j] =
              swiglu_value(widen(g[m * width + j]), widen(u[m * width + j]));
        }
      }
    }
  });
}

namespace {

// The int4 product for few rows alone.
at::Tensor int4_matvec_op(const at::Tensor& x, const at::Tensor& packed,
                          const at::Tensor& scales_and_offsets, int64_t group, int64_t block) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x is bfloat16 [M, K]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed is uint8");
  TORCH_CHECK(scales_and_offsets.scalar_type() == at::kBFloat16 &&
                  scales_and_offsets.is_contiguous() && scales_and_offsets.dim() == 3,
              "scales and offsets are bfloat16 [K / group, N, 2]");
  TORCH_CHECK(x.size(1) % group == 0 && x.size(1) / group == scales_and_offsets.size(0),
              "the group must divide K");
  TORCH_CHECK(fits(x.size(0), scales_and_offsets.size(1), block), "at most ", kMaxRows,
              " rows, a packing block of 32 or 64, and outputs a multiple of it");
  const at::Tensor rows = x.contiguous();
  auto y = at::empty({rows.size(0), scales_and_offsets.size(1)}, rows.options());
  products(rows, {Product(rows, packed, scales_and_offsets, group, block, y.data_ptr<bf16>())});
  return y;
}

}  // namespace
}  // namespace servelab::int4

SERVELAB_FRAGMENT(m) {
  m.def(
      "int4_matvec(Tensor x, Tensor packed, Tensor scales_and_offsets, int group, int block) "
      "-> Tensor");
}

SERVELAB_IMPL(CPU, m) { m.impl("int4_matvec", &servelab::int4::int4_matvec_op); }
