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

// A split warp's loop for a group of 1, 2, 4 or 8 query heads a kv head (split_raw) has
// the group as a template argument and holds the K and V rows of its next 4 tokens raw (L2
// loads, 8 bytes a row at D 128), the query loaded after the first 4 rows are asked for.
// ncu's source counters found the one-token-ahead loop's "next token" loads waited on at
// once: nvcc converts them to fp32 right after the load, so each token paid one whole load
// round trip; and its group loop, unrolled over kMaxGroup with a branch a head, runs one
// head's reduction chain after the other. The same arithmetic in the same order: the same
// bits. Of 2, 4 and 8 tokens ahead, 4 made the fastest list at b1, b4 and b8 (docs/perf.md);
// other groups run the one-token-ahead loop (attention_split).

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

__device__ __forceinline__ int ld_page(const int* p) {
  int v;
  asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A lane's raw bf16 row slice (two elements a 32-bit word) as fp32.
template <int kPer>
__device__ __forceinline__ void unpack_row(const u32 (&r)[kPer / 2], float (&f)[kPer]) {
#pragma unroll
  for (int w = 0; w < kPer / 2; ++w) {
    f[2 * w] = bf16_to_float(static_cast<bf16_bits>(r[w] & 0xffffu));
    f[2 * w + 1] = bf16_to_float(static_cast<bf16_bits>(r[w] >> 16));
  }
}

// One warp's tokens t = start + warp + k * kWarps of a split whose group is G query heads,
// its (acc, m, l) of each head into smem[warp][j] as the one-token-ahead loop leaves them.
template <int D, int G>
__device__ __forceinline__ void split_raw(const SplitArgs& a, int start, int end,
                                          float q_scale, float* smem) {
  constexpr int kPer = D / 32, kRow = D + 2, kAhead = 4;
  static_assert(kPer % 2 == 0, "a lane's row slice is whole 32-bit words");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long token_stride = static_cast<long long>(a.kv_heads) * D;
  using Raw = u32[kPer / 2];
  // The chunk's pages read once, two a lane, a token's page by shuffle (a table load per
  // token put one more round trip before each K/V load).
  const int first_page = start / a.page_size;
  const bool held = (end - 1) / a.page_size - first_page < 64;  // warp-uniform
  const int n_pages = (end - 1) / a.page_size - first_page + 1;
  int pg_lo = 0, pg_hi = 0;
  if (held && lane < n_pages) pg_lo = __ldcg(a.block_table + first_page + lane);
  if (held && 32 + lane < n_pages) pg_hi = __ldcg(a.block_table + first_page + 32 + lane);
  // L2 loads (__ldcg): a row of this step's token was written by another block's task.
  auto fetch = [&](int t, Raw& kd, Raw& vd) {
    const int i = t / a.page_size - first_page;  // warp-uniform: t is the warp's token
    long long page;
    if (held)
      page = __shfl_sync(0xffffffffu, i < 32 ? pg_lo : pg_hi, i & 31);
    else  // volatile: nvcc otherwise loads it whatever `held` says, and the K/V address
          // waits on it
      page = ld_page(a.block_table + t / a.page_size);
    const long long row = (page * a.page_size + t % a.page_size) * token_stride +
                          static_cast<long long>(a.kv_head) * D + lane * kPer;
    const u32* kp = reinterpret_cast<const u32*>(a.k_cache + row);
    const u32* vp = reinterpret_cast<const u32*>(a.v_cache + row);
    if constexpr (kPer == 4) {
      const uint2 kw = __ldcg(reinterpret_cast<const uint2*>(kp));
      const uint2 vw = __ldcg(reinterpret_cast<const uint2*>(vp));
      kd[0] = kw.x, kd[1] = kw.y, vd[0] = vw.x, vd[1] = vw.y;
    } else {
#pragma unroll
      for (int w = 0; w < kPer / 2; ++w) kd[w] = __ldcg(kp + w), vd[w] = __ldcg(vp + w);
    }
  };
  Raw kr[kAhead], vr[kAhead];
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (start + warp + s * kWarps < end) fetch(start + warp + s * kWarps, kr[s], vr[s]);
  }
  float qv[G][kPer], acc[G][kPer], m[G], l[G];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    m[j] = neg_inf();
    l[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      acc[j][i] = 0.0f;
      qv[j][i] = bf16_to_float(a.q[j * D + lane * kPer + i]) * q_scale;
    }
  }
  for (int t0 = start + warp; t0 < end; t0 += kAhead * kWarps) {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      const int t = t0 + s * kWarps;
      if (t >= end) break;
      float kv[kPer], vt[kPer];
      unpack_row<kPer>(kr[s], kv);
      unpack_row<kPer>(vr[s], vt);
      if (t + kAhead * kWarps < end) fetch(t + kAhead * kWarps, kr[s], vr[s]);
      // The one-token-ahead loop's update, head by head, in its order.
      float p[G];
#pragma unroll
      for (int j = 0; j < G; ++j) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kPer; ++i) dot = fmaf(qv[j][i], kv[i], dot);
        const float sc = warp_sum(dot);
        const float m_new = fmaxf(m[j], sc);
        const float correction = exp2f(m[j] - m_new);
        p[j] = exp2f(sc - m_new);
        l[j] = l[j] * correction + p[j];
        m[j] = m_new;
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[j][i] *= correction;
      }
#pragma unroll
      for (int j = 0; j < G; ++j) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[j][i] = fmaf(p[j], vt[i], acc[j][i]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < G; ++j) {
    float* st = smem + (warp * kMaxGroup + j) * kRow;
#pragma unroll
    for (int i = 0; i < kPer; ++i) st[lane * kPer + i] = acc[j][i];
    if (lane == 0) {
      st[D] = m[j];
      st[D + 1] = l[j];
    }
  }
}

// split_raw for the groups it is built for; false (the one-token-ahead loop runs) for
// others.
template <int D>
__device__ __forceinline__ bool split_raw_group(const SplitArgs& a, int start, int end,
                                                float q_scale, float* smem) {
  switch (a.group) {
    case 1: split_raw<D, 1>(a, start, end, q_scale, smem); return true;
    case 2: split_raw<D, 2>(a, start, end, q_scale, smem); return true;
    case 4: split_raw<D, 4>(a, start, end, q_scale, smem); return true;
    case 8: split_raw<D, 8>(a, start, end, q_scale, smem); return true;
    default: return false;
  }
}

// smem: kWarps * kMaxGroup * (D + 2) floats.
template <int D>
__device__ __forceinline__ void attention_split(const SplitArgs& a, float* smem) {
  constexpr int kPer = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int start = a.split * a.chunk;
  const int end = min(a.len, start + a.chunk);
  const float q_scale = a.softmax_scale * kLog2e;
  constexpr int kRow = D + 2;
  float* out = a.partials +
               ((static_cast<long long>(a.seq) * a.kv_heads + a.kv_head) * a.max_splits + a.split) *
                   a.group * kRow;
  if (start >= end) {
    // No token here: the empty state m = -inf, l = 0 and nothing else. A merge weighs a
    // split with l == 0 by 0 and never reads its acc (split_weights, merged), so the acc
    // the full path would write as 0 is left as it is (at b1, 19 of the probe model's 22
    // splits per kv head hold no token: they were 3 us tasks).
    for (int j = threadIdx.x; j < a.group; j += kThreads) {
      out[j * kRow + D] = neg_inf();
      out[j * kRow + D + 1] = 0.0f;
    }
    return;
  }
  if (!split_raw_group<D>(a, start, end, q_scale, smem)) {  // other groups
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
  auto row_of = [&](int t) {
    const long long page = a.block_table[t / a.page_size];
    return (page * a.page_size + t % a.page_size) * token_stride +
           static_cast<long long>(a.kv_head) * D + lane * kPer;
  };
  // The K and V rows of a warp's next token are requested while it works on the
  // current one (one dependent load round trip per token instead of two); the
  // arithmetic and its order are unchanged.
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
  }  // the one-token-ahead loop
  __syncthreads();
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

// The split weights of `rows` (sequence, query head) rows, into `scratch` (rows x
// (splits + 1) floats): w[r][s] = exp2(m_s - max m), 0 for a split without tokens
// (l == 0) -- the merge's arithmetic. The block loads every m at once, then every l (two
// L2 round trips for all rows; a row's own loop over the splits was 2 x splits dependent
// ones: a 4.8 us merge task at b1). Row r's split s state is at
// parts + row_at(r) + s * stride. Called by every thread of the block.
template <int D, typename RowAt>
__device__ __forceinline__ void split_weights(const float* parts, int rows, int splits,
                                              int stride, RowAt row_at, float* scratch) {
  float* w = scratch;                     // m, then the weights: [rows][splits]
  float* m_all = scratch + rows * splits; // [rows]
  for (int i = threadIdx.x; i < rows * splits; i += kThreads) {
    w[i] = __ldcg(parts + row_at(i / splits) + (i % splits) * stride + D);
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    float m = neg_inf();
    for (int s = 0; s < splits; ++s) m = fmaxf(m, w[r * splits + s]);
    m_all[r] = m;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * splits; i += kThreads) {
    const float l = __ldcg(parts + row_at(i / splits) + (i % splits) * stride + D + 1);
    w[i] = l > 0.0f ? exp2f(w[i] - m_all[i / splits]) : 0.0f;
  }
  __syncthreads();
}

// One output element of a merge: the acc values p[s * stride] and the sums l of the splits
// with a nonzero weight w[s], weighted and summed in split order (o and the row's l sum,
// as the merge sums them), o / l. The loads go out 8 splits at a time before the sums. A
// zero weight adds exactly nothing (fmaf(x, 0, y) == y for a split's finite acc and l; a
// split without tokens holds acc == 0, l == 0), so its split is not read: the same bits as
// summing every split. p: the element's acc in split 0; l at p - d + D + 1.
template <int D>
__device__ __forceinline__ float merged(const float* p, int d, int stride, const float* w,
                                        int splits) {
  constexpr int kAhead = 8;
  float o = 0.0f, l_all = 0.0f;
  for (int s0 = 0; s0 < splits; s0 += kAhead) {
    float v[kAhead], l[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int s = s0 + k;
      const bool used = s < splits && w[s] != 0.0f;
      v[k] = used ? __ldcg(p + s * stride) : 0.0f;
      l[k] = used ? __ldcg(p + s * stride - d + D + 1) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int s = s0 + k;
      if (s < splits && w[s] != 0.0f) {
        l_all = fmaf(l[k], w[s], l_all);
        o = fmaf(v[k], w[s], o);
      }
    }
  }
  return l_all > 0.0f ? __fdividef(o, l_all) : 0.0f;
}

// One (sequence, kv head): out[seq, kv_head * group + j, :] for every j. `scratch`:
// group x (splits + 1) floats of shared memory (the validator's merge_floats).
template <int D>
__device__ __forceinline__ void attention_merge(const float* partials, bf16_bits* out, int seq,
                                                int kv_head, int splits, int heads,
                                                int kv_heads, int group, int max_splits,
                                                float* scratch) {
  constexpr int kRow = D + 2;
  const float* base =
      partials + (static_cast<long long>(seq) * kv_heads + kv_head) * max_splits * group * kRow;
  split_weights<D>(base, group, splits, group * kRow, [&](int j) { return j * kRow; }, scratch);
  for (int idx = threadIdx.x; idx < group * D; idx += kThreads) {
    const int j = idx / D, d = idx % D;
    const float value = merged<D>(base + j * kRow + d, d, group * kRow, scratch + j * splits,
                                  splits);
    out[(static_cast<long long>(seq) * heads + kv_head * group + j) * D + d] =
        float_to_bf16(value);
  }
}

}  // namespace persistent
}  // namespace rowgate
