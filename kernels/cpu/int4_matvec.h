// Int4 weight products for few rows of x (decode steps of few sequences) on torch's packed
// CPU layout, defined in int4_matvec.cpp: each packed byte is read once for all the rows.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

namespace servelab::int4 {

constexpr int64_t kMaxRows = 4;    // beyond this torch's kernel re-reads less
constexpr int64_t kMaxBlock = 64;  // outputs per block of torch's packing, at most

// Whether the loops take `rows` rows of x for `n_len` outputs packed in blocks of `block`.
bool fits(int64_t rows, int64_t n_len, int64_t block);

// One int4 weight's packed bytes and (scale, offset) pairs, with x's sums over its groups.
struct Product {
  const uint8_t* packed;
  const c10::BFloat16* pairs;
  int64_t n_len, group, block;
  c10::BFloat16* y;           // [rows, n_len]
  std::vector<float> x_sums;  // [rows, K / group]

  Product(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& pairs,
          int64_t group, int64_t block, c10::BFloat16* y);
};

// Each product of x [rows, K] (contiguous bfloat16), in one parallel region over all their
// blocks of outputs.
void products(const at::Tensor& x, const std::vector<Product>& outs);

// y = silu(x gate^T) * (x up^T) for int4 gate and up of the same shape, block by block.
void gated(const at::Tensor& x, const Product& gate, const Product& up, c10::BFloat16* y);

}  // namespace servelab::int4
