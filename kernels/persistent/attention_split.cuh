// Split-KV paged decode attention as persistent-kernel tasks: one task is one
// (sequence, kv head, KV chunk) and writes the unnormalised online-softmax
// state of each query head of the group; a merge task combines the splits.
//
// Same arithmetic as kernels/decode_attention (whose device function is bound
// to its own grid: blockIdx is (head, sequence) there, so a task cannot call
// it): scores in base 2 with softmax_scale * log2(e) folded into q, a split or
// warp that saw no token weighs 0, l >= 1 after the max so the fast division
// is exact to 2 ulp. Shared helpers come from rowgate/dtypes.cuh and
// rowgate/reduce.cuh; nothing of decode_attention.cu is copied.
#pragma once

#include "rowgate/dtypes.cuh"
#include "rowgate/reduce.cuh"

namespace rowgate {
namespace persistent {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 8;
constexpr float kLog2e = 1.4426950408889634f;

struct SplitArgs {
  const bf16_bits* q;       // this (sequence, kv head)'s group of query heads, [group, D]
  const bf16_bits* k_cache; // [pages, page_size, kv_heads, D]
  const bf16_bits* v_cache;
  float* partials;          // [batch, kv_heads, max_splits, group, D + 2]
  const int* block_table;   // this sequence's row
  int seq, kv_head, split, chunk, len;
  int heads, kv_heads, group, page_size, max_splits;
  float softmax_scale;
};

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// smem: kWarps * kMaxGroup * (D + 2) floats.
template <int D>
__device__ __forceinline__ void attention_split(const SplitArgs& a, float* smem) {
  constexpr int kPer = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int start = a.split * a.chunk;
  const int end = min(a.len, start + a.chunk);
  const float q_scale = a.softmax_scale * kLog2e;

  float qv[kMaxGroup][kPer], acc[kMaxGroup][kPer], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int j = 0; j < kMaxGroup; ++j) {
    m[j] = neg_inf();
    l[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      acc[j][i] = 0.0f;
      qv[j][i] = 0.0f;
      if (j < a.group) qv[j][i] = bf16_to_float(a.q[j * D + lane * kPer + i]) * q_scale;
    }
  }
  const long long token_stride = static_cast<long long>(a.kv_heads) * D;
  // The K and V rows of a warp's next token are requested while it works on the
  // current one (one dependent load round trip per token instead of two); the
  // arithmetic and its order are unchanged.
  auto row_of = [&](int t) {
    const long long page = a.block_table[t / a.page_size];
    return (page * a.page_size + t % a.page_size) * token_stride +
           static_cast<long long>(a.kv_head) * D + lane * kPer;
  };
  float kc[kPer] = {}, vc[kPer] = {};
  if (start + warp < end) {
    const long long row = row_of(start + warp);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      kc[i] = bf16_to_float(a.k_cache[row + i]);
      vc[i] = bf16_to_float(a.v_cache[row + i]);
    }
  }
  for (int t = start + warp; t < end; t += kWarps) {
    float kn[kPer] = {}, vn[kPer] = {};
    if (t + kWarps < end) {
      const long long row = row_of(t + kWarps);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        kn[i] = bf16_to_float(a.k_cache[row + i]);
        vn[i] = bf16_to_float(a.v_cache[row + i]);
      }
    }
    float kv[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) kv[i] = kc[i];
    float p[kMaxGroup];
#pragma unroll
    for (int j = 0; j < kMaxGroup; ++j) {
      p[j] = 0.0f;
      if (j >= a.group) continue;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) dot = fmaf(qv[j][i], kv[i], dot);
      const float s = warp_sum(dot);
      const float m_new = fmaxf(m[j], s);
      const float correction = exp2f(m[j] - m_new);
      p[j] = exp2f(s - m_new);
      l[j] = l[j] * correction + p[j];
      m[j] = m_new;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[j][i] *= correction;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) kv[i] = vc[i];
#pragma unroll
    for (int j = 0; j < kMaxGroup; ++j) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[j][i] = fmaf(p[j], kv[i], acc[j][i]);
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      kc[i] = kn[i];
      vc[i] = vn[i];
    }
  }

  // Warp states to shared memory: [warp][j][D + 2] (acc, m, l).
  constexpr int kRow = D + 2;
#pragma unroll
  for (int j = 0; j < kMaxGroup; ++j) {
    if (j >= a.group) break;
    float* s = smem + (warp * kMaxGroup + j) * kRow;
#pragma unroll
    for (int i = 0; i < kPer; ++i) s[lane * kPer + i] = acc[j][i];
    if (lane == 0) {
      s[D] = m[j];
      s[D + 1] = l[j];
    }
  }
  __syncthreads();
  float* out = a.partials +
               ((static_cast<long long>(a.seq) * a.kv_heads + a.kv_head) * a.max_splits + a.split) *
                   a.group * kRow;
  for (int idx = threadIdx.x; idx < a.group * kRow; idx += kThreads) {
    const int j = idx / kRow, d = idx % kRow;
    float m_all = neg_inf();
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, smem[(w * kMaxGroup + j) * kRow + D]);
    float l_all = 0.0f, o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float* s = smem + (w * kMaxGroup + j) * kRow;
      const float weight = s[D + 1] > 0.0f ? exp2f(s[D] - m_all) : 0.0f;
      l_all = fmaf(s[D + 1], weight, l_all);
      if (d < D) o = fmaf(s[d], weight, o);
    }
    out[idx] = d < D ? o : (d == D ? m_all : l_all);
  }
}

// One (sequence, kv head): out[seq, kv_head * group + j, :] for every j.
template <int D>
__device__ __forceinline__ void attention_merge(const float* partials, bf16_bits* out, int seq,
                                                int kv_head, int splits, int heads,
                                                int kv_heads, int group, int max_splits) {
  constexpr int kRow = D + 2;
  const float* base =
      partials + (static_cast<long long>(seq) * kv_heads + kv_head) * max_splits * group * kRow;
  for (int idx = threadIdx.x; idx < group * D; idx += kThreads) {
    const int j = idx / D, d = idx % D;
    float m_all = neg_inf();
    for (int s = 0; s < splits; ++s) m_all = fmaxf(m_all, base[(s * group + j) * kRow + D]);
    float l_all = 0.0f, o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* p = base + (s * group + j) * kRow;
      const float weight = p[D + 1] > 0.0f ? exp2f(p[D] - m_all) : 0.0f;
      l_all = fmaf(p[D + 1], weight, l_all);
      o = fmaf(p[d], weight, o);
    }
    const float value = l_all > 0.0f ? __fdividef(o, l_all) : 0.0f;
    out[(static_cast<long long>(seq) * heads + kv_head * group + j) * D + d] =
        float_to_bf16(value);
  }
}

}  // namespace persistent
}  // namespace rowgate
