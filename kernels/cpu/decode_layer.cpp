// One Llama-family decoder layer for a batch whose sequences all have few new tokens (decode
// steps, short speculative verifications; any batch size), bfloat16, in one call.
//
// At batch 1 the eager layer is some twenty small operators, each dispatched from Python,
// and together they cost more than the layer's arithmetic; its matrix-vector products also
// run well below the machine's memory bandwidth in oneDNN. This operator runs the whole layer
// in C++: RMSNorm, the q/k/v projections, rotary embedding, the KV write, attention (the
// operator of paged_attention.cpp), the output projection and residual, RMSNorm, SwiGLU and
// its residual (the element-wise steps in row_ops.h). Dense weights are multiplied by an
// AVX-512 BF16 matrix-vector loop that reads each weight row once for all the batch's rows (a
// portable loop elsewhere) up to kMatvecMaxRows rows, and beyond by the panel products of
// panel_gemm.h on their packed copy (oneDNN's prepacked copy on a build without AVX-512 BF16);
// int4 weights in torch's packed layout by a loop of the same kind for at most
// kInt4MaxRows rows, else by torch's packed int4 CPU kernel. Every intermediate is rounded to
// bfloat16 where the eager model rounds it, so the two differ only in the order of sums.
// Registered as the operators `servelab::decode_layer`, and the two products alone (for the
// linear layers' decode steps, tests and benchmarks) `servelab::matvec` and
// `servelab::int4_matvec`.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "paged_attention.h"
#include "panel_gemm.h"
#include "row_ops.h"

namespace {

using bf16 = c10::BFloat16;

using servelab::rows::round_bf16;
using servelab::rows::swiglu_value;
using servelab::rows::widen;

constexpr int64_t kLinears = 7;  // q, k, v, o, gate, up, down

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

struct Product {
  const bf16* weight;
  int64_t n_len;
  bf16* y;
};

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

// silu(x gate^T) * (x up^T) [rows, N], the gate and up rows read side by side.
void gated_products(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
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

// Int4 weights in torch's packed CPU layout (`aten._convert_weight_to_int4pack_for_cpu`):
// uint8 [N / 64, K, 32], byte j of row k of block b holding output b * 64 + j in its low
// nibble and output b * 64 + 32 + j in its high one; [K / group, N, 2] (scale, offset) pairs,
// w = (q - 8) * scale + offset. For few rows of x this loop reads each byte once and sums per
// group, y += scale * sum(x q) + (offset - 8 scale) * sum(x); torch's kernel (used for more
// rows, or outputs not a multiple of 64) reads the same bytes at about half the speed.
constexpr int64_t kInt4Block = 64;
constexpr int64_t kInt4Tile = 2;     // rows of x per pass over a block's bytes
constexpr int64_t kInt4MaxRows = 4;  // beyond this torch's kernel re-reads less
constexpr int64_t kInt4Prefetch = 1024;  // bytes ahead of the loads: DRAM latency, measured

bool int4_matvec_fits(int64_t rows, int64_t n_len) {
  return rows <= kInt4MaxRows && n_len % kInt4Block == 0;
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
void int4_group(const bf16* x, int64_t k_len, const uint8_t* bytes, int64_t k0, int64_t k1,
                const bf16* pairs, const float* x_sums, int64_t x_sums_stride,
                float total[][kInt4Block]) {
  static const __m512i index_low = spread_index(0), index_high = spread_index(16);
  const __m512i nibble = _mm512_set1_epi16(0x000F), exponent = _mm512_set1_epi16(0x4300);
  constexpr __mmask64 kEvenBytes = 0x5555555555555555ULL;
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  }
  for (int64_t k = k0; k < k1; k += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(bytes + k * 32 + kInt4Prefetch), _MM_HINT_T0);
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
#else
template <int M>
void int4_group(const bf16* x, int64_t k_len, const uint8_t* bytes, int64_t k0, int64_t k1,
                const bf16* pairs, const float* x_sums, int64_t x_sums_stride,
                float total[][kInt4Block]) {
  float part[M][kInt4Block] = {};
  for (int64_t k = k0; k < k1; ++k) {
    const uint8_t* row = bytes + k * 32;
    for (int m = 0; m < M; ++m) {
      const float xk = widen(x[m * k_len + k]);
      for (int j = 0; j < 32; ++j) {
        part[m][j] += xk * static_cast<float>(row[j] & 0x0F);
        part[m][j + 32] += xk * static_cast<float>(row[j] >> 4);
      }
    }
  }
  for (int j = 0; j < kInt4Block; ++j) {
    const float scale = widen(pairs[2 * j]);
    const float bias = widen(pairs[2 * j + 1]) - 8.0f * scale;
    for (int m = 0; m < M; ++m) {
      total[m][j] += bias * x_sums[m * x_sums_stride] + scale * part[m][j];
    }
  }
}
#endif

// One int4 weight's packed bytes and (scale, offset) pairs, with x's sums over its groups.
struct Int4Product {
  const uint8_t* packed;
  const bf16* pairs;
  int64_t n_len, group;
  bf16* y;  // [rows, n_len]
  std::vector<float> x_sums;  // [rows, K / group]

  Int4Product(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& pairs_,
              int64_t group_, bf16* y_)
      : packed(packed_weight.data_ptr<uint8_t>()),
        pairs(pairs_.data_ptr<bf16>()),
        n_len(pairs_.size(1)),
        group(group_),
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
};

// Outputs block * 64 .. + 63 of `M` rows of x [M, K] (from row m0), written at y with
// row stride y_stride.
template <int M>
void int4_block(const bf16* x, int64_t m0, int64_t k_len, const Int4Product& w, int64_t block,
                bf16* y, int64_t y_stride) {
  const int64_t groups = k_len / w.group;
  const uint8_t* bytes = w.packed + block * k_len * 32;
  const float* x_sums = w.x_sums.data() + m0 * groups;
  float total[M][kInt4Block] = {};
  for (int64_t g = 0; g < groups; ++g) {
    int4_group<M>(x + m0 * k_len, k_len, bytes, g * w.group, (g + 1) * w.group,
                  w.pairs + (g * w.n_len + block * kInt4Block) * 2, x_sums + g, groups, total);
  }
  for (int m = 0; m < M; ++m) {
    for (int j = 0; j < kInt4Block; ++j) y[m * y_stride + j] = bf16(total[m][j]);
  }
}

// All rows of x for one block, in tiles of kInt4Tile rows.
void int4_block_rows(const bf16* x, int64_t rows, int64_t k_len, const Int4Product& w,
                     int64_t block, bf16* y, int64_t y_stride) {
  for (int64_t m = 0; m < rows; m += kInt4Tile) {
    bf16* ym = y + m * y_stride;
    if (rows - m >= 2) {
      int4_block<2>(x, m, k_len, w, block, ym, y_stride);
    } else {
      int4_block<1>(x, m, k_len, w, block, ym, y_stride);
    }
  }
}

// Several int4 products of one x in one parallel region over all their blocks of 64 outputs.
void int4_products(const at::Tensor& x, const std::vector<Int4Product>& outs) {
  const int64_t rows = x.size(0), k_len = x.size(1);
  const bf16* xp = x.data_ptr<bf16>();
  int64_t total = 0;
  for (const auto& w : outs) total += w.n_len / kInt4Block;
  at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (const auto& w : outs) {
      const int64_t blocks = w.n_len / kInt4Block;
      for (int64_t b = std::max(begin, first); b < std::min(end, first + blocks); ++b) {
        const int64_t block = b - first;
        int4_block_rows(xp, rows, k_len, w, block, w.y + block * kInt4Block, w.n_len);
      }
      first += blocks;
    }
  });
}

// silu(x gate^T) * (x up^T) for int4 gate and up of the same shape, block by block.
void int4_gated(const at::Tensor& x, const Int4Product& gate, const Int4Product& up, bf16* y) {
  const int64_t rows = x.size(0), k_len = x.size(1), n_len = gate.n_len;
  const bf16* xp = x.data_ptr<bf16>();
  at::parallel_for(0, n_len / kInt4Block, 1, [&](int64_t begin, int64_t end) {
    std::vector<bf16> g(rows * kInt4Block), u(rows * kInt4Block);
    for (int64_t block = begin; block < end; ++block) {
      int4_block_rows(xp, rows, k_len, gate, block, g.data(), kInt4Block);
      int4_block_rows(xp, rows, k_len, up, block, u.data(), kInt4Block);
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t j = 0; j < kInt4Block; ++j) {
          y[m * n_len + block * kInt4Block + j] =
              swiglu_value(widen(g[m * kInt4Block + j]), widen(u[m * kInt4Block + j]));
        }
      }
    }
  });
}

// oneDNN's product with a weight it has prepacked (`mkldnn::_linear_pointwise`, what the
// eager layer calls for more than a few rows), reached through the dispatcher.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  return op.call(x, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), "");
}

// Rows of x up to which dense products run the matrix-vector loop; beyond, blocked products
// on a packed copy of the weight win (the eager layer's boundary, measured the same way).
constexpr int64_t kMatvecMaxRows = 8;

// One projection: dense (`group` 0: `weight` bfloat16 [N, K] and `packed`, its copy packed
// into panels by `servelab::pack_panels` or oneDNN's prepacked one) or int4 (`weight` torch's
// packed int4 bytes, `packed` its [K / group, N, 2] scales and offsets).
struct Linear {
  at::Tensor weight;
  at::Tensor packed;
  int64_t group;

  bool dense() const { return group == 0; }
  int64_t out_features() const { return dense() ? weight.size(0) : packed.size(1); }
  bool int4_loop(const at::Tensor& x) const {
    return !dense() && int4_matvec_fits(x.size(0), out_features());
  }
  bool blocked(const at::Tensor& x) const {
    return dense() && packed.defined() && x.size(0) > kMatvecMaxRows;
  }
  bool onednn(const at::Tensor& x) const { return blocked(x) && packed.is_mkldnn(); }
  bool panels(const at::Tensor& x) const { return blocked(x) && !packed.is_mkldnn(); }

  at::Tensor operator()(const at::Tensor& x) const { return project(x, {this}).front(); }

  // residual + x W^T, rounded as the eager add rounds: fused into the panel products' store,
  // else a separate pass.
  at::Tensor plus(const at::Tensor& x, const at::Tensor& residual) const {
    if (!panels(x)) return servelab::rows::add(residual, (*this)(x));
    auto y = at::empty({x.size(0), out_features()}, x.options());
    servelab::panels::products(x, {{packed.data_ptr<bf16>(), out_features(), y.data_ptr<bf16>(),
                                    residual.data_ptr<bf16>()}});
    return y;
  }

  // x times each of `linears` (which share the input): the dense ones in one parallel region
  // (the matrix-vector loop or the panel products), the int4 ones the loop above takes in
  // another, the rest by oneDNN or torch's int4 kernel.
  static std::vector<at::Tensor> project(const at::Tensor& x,
                                         const std::vector<const Linear*>& linears) {
    std::vector<at::Tensor> ys;
    std::vector<Product> dense;
    std::vector<servelab::panels::Product> panelled;
    std::vector<Int4Product> int4;
    for (const Linear* linear : linears) {
      if (linear->onednn(x)) {
        ys.push_back(onednn_linear(x, linear->packed));
        continue;
      }
      if (!linear->dense() && !linear->int4_loop(x)) {
        ys.push_back(
            at::_weight_int4pack_mm_for_cpu(x, linear->weight, linear->group, linear->packed));
        continue;
      }
      ys.push_back(at::empty({x.size(0), linear->out_features()}, x.options()));
      bf16* y = ys.back().data_ptr<bf16>();
      if (linear->panels(x)) {
        panelled.push_back({linear->packed.data_ptr<bf16>(), linear->out_features(), y});
      } else if (linear->dense()) {
        dense.push_back({linear->weight.data_ptr<bf16>(), linear->out_features(), y});
      } else {
        int4.emplace_back(x, linear->weight, linear->packed, linear->group, y);
      }
    }
    if (!dense.empty()) products(x, dense);
    if (!panelled.empty()) servelab::panels::products(x, panelled);
    if (!int4.empty()) int4_products(x, int4);
    return ys;
  }
};

// The SwiGLU inner activations silu(x gate^T) * (x up^T).
at::Tensor gated(const at::Tensor& x, const Linear& gate, const Linear& up) {
  auto y = at::empty({x.size(0), gate.out_features()}, x.options());
  if (gate.panels(x) && up.panels(x)) {
    servelab::panels::gated(x, gate.packed, up.packed, gate.out_features(), y);
    return y;
  }
  if (gate.dense() && up.dense() && !gate.blocked(x)) {
    gated_products(x, gate.weight, up.weight, y);
    return y;
  }
  if (gate.int4_loop(x) && up.int4_loop(x)) {
    const Int4Product g(x, gate.weight, gate.packed, gate.group, nullptr);
    const Int4Product u(x, up.weight, up.packed, up.group, nullptr);
    int4_gated(x, g, u, y.data_ptr<bf16>());
    return y;
  }
  servelab::rows::swiglu(gate(x), up(x), y);
  return y;
}

// The step's keys and values into the cache at their flat slots.
void write_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache,
                 at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  const int64_t row = k.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  bf16* kc = k_cache.data_ptr<bf16>();
  bf16* vc = v_cache.data_ptr<bf16>();
  for (int64_t t = 0; t < k.size(0); ++t) {
    std::memcpy(kc + slots[t] * row, k.data_ptr<bf16>() + t * row, row * sizeof(bf16));
    std::memcpy(vc + slots[t] * row, v.data_ptr<bf16>() + t * row, row * sizeof(bf16));
  }
}

// Two tensors per projection, in the order q, k, v, o, gate, up, down: a dense one's weight
// and its oneDNN-prepacked copy (group 0), or an int4 one's packed bytes and scales.
std::vector<Linear> linears_of(at::TensorList tensors, at::IntArrayRef groups) {
  TORCH_CHECK(static_cast<int64_t>(groups.size()) == kLinears,
              "seven projections: q, k, v, o, gate, up, down");
  TORCH_CHECK(static_cast<int64_t>(tensors.size()) == 2 * kLinears, "two tensors per projection");
  std::vector<Linear> linears;
  for (int64_t i = 0; i < kLinears; ++i) {
    const at::Tensor& weight = tensors[2 * i];
    if (groups[i] == 0) {
      TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() &&
                      weight.dim() == 2,
                  "dense weights are contiguous bfloat16 [out, in]");
      const at::Tensor& packed = tensors[2 * i + 1];
      if (packed.defined() && !packed.is_mkldnn()) {
        servelab::panels::check_packed(packed, weight.size(1), weight.size(0));
      }
    }
    linears.push_back({weight, tensors[2 * i + 1], groups[i]});
  }
  return linears;
}

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& input_norm,
                        const at::Tensor& post_attention_norm, double eps,
                        at::TensorList weights, at::IntArrayRef int4_groups,
                        const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                        at::Tensor v_cache, const at::Tensor& slot_mapping,
                        const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                        const at::Tensor& kv_index, bool paged, int64_t num_heads,
                        double scale) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16,
              "x is contiguous bfloat16 [T, hidden]");
  TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16 && v_cache.scalar_type() == at::kBFloat16 &&
                  k_cache.is_contiguous() && v_cache.is_contiguous(),
              "the caches are contiguous bfloat16 [blocks, block_size, kv_heads, D]");
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 &&
                  cos.is_contiguous() && sin.is_contiguous(),
              "cos and sin are contiguous bfloat16 [T, D / 2]");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == x.size(0),
              "one int64 slot per token");
  const auto linears = linears_of(weights, int4_groups);
  const int64_t tokens = x.size(0);
  const int64_t num_kv_heads = k_cache.size(2), dim = k_cache.size(3);

  // each part a named range in torch.profiler's traces (free when no profiler runs)
  std::vector<at::Tensor> qkv;
  {
    RECORD_FUNCTION("decode_layer/qkv", std::vector<c10::IValue>());
    qkv = Linear::project(servelab::rows::rms_norm(x, input_norm, eps),
                          {&linears[0], &linears[1], &linears[2]});
    servelab::rows::rotate(qkv[0], num_heads, dim, cos, sin);
    servelab::rows::rotate(qkv[1], num_kv_heads, dim, cos, sin);
    write_cache(qkv[1], qkv[2], k_cache, v_cache, slot_mapping.contiguous());
  }
  at::Tensor attended;
  {
    RECORD_FUNCTION("decode_layer/attention", std::vector<c10::IValue>());
    attended = servelab::cpu_paged_attention(qkv[0].view({tokens, num_heads, dim}), k_cache,
                                             v_cache, query_start_loc, seq_lens, kv_index, paged,
                                             scale);
  }
  at::Tensor hidden;
  {
    RECORD_FUNCTION("decode_layer/o_proj", std::vector<c10::IValue>());
    hidden = linears[3].plus(attended.view({tokens, num_heads * dim}), x);
  }
  at::Tensor inner;
  {
    RECORD_FUNCTION("decode_layer/gate_up", std::vector<c10::IValue>());
    inner = gated(servelab::rows::rms_norm(hidden, post_attention_norm, eps), linears[4],
                  linears[5]);
  }
  RECORD_FUNCTION("decode_layer/down_proj", std::vector<c10::IValue>());
  return linears[6].plus(inner, hidden);
}

// The dense projection alone, for tests and benchmarks: x [M, K] w [N, K]^T, bfloat16.
at::Tensor matvec(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bfloat16");
  const Linear linear{w.contiguous(), at::Tensor(), 0};
  return linear(x.contiguous());
}

// The int4 product for few rows alone (tests, benchmarks, the int4 layer's decode steps).
at::Tensor int4_matvec_op(const at::Tensor& x, const at::Tensor& packed,
                          const at::Tensor& scales_and_offsets, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x is bfloat16 [M, K]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed is uint8");
  TORCH_CHECK(scales_and_offsets.scalar_type() == at::kBFloat16 &&
                  scales_and_offsets.is_contiguous() && scales_and_offsets.dim() == 3,
              "scales and offsets are bfloat16 [K / group, N, 2]");
  TORCH_CHECK(x.size(1) % group == 0 && x.size(1) / group == scales_and_offsets.size(0),
              "the group must divide K");
  TORCH_CHECK(int4_matvec_fits(x.size(0), scales_and_offsets.size(1)),
              "at most ", kInt4MaxRows, " rows and outputs a multiple of ", kInt4Block);
  const Linear linear{packed.contiguous(), scales_and_offsets.contiguous(), group};
  return linear(x.contiguous());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(servelab, m) {
  m.def("matvec(Tensor x, Tensor w) -> Tensor");
  m.def("int4_matvec(Tensor x, Tensor packed, Tensor scales_and_offsets, int group) -> Tensor");
  m.def(
      "decode_layer(Tensor x, Tensor input_norm, Tensor post_attention_norm, float eps, "
      "Tensor[] weights, int[] int4_groups, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor slot_mapping, Tensor query_start_loc, Tensor seq_lens, "
      "Tensor kv_index, bool paged, int num_heads, float scale) -> Tensor");
}

// oneDNN's prepacked weights are MkldnnCPU tensors, and the dispatcher keys a call on them
TORCH_LIBRARY_IMPL(servelab, MkldnnCPU, m) { m.impl("decode_layer", &decode_layer); }

TORCH_LIBRARY_IMPL(servelab, CPU, m) {
  m.impl("decode_layer", &decode_layer);
  m.impl("matvec", &matvec);
  m.impl("int4_matvec", &int4_matvec_op);
}
