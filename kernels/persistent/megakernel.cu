// Persistent decode megakernel: one block per SM runs a whole decode step from
// a task list (task ABI v1, kernels/persistent/task_abi.cuh, docs/task-abi.md).
//
// Launch: grid = number of SMs, block kThreads, no dynamic shared memory; the
// counters and the queue head are zeroed before every launch. Arguments: tasks,
// num_tasks, buffer table, step shape, counters, queue head, trace (nullptr, or
// num_tasks x 4 u64 for per-task timing). Two entry
// points, one per schedule variant:
//   persistent_decode_static   block i runs tasks i, i + grid, ... in order
//   persistent_decode_dynamic  blocks claim task indices from an atomic head
// Both take tasks in increasing index order; the host validator guarantees
// every producer precedes its consumers, so neither can deadlock while all
// blocks are resident (one per SM).
//
// Weights are bf16 and read through the read-only path (they never change
// during a launch); activations written by other blocks are read with plain
// loads after the counter acquire. Accumulation is fp32; each op rounds to
// bf16 where the torch reference engine rounds, so results track it.

#include "rowgate/dtypes.cuh"
#include "rowgate/reduce.cuh"
#include "attention_split.cuh"
#include "task_abi.cuh"

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

constexpr int kMaxBatch = 8;
constexpr int kSmemFloats = kWarps * rowgate::persistent::kMaxGroup * (128 + 2);

__device__ __forceinline__ float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// Sum over the block; every thread gets it. `red` holds kWarps floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = rowgate::warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += red[w];
  __syncthreads();  // red is reused by the next call
  return total;
}

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

struct Ctx {
  const StepShape& s;
  const u64* buffers;
  const int* meta;
  float* smem;
};

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

__device__ void op_rms_norm(const TaskDesc& t, const Ctx& c) {
  const bf16_bits* x = operand<const bf16_bits>(t, c.buffers, 0);
  const bf16_bits* w = operand<const bf16_bits>(t, c.buffers, 1);
  bf16_bits* out = operand<bf16_bits>(t, c.buffers, 2);
  const u32 n = t.tile[2];
  for (u32 r = t.tile[0]; r < t.tile[0] + t.tile[1]; ++r) {
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < n; i += kThreads) {
      const float v = bf16_to_float(x[r * n + i]);
      ss = fmaf(v, v, ss);
    }
    const float inv = rsqrtf(block_sum(ss, c.smem) / n + c.s.rms_eps);
    for (u32 i = threadIdx.x; i < n; i += kThreads) {
      const float v = bf16_to_float(x[r * n + i]) * inv;
      out[r * n + i] = float_to_bf16(v * bf16_to_float(__ldg(w + i)));
    }
  }
}

// y[b, row] = x[b, :] . W[row, :] for the tile's rows; one warp per row.
// Each lane first issues kChunks 16-byte weight loads, then consumes them: a
// step is bound by weight bytes, and HBM needs ~32 KB in flight per SM to run
// at bandwidth (Little's law at ~1 us latency); one load at a time per lane
// kept it at ~16 % of the copy ceiling on the H200 (docs/perf.md). The order of
// the fp32 sums per lane is unchanged (k ascending), so results are too.
constexpr int kChunks = 8;
// The activations x[batch, K] are staged in the block's shared buffer when they
// fit (every warp reads all of them once per weight row: from L2 that is batch x
// the weight bytes, the traced step time grew with the batch although the
// weights do not). Same values, same order: results are bitwise unchanged.
constexpr u32 kSmemBytes = kSmemFloats * sizeof(float);

template <bool kF32Out>
__device__ void op_gemv(const TaskDesc& t, const Ctx& c) {
  const bf16_bits* W = operand<const bf16_bits>(t, c.buffers, 0);
  const uint4* xg = reinterpret_cast<const uint4*>(operand<const bf16_bits>(t, c.buffers, 1));
  void* y = operand<void>(t, c.buffers, 2);
  const u32 K = t.tile[2], N = t.tile[3], K8 = K / 8;
  const int batch = static_cast<int>(c.s.batch);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* xs = reinterpret_cast<uint4*>(c.smem);
  const bool staged = static_cast<u32>(batch) * K * sizeof(bf16_bits) <= kSmemBytes;
  if (staged) {
    // Activations come from other blocks of this launch: read them at L2
    // (ld.global.cg), never through the non-coherent path.
    for (u32 i = threadIdx.x; i < batch * K8; i += kThreads) xs[i] = __ldcg(xg + i);
    __syncthreads();
  }
  for (u32 row = t.tile[0] + warp; row < t.tile[0] + t.tile[1]; row += kWarps) {
    const uint4* wrow = reinterpret_cast<const uint4*>(W + static_cast<u64>(row) * K);
    float acc[kMaxBatch];
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) acc[b] = 0.0f;
    for (u32 base = lane; base < K8; base += 32 * kChunks) {
      uint4 wv[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const u32 k8 = base + 32 * j;
        wv[j] = k8 < K8 ? __ldg(wrow + k8) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const u32 k8 = base + 32 * j;
        if (k8 >= K8) break;
        float wf[8];
        unpack8(wv[j], wf);
#pragma unroll
        for (int b = 0; b < kMaxBatch; ++b) {
          if (b >= batch) break;
          float xf[8];
          unpack8(staged ? xs[b * K8 + k8] : __ldcg(xg + b * K8 + k8), xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[b] = fmaf(wf[i], xf[i], acc[b]);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {
      if (b >= batch) break;
      const float v = rowgate::warp_sum(acc[b]);
      if (lane == 0) {
        if (kF32Out) {
          static_cast<float*>(y)[b * N + row] = round_bf16(v);
        } else {
          static_cast<bf16_bits*>(y)[b * N + row] = float_to_bf16(v);
        }
      }
    }
  }
}

// Per-head RMSNorm then neox rotation, in place; one warp per (sequence, head) row.
template <int D>
__device__ void rope_rows(const TaskDesc& t, const Ctx& c) {
  constexpr int kHalf = D / 2, kPairs = D / 64;
  bf16_bits* x = operand<bf16_bits>(t, c.buffers, 0);
  const bf16_bits* cs = operand<const bf16_bits>(t, c.buffers, 1);
  const bf16_bits* w = operand<const bf16_bits>(t, c.buffers, 2);
  const bool append = t.flags & rowgate::task::kFlagAppendKv;
  const u32 nheads = t.tile[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (u32 r = t.tile[0] + warp; r < t.tile[0] + t.tile[1]; r += kWarps) {
    const u32 b = r / nheads, head = r % nheads;
    const long long pos = c.meta[c.s.positions_at + b];
    bf16_bits* row = x + static_cast<u64>(r) * D;
    float lo[kPairs], hi[kPairs];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      lo[j] = bf16_to_float(row[lane + 32 * j]);
      hi[j] = bf16_to_float(row[lane + 32 * j + kHalf]);
      ss = fmaf(lo[j], lo[j], fmaf(hi[j], hi[j], ss));
    }
    const float inv = rsqrtf(rowgate::warp_sum(ss) / D + c.s.rms_eps);
    bf16_bits* cache = nullptr;
    if (append) {
      const long long slot = c.meta[c.s.slots_at + b];
      cache = operand<bf16_bits>(t, c.buffers, 3) + (slot * nheads + head) * D;
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      const float x1 = round_bf16(lo[j] * inv * bf16_to_float(__ldg(w + i)));
      const float x2 = round_bf16(hi[j] * inv * bf16_to_float(__ldg(w + i + kHalf)));
      const float cos = bf16_to_float(__ldg(cs + pos * D + i));
      const float sin = bf16_to_float(__ldg(cs + pos * D + kHalf + i));
      const bf16_bits o1 = float_to_bf16(round_bf16(x1 * cos) - round_bf16(x2 * sin));
      const bf16_bits o2 = float_to_bf16(round_bf16(x2 * cos) + round_bf16(x1 * sin));
      row[i] = o1;
      row[i + kHalf] = o2;
      if (append) {
        cache[i] = o1;
        cache[i + kHalf] = o2;
      }
    }
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

template <int D>
__device__ void op_attn_split(const TaskDesc& t, const Ctx& c) {
  rowgate::persistent::SplitArgs a;
  a.q = operand<const bf16_bits>(t, c.buffers, 0);
  a.k_cache = operand<const bf16_bits>(t, c.buffers, 1);
  a.v_cache = operand<const bf16_bits>(t, c.buffers, 2);
  a.partials = operand<float>(t, c.buffers, 3);
  a.seq = t.tile[0];
  a.kv_head = t.tile[1];
  a.split = t.tile[2];
  a.chunk = t.tile[3];
  a.len = c.meta[c.s.context_lens_at + a.seq];
  a.block_table = c.meta + c.s.block_tables_at + a.seq * c.s.table_width;
  a.heads = c.s.num_heads;
  a.kv_heads = c.s.num_kv_heads;
  a.group = c.s.num_heads / c.s.num_kv_heads;
  a.page_size = c.s.page_size;
  a.max_splits = c.s.max_splits;
  a.softmax_scale = c.s.softmax_scale;
  rowgate::persistent::attention_split<D>(a, c.smem);
}

template <int D>
__device__ void op_attn_merge(const TaskDesc& t, const Ctx& c) {
  rowgate::persistent::attention_merge<D>(
      operand<const float>(t, c.buffers, 0), operand<bf16_bits>(t, c.buffers, 1), t.tile[0],
      t.tile[1], t.tile[2], c.s.num_heads, c.s.num_kv_heads, c.s.num_heads / c.s.num_kv_heads,
      c.s.max_splits);
}

__device__ void op_silu_mul(const TaskDesc& t, const Ctx& c) {
  const bf16_bits* gate = operand<const bf16_bits>(t, c.buffers, 0);
  const bf16_bits* up = operand<const bf16_bits>(t, c.buffers, 1);
  bf16_bits* out = operand<bf16_bits>(t, c.buffers, 2);
  const u32 n = t.tile[2];
  for (u32 b = 0; b < c.s.batch; ++b) {
    for (u32 i = t.tile[0] + threadIdx.x; i < t.tile[0] + t.tile[1]; i += kThreads) {
      const float g = bf16_to_float(gate[b * n + i]);
      const float act = round_bf16(g / (1.0f + expf(-g)));
      out[b * n + i] = float_to_bf16(act * bf16_to_float(up[b * n + i]));
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

// A GEMV task's weight rows do not depend on any counter: ask L2 for them before
// waiting, so the weight stream overlaps the wait for the previous stage (the
// traced breakdown put 25-30 % of block time in counter waits). Hopper's bulk
// prefetch takes a byte range per instruction; each warp issues a slice.
constexpr u32 kPrefetchSlice = 16384;

__device__ __forceinline__ void prefetch_weights(const TaskDesc& t, const u64* buffers) {
  namespace task = rowgate::task;
  if (t.opcode != task::kGemv && t.opcode != task::kLogits) return;
  const char* w = reinterpret_cast<const char*>(operand<const bf16_bits>(t, buffers, 0)) +
                  static_cast<u64>(t.tile[0]) * t.tile[2] * sizeof(bf16_bits);
  const u64 bytes = static_cast<u64>(t.tile[1]) * t.tile[2] * sizeof(bf16_bits);
  if (threadIdx.x % 32 != 0) return;
  for (u64 at = static_cast<u64>(threadIdx.x / 32) * kPrefetchSlice; at < bytes;
       at += static_cast<u64>(kWarps) * kPrefetchSlice) {
    const u32 n = static_cast<u32>(min(static_cast<u64>(kPrefetchSlice), bytes - at));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + at), "r"(n) : "memory");
  }
}

__device__ void run_task(const TaskDesc& t, const Ctx& c) {
  namespace task = rowgate::task;
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
    default: break;  // kNop; unknown opcodes never pass the host validator
  }
}

__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Optional per-task timing (trace != nullptr): kTraceWords u64 per task index, written by
// thread 0: block, globaltimer at claim (ns), cycles waiting on counters, cycles running
// (until the signal). Cycles are the SM's clock64: differences on one SM only.
constexpr int kTraceWords = 4;

template <bool kDynamic>
__device__ __forceinline__ void persistent_decode(const TaskDesc* tasks, u32 num_tasks,
                                                  const u64* buffers, const StepShape* shape,
                                                  u32* counters, u32* queue_head, u64* trace) {
  __shared__ __align__(16) TaskDesc s_task;
  __shared__ StepShape s_shape;
  __shared__ u32 s_index;
  __shared__ __align__(16) float s_buf[kSmemFloats];
  if (threadIdx.x < sizeof(StepShape) / 4) {
    reinterpret_cast<u32*>(&s_shape)[threadIdx.x] =
        reinterpret_cast<const u32*>(shape)[threadIdx.x];
  }
  __syncthreads();
  const Ctx c{s_shape, buffers,
              reinterpret_cast<const int*>(buffers[s_shape.meta_buffer]), s_buf};
  for (u32 k = 0;; ++k) {
    u32 index;
    if (kDynamic) {
      if (threadIdx.x == 0) s_index = atomicAdd(queue_head, 1u);
      __syncthreads();
      index = s_index;
    } else {
      index = blockIdx.x + k * gridDim.x;
    }
    if (index >= num_tasks) break;
    if (threadIdx.x < rowgate::task::kTaskBytes / 16) {
      reinterpret_cast<uint4*>(&s_task)[threadIdx.x] =
          __ldg(reinterpret_cast<const uint4*>(tasks + index) + threadIdx.x);
    }
    const bool timed = trace != nullptr && threadIdx.x == 0;
    u64 claimed_ns = 0, c0 = 0, c1 = 0;
    if (timed) {
      claimed_ns = global_ns();
      c0 = clock64();
    }
    __syncthreads();
    prefetch_weights(s_task, buffers);
    rowgate::task::wait_counters(s_task, counters);
    if (timed) c1 = clock64();
    run_task(s_task, c);
    rowgate::task::signal_counter(s_task, counters);
    if (timed) {
      u64* r = trace + static_cast<u64>(index) * kTraceWords;
      r[0] = blockIdx.x;
      r[1] = claimed_ns;
      r[2] = c1 - c0;
      r[3] = clock64() - c1;
    }
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
