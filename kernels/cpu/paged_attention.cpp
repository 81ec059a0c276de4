// Attention over the KV cache on the CPU for sequences with few new tokens (decode,
// speculative verification, short chunks), paged or contiguous, in one call per layer.
//
// Work items are (sequence, KV head): each reads its context's keys and values once for all
// the query heads of its group and all its new tokens, so the cache is streamed once per
// step. Scores and accumulation are fp32 whatever the cache dtype; a row at position
// `seq_len - n + i` attends causally to positions 0 .. that position. The inner loops run
// over the head dimension and are written to be vectorised by the compiler (-O3, the
// host's vector ISA; exp through the C library's vector math, which -fno-math-errno allows).
// Registered as the operator `servelab::cpu_paged_attention`.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float to_float(float x) { return x; }

inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float to_float(c10::Half x) { return static_cast<float>(x); }

// A dot product written as 16 independent lanes, which the compiler vectorises without
// having to reassociate a single running sum.
inline float dot(const float* a, const float* b, int64_t dim) {
  float lanes[16] = {0.0f};
  int64_t d = 0;
  for (; d + 16 <= dim; d += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += a[d + j] * b[d + j];
  }
  float sum = 0.0f;
  for (int j = 0; j < 16; ++j) sum += lanes[j];
  for (; d < dim; ++d) sum += a[d] * b[d];
  return sum;
}

// Maximum and sum of `count` floats, as 16 independent lanes (vectorised, no reassociation).
inline float max_of(const float* x, int64_t count) {
  float lanes[16];
  for (int j = 0; j < 16; ++j) lanes[j] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] = lanes[j] > x[i + j] ? lanes[j] : x[i + j];
  }
  float best = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < 16; ++j) best = best > lanes[j] ? best : lanes[j];
  for (; i < count; ++i) best = best > x[i] ? best : x[i];
  return best;
}

inline float sum_of(const float* x, int64_t count) {
  float lanes[16] = {0.0f};
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += x[i + j];
  }
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += lanes[j];
  for (; i < count; ++i) total += x[i];
  return total;
}

template <typename scalar_t>
inline void store(scalar_t* dst, const float* src, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<scalar_t>(src[d]);
}

// Flat cache slot of position `pos` of a sequence.
struct SlotMap {
  bool paged;
  int64_t block_size;
  const int32_t* table;  // paged: the sequence's block table row
  int64_t slab_start;    // contiguous: first slot of the slab

  inline int64_t operator()(int64_t pos) const {
    if (!paged) return slab_start + pos;
    return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
  }
};

template <typename scalar_t>
void attend_item(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache,
                 scalar_t* out, int64_t first_row, int64_t rows, int64_t seq_len,
                 int64_t kv_head, int64_t group, int64_t num_kv_heads, int64_t dim,
                 float scale, const SlotMap& slot, std::vector<float>& scores,
                 std::vector<float>& acc, std::vector<float>& query) {
  const int64_t num_heads = num_kv_heads * group;
  const int64_t first_pos = seq_len - rows;
  const int64_t lanes = rows * group;  // one (row, head) pair per lane
  query.assign(lanes * dim, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < group; ++g) {
      const scalar_t* src = q + ((first_row + r) * num_heads + kv_head * group + g) * dim;
      float* dst = query.data() + (r * group + g) * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = to_float(src[d]) * scale;
    }
  }
  scores.assign(lanes * seq_len, -std::numeric_limits<float>::infinity());
  const int64_t token_stride = num_kv_heads * dim;
  for (int64_t pos = 0; pos < seq_len; ++pos) {
    const scalar_t* key = k_cache + slot(pos) * token_stride + kv_head * dim;
    float key_f[512];
    for (int64_t d = 0; d < dim; ++d) key_f[d] = to_float(key[d]);
    const int64_t first_visible = std::max<int64_t>(0, pos - first_pos);  // earliest row seeing pos
    for (int64_t r = first_visible; r < rows; ++r) {
      for (int64_t g = 0; g < group; ++g) {
        const float* qv = query.data() + (r * group + g) * dim;
        scores[(r * group + g) * seq_len + pos] = dot(qv, key_f, dim);
      }
    }
  }
  acc.assign(lanes * dim, 0.0f);
  std::vector<float> denom(lanes, 0.0f);
  for (int64_t lane = 0; lane < lanes; ++lane) {
    float* row = scores.data() + lane * seq_len;
    const int64_t visible = first_pos + lane / group + 1;
    const float peak = max_of(row, visible);
    for (int64_t pos = 0; pos < visible; ++pos) row[pos] = std::exp(row[pos] - peak);
    denom[lane] = sum_of(row, visible);
  }
  for (int64_t pos = 0; pos < seq_len; ++pos) {
    const scalar_t* value = v_cache + slot(pos) * token_stride + kv_head * dim;
    float value_f[512];
    for (int64_t d = 0; d < dim; ++d) value_f[d] = to_float(value[d]);
    const int64_t first_visible = std::max<int64_t>(0, pos - first_pos);
    for (int64_t lane = first_visible * group; lane < lanes; ++lane) {
      const float weight = scores[lane * seq_len + pos];
      float* a = acc.data() + lane * dim;
      for (int64_t d = 0; d < dim; ++d) a[d] += weight * value_f[d];
    }
  }
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const int64_t r = lane / group;
    const int64_t g = lane % group;
    float* a = acc.data() + lane * dim;
    const float inv = 1.0f / denom[lane];
    for (int64_t d = 0; d < dim; ++d) a[d] *= inv;
    store(out + ((first_row + r) * num_heads + kv_head * group + g) * dim, a, dim);
  }
}

template <typename scalar_t>
void attend_all(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                at::Tensor& out, const at::Tensor& query_start_loc, const at::Tensor& seq_lens,
                const at::Tensor& kv_index, bool paged, double scale) {
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t num_kv_heads = k_cache.size(2);
  const int64_t dim = k_cache.size(3);
  const int64_t group = q.size(1) / num_kv_heads;
  const int64_t block_size = k_cache.size(1);
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const int32_t* tables = paged ? kv_index.data_ptr<int32_t>() : nullptr;
  const int64_t* slabs = paged ? nullptr : kv_index.data_ptr<int64_t>();
  const int64_t table_width = paged ? kv_index.size(1) : 0;
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc, query;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / num_kv_heads;
      const int64_t kv_head = item % num_kv_heads;
      const int64_t rows = starts[b + 1] - starts[b];
      if (rows == 0) continue;
      SlotMap slot{paged, block_size, paged ? tables + b * table_width : nullptr,
                   paged ? 0 : slabs[b]};
      attend_item<scalar_t>(q_ptr, k_ptr, v_ptr, out_ptr, starts[b], rows, lens[b], kv_head,
                            group, num_kv_heads, dim, fscale, slot, scores, acc, query);
    }
  });
}

at::Tensor cpu_paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& query_start_loc,
                               const at::Tensor& seq_lens, const at::Tensor& kv_index,
                               bool paged, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4, "q [T, Hq, D], caches [blocks, bs, Hkv, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "q and the caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type(), "q and the cache must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && k_cache.size(3) <= 512, "head dim mismatch");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(query_start_loc.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "query_start_loc and seq_lens are int32");
  TORCH_CHECK(kv_index.scalar_type() == (paged ? at::kInt : at::kLong),
              "block tables are int32, slab starts int64");
  auto out = at::empty_like(q);
  const auto qsl = query_start_loc.contiguous();
  const auto lens = seq_lens.contiguous();
  const auto index = kv_index.contiguous();
  switch (q.scalar_type()) {
    case at::kFloat:
      attend_all<float>(q, k_cache, v_cache, out, qsl, lens, index, paged, scale);
      break;
    case at::kBFloat16:
      attend_all<c10::BFloat16>(q, k_cache, v_cache, out, qsl, lens, index, paged, scale);
      break;
    case at::kHalf:
      attend_all<c10::Half>(q, k_cache, v_cache, out, qsl, lens, index, paged, scale);
      break;
    default:
      TORCH_CHECK(false, "cpu_paged_attention supports float32, bfloat16 and float16");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(servelab, m) {
  m.def(
      "cpu_paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor kv_index, bool paged, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(servelab, CPU, m) { m.impl("cpu_paged_attention", &cpu_paged_attention); }
