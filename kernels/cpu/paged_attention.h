// The CPU attention operator of paged_attention.cpp, for other operators of the same library
// (the fused decoder layer) to call without going through the dispatcher.
#pragma once

#include <ATen/ATen.h>

namespace servelab {

// Causal attention of `q` [T, Hq, D] over the cache for sequences with few new tokens; see
// paged_attention.cpp. Returns [T, Hq, D] in q's dtype.
at::Tensor cpu_paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& query_start_loc,
                               const at::Tensor& seq_lens, const at::Tensor& kv_index,
                               bool paged, double scale);

}  // namespace servelab
