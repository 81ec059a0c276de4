// One product of a batch's rows of x [rows, K] by a bfloat16 weight into y [rows, n_len]: what
// both dense product loops (matvec.h for few rows, panel_gemm.h beyond) take, several at a
// time when they share x, in one parallel region.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace servelab {

struct Product {
  const c10::BFloat16* weight;  // [n_len, K] row-major (matvec.h) or packed panels (panel_gemm.h)
  int64_t n_len;
  c10::BFloat16* y;
  const c10::BFloat16* residual = nullptr;  // added at the store where given (panel products)
};

}  // namespace servelab
