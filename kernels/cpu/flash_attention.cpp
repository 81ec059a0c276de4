// Causal flash attention of a prompt's new tokens on a CPU with AVX-512 BF16: prefill.
//
// `servelab::flash_attention(q [n, Hq, D], k [L, Hkv, D], v [L, Hkv, D], scale)`: row i of q
// (position L - n + i) attends to keys 0 .. L - n + i, so one call covers a fresh prompt
// (L = n) and new tokens after a cached prefix (k, v the prefix's keys and values followed by
// the new ones). bfloat16 in and out, head dims 32, 64 and 128, any group size.
//
// Why it exists: torch's CPU flash kernel ran a 3,000-token causal prompt (9 query heads on 3
// KV heads of 64) at 0.28 of the development CPU's calibrated bf16 matmul peak; this runs it at
// 0.75 (`python -m benchmarks.bench_steps --cases prefill-3000` shows the whole step). Both
// products run on vdpbf16ps from registers: a tile of query rows (a KV head's query heads at
// consecutive positions) against 64 keys at a time, scores and the running output of the
// tile in registers, the keys and values of the KV head packed once per call into the
// pair-interleaved layout the instruction reads.
// Softmax is online (running maximum and sum per row, fp32, in base 2); the probabilities are
// rounded to bfloat16 for the value product, as torch's kernel does. Work items are (KV head,
// block of positions), ordered so that a static split over threads gets equal causal work.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "ops_library.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vector_math.h"

namespace {

constexpr int64_t kKeys = 64;       // keys per block: four 16-lane score vectors per row
constexpr int64_t kPositions = 32;  // positions per work item

inline __m512 broadcast_pair(const uint32_t* pair) {
  return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(*pair)));
}

// One KV head's keys and values in vdpbf16ps' operand layout, zero-padded to whole blocks:
// keys [L / 16][D / 2][16 keys][2 dims], values [L / 2][D][2 keys].
struct PackedHead {
  std::vector<uint32_t> keys, values;  // bfloat16 pairs
};

void pack_head(const uint16_t* k, const uint16_t* v, int64_t L, int64_t stride, int64_t dim,
               PackedHead& packed) {
  const int64_t padded = (L + kKeys - 1) / kKeys * kKeys;
  const int64_t pairs = dim / 2;
  packed.keys.assign(padded * pairs, 0);
  packed.values.assign(padded * pairs, 0);
  for (int64_t key = 0; key < L; ++key) {
    const uint16_t* row = k + key * stride;
    uint32_t* group = packed.keys.data() + (key / 16) * pairs * 16 + key % 16;
    for (int64_t j = 0; j < pairs; ++j) {
      uint32_t pair;
      std::memcpy(&pair, row + 2 * j, sizeof(pair));
      group[j * 16] = pair;
    }
  }
  for (int64_t key = 0; key < L; ++key) {
    const uint16_t* row = v + key * stride;
    uint16_t* out = reinterpret_cast<uint16_t*>(packed.values.data() + (key / 2) * dim);
    for (int64_t d = 0; d < dim; ++d) out[2 * d + key % 2] = row[d];
  }
}

struct Problem {
  const uint16_t* q;
  uint16_t* out;
  int64_t n, L, num_heads, group, dim;
  float scale_log2;  // the softmax scale times log2(e): scores in base 2
};

// Rows `first .. first + R` of a work item: row r is position first_pos + r / group, query
// head kv_head * group + r % group. R rows by C 16-dim chunks of output in registers.
template <int R, int C>
void attend_rows(const Problem& pb, const PackedHead& packed, int64_t kv_head,
                 int64_t first_pos, int64_t first_row) {
  const int64_t pairs = pb.dim / 2;
  int64_t row_offset[R];  // of the row's query in q and its output in out
  const uint32_t* q_pairs[R];
  int64_t limit[R];  // the last key each row sees
  int64_t last_key = 0;
  for (int r = 0; r < R; ++r) {
    const int64_t row = first_row + r;
    const int64_t pos = first_pos + row / pb.group;
    const int64_t head = kv_head * pb.group + row % pb.group;
    row_offset[r] = (pos * pb.num_heads + head) * pb.dim;
    q_pairs[r] = reinterpret_cast<const uint32_t*>(pb.q + row_offset[r]);
    limit[r] = pb.L - pb.n + pos;
    last_key = std::max(last_key, limit[r]);
  }
  float running_max[R];
  __m512 lane_sums[R];  // the running softmax denominators, as 16 partial sums each
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    running_max[r] = -std::numeric_limits<float>::infinity();
    lane_sums[r] = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  alignas(64) uint32_t probs[R][kKeys / 2];  // bfloat16 pairs
  const __m512 lane_index = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t block = 0; block <= last_key; block += kKeys) {
    // scores of the R rows against keys block .. block + 63
    __m512 score[R][4];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < 4; ++c) score[r][c] = _mm512_setzero_ps();
    }
    const uint32_t* keys = packed.keys.data() + (block / 16) * pairs * 16;
    for (int64_t j = 0; j < pairs; ++j) {
      __m512bh key[4];
      for (int c = 0; c < 4; ++c) {
        key[c] = (__m512bh)_mm512_loadu_si512(keys + (c * pairs + j) * 16);
      }
      for (int r = 0; r < R; ++r) {
        const __m512bh query = (__m512bh)broadcast_pair(q_pairs[r] + j);
        for (int c = 0; c < 4; ++c) score[r][c] = _mm512_dpbf16_ps(score[r][c], query, key[c]);
      }
    }
    // online softmax per row, in base 2 (scores times scale * log2 e); the running output and
    // sum are rescaled by 2^(old max - new max) when the maximum moves
    const __m512 scale = _mm512_set1_ps(pb.scale_log2);
    for (int r = 0; r < R; ++r) {
      __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int c = 0; c < 4; ++c) {
        if (block + 16 * c + 15 > limit[r]) {  // keys past the row's position are hidden
          const __m512 key_index =
              _mm512_add_ps(lane_index, _mm512_set1_ps(static_cast<float>(block + 16 * c)));
          const __mmask16 hidden = _mm512_cmp_ps_mask(
              key_index, _mm512_set1_ps(static_cast<float>(limit[r])), _CMP_GT_OQ);
          score[r][c] = _mm512_mask_mov_ps(
              score[r][c], hidden, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
        }
        best = _mm512_max_ps(best, score[r][c]);
      }
      const float block_max = _mm512_reduce_max_ps(best) * pb.scale_log2;
      if (block_max > running_max[r]) {
        const __m512 factor = _mm512_set1_ps(std::exp2(running_max[r] - block_max));
        running_max[r] = block_max;
        lane_sums[r] = _mm512_mul_ps(lane_sums[r], factor);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_mul_ps(acc[r][c], factor);
      }
      const __m512 shift = _mm512_set1_ps(-running_max[r]);
      for (int c = 0; c < 4; ++c) {
        score[r][c] = servelab::exp2_nonpositive(_mm512_fmadd_ps(score[r][c], scale, shift));
        lane_sums[r] = _mm512_add_ps(lane_sums[r], score[r][c]);
      }
      _mm512_store_si512(probs[r], (__m512i)_mm512_cvtne2ps_pbh(score[r][1], score[r][0]));
      _mm512_store_si512(probs[r] + 16, (__m512i)_mm512_cvtne2ps_pbh(score[r][3], score[r][2]));
    }
    // acc += probabilities . values, two keys per instruction
    const int64_t key_end = std::min<int64_t>(kKeys, last_key + 1 - block);
    const uint32_t* values = packed.values.data() + (block / 2) * pb.dim;
    for (int64_t i = 0; i < (key_end + 1) / 2; ++i) {
      __m512bh value[C];
      for (int c = 0; c < C; ++c) {
        value[c] = (__m512bh)_mm512_loadu_si512(values + i * pb.dim + 16 * c);
      }
      for (int r = 0; r < R; ++r) {
        const __m512bh weight = (__m512bh)broadcast_pair(&probs[r][i]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], weight, value[c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    uint16_t* dst = pb.out + row_offset[r];
    const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(lane_sums[r]));
    for (int c = 0; c < C; ++c) {
      const __m256bh half = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][c], inverse));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * c), (__m256i)half);
    }
  }
}

// The last `left` (< R) rows of a work item, with a tile of exactly that many rows.
template <int R, int C>
void attend_tail(const Problem& pb, const PackedHead& packed, int64_t kv_head,
                 int64_t first_pos, int64_t first_row, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) return attend_rows<R, C>(pb, packed, kv_head, first_pos, first_row);
    attend_tail<R - 1, C>(pb, packed, kv_head, first_pos, first_row, left);
  }
}

// Every row of one work item, in tiles of at most `kRows` rows (the score tile and the
// output tile each fit the 32 vector registers).
template <int C>
void attend_item(const Problem& pb, const PackedHead& packed, int64_t kv_head,
                 int64_t first_pos, int64_t positions) {
  constexpr int kRows = C <= 4 ? 6 : 3;
  const int64_t rows = positions * pb.group;
  int64_t row = 0;
  for (; row + kRows <= rows; row += kRows) {
    attend_rows<kRows, C>(pb, packed, kv_head, first_pos, row);
  }
  attend_tail<kRows - 1, C>(pb, packed, kv_head, first_pos, row, rows - row);
}

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q [n, Hq, D], k and v [L, Hkv, D]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                  v.scalar_type() == at::kBFloat16,
              "flash_attention takes bfloat16");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(2) == k.size(2), "k, v and q must agree");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(0) <= k.size(0), "more new rows than keys");
  const int64_t dim = q.size(2);
  TORCH_CHECK(dim == 32 || dim == 64 || dim == 128, "head dims 32, 64 and 128");
  const auto query = q.contiguous();
  const auto keys = k.contiguous();
  const auto values = v.contiguous();
  auto out = at::empty_like(query);
  const int64_t num_kv_heads = k.size(1);
  const Problem pb{reinterpret_cast<const uint16_t*>(query.data_ptr<c10::BFloat16>()),
                   reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()),
                   q.size(0), k.size(0), q.size(1), q.size(1) / num_kv_heads, dim,
                   static_cast<float>(scale) * servelab::kLog2e};
  const auto* k_ptr = reinterpret_cast<const uint16_t*>(keys.data_ptr<c10::BFloat16>());
  const auto* v_ptr = reinterpret_cast<const uint16_t*>(values.data_ptr<c10::BFloat16>());
  std::vector<PackedHead> packed(num_kv_heads);
  at::parallel_for(0, num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      pack_head(k_ptr + h * dim, v_ptr + h * dim, pb.L, num_kv_heads * dim, dim, packed[h]);
    }
  });
  // item i: KV head i % Hkv, block of positions taken from both ends in turn (0, last, 1,
  // last - 1, ...), so any contiguous range of items holds as much causal work as another
  const int64_t blocks = (pb.n + kPositions - 1) / kPositions;
  at::parallel_for(0, blocks * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t kv_head = item % num_kv_heads;
      const int64_t turn = item / num_kv_heads;
      const int64_t block = turn % 2 == 0 ? turn / 2 : blocks - 1 - turn / 2;
      const int64_t first_pos = block * kPositions;
      const int64_t positions = std::min(kPositions, pb.n - first_pos);
      if (dim == 32) attend_item<2>(pb, packed[kv_head], kv_head, first_pos, positions);
      if (dim == 64) attend_item<4>(pb, packed[kv_head], kv_head, first_pos, positions);
      if (dim == 128) attend_item<8>(pb, packed[kv_head], kv_head, first_pos, positions);
    }
  });
  return out;
}

}  // namespace

SERVELAB_FRAGMENT(m) {
  m.def("flash_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
}

SERVELAB_IMPL(CPU, m) { m.impl("flash_attention", &flash_attention); }

#endif
