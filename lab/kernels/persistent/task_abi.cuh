// rowgate persistent decode task ABI, version 2 (docs/task-abi.md).
//
// A decode step is a flat list of fixed-size task descriptors executed by a
// persistent kernel (one block per SM). Tasks name their operands as
// (buffer-table slot, 16-byte granule offset), wait on up to three counters
// (proceed when counter >= value) and add 1 to one counter when done.
// Version 2: 128-byte descriptors (8 operands, 8 tile words) and flags that fuse
// the small stages into their consumers: a GEMV normalises, merges attention
// splits or applies SiLU-mul while staging its input, and adds its output into
// the residual stream; an attention split applies the q/k head norm and RoPE to
// its own heads and appends the newest token's K/V itself.
//
// This header is included by host C++ as well (lab/rowgate_lab/megakernel/abi.py's
// layout test compiles it with g++ -x c++): the data layout below uses no
// CUDA header, and everything device-only sits under __CUDACC__.
#pragma once

namespace rowgate {
namespace task {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
static_assert(sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(u64) == 8, "integer widths");

constexpr u32 kAbiVersion = 2;
constexpr u32 kTaskBytes = 128;
constexpr u32 kGranuleBytes = 16;    // operand offsets count 16-byte granules
constexpr u32 kNoCounter = 0xffffffffu;
constexpr u16 kNoBuffer = 0xffffu;
constexpr int kOperands = 8;
constexpr int kWaits = 3;
constexpr int kTileWords = 8;
// Shared memory a fused task relies on (the validator checks a list against these):
// a GEMV with an input flag stages batch x K bf16 in kStageBytes; MERGE_IN keeps the
// split weights, batch x heads x (max_splits + 1) floats, in kScratchBytes (ATTN_MERGE
// group x (splits + 1)).
constexpr u32 kStageBytes = 96 * 1024;
constexpr u32 kScratchBytes = 16 * 1024;

// Operation codes of one decode step. Operands a..d and tile words t0..t3 per
// opcode are specified in docs/task-abi.md; lab/rowgate_lab/megakernel/abi.py holds
// the same table for the host validator.
enum Opcode : u16 {
  kNop = 0,
  kEmbed = 1,        // out[b,:] = table[ids[b],:]
  kRmsNorm = 2,      // out[r,:] = bf16(x[r,:] * rsqrt(mean(x^2)+eps) * w)
  kGemv = 3,         // y[b, rows] = bf16(x[b,:] . W[rows,:])     (fp32 accumulate)
  kRope = 4,         // per-head RMSNorm, neox rotation; optional KV-cache append
  kKvAppend = 5,     // cache[slot[b], head, :] = src[b, head, :]
  kAttnSplit = 6,    // one (seq, kv head, KV chunk): partial softmax state
  kAttnMerge = 7,    // merge a (seq, kv head)'s splits into bf16 output
  kSiluMul = 8,      // out = bf16(bf16(silu(gate)) * up)
  kResidualAdd = 9,  // x = bf16(x + y)
  kLogits = 10,      // GEMV with fp32 output (the bf16-rounded dot products)
  kPrefetchL2 = 11,  // ask L2 for bytes of a read-only buffer (no result: a hint)
  kOpcodeCount = 12,
};

enum Flag : u16 {
  kFlagNone = 0,
  kFlagAppendKv = 1u << 0,    // kRope: also write the rotated row into the cache (operand d)
  kFlagNormIn = 1u << 1,      // kGemv/kLogits: x = bf16(rmsnorm(x) * w), w = operand d
  kFlagSiluIn = 1u << 2,      // kGemv: x = bf16(bf16(silu(gate)) * up), gate = b, up = d
  kFlagMergeIn = 1u << 3,     // kGemv: x = the merged attention splits (partials = b)
  kFlagResidualOut = 1u << 4, // kGemv: y = bf16(y + bf16(x . W)) (y is the residual stream)
  kFlagRopeIn = 1u << 5,      // kAttnSplit: q/k/v rows (a), head norms + RoPE, own append
  kFlagSiluOut = 1u << 6,     // kGemv: rows of two weights, gate = a and up = e, one tile:
                              // y = bf16(bf16(silu(bf16(x . Wg))) * bf16(x . Wu))
  kFlagEvenSplits = 1u << 7,  // kAttnSplit: the sequence's context over max_splits splits,
                              // even_chunk() tokens each, not the planned chunk (t3)
};
constexpr u16 kKnownFlags = kFlagAppendKv | kFlagNormIn | kFlagSiluIn | kFlagMergeIn |
                            kFlagResidualOut | kFlagRopeIn | kFlagSiluOut | kFlagEvenSplits;

// EVEN_SPLITS: a split's tokens for a context of len: ceil(len / max_splits), at least
// kMinEvenChunk (two a warp), at most the planned chunk (max_splits * chunk covers the
// plan's longest context, so only a plan shorter than kMinEvenChunk makes this bind).
constexpr u32 kMinEvenChunk = 16;

enum Schedule : u32 {
  kStaticRoundRobin = 0,  // block i runs tasks i, i+grid, i+2*grid, ... in list order
  kDynamicQueue = 1,      // blocks claim the next index from an atomic queue head
};

// 128 bytes: one line, copied to shared memory by 8 threads (16 bytes each).
struct TaskDesc {
  u16 opcode;              //   0
  u16 flags;               //   2
  u32 signal;              //   4 counter to add 1 to when done (kNoCounter: none)
  u32 wait_counter[kWaits];//   8 counters to wait on (kNoCounter: unused slot)
  u32 wait_value[kWaits];  //  20 proceed once counter >= value
  u16 buffer[kOperands];   //  32 buffer-table slot of operand a..h (kNoBuffer: unused)
  u32 offset[kOperands];   //  48 operand start, in 16-byte granules from the buffer base
  u32 tile[kTileWords];    //  80 op-specific tile coordinates
  u32 reserved[4];         // 112 must be 0
};
static_assert(sizeof(TaskDesc) == kTaskBytes, "TaskDesc must be 128 bytes");
static_assert(alignof(TaskDesc) == 8 || alignof(TaskDesc) == 4, "TaskDesc alignment");

// Step-wide shape and metadata, one per launch (read-only in the kernel).
// `meta_buffer` is an int32 buffer holding, at the element offsets given,
// ids[batch], positions[batch], slots[batch], context_lens[batch] and the
// block tables [batch, table_width].
struct StepShape {
  u32 abi_version;         //  0 must equal kAbiVersion
  u32 batch;               //  4
  u32 hidden;              //  8
  u32 num_heads;           // 12
  u32 num_kv_heads;        // 16
  u32 head_dim;            // 20
  u32 intermediate;        // 24
  u32 vocab;               // 28
  u32 page_size;           // 32
  u32 table_width;         // 36 block-table row stride (entries)
  u32 max_splits;          // 40 split slots per (seq, kv head) in the partials buffer
  float rms_eps;           // 44
  float softmax_scale;     // 48
  u16 meta_buffer;         // 52
  u16 reserved0;           // 54
  u32 ids_at;              // 56 element offsets into the meta buffer
  u32 positions_at;        // 60
  u32 slots_at;            // 64
  u32 context_lens_at;     // 68
  u32 block_tables_at;     // 72
  u32 reserved1;           // 76
};
static_assert(sizeof(StepShape) == 80, "StepShape must be 80 bytes");

// Partial softmax state of one (seq, kv head, split, query head): acc[head_dim], m, l.
constexpr u32 partial_floats(u32 head_dim) { return head_dim + 2; }

#ifdef __CUDACC__

// Counter barriers. Release: every thread's writes of a task are ordered
// before the signal by the block barrier, then one thread publishes with a
// gpu-scope release reduction (cumulative, so it covers the other threads'
// writes). Acquire: one thread spins on a gpu-scope acquire load, then the
// block barrier orders every thread's later reads after it. This is the
// pattern of CUTLASS's generic barrier; docs/task-abi.md says why not
// cuda::atomic_ref (it would need libcu++ headers in every toolchain).
__device__ __forceinline__ u32 load_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void red_release_gpu_add(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Called by every thread of the block.
__device__ __forceinline__ void wait_counters(const TaskDesc& t, const u32* counters) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kWaits; ++i) {
      if (t.wait_counter[i] == kNoCounter) continue;
      const u32* c = counters + t.wait_counter[i];
      while (load_acquire_gpu(c) < t.wait_value[i]) {
        __nanosleep(32);
      }
    }
  }
  __syncthreads();
}

// Called by every thread of the block after the task's writes.
// `t` may live in shared memory that the next task overwrites right after the
// barrier, so the counter index is read before it.
__device__ __forceinline__ void signal_counter(const TaskDesc& t, u32* counters) {
  const u32 signal = t.signal;
  __syncthreads();
  if (threadIdx.x == 0 && signal != kNoCounter) {
    red_release_gpu_add(counters + signal, 1u);
  }
}

__device__ __forceinline__ u32 even_chunk(u32 len, u32 max_splits, u32 chunk) {
  const u32 even = (len + max_splits - 1) / max_splits;
  return even < kMinEvenChunk ? (kMinEvenChunk < chunk ? kMinEvenChunk : chunk)
                              : (even < chunk ? even : chunk);
}

// Operand address: buffer base + granules * 16.
template <typename T>
__device__ __forceinline__ T* operand(const TaskDesc& t, const u64* buffers, int i) {
  const u64 base = buffers[t.buffer[i]];
  return reinterpret_cast<T*>(base + static_cast<u64>(t.offset[i]) * kGranuleBytes);
}

#endif  // __CUDACC__

}  // namespace task
}  // namespace rowgate
