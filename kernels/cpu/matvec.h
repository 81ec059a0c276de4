// Dense bfloat16 products for few rows of x (decode steps of few sequences), defined in
// matvec.cpp: each weight row is read once, front to back, for up to four rows of x at a
// time, so the weight streams from memory in order; oneDNN reads such weights at about half
// the bandwidth.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "product.h"

namespace servelab::matvec {

// Rows of x up to which the decoder layer's dense products run this loop; beyond, products
// on a packed copy of the weight win (the eager layer's boundary, measured the same way).
constexpr int64_t kMaxRows = 8;

// Each product of x [rows, K] (contiguous bfloat16) by its row-major weight [n_len, K], fp32
// sums rounded to bfloat16, all in one parallel region over their weight rows (`residual`
// is not read: the caller adds it).
void products(const at::Tensor& x, const std::vector<Product>& outs);

// y = silu(x gate^T) * (x up^T) [rows, N], the gate and up rows read side by side.
void gated(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, at::Tensor& y);

}  // namespace servelab::matvec
