// Paged decode attention, first simple version: one query token per sequence,
// grouped-query attention, KV cache in bf16 or FP8-E5M2 (with per-tensor scales),
// pages addressed through a block table.
//
// Layouts (row-major, element types as stored):
//   out, q       [num_seqs, num_heads, HEAD_DIM]                     bf16
//   k_cache,
//   v_cache      [num_pages, page_size, num_kv_heads, HEAD_DIM]      bf16 | e5m2
//   block_table  [num_seqs, max_pages_per_seq]                       int32
//   seq_lens     [num_seqs]                                          int32
// Launch: grid (num_heads, num_seqs), block kThreads, no dynamic shared memory.
// num_heads must be a multiple of num_kv_heads. KV values are dequantised as
// stored * k_scale (keys) and stored * v_scale (values); pass 1.0 for bf16.
//
// One CTA per (sequence, query head). Each warp walks every kWarps-th token with
// an online softmax; the warps' partial states are merged through shared memory.

#include "rowgate/dtypes.cuh"
#include "rowgate/reduce.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// Each lane owns HEAD_DIM / 32 consecutive elements of a head vector.
template <int HEAD_DIM>
struct Lane {
  static constexpr int kPer = HEAD_DIM / 32;
  static_assert(HEAD_DIM % 64 == 0, "HEAD_DIM must be a multiple of 64");
};

template <int HEAD_DIM>
__device__ __forceinline__ void load_row(const rowgate::bf16_bits* p, int lane,
                                         float (&x)[Lane<HEAD_DIM>::kPer]) {
  constexpr int kPer = Lane<HEAD_DIM>::kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    x[i] = rowgate::bf16_to_float(p[lane * kPer + i]);
  }
}

template <int HEAD_DIM>
__device__ __forceinline__ void load_row(const rowgate::e5m2_bits* p, int lane,
                                         float (&x)[Lane<HEAD_DIM>::kPer]) {
  constexpr int kPer = Lane<HEAD_DIM>::kPer;
  // kPer is even and the row start is 2-byte aligned: read E5M2 pairs.
  const rowgate::u16* pairs = reinterpret_cast<const rowgate::u16*>(p + lane * kPer);
#pragma unroll
  for (int i = 0; i < kPer / 2; ++i) {
    rowgate::e5m2x2_to_float2(pairs[i], x[2 * i], x[2 * i + 1]);
  }
}

template <int HEAD_DIM, typename KV>
__device__ __forceinline__ void decode_attention(
    rowgate::bf16_bits* __restrict__ out, const rowgate::bf16_bits* __restrict__ q,
    const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const int* __restrict__ block_table, const int* __restrict__ seq_lens, int num_heads,
    int num_kv_heads, int page_size, int max_pages_per_seq, float softmax_scale,
    float k_scale, float v_scale) {
  constexpr int kPer = Lane<HEAD_DIM>::kPer;
  __shared__ float warp_m[kWarps];
  __shared__ float warp_l[kWarps];
  __shared__ float warp_acc[kWarps][HEAD_DIM];

  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int seq_len = seq_lens[seq];
  const long long head_offset = (static_cast<long long>(seq) * num_heads + head) * HEAD_DIM;
  const long long token_stride = static_cast<long long>(num_kv_heads) * HEAD_DIM;

  // Scores are kept in base 2 (exp2): fold log2(e), the softmax scale and the
  // key dequantisation scale into q once.
  float qv[kPer];
  load_row<HEAD_DIM>(q + head_offset, lane, qv);
  const float q_scale = softmax_scale * k_scale * kLog2e;
#pragma unroll
  for (int i = 0; i < kPer; ++i) qv[i] *= q_scale;

  float m = -__int_as_float(0x7f800000);  // -inf (NVRTC has no <math.h>)
  float l = 0.0f;
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;

  const int* pages = block_table + static_cast<long long>(seq) * max_pages_per_seq;
  // (page index, slot) of token t advance incrementally: no division per token.
  int page_idx = warp / page_size;
  int slot = warp % page_size;
  for (int t = warp; t < seq_len; t += kWarps) {
    const long long page = pages[page_idx];
    const long long row = (page * page_size + slot) * token_stride +
                          static_cast<long long>(kv_head) * HEAD_DIM;
    slot += kWarps;
    while (slot >= page_size) {
      slot -= page_size;
      ++page_idx;
    }
    float kv[kPer];
    load_row<HEAD_DIM>(k_cache + row, lane, kv);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) dot = fmaf(qv[i], kv[i], dot);
    const float s = rowgate::warp_sum(dot);

    const float m_new = fmaxf(m, s);
    const float correction = exp2f(m - m_new);
    const float p = exp2f(s - m_new);
    l = l * correction + p;
    m = m_new;
    load_row<HEAD_DIM>(v_cache + row, lane, kv);
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] = fmaf(p, kv[i], acc[i] * correction);
  }

  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) warp_acc[warp][lane * kPer + i] = acc[i];
  __syncthreads();

  // Merge the warps' online-softmax states: one thread per output element.
  for (int d = threadIdx.x; d < HEAD_DIM; d += kThreads) {
    float m_all = -__int_as_float(0x7f800000);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
    float l_all = 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      // A warp that saw no token has m = -inf and l = 0: its weight is 0.
      const float weight = warp_l[w] > 0.0f ? exp2f(warp_m[w] - m_all) : 0.0f;
      l_all = fmaf(warp_l[w], weight, l_all);
      o = fmaf(warp_acc[w][d], weight, o);
    }
    // An empty sequence (seq_len == 0) attends to nothing: its output is 0.
    // l_all >= 1 (the largest score contributes exp2(0)), so the fast division
    // is exact to 2 ulp and avoids the IEEE slow-path call (and its spills).
    const float value = l_all > 0.0f ? __fdividef(o * v_scale, l_all) : 0.0f;
    out[head_offset + d] = rowgate::float_to_bf16(value);
  }
}

}  // namespace

#define ROWGATE_DECODE_ATTENTION_ENTRY(NAME, HEAD_DIM, KV)                                  \
  extern "C" __global__ void __launch_bounds__(kThreads) NAME(                              \
      rowgate::bf16_bits* __restrict__ out, const rowgate::bf16_bits* __restrict__ q,       \
      const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,                       \
      const int* __restrict__ block_table, const int* __restrict__ seq_lens, int num_heads, \
      int num_kv_heads, int page_size, int max_pages_per_seq, float softmax_scale,          \
      float k_scale, float v_scale) {                                                       \
    decode_attention<HEAD_DIM, KV>(out, q, k_cache, v_cache, block_table, seq_lens,         \
                                   num_heads, num_kv_heads, page_size, max_pages_per_seq,   \
                                   softmax_scale, k_scale, v_scale);                        \
  }

ROWGATE_DECODE_ATTENTION_ENTRY(decode_attention_bf16_hd64, 64, rowgate::bf16_bits)
ROWGATE_DECODE_ATTENTION_ENTRY(decode_attention_bf16_hd128, 128, rowgate::bf16_bits)
ROWGATE_DECODE_ATTENTION_ENTRY(decode_attention_e5m2_hd64, 64, rowgate::e5m2_bits)
ROWGATE_DECODE_ATTENTION_ENTRY(decode_attention_e5m2_hd128, 128, rowgate::e5m2_bits)
