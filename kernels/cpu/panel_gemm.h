// Dense bfloat16 products of a few dozen rows (decode steps of many sequences) on weights
// packed once into column panels for vdpbf16ps; defined in panel_gemm.cpp.
//
// oneDNN runs these shapes near the machine's peak when its weights are in cache, but a
// decoder layer's weights come from memory once per step, and its kernels wait on them: a
// decode step of 64 sequences spent 52-55 ms in its 211 products with each layer's own weights
// (from DRAM) against 45-46 ms with one layer's weights reused (hot), on the development CPU.
// These products ask for the next panel's weights into L2 while they multiply the current one,
// so the load is hidden behind the arithmetic.
//
// Layout: a weight [N, K] becomes [ceil(N / 32), ceil(K / 2), 32, 2], zero-padded: panel p,
// pair j holds (w[32 p + c][2 j], w[32 p + c][2 j + 1]) for its 32 columns c, the operand
// vdpbf16ps multiplies by a broadcast pair (x[2 j], x[2 j + 1]). A tile is 6 rows of x by two
// panels (64 columns: 24 accumulators), over the whole of K.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

#include "product.h"

namespace servelab::panels {

constexpr int64_t kPanelColumns = 32;

// Whether this build has the products (AVX-512 BF16); elsewhere the decoder layer takes
// oneDNN's where it multiplies bfloat16, else the matrix-vector loop of matvec.h.
bool available();

// The packed copy of a bfloat16 weight [N, K].
at::Tensor pack(const at::Tensor& weight);

// Fails unless `panels` is what `pack` makes of a weight [n_len, k_len].
void check_packed(const at::Tensor& panels, int64_t k_len, int64_t n_len);

// Each product of x [rows, K] (contiguous bfloat16), fp32 sums rounded to bfloat16 (then the
// residual added and rounded again, as the eager add rounds), all in one parallel region over
// their panels.
void products(const at::Tensor& x, const std::vector<servelab::Product>& outs);

// y = silu(x gate^T) * (x up^T) [rows, N], rounded as the eager SwiGLU rounds, from the packed
// gate and up weights (both N outputs).
void gated(const at::Tensor& x, const at::Tensor& gate_panels, const at::Tensor& up_panels,
           int64_t n_len, at::Tensor& y);

}  // namespace servelab::panels
