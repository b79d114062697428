// Persistent decode megakernel: one block per SM runs a whole decode step from
// a task list (task ABI v2, kernels/persistent/task_abi.cuh, docs/task-abi.md).
//
// Launch: grid = number of SMs, block kThreads, kDynamicSmemBytes of dynamic
// shared memory (opted in); the counters and the queue head are zeroed before
// every launch. Arguments: tasks, num_tasks, buffer table, step shape, counters,
// queue head, trace (nullptr, or num_tasks x 4 u64 for per-task timing). Two
// entry points, one per schedule variant:
//   persistent_decode_static   block i runs tasks i, i + grid, ... in order
//   persistent_decode_dynamic  blocks claim task indices from an atomic head
// Both take tasks in increasing index order; the host validator guarantees
// every producer precedes its consumers, so neither can deadlock while all
// blocks are resident (one per SM). A block of the dynamic queue claims its next
// index only after its current task has signalled (docs/task-abi.md, Progress).
//
// Weights are bf16 and read through the read-only path (they never change
// during a launch); activations written by other blocks are read at L2 or with
// plain loads after the counter acquire. Accumulation is fp32; each op rounds to
// bf16 where the torch reference engine rounds, so results track it. Every
// fused flag computes what the unfused ops compute, in the same order, and the
// weight stream feeds the same per-lane sums in the same order: a fused list
// gives the unfused list's logits bit for bit.
//
// A GEMV's weights stream through a per-lane cp.async ring in shared memory
// (kRingGroups x 8 16-byte loads in flight per lane, no registers held), its first
// groups issued before the task's counter wait. An attention split's loop is templated
// on the group (1, 2, 4, 8; other groups run the one-token-ahead loop), the K/V rows of
// its next 4 tokens held raw (kernels/persistent/attention_split.cuh).
//
// Build variants (kernels.toml; the experiments that lost are in git history):
//   RG_MK_MMA=1          GEMV tiles on the tensor cores (mma.sync m16n8k16, the batch as
//                        N = 8; kernels/persistent/gemv_mma.cuh) where K % 1024 == 0 and
//                        the input is staged, the weights through the same ring; bit for
//                        bit across its schedules and task lists, not the FMA variant's
//                        bits (another summation order); kernels.toml
//                        persistent_decode_mma (the default build is the FMA GEMV)
//   RG_MK_STREAM=1       the tensor-core GEMV's ring as one stream across a block's tasks
//                        (needs RG_MK_MMA=1; kernels.toml persistent_decode_mma builds it):
//                        5 groups (160 KB, 4 in flight before the counter wait) where the
//                        step's inputs fit 48 KB (b1-b4 of the probe model), else 3, each
//                        group committed only with copies and waited for exactly; 224 KB
//                        of dynamic shared memory. 2-6 % faster than the plain ring at
//                        b1 / b4 / b8 on the H100 (docs/perf.md). The same loads in the
//                        same order into the same sums: bit for bit

#include "rowgate/dtypes.cuh"
#include "rowgate/reduce.cuh"
#include "attention_split.cuh"
#include "task_abi.cuh"

#ifndef RG_MK_MMA
#define RG_MK_MMA 0
#endif
#ifndef RG_MK_STREAM
#define RG_MK_STREAM 0
#endif
#if RG_MK_STREAM && !RG_MK_MMA
#error "RG_MK_STREAM runs the tensor-core GEMV's ring across tasks: it needs RG_MK_MMA=1"
#endif

namespace {

using rowgate::bf16_bits;
using rowgate::bf16_to_float;
using rowgate::float_to_bf16;
using rowgate::u32;
using rowgate::persistent::kThreads;
using rowgate::persistent::kWarps;
using rowgate::task::StepShape;
using rowgate::task::TaskDesc;
using rowgate::task::operand;
using u64 = rowgate::task::u64;
namespace task = rowgate::task;

constexpr int kMaxBatch = 8;
constexpr u32 kAttnFloats = kWarps * rowgate::persistent::kMaxGroup * (128 + 2);
constexpr int kRingGroups = 3;    // groups of 8 16-byte loads in flight per lane
constexpr int kGroupChunks = 8;
constexpr u32 kRingBytes = kWarps * 32 * kRingGroups * kGroupChunks * 16;  // 96 KB
// Dynamic shared memory: the ring, the staging buffer (a GEMV's input; an attention
// split's warp states and query heads), the scratch (the merges' split weights).
#if RG_MK_STREAM
// RG_MK_STREAM: a launch whose inputs fit kStreamStage runs a kDeepGroups ring with the
// staging buffer after it; otherwise the kRingGroups ring and the whole staging buffer.
// The scratch sits after both layouts.
constexpr int kDeepGroups = 5;
constexpr u32 kDeepRingBytes = kWarps * kDeepGroups * kGroupChunks * 32 * 16;  // 160 KB
constexpr u32 kStreamStage = 48 * 1024;
constexpr u32 kScratchAt = kDeepRingBytes + kStreamStage;  // 208 KB
static_assert(kRingBytes + task::kStageBytes <= kScratchAt, "the shallow layout fits too");
static_assert(kAttnFloats * 4 + rowgate::persistent::kMaxGroup * 128 * 2 <= kStreamStage,
              "attention splits keep their states in the deep layout's staging buffer");
#else
constexpr u32 kScratchAt = kRingBytes + task::kStageBytes;
#endif
constexpr u32 kDynamicSmemBytes = kScratchAt + task::kScratchBytes;
static_assert(kAttnFloats * 4 + rowgate::persistent::kMaxGroup * 128 * 2 <= task::kStageBytes,
              "attention splits keep their warp states and query heads in the staging buffer");

__device__ __forceinline__ float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// The SM clock when a GEMV task's input was staged (0: not a staged GEMV), for the
// optional trace: it splits a task's run into its prologue and its weight stream.
__shared__ long long s_staged_at;

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = static_cast<u32>(float_to_bf16(f[2 * i])) |
           (static_cast<u32>(float_to_bf16(f[2 * i + 1])) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

#if RG_MK_STREAM
constexpr u32 kNoTask = 0xffffffffu;
// RG_MK_STREAM: where a warp's ring stands across tasks. Every warp issues and consumes
// the same group counts; each keeps its own copy (written by its lane 0) so no warp reads
// what another writes.
struct Feed {
  u32 issued;    // groups issued since the launch: group G goes to ring slot G % depth
  u32 consumed;  // groups consumed
  u32 task;      // the task whose groups the ring is issuing (kNoTask: none yet)
  u32 group;     // how many of its groups are issued
};
struct Feeds {
  Feed warp[kWarps];
  // Read by nothing since the removed look-ahead build (the ring run on into a block's next
  // GEMV task): kept, with its store below, because dropping them moves the static shared
  // memory and so changes the sealed cubin; they go with the next change that re-seals it.
  u32 next;
  __align__(16) TaskDesc next_desc;
};
#endif

struct Ctx {
  const StepShape& s;
  const u64* buffers;
  const int* meta;
  unsigned char* stage;   // kStageBytes
  float* scratch;         // kScratchBytes
  uint4* ring;            // kRingBytes (RG_MK_STREAM's deep layout: kDeepRingBytes)
  float* red;             // kMaxBatch x kWarps floats (static shared)
#if RG_MK_STREAM
  struct Feeds* feeds;    // the ring's state across tasks (static shared)
  bool deep;              // this launch's ring is kDeepGroups deep
#endif
};

// Sums over the block of up to kMaxBatch values per thread; every thread gets the
// sums. The same order as one row at a time (each warp's butterfly, then the warps
// in order), so a batched norm equals the per-row one bit for bit.
template <int kRows>
__device__ __forceinline__ void block_sums(float (&v)[kRows], int rows, float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
    const float w = rowgate::warp_sum(v[r]);
    if (lane == 0) red[r * kWarps + warp] = w;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += red[r * kWarps + w];
    v[r] = total;
  }
  __syncthreads();  // red is reused by the next call
}

// ------------------------------------------------------------------ ops

__device__ void op_embed(const TaskDesc& t, const Ctx& c) {
  const bf16_bits* table = operand<const bf16_bits>(t, c.buffers, 0);
  bf16_bits* out = operand<bf16_bits>(t, c.buffers, 1);
  const u32 hidden = t.tile[2];
  for (u32 b = t.tile[0]; b < t.tile[0] + t.tile[1]; ++b) {
    const long long id = c.meta[c.s.ids_at + b];
    for (u32 i = threadIdx.x; i < hidden; i += kThreads) {
      out[b * hidden + i] = __ldg(table + id * hidden + i);
    }
  }
}

// out[r] = bf16(x[r] * rsqrt(mean(x[r]^2) + eps) * w) for rows r0 .. r0 + rows; the
// RMS_NORM op and a GEMV's NORM_IN staging (x_stride: the source row stride). A thread
// takes elements i = tid, tid + kThreads, ... of a row, in that order; their loads go out
// kNormAhead at a time before the sums (a norm is on the critical path of every GEMV
// stage that waits for it: one L2 round trip per kNormAhead elements, not per element).
constexpr int kNormAhead = 8;

__device__ __forceinline__ void norm_rows(const bf16_bits* x, u32 x_stride, const bf16_bits* w,
                                          bf16_bits* out, u32 out_stride, u32 r0, u32 rows,
                                          u32 n, const Ctx& c) {
  float ss[kMaxBatch];
#pragma unroll
  for (int r = 0; r < kMaxBatch; ++r) {
    ss[r] = 0.0f;
    if (r >= static_cast<int>(rows)) continue;
    const bf16_bits* xr = x + (r0 + r) * x_stride;
    for (u32 i0 = threadIdx.x; i0 < n; i0 += kThreads * kNormAhead) {
      float v[kNormAhead];
#pragma unroll
      for (int k = 0; k < kNormAhead; ++k) {
        const u32 i = i0 + k * kThreads;
        v[k] = i < n ? bf16_to_float(xr[i]) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kNormAhead; ++k) {
        if (i0 + k * kThreads < n) ss[r] = fmaf(v[k], v[k], ss[r]);
      }
    }
  }
  block_sums<kMaxBatch>(ss, static_cast<int>(rows), c.red);
#pragma unroll
  for (int r = 0; r < kMaxBatch; ++r) {
    if (r >= static_cast<int>(rows)) break;
    const float inv = rsqrtf(ss[r] / n + c.s.rms_eps);
    const bf16_bits* xr = x + (r0 + r) * x_stride;
    for (u32 i0 = threadIdx.x; i0 < n; i0 += kThreads * kNormAhead) {
      float v[kNormAhead], g[kNormAhead];
#pragma unroll
      for (int k = 0; k < kNormAhead; ++k) {
        const u32 i = i0 + k * kThreads;
        v[k] = i < n ? bf16_to_float(xr[i]) : 0.0f;
        g[k] = i < n ? bf16_to_float(__ldg(w + i)) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kNormAhead; ++k) {
        const u32 i = i0 + k * kThreads;
        if (i < n) out[(r0 + r) * out_stride + i] = float_to_bf16(v[k] * inv * g[k]);
      }
    }
  }
}

__device__ void op_rms_norm(const TaskDesc& t, const Ctx& c) {
  const u32 n = t.tile[2];
  for (u32 r = t.tile[0]; r < t.tile[0] + t.tile[1]; r += kMaxBatch) {
    norm_rows(operand<const bf16_bits>(t, c.buffers, 0), n,
              operand<const bf16_bits>(t, c.buffers, 1), operand<bf16_bits>(t, c.buffers, 2), n,
              r, min(static_cast<u32>(kMaxBatch), t.tile[0] + t.tile[1] - r), n, c);
  }
}

__device__ __forceinline__ float silu_mul(float g, float up) {
  return round_bf16(g / (1.0f + expf(-g))) * up;
}

// MERGE_IN: stage[b][h * D + d] = bf16 of the merged splits of (b, h / group), the
// ATTN_MERGE arithmetic and its helpers (attention_split.cuh): the split weights of every
// (b, h) into the scratch at once, then one element per thread.
__device__ void stage_merge(const TaskDesc& t, const Ctx& c, bf16_bits* xs) {
  const float* parts = operand<const float>(t, c.buffers, 1);
  const int H = c.s.num_heads, KV = c.s.num_kv_heads, G = H / KV, D = c.s.head_dim;
  const int S = c.s.max_splits, row = D + 2, batch = c.s.batch;
  // (b, h)'s split 0 state: partials[b][h / G][s][h % G][row]
  auto row_at = [&](int idx) {
    const int b = idx / H, h = idx % H;
    return ((static_cast<long long>(b) * KV + h / G) * S * G + h % G) * row;
  };
  if (D == 128) {
    rowgate::persistent::split_weights<128>(parts, batch * H, S, G * row, row_at, c.scratch);
  } else {
    rowgate::persistent::split_weights<64>(parts, batch * H, S, G * row, row_at, c.scratch);
  }
  for (int e = threadIdx.x; e < batch * H * D; e += kThreads) {
    const int idx = e / D, d = e % D;
    const float* p = parts + row_at(idx) + d;
    const float* w = c.scratch + idx * S;
    xs[e] = float_to_bf16(D == 128 ? rowgate::persistent::merged<128>(p, d, G * row, w, S)
                                   : rowgate::persistent::merged<64>(p, d, G * row, w, S));
  }
}

// What a GEMV stages as its input x[batch][K] (bf16) at `xs` in shared memory, by its
// flags.
__device__ void stage_input(const TaskDesc& t, const Ctx& c, u32 K, u32 x_stride,
                            bf16_bits* xs) {
  const u32 batch = c.s.batch, K8 = K / 8, s8 = x_stride / 8;
  if (t.flags & task::kFlagMergeIn) {
    stage_merge(t, c, xs);
  } else if (t.flags & task::kFlagNormIn) {
    norm_rows(operand<const bf16_bits>(t, c.buffers, 1), x_stride,
              operand<const bf16_bits>(t, c.buffers, 3), xs, K, 0, batch, K, c);
  } else if (t.flags & task::kFlagSiluIn) {
    // kSiluAhead granules of gate and of up requested before their sums: at b1 a
    // thread's 3 granules are 2 L2 round trips, not 3 (a down tile's prologue measured
    // 3.2 us); 4 and 8 in flight were no faster (the IEEE SiLU, not the round trips, sets
    // the prologue) and cost 8 registers each
    constexpr int kSiluAhead = 2;
    const uint4* gate = operand<const uint4>(t, c.buffers, 1);
    const uint4* up = operand<const uint4>(t, c.buffers, 3);
    for (u32 i0 = threadIdx.x; i0 < batch * K8; i0 += kThreads * kSiluAhead) {
      uint4 gv[kSiluAhead], uv[kSiluAhead];
#pragma unroll
      for (int k = 0; k < kSiluAhead; ++k) {
        const u32 i = i0 + k * kThreads, b = i / K8, k8 = i % K8;
        if (i < batch * K8) {
          gv[k] = __ldcg(gate + b * s8 + k8);
          uv[k] = __ldcg(up + b * s8 + k8);
        }
      }
#pragma unroll
      for (int k = 0; k < kSiluAhead; ++k) {
        const u32 i = i0 + k * kThreads;
        if (i >= batch * K8) break;
        float g[8], u[8], a[8];
        unpack8(gv[k], g);
        unpack8(uv[k], u);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = silu_mul(g[j], u[j]);
        reinterpret_cast<uint4*>(xs)[i] = pack8(a);
      }
    }
  } else {
    // Activations come from other blocks of this launch: read them at L2
    // (ld.global.cg), never through the non-coherent path.
    const uint4* xg = operand<const uint4>(t, c.buffers, 1);
    for (u32 i = threadIdx.x; i < batch * K8; i += kThreads) {
      reinterpret_cast<uint4*>(xs)[i] = __ldcg(xg + (i / K8) * s8 + i % K8);
    }
  }
  __syncthreads();
}

// SILU_OUT: 1 (the tile's rows of two weights, a gate row then its up row), else 0; and
// the second weight (operand e; `w`, the first, where there is none).
__device__ __forceinline__ u32 silu_pair(const TaskDesc& t) {
  return (t.flags & task::kFlagSiluOut) ? 1u : 0u;
}
__device__ __forceinline__ const uint4* up_weight(const TaskDesc& t, const u64* buffers,
                                                  const uint4* w) {
  return silu_pair(t) ? operand<const uint4>(t, buffers, 4) : w;
}

// One output row's epilogue (lane 0 writes): y = bf16(dot), or with RESIDUAL_OUT the
// residual stream y = bf16(y + bf16(dot)) -- GEMV then RESIDUAL_ADD, fused; with SILU_OUT
// (v the up row's dot, gate the gate row's) y = SILU_MUL of the two as the unfused gate and
// up GEMVs store them (bf16): the gate|up GEMV then SILU_MUL, fused.
template <bool kF32Out>
__device__ __forceinline__ void gemv_store(const TaskDesc& t, void* y, u32 index, float v,
                                           float gate) {
  if (kF32Out) {
    static_cast<float*>(y)[index] = round_bf16(v);
  } else if (t.flags & task::kFlagResidualOut) {
    bf16_bits* r = static_cast<bf16_bits*>(y) + index;
    *r = float_to_bf16(bf16_to_float(__ldcg(r)) + round_bf16(v));
  } else if (t.flags & task::kFlagSiluOut) {
    static_cast<bf16_bits*>(y)[index] = float_to_bf16(silu_mul(round_bf16(gate), round_bf16(v)));
  } else {
    static_cast<bf16_bits*>(y)[index] = float_to_bf16(v);
  }
}

// The per-warp weight stream of a GEMV task: rows row0 + warp + 8 i, each in
// J = ceil(K8 / 32) steps of one 16-byte load per lane (k8 = lane + 32 j); the
// stream's chunk c = i * J + j, in groups of kGroupChunks. Every lane runs the same
// sequence, so the row ends are warp-uniform. SILU_OUT (pair = 1): stream row i is row
// i / 2 of the gate weight (even i) or of the up weight (odd i, operand e).
struct Stream {
  const uint4* w;   // the weight's first row
  const uint4* w2;  // SILU_OUT: the up weight's (else w)
  u32 row0, K8, J, rows, total, pair;
  __device__ __forceinline__ Stream(const TaskDesc& t, const u64* buffers, int warp) {
    w = operand<const uint4>(t, buffers, 0);
    pair = silu_pair(t);
    w2 = up_weight(t, buffers, w);
    const u32 tile_rows = t.tile[1];
    row0 = t.tile[0] + warp;
    K8 = t.tile[2] / 8;
    J = (K8 + 31) / 32;
    rows = static_cast<u32>(warp) < tile_rows ? (tile_rows - warp + kWarps - 1) / kWarps : 0;
    total = (rows << pair) * J;
  }
  __device__ __forceinline__ u32 groups() const {
    return (total + kGroupChunks - 1) / kGroupChunks;
  }
  __device__ __forceinline__ u32 row(u32 i) const { return row0 + kWarps * (i >> pair); }
  __device__ __forceinline__ const uint4* row_at(u32 i) const {
    return ((i & pair) ? w2 : w) + static_cast<u64>(row(i)) * K8;
  }
};

__device__ __forceinline__ uint4* ring_slot(uint4* ring, int warp, u32 group, int e, int lane) {
  return ring + ((warp * kRingGroups + group % kRingGroups) * kGroupChunks + e) * 32 + lane;
}

// Copies of one group of the stream into its ring slot (an empty group past the end:
// the commit keeps the group count uniform).
__device__ __forceinline__ void ring_issue(const Stream& st, u32 g, uint4* ring, int warp,
                                           int lane) {
  if (g < st.groups()) {
    u32 c = g * kGroupChunks, i = c / st.J, j = c % st.J;
#pragma unroll
    for (int e = 0; e < kGroupChunks; ++e, ++c) {
      if (c >= st.total) break;
      const u32 k8 = lane + 32 * j;
      const bool ok = k8 < st.K8;
      const uint4* src = st.row_at(i) + (ok ? k8 : 0);
      const u32 dst = static_cast<u32>(__cvta_generic_to_shared(ring_slot(ring, warp, g, e, lane)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                   "r"(ok ? 16 : 0)
                   : "memory");
      if (++j == st.J) {
        j = 0;
        ++i;
      }
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

#if RG_MK_MMA
#include "gemv_mma.cuh"
static_assert(mma::kPartialBytes <= task::kScratchBytes,
              "a round's partials live in the scratch (free once the input is staged)");
#endif

// Ask L2 for `bytes` from `p` (Hopper's bulk prefetch) in kL2Piece pieces: this caller's
// pieces are first, first + step, ... (callers interleave their pieces by `first`/`step`).
// Read-only data: a prefetch cannot change a result (PREFETCH_L2 tasks).
constexpr u64 kL2Piece = 16384;

__device__ __forceinline__ void prefetch_l2(const char* p, u64 bytes, u64 first, u64 step) {
  for (u64 at = first; at < bytes; at += step) {
    const u32 n = static_cast<u32>(min(kL2Piece, bytes - at));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(n) : "memory");
  }
}


// Before the counter wait: the first groups of a GEMV task's weights (which depend on
// no counter) are already on their way while the block waits for the previous stage.
__device__ __forceinline__ void prefetch_weights(const TaskDesc& t, const Ctx& c, u32 index) {
  if (t.opcode != task::kGemv && t.opcode != task::kLogits) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#if RG_MK_STREAM
  if (mma::usable(t, c.s.batch)) {  // the ring's groups of this task not yet in flight
    if (c.deep) {
      mma::fill<kDeepGroups>(t, index, c.buffers, c.ring, c.feeds->warp, warp, lane);
    } else {
      mma::fill<kRingGroups>(t, index, c.buffers, c.ring, c.feeds->warp, warp, lane);
    }
    return;
  }
#else
  (void)index;
#endif
#if RG_MK_MMA
  if (mma::usable(t, c.s.batch)) {
    mma::prefetch<kRingGroups>(t, c.buffers, c.ring, warp, lane);
    return;
  }
#endif
  const Stream st(t, c.buffers, warp);
#pragma unroll
  for (int g = 0; g < kRingGroups - 1; ++g) ring_issue(st, g, c.ring, warp, lane);
}

// y[b, col + row] (row stride N) = x[b, :] . W[row, :] for the tile's rows, one warp per
// row, all B sequences per weight load; x staged in shared memory (always for a fused
// GEMV; for a plain one when it fits, else read at L2). Per lane the fp32 sums run over
// k8 = lane, lane + 32, ... in order, whichever way the weights arrive.
template <bool kF32Out>
__device__ void op_gemv(const TaskDesc& t, const Ctx& c) {
  const u32 K = t.tile[2], N = t.tile[3], col = t.tile[4];
  const u32 x_stride = t.tile[5] ? t.tile[5] : K;
  const u32 K8 = K / 8, s8 = x_stride / 8;
  const int batch = static_cast<int>(c.s.batch);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  void* y = operand<void>(t, c.buffers, 2);
  const uint4* xg = operand<const uint4>(t, c.buffers, 1);
  const uint4* xs = reinterpret_cast<const uint4*>(c.stage);
  const bool staged = static_cast<u32>(batch) * K * sizeof(bf16_bits) <= task::kStageBytes;
  if (staged) {
    stage_input(t, c, K, x_stride, reinterpret_cast<bf16_bits*>(c.stage));
    if (threadIdx.x == 0) s_staged_at = clock64();
  }
  auto x_at = [&](int b, u32 k8) { return staged ? xs[b * K8 + k8] : __ldcg(xg + b * s8 + k8); };
#if RG_MK_MMA
  if (mma::usable(t, c.s.batch)) {  // staged (the same test)
    auto store = [&](int b, u32 row, float v, float gate) {
      gemv_store<kF32Out>(t, y, b * N + col + row, v, gate);
    };
#if RG_MK_STREAM
    if (c.deep) {
      mma::gemv_fed<kDeepGroups>(t, c.buffers, c.ring, c.scratch, xs, batch, c.feeds->warp,
                                 store);
    } else {
      mma::gemv_fed<kRingGroups>(t, c.buffers, c.ring, c.scratch, xs, batch, c.feeds->warp,
                                 store);
    }
#else
    mma::gemv<kRingGroups>(t, c.buffers, c.ring, c.scratch, xs, batch, store);
#endif
    return;
  }
#endif
  float acc[kMaxBatch];
#pragma unroll
  for (int b = 0; b < kMaxBatch; ++b) acc[b] = 0.0f;
  // half 0: a row of a plain GEMV; SILU_OUT: 1 a pair's gate row (lane 0 keeps its sums in
  // the scratch, free once the input is staged), 2 its up row (stored with them)
  auto finish_row = [&](u32 row, u32 half) {
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {
      if (b >= batch) break;
      const float v = rowgate::warp_sum(acc[b]);
      float* kept = c.scratch + warp * kMaxBatch + b;
      if (lane == 0 && half == 1) *kept = v;
      if (lane == 0 && half != 1) {
        gemv_store<kF32Out>(t, y, b * N + col + row, v, half == 2 ? *kept : 0.0f);
      }
      acc[b] = 0.0f;
    }
  };
  auto fma_chunk = [&](const uint4& wv, u32 k8) {
    float wf[8];
    unpack8(wv, wf);
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {
      if (b >= batch) break;
      float xf[8];
      unpack8(x_at(b, k8), xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[b] = fmaf(wf[i], xf[i], acc[b]);
    }
  };
  const Stream st(t, c.buffers, warp);
  const u32 groups = st.groups();
  u32 i = 0, j = 0;
  for (u32 g = 0; g < groups; ++g) {
    ring_issue(st, g + kRingGroups - 1, c.ring, warp, lane);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kRingGroups - 1) : "memory");
#pragma unroll
    for (int e = 0; e < kGroupChunks; ++e) {
      if (g * kGroupChunks + e >= st.total) break;
      const u32 k8 = lane + 32 * j;
      if (k8 < K8) fma_chunk(*ring_slot(c.ring, warp, g, e, lane), k8);
      if (++j == st.J) {
        finish_row(st.row(i), st.pair ? 1 + (i & 1) : 0);
        j = 0;
        ++i;
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// One head row: per-head RMSNorm (Qwen3 q/k norm) then the neox rotation at the
// position's cos | sin row, one warp; `in` and `out` may alias.
template <int D>
__device__ __forceinline__ void rope_head(const bf16_bits* in, bf16_bits* out,
                                          const bf16_bits* w, const bf16_bits* cs_row, float eps,
                                          int lane, bf16_bits* also = nullptr) {
  constexpr int kHalf = D / 2, kPairs = D / 64;
  float lo[kPairs], hi[kPairs];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    lo[j] = bf16_to_float(in[lane + 32 * j]);
    hi[j] = bf16_to_float(in[lane + 32 * j + kHalf]);
    ss = fmaf(lo[j], lo[j], fmaf(hi[j], hi[j], ss));
  }
  const float inv = rsqrtf(rowgate::warp_sum(ss) / D + eps);
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    const float x1 = round_bf16(lo[j] * inv * bf16_to_float(__ldg(w + i)));
    const float x2 = round_bf16(hi[j] * inv * bf16_to_float(__ldg(w + i + kHalf)));
    const float cos = bf16_to_float(__ldg(cs_row + i));
    const float sin = bf16_to_float(__ldg(cs_row + kHalf + i));
    const bf16_bits o1 = float_to_bf16(round_bf16(x1 * cos) - round_bf16(x2 * sin));
    const bf16_bits o2 = float_to_bf16(round_bf16(x2 * cos) + round_bf16(x1 * sin));
    out[i] = o1;
    out[i + kHalf] = o2;
    if (also != nullptr) {
      also[i] = o1;
      also[i + kHalf] = o2;
    }
  }
}

// ROPE: rows (sequence, head) in place; one warp per row.
template <int D>
__device__ void rope_rows(const TaskDesc& t, const Ctx& c) {
  bf16_bits* x = operand<bf16_bits>(t, c.buffers, 0);
  const bf16_bits* cs = operand<const bf16_bits>(t, c.buffers, 1);
  const bf16_bits* w = operand<const bf16_bits>(t, c.buffers, 2);
  const bool append = t.flags & task::kFlagAppendKv;
  const u32 nheads = t.tile[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (u32 r = t.tile[0] + warp; r < t.tile[0] + t.tile[1]; r += kWarps) {
    const u32 b = r / nheads, head = r % nheads;
    const long long pos = c.meta[c.s.positions_at + b];
    bf16_bits* cache = nullptr;
    if (append) {
      const long long slot = c.meta[c.s.slots_at + b];
      cache = operand<bf16_bits>(t, c.buffers, 3) + (slot * nheads + head) * D;
    }
    bf16_bits* row = x + static_cast<u64>(r) * D;
    rope_head<D>(row, row, w, cs + pos * D, c.s.rms_eps, lane, cache);
  }
}

__device__ void op_kv_append(const TaskDesc& t, const Ctx& c) {
  const bf16_bits* src = operand<const bf16_bits>(t, c.buffers, 0);
  bf16_bits* cache = operand<bf16_bits>(t, c.buffers, 1);
  const u32 nheads = t.tile[2], D = t.tile[3];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (u32 r = t.tile[0] + warp; r < t.tile[0] + t.tile[1]; r += kWarps) {
    const u32 b = r / nheads, head = r % nheads;
    const long long slot = c.meta[c.s.slots_at + b];
    for (u32 i = lane; i < D; i += 32) cache[(slot * nheads + head) * D + i] = src[r * D + i];
  }
}

// A split's tokens: the planned chunk (t3), or with EVEN_SPLITS the sequence's context
// spread over the splits (task::even_chunk): split s covers [s * chunk, (s + 1) * chunk).
__device__ __forceinline__ u32 split_chunk(const TaskDesc& t, const Ctx& c) {
  if (!(t.flags & task::kFlagEvenSplits)) return t.tile[3];
  const u32 len = static_cast<u32>(c.meta[c.s.context_lens_at + t.tile[0]]);
  return task::even_chunk(len, c.s.max_splits, t.tile[3]);
}

// ROPE_IN: the split's query heads normalised and rotated into shared memory `q`; the
// split holding the sequence's position (its split_chunk tokens from split * chunk) also
// writes that token's rotated K and its V into the caches (it reads them back below, after
// the block barrier).
template <int D>
__device__ void split_prologue(const TaskDesc& t, const Ctx& c, bf16_bits* q) {
  const u32 seq = t.tile[0], kvh = t.tile[1], stride = t.tile[4];
  const u32 k_col = t.tile[5], v_col = t.tile[6], q_col = t.tile[7];
  const int G = c.s.num_heads / c.s.num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long pos = c.meta[c.s.positions_at + seq];
  const u32 chunk = split_chunk(t, c);
  const u32 start = t.tile[2] * chunk;
  const bool append = pos >= start && pos < start + chunk;
  const bf16_bits* row = operand<const bf16_bits>(t, c.buffers, 0) + static_cast<u64>(seq) * stride;
  const bf16_bits* cs = operand<const bf16_bits>(t, c.buffers, 4) + pos * D;
  for (int job = warp; job < G + 2; job += kWarps) {
    if (job < G) {
      rope_head<D>(row + q_col + (kvh * G + job) * D, q + job * D,
                   operand<const bf16_bits>(t, c.buffers, 5), cs, c.s.rms_eps, lane);
    } else if (append) {
      const long long slot = c.meta[c.s.slots_at + seq];
      const u64 at = (static_cast<u64>(slot) * c.s.num_kv_heads + kvh) * D;
      if (job == G) {
        rope_head<D>(row + k_col + kvh * D, operand<bf16_bits>(t, c.buffers, 1) + at,
                     operand<const bf16_bits>(t, c.buffers, 6), cs, c.s.rms_eps, lane);
      } else {
        bf16_bits* v = operand<bf16_bits>(t, c.buffers, 2) + at;
        for (int i = lane; i < D; i += 32) v[i] = row[v_col + kvh * D + i];
      }
    }
  }
  __syncthreads();
}

template <int D>
__device__ void op_attn_split(const TaskDesc& t, const Ctx& c) {
  rowgate::persistent::SplitArgs a;
  a.seq = t.tile[0];
  a.kv_head = t.tile[1];
  a.split = t.tile[2];
  a.chunk = static_cast<int>(split_chunk(t, c));
  a.len = c.meta[c.s.context_lens_at + a.seq];
  a.heads = c.s.num_heads;
  a.kv_heads = c.s.num_kv_heads;
  a.group = c.s.num_heads / c.s.num_kv_heads;
  a.page_size = c.s.page_size;
  a.max_splits = c.s.max_splits;
  a.softmax_scale = c.s.softmax_scale;
  a.k_cache = operand<const bf16_bits>(t, c.buffers, 1);
  a.v_cache = operand<const bf16_bits>(t, c.buffers, 2);
  a.partials = operand<float>(t, c.buffers, 3);
  a.block_table = c.meta + c.s.block_tables_at + a.seq * c.s.table_width;
  float* smem = reinterpret_cast<float*>(c.stage);
  // One inlined copy of the split (its raw loops are one a group).
  if ((t.flags & task::kFlagRopeIn) && a.split * a.chunk >= a.len) {
    a.q = operand<const bf16_bits>(t, c.buffers, 0);  // read, never used
  } else if (t.flags & task::kFlagRopeIn) {
    bf16_bits* q = reinterpret_cast<bf16_bits*>(smem + kAttnFloats);
    split_prologue<D>(t, c, q);
    a.q = q;
  } else {
    a.q = operand<const bf16_bits>(t, c.buffers, 0) +
          (static_cast<long long>(a.seq) * a.heads + a.kv_head * a.group) * D;
  }
  rowgate::persistent::attention_split<D>(a, smem);
}

template <int D>
__device__ void op_attn_merge(const TaskDesc& t, const Ctx& c) {
  rowgate::persistent::attention_merge<D>(
      operand<const float>(t, c.buffers, 0), operand<bf16_bits>(t, c.buffers, 1), t.tile[0],
      t.tile[1], t.tile[2], c.s.num_heads, c.s.num_kv_heads, c.s.num_heads / c.s.num_kv_heads,
      c.s.max_splits, c.scratch);
}

__device__ void op_silu_mul(const TaskDesc& t, const Ctx& c) {
  const bf16_bits* gate = operand<const bf16_bits>(t, c.buffers, 0);
  const bf16_bits* up = operand<const bf16_bits>(t, c.buffers, 1);
  bf16_bits* out = operand<bf16_bits>(t, c.buffers, 2);
  const u32 n = t.tile[2];
  for (u32 b = 0; b < c.s.batch; ++b) {
    for (u32 i = t.tile[0] + threadIdx.x; i < t.tile[0] + t.tile[1]; i += kThreads) {
      out[b * n + i] =
          float_to_bf16(silu_mul(bf16_to_float(gate[b * n + i]), bf16_to_float(up[b * n + i])));
    }
  }
}

__device__ void op_residual_add(const TaskDesc& t, const Ctx& c) {
  bf16_bits* x = operand<bf16_bits>(t, c.buffers, 0);
  const bf16_bits* y = operand<const bf16_bits>(t, c.buffers, 1);
  const u32 n = t.tile[2];
  for (u32 b = 0; b < c.s.batch; ++b) {
    for (u32 i = t.tile[0] + threadIdx.x; i < t.tile[0] + t.tile[1]; i += kThreads) {
      x[b * n + i] = float_to_bf16(bf16_to_float(x[b * n + i]) + bf16_to_float(y[b * n + i]));
    }
  }
}


// PREFETCH_L2: every thread asks L2 for one piece of the t0 bytes at operand a at a time
// (the validator keeps t0 a multiple of 16). A hint without a result: the blocks idle in a
// latency-bound phase pull a later stage's weights in.
__device__ void op_prefetch_l2(const TaskDesc& t, const Ctx& c) {
  prefetch_l2(operand<const char>(t, c.buffers, 0), t.tile[0], threadIdx.x * kL2Piece,
              kThreads * kL2Piece);
}

__device__ void run_task(const TaskDesc& t, const Ctx& c) {
  const bool d128 = c.s.head_dim == 128;
  switch (t.opcode) {
    case task::kEmbed: op_embed(t, c); break;
    case task::kRmsNorm: op_rms_norm(t, c); break;
    case task::kGemv: op_gemv<false>(t, c); break;
    case task::kLogits: op_gemv<true>(t, c); break;
    case task::kRope: d128 ? rope_rows<128>(t, c) : rope_rows<64>(t, c); break;
    case task::kKvAppend: op_kv_append(t, c); break;
    case task::kAttnSplit: d128 ? op_attn_split<128>(t, c) : op_attn_split<64>(t, c); break;
    case task::kAttnMerge: d128 ? op_attn_merge<128>(t, c) : op_attn_merge<64>(t, c); break;
    case task::kSiluMul: op_silu_mul(t, c); break;
    case task::kResidualAdd: op_residual_add(t, c); break;
    case task::kPrefetchL2: op_prefetch_l2(t, c); break;
    default: break;  // kNop; unknown opcodes never pass the host validator
  }
}

__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}


__device__ __forceinline__ u32 dynamic_smem_size() {
  u32 n;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
  return n;
}

#if RG_MK_STREAM
// The largest GEMV input of the step (the staged batch x K), against kStreamStage.
__device__ __forceinline__ bool deep_launch(const StepShape& s) {
  const u32 k = max(max(s.hidden, s.intermediate), s.num_heads * s.head_dim);
  return s.batch * k * sizeof(bf16_bits) <= kStreamStage;
}
#endif

// Optional per-task timing (trace != nullptr): kTraceWords u64 per task index, written by
// thread 0: the block (low 32 bits) and the cycles from the end of the wait to the staged
// input of a GEMV (high 32 bits; 0 for other tasks), globaltimer at claim (ns), cycles
// waiting on counters, cycles running (until the signal). Cycles are the SM's clock64:
// differences on one SM only.
constexpr int kTraceWords = 4;

template <bool kDynamic>
__device__ __forceinline__ void persistent_decode(const TaskDesc* tasks, u32 num_tasks,
                                                  const u64* buffers, const StepShape* shape,
                                                  u32* counters, u32* queue_head, u64* trace) {
  extern __shared__ __align__(16) unsigned char dsmem[];
  __shared__ __align__(16) TaskDesc s_task;
  __shared__ StepShape s_shape;
  __shared__ u32 s_index;
  __shared__ float s_red[kMaxBatch * kWarps];
  if (dynamic_smem_size() < kDynamicSmemBytes) __trap();  // launched without its buffers
  if (threadIdx.x < sizeof(StepShape) / 4) {
    reinterpret_cast<u32*>(&s_shape)[threadIdx.x] =
        reinterpret_cast<const u32*>(shape)[threadIdx.x];
  }
  if (kDynamic && threadIdx.x == 0) s_index = atomicAdd(queue_head, 1u);
#if RG_MK_STREAM
  __shared__ Feeds s_feeds;
  if (threadIdx.x < kWarps) s_feeds.warp[threadIdx.x] = Feed{0, 0, kNoTask, 0};
  if (threadIdx.x == 0) s_feeds.next = kNoTask;
  __syncthreads();
  const bool deep = deep_launch(s_shape);
  const Ctx c{s_shape, buffers, reinterpret_cast<const int*>(buffers[s_shape.meta_buffer]),
              dsmem + (deep ? kDeepRingBytes : kRingBytes),
              reinterpret_cast<float*>(dsmem + kScratchAt), reinterpret_cast<uint4*>(dsmem),
              s_red, &s_feeds, deep};
#else
  __syncthreads();
  const Ctx c{s_shape, buffers, reinterpret_cast<const int*>(buffers[s_shape.meta_buffer]),
              dsmem + kRingBytes, reinterpret_cast<float*>(dsmem + kScratchAt),
              reinterpret_cast<uint4*>(dsmem), s_red};
#endif
  u32 index = kDynamic ? s_index : blockIdx.x;
  while (index < num_tasks) {
    if (threadIdx.x < task::kTaskBytes / 16) {
      reinterpret_cast<uint4*>(&s_task)[threadIdx.x] =
          __ldg(reinterpret_cast<const uint4*>(tasks + index) + threadIdx.x);
    }
    const bool timed = trace != nullptr && threadIdx.x == 0;
    u64 claimed_ns = 0, c0 = 0, c1 = 0;
    if (timed) {
      claimed_ns = global_ns();
      c0 = clock64();
      s_staged_at = 0;
    }
    __syncthreads();
    prefetch_weights(s_task, c, index);
    task::wait_counters(s_task, counters);
    if (timed) c1 = clock64();
    run_task(s_task, c);
    // Signal first, then claim: the consumers of this task wait for the signal, only this
    // block's next task for the claim (an L2 round trip on the queue head, measured in
    // every task's run when the claim came before the signal).
    task::signal_counter(s_task, counters);
    if (timed) {
      u64* r = trace + static_cast<u64>(index) * kTraceWords;
      const u64 staged = s_staged_at ? static_cast<u64>(s_staged_at) - c1 : 0;
      r[0] = blockIdx.x | (min(staged, static_cast<u64>(0xffffffffu)) << 32);
      r[1] = claimed_ns;
      r[2] = c1 - c0;
      r[3] = clock64() - c1;
    }
    if (kDynamic) {
      if (threadIdx.x == 0) s_index = atomicAdd(queue_head, 1u);
      __syncthreads();  // publishes s_index
    }
    index = kDynamic ? s_index : index + gridDim.x;
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    persistent_decode_static(const TaskDesc* tasks, u32 num_tasks, const u64* buffers,
                             const StepShape* shape, u32* counters, u32* queue_head,
                             u64* trace) {
  persistent_decode<false>(tasks, num_tasks, buffers, shape, counters, queue_head, trace);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    persistent_decode_dynamic(const TaskDesc* tasks, u32 num_tasks, const u64* buffers,
                              const StepShape* shape, u32* counters, u32* queue_head,
                              u64* trace) {
  persistent_decode<true>(tasks, num_tasks, buffers, shape, counters, queue_head, trace);
}
