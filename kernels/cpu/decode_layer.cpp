// One Llama-family decoder layer for a batch whose sequences all have few new tokens (decode
// steps, short speculative verifications; any batch size), bfloat16, in one call.
//
// At batch 1 the eager layer is some twenty small operators, each dispatched from Python,
// and together they cost more than the layer's arithmetic; its matrix-vector products also
// run well below the machine's memory bandwidth in oneDNN. This operator runs the whole layer
// in C++: RMSNorm, the q/k/v projections, rotary embedding, the KV write, attention (the
// operator of paged_attention.cpp), the output projection and residual, RMSNorm, SwiGLU and
// its residual (the element-wise steps in row_ops.h). Dense weights are multiplied by the
// matrix-vector loop of matvec.h up to matvec::kMaxRows rows, and beyond by the panel products
// of panel_gemm.h on their packed copy (oneDNN's prepacked copy on a build without AVX-512
// BF16 where oneDNN multiplies bfloat16; the matrix-vector loop for any rows where it does
// not); int4 weights in torch's packed layout by the loop of int4_matvec.h for at most
// int4::kMaxRows rows, else by torch's packed int4 CPU kernel. Every intermediate is rounded to
// bfloat16 where the eager model rounds it, so the two differ only in the order of sums.
// Registered as the operator `decode_layer` of this build's namespace (ops_library.h).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "int4_matvec.h"
#include "matvec.h"
#include "ops_library.h"
#include "paged_attention.h"
#include "panel_gemm.h"
#include "row_ops.h"

namespace {

using bf16 = c10::BFloat16;

constexpr int64_t kLinears = 7;  // q, k, v, o, gate, up, down

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

// One projection: dense (`group` 0: `weight` bfloat16 [N, K] and `packed`, its copy packed
// into panels by `pack_panels` or oneDNN's prepacked one, or undefined) or int4 (`weight`
// torch's packed int4 bytes, `packed` its [K / group, N, 2] scales and offsets, `block` the
// packing's outputs per block, 0 where the int4 loop cannot read it).
struct Linear {
  at::Tensor weight;
  at::Tensor packed;
  int64_t group;
  int64_t block;

  bool dense() const { return group == 0; }
  int64_t out_features() const { return dense() ? weight.size(0) : packed.size(1); }
  bool int4_loop(const at::Tensor& x) const {
    return !dense() && servelab::int4::fits(x.size(0), out_features(), block);
  }
  bool blocked(const at::Tensor& x) const {
    return dense() && packed.defined() && x.size(0) > servelab::matvec::kMaxRows;
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
  // (the matrix-vector loop or the panel products), the int4 ones the int4 loop takes in
  // another, the rest by oneDNN or torch's int4 kernel.
  static std::vector<at::Tensor> project(const at::Tensor& x,
                                         const std::vector<const Linear*>& linears) {
    std::vector<at::Tensor> ys;
    std::vector<servelab::Product> dense;
    std::vector<servelab::Product> panelled;
    std::vector<servelab::int4::Product> int4;
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
        int4.emplace_back(x, linear->weight, linear->packed, linear->group, linear->block, y);
      }
    }
    if (!dense.empty()) servelab::matvec::products(x, dense);
    if (!panelled.empty()) servelab::panels::products(x, panelled);
    if (!int4.empty()) servelab::int4::products(x, int4);
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
    servelab::matvec::gated(x, gate.weight, up.weight, y);
    return y;
  }
  if (gate.int4_loop(x) && up.int4_loop(x)) {
    const servelab::int4::Product g(x, gate.weight, gate.packed, gate.group, gate.block, nullptr);
    const servelab::int4::Product u(x, up.weight, up.packed, up.group, up.block, nullptr);
    servelab::int4::gated(x, g, u, y.data_ptr<bf16>());
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
// and its packed copy or none (group 0), or an int4 one's packed bytes and scales.
std::vector<Linear> linears_of(const c10::List<std::optional<at::Tensor>>& tensors,
                               at::IntArrayRef groups, int64_t int4_block) {
  TORCH_CHECK(static_cast<int64_t>(groups.size()) == kLinears,
              "seven projections: q, k, v, o, gate, up, down");
  TORCH_CHECK(static_cast<int64_t>(tensors.size()) == 2 * kLinears, "two tensors per projection");
  std::vector<Linear> linears;
  for (int64_t i = 0; i < kLinears; ++i) {
    const std::optional<at::Tensor> first = tensors.get(2 * i), second = tensors.get(2 * i + 1);
    TORCH_CHECK(first.has_value(), "projection ", i, " has no weight");
    const at::Tensor weight = *first;
    const at::Tensor packed = second.value_or(at::Tensor());
    if (groups[i] == 0) {
      TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() &&
                      weight.dim() == 2,
                  "dense weights are contiguous bfloat16 [out, in]");
      if (packed.defined() && !packed.is_mkldnn()) {
        servelab::panels::check_packed(packed, weight.size(1), weight.size(0));
      }
    } else {
      TORCH_CHECK(packed.defined(), "int4 projection ", i, " has no scales and offsets");
    }
    linears.push_back({weight, packed, groups[i], int4_block});
  }
  return linears;
}

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& input_norm,
                        const at::Tensor& post_attention_norm, double eps,
                        const c10::List<std::optional<at::Tensor>>& weights,
                        at::IntArrayRef int4_groups,
                        int64_t int4_block, const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
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
  const auto linears = linears_of(weights, int4_groups, int4_block);
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

}  // namespace

SERVELAB_FRAGMENT(m) {
  m.def(
      "decode_layer(Tensor x, Tensor input_norm, Tensor post_attention_norm, float eps, "
      "Tensor?[] weights, int[] int4_groups, int int4_block, Tensor cos, Tensor sin, "
      "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, Tensor query_start_loc, Tensor seq_lens, "
      "Tensor kv_index, bool paged, int num_heads, float scale) -> Tensor");
}

// oneDNN's prepacked weights are MkldnnCPU tensors, and the dispatcher keys a call on them
SERVELAB_IMPL(MkldnnCPU, m) { m.impl("decode_layer", &decode_layer); }

SERVELAB_IMPL(CPU, m) { m.impl("decode_layer", &decode_layer); }
