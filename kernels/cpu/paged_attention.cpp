// Attention over the KV cache on the CPU for sequences with few new tokens (decode,
// speculative verification, short chunks), paged or contiguous, in one call per layer.
//
// Work items are (sequence, KV head): each reads its context's keys and values once for all
// the query heads of its group and all its new tokens, so the cache is streamed once per
// step. Items are split across threads by work (positions times rows), and while a thread
// attends one sequence it asks for the whole cache rows of the next into L2, a few lines per
// 16 scored positions: a head's rows are a strided part of each cache row, which demand misses
// alone read at a fraction of the bandwidth.
// Scores and accumulation are fp32 whatever the cache dtype; a row at position
// `seq_len - n + i` attends causally to positions 0 .. that position. The portable loops run
// over the head dimension and are written to be vectorised by the compiler (-O3, the host's
// vector ISA; exp by a polynomial). An fp32 cache with AVX2 and FMA takes explicit loops for
// its scores (8 positions per transposed sum) and value sums (in registers), the portable
// softmax between them. A bfloat16 cache on an AVX-512 host takes explicit loops:
// scores on vdpbf16ps with one transposed sum per 16 positions (with AVX-512 BF16), a
// vectorised softmax that zeroes what a row cannot see, and value sums in registers.
// Registered as the operator `servelab::cpu_paged_attention` (declared in paged_attention.h
// for the fused decoder layer, which calls it directly).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "paged_attention.h"
#include "ops_library.h"
#include "vector_math.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
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

// Flat cache slots of a sequence's positions, a block table's row or a slab.
struct SlotMap {
  bool paged;
  int64_t block_size;
  const int32_t* table;  // paged: the sequence's block table row
  int64_t slab_start;    // contiguous: first slot of the slab

  // offsets[pos] = slot(pos) * stride for pos < length, without a division per position
  void fill(int64_t length, int64_t stride, std::vector<int64_t>& offsets) const {
    offsets.resize(length);
    if (!paged) {
      for (int64_t pos = 0; pos < length; ++pos) offsets[pos] = (slab_start + pos) * stride;
      return;
    }
    for (int64_t first = 0, block = 0; first < length; first += block_size, ++block) {
      const int64_t slot0 = static_cast<int64_t>(table[block]) * block_size;
      const int64_t end = std::min(length, first + block_size);
      for (int64_t pos = first; pos < end; ++pos) {
        offsets[pos] = (slot0 + pos - first) * stride;
      }
    }
  }
};

// exp(x) for the x <= 0 of a softmax after its maximum is subtracted, branch-free so that
// the loop calling it vectorises: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by the classic
// minimax polynomial (Cephes' expf coefficients, about 1 ulp), 2^n built in the exponent
// bits. Below -87, where 2^n leaves the normal range, it returns exp(-87) ~ 1.6e-38.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const int32_t n = static_cast<int32_t>(x * 1.44269504088896341f - 0.5f);  // nearest, x <= 0
  const float nf = static_cast<float>(n);
  const float r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union {
    int32_t bits;
    float value;
  } two_to_n;
  two_to_n.bits = (n + 127) << 23;
  return p * two_to_n.value;
}

// The cache lines of one sequence's keys and values (all KV heads: `offsets` of KV head 0,
// `row_bytes` per position), asked into L2 a few at a time. A thread aims it at the sequence
// it attends next and steps it while it computes the current one, so that reading the next
// sequence overlaps the arithmetic on this one; `drain` asks for whatever is left at once (the
// first sequence of a thread, and the loops that do not step it). Demand misses alone read a
// KV head's rows, a strided part of each cache row, at a fraction of the memory bandwidth.
struct LineStream {
  const char* keys = nullptr;
  const char* values = nullptr;
  const int64_t* offsets = nullptr;  // element offsets of each position's cache row
  int64_t element_bytes = 0, row_bytes = 0, positions = 0;
  int64_t pos = 0, byte = 0;  // the next line to ask for
  int64_t per_step = 0;       // line pairs (key and value) per step

  // `steps`: how many times the caller will step it before it needs the lines.
  void aim(const char* k_cache, const char* v_cache, int64_t element_size,
           const std::vector<int64_t>& rows, int64_t row_elements, int64_t steps) {
    keys = k_cache;
    values = v_cache;
    offsets = rows.data();
    element_bytes = element_size;
    row_bytes = row_elements * element_size;
    positions = static_cast<int64_t>(rows.size());
    pos = 0;
    byte = 0;
    const int64_t lines = positions * ((row_bytes + 63) / 64);
    per_step = steps > 0 ? (lines + steps - 1) / steps : lines;
  }

  void ask(int64_t count) {
    for (int64_t i = 0; i < count && pos < positions; ++i) {
      const int64_t at = offsets[pos] * element_bytes + byte;
      __builtin_prefetch(keys + at, 0, 1);  // locality 1: to L2, measured best
      __builtin_prefetch(values + at, 0, 1);
      byte += 64;
      if (byte >= row_bytes) {
        byte = 0;
        ++pos;
      }
    }
  }

  void step() { ask(per_step); }
  void drain() { ask(positions * ((row_bytes + 63) / 64)); }
};

// One work item's geometry: `rows` new tokens ending a context of `seq_len` positions, each
// row with `group` query heads on KV head `kv_head`; lane = row * group + head.
struct Item {
  int64_t first_row, rows, seq_len, kv_head, group, num_kv_heads, dim;
  const int64_t* offsets;  // [seq_len]: where each position's cache row (KV head 0) starts

  int64_t lanes() const { return rows * group; }
  int64_t first_pos() const { return seq_len - rows; }
  // The first lane that sees position `pos` (causal: row r sees 0 .. first_pos + r).
  int64_t first_lane(int64_t pos) const {
    return std::max<int64_t>(0, pos - first_pos()) * group;
  }
  int64_t cache_offset(int64_t pos) const { return offsets[pos] + kv_head * dim; }
  // Offset of lane's query (and output) row in the [tokens, heads, dim] tensors.
  int64_t head_offset(int64_t lane) const {
    const int64_t num_heads = num_kv_heads * group;
    return ((first_row + lane / group) * num_heads + kv_head * group + lane % group) * dim;
  }
};

// scores[lane][pos] = query[lane] . key[pos], portable loops.
template <typename scalar_t>
void score_portable(const Item& it, const float* query, const scalar_t* k_cache, float* scores) {
  for (int64_t pos = 0; pos < it.seq_len; ++pos) {
    const scalar_t* key = k_cache + it.cache_offset(pos);
    float key_f[512];
    for (int64_t d = 0; d < it.dim; ++d) key_f[d] = to_float(key[d]);
    for (int64_t lane = it.first_lane(pos); lane < it.lanes(); ++lane) {
      scores[lane * it.seq_len + pos] = dot(query + lane * it.dim, key_f, it.dim);
    }
  }
}

// acc[lane] += weight[lane][pos] * value[pos], portable loops.
template <typename scalar_t>
void accumulate_portable(const Item& it, const float* weights, const scalar_t* v_cache,
                         float* acc) {
  for (int64_t pos = 0; pos < it.seq_len; ++pos) {
    const scalar_t* value = v_cache + it.cache_offset(pos);
    float value_f[512];
    for (int64_t d = 0; d < it.dim; ++d) value_f[d] = to_float(value[d]);
    for (int64_t lane = it.first_lane(pos); lane < it.lanes(); ++lane) {
      const float weight = weights[lane * it.seq_len + pos];
      float* a = acc + lane * it.dim;
      for (int64_t d = 0; d < it.dim; ++d) a[d] += weight * value_f[d];
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The same two loops for an fp32 cache with AVX2 and FMA (every level from avx2 up), for head
// dims that are multiples of 8: the scores of 8 positions at a time as 8 vectors of partial
// sums, each query chunk loaded once for the 8 keys, turned into 8 scores by one transposed
// reduction; the value sums of one lane in registers over the positions it sees, 64 dims at a
// time. Every lane gets every position's score (the softmax reads only what it sees).
inline bool avx2_fits(const Item& it) { return it.dim % 8 == 0; }

// Lane i of the result is the sum of the 8 lanes of v[i].
inline __m256 transposed_sum8(const __m256 v[8]) {
  const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // low: v[0..3] summed over lanes 0-3, then over lanes 4-7; high: the same for v[4..7]
  return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20),
                       _mm256_permute2f128_ps(low, high, 0x31));
}

void score_avx2(const Item& it, const float* query, const float* k_cache, float* scores,
                LineStream& ahead) {
  const int64_t chunks = it.dim / 8;
  for (int64_t pos0 = 0; pos0 < it.seq_len; pos0 += 8) {
    const int64_t count = std::min<int64_t>(8, it.seq_len - pos0);
    const float* keys[8];  // past the last position: the last key again, its score not stored
    for (int64_t p = 0; p < 8; ++p) {
      keys[p] = k_cache + it.cache_offset(pos0 + std::min(p, count - 1));
    }
    const __m256i store = servelab::lanes_below(count);
    for (int64_t lane = 0; lane < it.lanes(); ++lane) {
      ahead.step();
      const float* q = query + lane * it.dim;
      __m256 partial[8];
      for (int p = 0; p < 8; ++p) partial[p] = _mm256_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) {
        const __m256 q_chunk = _mm256_loadu_ps(q + 8 * c);
        for (int p = 0; p < 8; ++p) {
          partial[p] = _mm256_fmadd_ps(q_chunk, _mm256_loadu_ps(keys[p] + 8 * c), partial[p]);
        }
      }
      _mm256_maskstore_ps(scores + lane * it.seq_len + pos0, store, transposed_sum8(partial));
    }
  }
}

// acc[lane][dim0 .. dim0 + 8 kChunks) = the lane's weights times the values it sees.
template <int kChunks>
void accumulate_lane_avx2(const Item& it, int64_t lane, int64_t dim0, const float* weights,
                          const float* v_cache, float* acc) {
  __m256 sum[kChunks];
  for (int c = 0; c < kChunks; ++c) sum[c] = _mm256_setzero_ps();
  const float* row = weights + lane * it.seq_len;
  const int64_t visible = it.first_pos() + lane / it.group + 1;
  for (int64_t pos = 0; pos < visible; ++pos) {
    const float* value = v_cache + it.cache_offset(pos) + dim0;
    const __m256 weight = _mm256_broadcast_ss(row + pos);
    for (int c = 0; c < kChunks; ++c) {
      sum[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * c), sum[c]);
    }
  }
  for (int c = 0; c < kChunks; ++c) _mm256_storeu_ps(acc + lane * it.dim + dim0 + 8 * c, sum[c]);
}

void accumulate_avx2(const Item& it, const float* weights, const float* v_cache, float* acc) {
  for (int64_t lane = 0; lane < it.lanes(); ++lane) {
    for (int64_t dim0 = 0; dim0 < it.dim; dim0 += 64) {
      switch (std::min<int64_t>(8, (it.dim - dim0) / 8)) {
        case 1: accumulate_lane_avx2<1>(it, lane, dim0, weights, v_cache, acc); break;
        case 2: accumulate_lane_avx2<2>(it, lane, dim0, weights, v_cache, acc); break;
        case 3: accumulate_lane_avx2<3>(it, lane, dim0, weights, v_cache, acc); break;
        case 4: accumulate_lane_avx2<4>(it, lane, dim0, weights, v_cache, acc); break;
        case 5: accumulate_lane_avx2<5>(it, lane, dim0, weights, v_cache, acc); break;
        case 6: accumulate_lane_avx2<6>(it, lane, dim0, weights, v_cache, acc); break;
        case 7: accumulate_lane_avx2<7>(it, lane, dim0, weights, v_cache, acc); break;
        default: accumulate_lane_avx2<8>(it, lane, dim0, weights, v_cache, acc); break;
      }
    }
  }
}
#endif

#if defined(__AVX512F__)
// The same two loops for a bfloat16 cache with AVX-512: each key and value row is widened
// to fp32 in registers once (a bfloat16 is the top half of a float) and used by every lane,
// and each dot product ends in one in-register reduction. Head dims that are multiples of
// 16 up to 256.
constexpr int64_t kMaxChunks = 16;

inline __m512 load_bf16(const c10::BFloat16* src) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline bool avx512_fits(const Item& it) {
  return it.dim % 16 == 0 && it.dim / 16 <= kMaxChunks;
}

void score_avx512(const Item& it, const float* query, const c10::BFloat16* k_cache,
                  float* scores) {
  const int64_t chunks = it.dim / 16;
  __m512 key[kMaxChunks];
  for (int64_t pos = 0; pos < it.seq_len; ++pos) {
    const c10::BFloat16* src = k_cache + it.cache_offset(pos);
    for (int64_t c = 0; c < chunks; ++c) key[c] = load_bf16(src + 16 * c);
    for (int64_t lane = it.first_lane(pos); lane < it.lanes(); ++lane) {
      const float* q = query + lane * it.dim;
      __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(q), key[0]);
      for (int64_t c = 1; c < chunks; ++c) {
        sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), key[c], sum);
      }
      scores[lane * it.seq_len + pos] = _mm512_reduce_add_ps(sum);
    }
  }
}

#if defined(__AVX512BF16__)
// Asks for the cache lines of one bfloat16 key or value row (`kHint`: to L1 or to L2).
template <int kHint>
inline void prefetch_row(const c10::BFloat16* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row + d), static_cast<_mm_hint>(kHint));
  }
}

// The scores with AVX-512 BF16, for head dims that are multiples of 32: each bfloat16 query
// row and key row are multiplied on vdpbf16ps as they are (exact products, fp32 sums), the
// sixteen partial sums of 16 positions at a time summed by one transposed reduction, then
// scaled. Every lane gets every position's score (the softmax reads only what it sees).
void score_bf16(const Item& it, const c10::BFloat16* q, const c10::BFloat16* k_cache,
                const c10::BFloat16* v_cache, float scale, float* scores, LineStream& ahead) {
  const int64_t chunks = it.dim / 32;
  const __m512 factor = _mm512_set1_ps(scale);
  for (int64_t pos0 = 0; pos0 < it.seq_len; pos0 += 16) {
    const int64_t count = std::min<int64_t>(16, it.seq_len - pos0);
    const c10::BFloat16* keys[16];
    for (int64_t p = 0; p < count; ++p) keys[p] = k_cache + it.cache_offset(pos0 + p);
    // the cache is read from memory once per step: ask for the next keys and for these
    // positions' values (read after the softmax) while these scores are computed
    for (int64_t p = pos0 + 16; p < std::min<int64_t>(it.seq_len, pos0 + 32); ++p) {
      prefetch_row<_MM_HINT_T0>(k_cache + it.cache_offset(p), it.dim);
    }
    for (int64_t p = 0; p < count; ++p) {
      prefetch_row<_MM_HINT_T1>(v_cache + it.cache_offset(pos0 + p), it.dim);
    }
    for (int64_t lane = 0; lane < it.lanes(); ++lane) {
      ahead.step();
      const c10::BFloat16* query = q + it.head_offset(lane);
      __m512bh query_chunk[kMaxChunks / 2];
      for (int64_t c = 0; c < chunks; ++c) {
        query_chunk[c] = (__m512bh)_mm512_loadu_si512(query + 32 * c);
      }
      __m512 partial[16];
      for (int64_t p = 0; p < 16; ++p) {
        partial[p] = _mm512_setzero_ps();
        if (p >= count) continue;
        for (int64_t c = 0; c < chunks; ++c) {
          const __m512bh key = (__m512bh)_mm512_loadu_si512(keys[p] + 32 * c);
          partial[p] = _mm512_dpbf16_ps(partial[p], query_chunk[c], key);
        }
      }
      const __m512 row = _mm512_mul_ps(servelab::transposed_sum16(partial), factor);
      _mm512_mask_storeu_ps(scores + lane * it.seq_len + pos0, servelab::tail_mask(count), row);
    }
  }
}
#endif

// acc[lane] += weight[lane][pos] * value[pos] for `kChunks` x 16 dims and `kLanes` lanes from
// lane0, whose sums stay in registers over all positions (a weight past a lane's view is 0).
template <int kChunks, int kLanes>
void accumulate_tile(const Item& it, int64_t lane0, const float* weights,
                     const c10::BFloat16* v_cache, float* acc) {
  __m512 sum[kLanes][kChunks];
  for (int l = 0; l < kLanes; ++l) {
    for (int c = 0; c < kChunks; ++c) sum[l][c] = _mm512_setzero_ps();
  }
  const float* row = weights + lane0 * it.seq_len;
  for (int64_t pos = 0; pos < it.seq_len; ++pos) {
    const c10::BFloat16* src = v_cache + it.cache_offset(pos);
    __m512 value[kChunks];
    for (int c = 0; c < kChunks; ++c) value[c] = load_bf16(src + 16 * c);
    for (int l = 0; l < kLanes; ++l) {
      const __m512 weight = _mm512_set1_ps(row[l * it.seq_len + pos]);
      for (int c = 0; c < kChunks; ++c) sum[l][c] = _mm512_fmadd_ps(weight, value[c], sum[l][c]);
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    for (int c = 0; c < kChunks; ++c) {
      _mm512_storeu_ps(acc + (lane0 + l) * it.dim + 16 * c, sum[l][c]);
    }
  }
}

template <int kChunks>
void accumulate_tiles(const Item& it, const float* weights, const c10::BFloat16* v_cache,
                      float* acc) {
  for (int64_t lane0 = 0; lane0 < it.lanes(); lane0 += 4) {
    switch (std::min<int64_t>(4, it.lanes() - lane0)) {
      case 1: accumulate_tile<kChunks, 1>(it, lane0, weights, v_cache, acc); break;
      case 2: accumulate_tile<kChunks, 2>(it, lane0, weights, v_cache, acc); break;
      case 3: accumulate_tile<kChunks, 3>(it, lane0, weights, v_cache, acc); break;
      default: accumulate_tile<kChunks, 4>(it, lane0, weights, v_cache, acc); break;
    }
  }
}

// Softmax numerators of one lane's scores in place: exp(x - max) over the `visible` first
// positions, 0 after them up to `length`; returns their sum.
float softmax_row_avx512(float* row, int64_t visible, int64_t length) {
  using servelab::kLog2e;
  using servelab::tail_mask;
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best = minus_inf;
  for (int64_t i = 0; i < visible; i += 16) {
    best = _mm512_max_ps(best, _mm512_mask_loadu_ps(minus_inf, tail_mask(visible - i), row + i));
  }
  const __m512 log2e = _mm512_set1_ps(kLog2e);
  const __m512 shift = _mm512_set1_ps(-_mm512_reduce_max_ps(best) * kLog2e);
  __m512 total = _mm512_setzero_ps();
  for (int64_t i = 0; i < length; i += 16) {
    const __mmask16 store = tail_mask(length - i);
    const __mmask16 keep = tail_mask(visible - i);
    const __m512 x = _mm512_maskz_loadu_ps(keep, row + i);
    const __m512 exponent = _mm512_fmadd_ps(x, log2e, shift);
    const __m512 p = _mm512_maskz_mov_ps(keep, servelab::exp2_nonpositive(exponent));
    _mm512_mask_storeu_ps(row + i, store, p);
    total = _mm512_add_ps(total, p);
  }
  return _mm512_reduce_add_ps(total);
}

void accumulate_avx512(const Item& it, const float* weights, const c10::BFloat16* v_cache,
                       float* acc) {
  if (it.dim == 64) return accumulate_tiles<4>(it, weights, v_cache, acc);
  if (it.dim == 128) return accumulate_tiles<8>(it, weights, v_cache, acc);
  const int64_t chunks = it.dim / 16;
  __m512 value[kMaxChunks];
  for (int64_t pos = 0; pos < it.seq_len; ++pos) {
    const c10::BFloat16* src = v_cache + it.cache_offset(pos);
    for (int64_t c = 0; c < chunks; ++c) value[c] = load_bf16(src + 16 * c);
    for (int64_t lane = it.first_lane(pos); lane < it.lanes(); ++lane) {
      const __m512 weight = _mm512_set1_ps(weights[lane * it.seq_len + pos]);
      float* a = acc + lane * it.dim;
      for (int64_t c = 0; c < chunks; ++c) {
        _mm512_storeu_ps(a + 16 * c,
                         _mm512_fmadd_ps(weight, value[c], _mm512_loadu_ps(a + 16 * c)));
      }
    }
  }
}
#endif

template <typename scalar_t>
void attend_item(const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache,
                 scalar_t* out, const Item& it, float scale, std::vector<float>& scores,
                 std::vector<float>& acc, std::vector<float>& query, std::vector<float>& denom,
                 LineStream& ahead) {
  const int64_t lanes = it.lanes();
  const int64_t dim = it.dim;
  // the query rows widened to fp32 and scaled, for the score loops that read them so
  const auto widened_query = [&]() {
    query.resize(lanes * dim);
    for (int64_t lane = 0; lane < lanes; ++lane) {
      const scalar_t* src = q + it.head_offset(lane);
      float* dst = query.data() + lane * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = to_float(src[d]) * scale;
    }
    return query.data();
  };
  scores.assign(lanes * it.seq_len, -std::numeric_limits<float>::infinity());
  acc.assign(lanes * dim, 0.0f);
  bool vectorised = false;  // AVX-512 loops for a bfloat16 cache
  bool f32_lanes = false;   // AVX2 loops for an fp32 cache
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (avx2_fits(it)) {
      score_avx2(it, widened_query(), k_cache, scores.data(), ahead);
      f32_lanes = true;
    }
  }
#endif
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (avx512_fits(it)) {
#if defined(__AVX512BF16__)
      if (it.dim % 32 == 0) {
        score_bf16(it, q, k_cache, v_cache, scale, scores.data(), ahead);
      } else {
        score_avx512(it, widened_query(), k_cache, scores.data());
      }
#else
      score_avx512(it, widened_query(), k_cache, scores.data());
#endif
      vectorised = true;
    }
  }
#endif
  if (!vectorised && !f32_lanes) score_portable(it, widened_query(), k_cache, scores.data());
  denom.assign(lanes, 0.0f);
  for (int64_t lane = 0; lane < lanes; ++lane) {
    float* row = scores.data() + lane * it.seq_len;
    const int64_t visible = it.first_pos() + lane / it.group + 1;
#if defined(__AVX512F__)
    if (vectorised) {
      denom[lane] = softmax_row_avx512(row, visible, it.seq_len);
      continue;
    }
#endif
    const float peak = max_of(row, visible);
    for (int64_t pos = 0; pos < visible; ++pos) row[pos] = exp_nonpositive(row[pos] - peak);
    denom[lane] = sum_of(row, visible);
  }
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (vectorised) accumulate_avx512(it, scores.data(), v_cache, acc.data());
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (f32_lanes) accumulate_avx2(it, scores.data(), v_cache, acc.data());
  }
#endif
  if (!vectorised && !f32_lanes) accumulate_portable(it, scores.data(), v_cache, acc.data());
  for (int64_t lane = 0; lane < lanes; ++lane) {
    float* a = acc.data() + lane * dim;
    const float inv = 1.0f / denom[lane];
    for (int64_t d = 0; d < dim; ++d) a[d] *= inv;
    store(out + it.head_offset(lane), a, dim);
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
  // items (sequence, KV head) split into one contiguous range per thread of equal work
  // (positions times query rows), not equal counts: a batch's context lengths differ widely
  const int64_t items = num_seqs * num_kv_heads;
  std::vector<int64_t> work_before(items + 1, 0);
  for (int64_t index = 0; index < items; ++index) {
    const int64_t b = index / num_kv_heads;
    work_before[index + 1] = work_before[index] + lens[b] * (starts[b + 1] - starts[b]);
  }
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  at::parallel_for(0, threads, 1, [&](int64_t thread_begin, int64_t thread_end) {
    const int64_t total = work_before[items];
    const auto first_item = [&](int64_t thread) {
      return static_cast<int64_t>(
          std::lower_bound(work_before.begin(), work_before.end(), total * thread / threads) -
          work_before.begin());
    };
    const int64_t item_begin = first_item(thread_begin);
    const int64_t item_end = std::min(items, first_item(thread_end));
    const auto map = [&](int64_t b, std::vector<int64_t>& offsets) {
      const SlotMap slot{paged, block_size, paged ? tables + b * table_width : nullptr,
                         paged ? 0 : slabs[b]};
      slot.fill(lens[b], num_kv_heads * dim, offsets);
    };
    const auto aim = [&](LineStream& stream, const std::vector<int64_t>& offsets, int64_t steps) {
      stream.aim(reinterpret_cast<const char*>(k_ptr), reinterpret_cast<const char*>(v_ptr),
                 sizeof(scalar_t), offsets, num_kv_heads * dim, steps);
    };
    std::vector<float> scores, acc, query, denom;  // per thread, reused across items
    // the cache offsets of the sequence `mapped` (shared by its KV heads' items) and of the
    // one after it in this thread's range, whose lines `ahead` asks for meanwhile
    std::vector<int64_t> offsets, next_offsets;
    int64_t mapped = -1, next = -1;
    LineStream ahead;
    for (int64_t index = item_begin; index < item_end; ++index) {
      const int64_t b = index / num_kv_heads;
      const int64_t kv_head = index % num_kv_heads;
      const int64_t rows = starts[b + 1] - starts[b];
      if (rows == 0) continue;
      if (b != mapped) {
        if (b == next) {
          ahead.drain();
          std::swap(offsets, next_offsets);
        } else {
          map(b, offsets);
          aim(ahead, offsets, 0);
          ahead.drain();
        }
        mapped = b;
        // the next sequence with new tokens, asked for over this one's score loops
        next = -1;
        const int64_t last = std::min(num_seqs, (item_end + num_kv_heads - 1) / num_kv_heads);
        for (int64_t later = b + 1; later < last && next < 0; ++later) {
          if (starts[later + 1] > starts[later]) next = later;
        }
        if (next >= 0) {
          map(next, next_offsets);
          const int64_t my_items = std::min(item_end, (b + 1) * num_kv_heads) -
                                   std::max(item_begin, b * num_kv_heads);
          aim(ahead, next_offsets, my_items * ((lens[b] + 15) / 16) * rows * group);
        }
      }
      const Item item{starts[b], rows, lens[b], kv_head, group, num_kv_heads, dim, offsets.data()};
      attend_item<scalar_t>(q_ptr, k_ptr, v_ptr, out_ptr, item, fscale, scores, acc, query,
                            denom, ahead);
    }
  });
}

}  // namespace

namespace servelab {

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

}  // namespace servelab

SERVELAB_LIBRARY(m) {
  m.def(
      "cpu_paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor query_start_loc, "
      "Tensor seq_lens, Tensor kv_index, bool paged, float scale) -> Tensor");
}

SERVELAB_IMPL(CPU, m) {
  m.impl("cpu_paged_attention", &servelab::cpu_paged_attention);
}
