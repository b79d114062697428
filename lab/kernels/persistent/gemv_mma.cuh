// Tensor-core GEMV tiles for the persistent kernel (build variant RG_MK_MMA=1).
//
// y[b, row] = x[b, :] . W[row, :] with mma.sync.m16n8k16 (bf16 in, fp32 accumulate): 16
// weight rows are the A operand, the batch the B operand's N = 8 columns (batch < 8: the
// other columns read row 0 again and are never stored). Why: the FMA GEMV spends about
// 140 instructions per 16-byte weight chunk at batch 8 (a shared-memory load, an 8-value
// unpack and 8 FMAs per batch row) and streams 11-16 GB/s per SM; here a 16-byte chunk
// is one cp.async into the ring and half of an ldmatrix.x4 and of an HMMA, at every batch
// (docs/perf.md).
//
// A unit is one 16-row block and one of 8 K-slices (whole 32-wide K-blocks,
// [s KB / 8, (s + 1) KB / 8)); warp w computes slice w of every row block of the tile, one
// row block (a round) after the other. A lane's weight stream runs the rounds in order,
// per round its slice's K-blocks, 4 K-blocks (8 chunks) per ring group: K-block i of a
// group is chunks e = 2i (rows 0-7) and 2i + 1 (rows 8-15), lane l copying row l / 4, k
// chunk l % 4 to position swz(l) of the slot (a swizzle: the 8 rows one ldmatrix matrix
// reads lie in 8 different bank groups). The ring (kRingGroups groups in flight, the first
// before the task's counter wait) runs across rounds. ldmatrix turns the slots into A
// fragments and the staged input x[b][k] into B fragments with no moves, in natural k
// order. A round ends with the 8 slices' fp32 partials in the scratch (double-buffered) and
// one block barrier; each output is the sum of its 8 partials in slice order. A row's value
// depends on K only -- not on the tile, the warp, the schedule or the fused flags -- so
// every schedule and task list of this variant gives the same logits bit for bit (the FMA
// variant's logits differ: another summation order). Needs K % 1024 == 0 (8 slices of
// whole groups: no per-K-block tests in the loop) and the input staged in shared memory;
// op_gemv keeps the FMA path otherwise.

#pragma once

// Included by megakernel.cu inside its anonymous namespace, after the weight ring
// (kRingGroups, kGroupChunks, ring_slot), whose slots it uses.
namespace mma {

constexpr int kSlices = kWarps;                  // warp w: K-slice w
constexpr int kGroupBlocks = kGroupChunks / 2;   // K-blocks per ring group: 4
constexpr int kUnitFloats = 16 * 8;              // one m16n8 accumulator tile
constexpr u32 kPartialBytes = 2 * kSlices * kUnitFloats * 4;   // 8 KB, double-buffered
constexpr u32 kSlotChunks = 32;                  // 16-byte chunks of one ring slot (e)

__device__ __forceinline__ bool usable(const TaskDesc& t, u32 batch) {
  const u32 K = t.tile[2];
  return K % (32 * kGroupBlocks * kSlices) == 0 && batch * K * 2 <= task::kStageBytes;
}

// Position of lane l's chunk (row l / 4 of the 8, k chunk l % 4) in its slot: the chunks
// of one k chunk (l % 4 fixed) go to 8 different positions mod 8, so an ldmatrix of 8 rows
// touches all 32 banks once.
__device__ __forceinline__ u32 swz(u32 l) { return (l & ~3u) | (((l & 3u) + (l >> 3)) & 3u); }

// SILU_OUT (pair = 1): the rounds alternate the gate weight's row block r / 2 (even r) and
// the up weight's (odd r, operand e), so one thread holds an output's gate and up sums.
struct Stream {
  const uint4* w;   // the weight's first row
  const uint4* w2;  // SILU_OUT: the up weight's (else w)
  u32 row0, rows, K8, kb0, nkb, groups_per_round, rounds, pair;
  __device__ __forceinline__ Stream(const TaskDesc& t, const u64* buffers, int warp) {
    w = operand<const uint4>(t, buffers, 0);
    pair = silu_pair(t);
    w2 = up_weight(t, buffers, w);
    row0 = t.tile[0];
    rows = t.tile[1];
    K8 = t.tile[2] / 8;
    const u32 KB = t.tile[2] / 32;
    nkb = KB / kSlices;                        // a multiple of kGroupBlocks (usable)
    kb0 = static_cast<u32>(warp) * nkb;
    groups_per_round = nkb / kGroupBlocks;
    rounds = ((rows + 15) / 16) << pair;
  }
  __device__ __forceinline__ u32 groups() const { return rounds * groups_per_round; }
};

// Where a lane's next ring group comes from (group g = round r, K-blocks kb0 + 4 q ..)
// and goes to (its slot's shared address, ring slot g % kRingGroups).
template <int kDepth>
struct Cursor {
  u32 r, q, dst, slot;
  const uint4* lo;   // row r * 16 + lane / 4, k chunk 4 (kb0 + 4 q) + lane % 4 (a valid
  const uint4* hi;   // row when outside the tile: zero-filled) and row + 8
  bool lo_ok, hi_ok;
  __device__ __forceinline__ Cursor(const Stream& st, u32 g0, u32 ring_at, int lane)
      : r(g0 / st.groups_per_round), q(g0 % st.groups_per_round), dst(ring_at),
        slot(g0 % kDepth) {
    round(st, lane);
  }
  __device__ __forceinline__ void round(const Stream& st, int lane) {
    const u32 row = (r >> st.pair) * 16 + static_cast<u32>(lane) / 4;
    lo_ok = row < st.rows;
    hi_ok = row + 8 < st.rows;
    const uint4* at = ((r & st.pair) ? st.w2 : st.w) + (st.kb0 + 4 * q) * 4 +
                      static_cast<u32>(lane) % 4;
    lo = at + static_cast<u64>(st.row0 + (lo_ok ? row : 0)) * st.K8;
    hi = at + static_cast<u64>(st.row0 + (hi_ok ? row + 8 : 0)) * st.K8;
  }
  __device__ __forceinline__ void next(const Stream& st, int lane) {
    if (++slot == kDepth) slot = 0;
    if (++q < st.groups_per_round) {
      lo += 4 * kGroupBlocks;
      hi += 4 * kGroupBlocks;
      return;
    }
    q = 0;
    ++r;
    round(st, lane);
  }
};

__device__ __forceinline__ void cp16(u32 dst, const uint4* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}

constexpr u32 kSlotBytes = kSlotChunks * 16;                // one e of a group
constexpr u32 kGroupBytes = kGroupChunks * kSlotBytes;      // one ring group of a warp

// The copies of the cursor's group into its ring slot (rows past the tile zero-filled,
// no global read), then the cursor moves on; past the stream's end a group copies nothing
// but still commits, keeping the group count uniform.
template <int kDepth>
__device__ __forceinline__ void issue(const Stream& st, Cursor<kDepth>& cur, int lane) {
  if (cur.r < st.rounds) {
    const u32 base = cur.dst + cur.slot * kGroupBytes;
#pragma unroll
    for (int i = 0; i < kGroupBlocks; ++i) {
      cp16(base + (2 * i) * kSlotBytes, cur.lo + 4 * i, cur.lo_ok);
      cp16(base + (2 * i + 1) * kSlotBytes, cur.hi + 4 * i, cur.hi_ok);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  cur.next(st, lane);
}

__device__ __forceinline__ void ldsm4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void hmma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A warp's ring of kDepth groups: its slot 0 (e 0) in shared memory.
template <int kDepth>
__device__ __forceinline__ u32 warp_ring(uint4* ring, int warp) {
  return static_cast<u32>(__cvta_generic_to_shared(ring)) + warp * kDepth * kGroupBytes;
}

// The warp's ring plus the lane's swizzled chunk position.
template <int kDepth>
__device__ __forceinline__ u32 ring_at(uint4* ring, int warp, int lane) {
  return warp_ring<kDepth>(ring, warp) + swz(static_cast<u32>(lane)) * 16;
}

// Before the task's counter wait: its first kDepth - 1 groups.
template <int kDepth>
__device__ __forceinline__ void prefetch(const TaskDesc& t, const u64* buffers, uint4* ring,
                                         int warp, int lane) {
  const Stream st(t, buffers, warp);
  Cursor<kDepth> cur(st, 0, ring_at<kDepth>(ring, warp, lane), lane);
#pragma unroll
  for (int g = 0; g < kDepth - 1; ++g) issue(st, cur, lane);
}

// xs: the staged input [batch][K] bf16; store(b, row, v, gate): output (b, weight row)'s
// epilogue (gate: SILU_OUT's gate sum of the output, from the round before; else 0).
template <int kDepth, typename Store>
__device__ __forceinline__ void gemv(const TaskDesc& t, const u64* buffers, uint4* ring,
                                     float* partials, const uint4* xs, int batch, Store store) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Stream st(t, buffers, warp);
  Cursor<kDepth> cur(st, kDepth - 1, ring_at<kDepth>(ring, warp, lane), lane);  // after prefetch()'s
  // ldmatrix rows: lane i addresses matrix i / 8, row i % 8. x: k chunk i / 8 of the
  // K-block, batch row i % 8 (row 0 again past the batch). A (the ring): matrix m = i / 8
  // is rows (m & 1) * 8 .., k chunk m >> 1 (+ 2 for the K-block's second HMMA).
  const u32 xb = static_cast<u32>(lane % 8) < static_cast<u32>(batch) ? lane % 8 : 0;
  const u32 x_at = static_cast<u32>(__cvta_generic_to_shared(xs + xb * st.K8 + st.kb0 * 4 +
                                                             lane / 8));
  const u32 m = static_cast<u32>(lane) / 8, row8 = static_cast<u32>(lane) % 8;
  const u32 a_off0 = ((m & 1) * kSlotChunks + swz(4 * row8 + (m >> 1))) * 16;
  const u32 a_off1 = ((m & 1) * kSlotChunks + swz(4 * row8 + (m >> 1) + 2)) * 16;
  const u32 ring0 = warp_ring<kDepth>(ring, warp);
  u32 use = 0;  // the ring slot consumed
  float gate = 0.0f;  // SILU_OUT: this thread's output's gate sum, kept over its up round
  for (u32 r = 0; r < st.rounds; ++r) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 q = 0; q < st.groups_per_round; ++q) {
      __syncwarp();  // every lane's ldmatrix of the slot issue() refills is done (WAR)
      issue(st, cur, lane);
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kDepth - 1) : "memory");
      __syncwarp();  // ldmatrix reads chunks other lanes copied: their copies are visible
      const u32 slot = ring0 + use * kGroupBytes;
      if (++use == kDepth) use = 0;
#pragma unroll
      for (int i = 0; i < kGroupBlocks; ++i) {
        u32 x[4], a0[4], a1[4];
        ldsm4(x, x_at + (kGroupBlocks * q + i) * 64);
        ldsm4(a0, slot + 2 * i * kSlotBytes + a_off0);
        ldsm4(a1, slot + 2 * i * kSlotBytes + a_off1);
        hmma(acc, a0, x[0], x[1]);
        hmma(acc, a1, x[2], x[3]);
      }
    }
    // slice `warp`'s partial of the round: lane 4 g + t holds (row g, batch 2t, 2t + 1)
    // and (row g + 8, the same batch columns)
    float* part = partials + (r % 2) * kSlices * kUnitFloats;
    reinterpret_cast<float4*>(part + warp * kUnitFloats)[lane] =
        make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();   // one barrier a round: the next round writes the other buffer
    const u32 o = threadIdx.x, row = o % 16, b = o / 16, blk = r >> st.pair;
    if (o < kUnitFloats && static_cast<int>(b) < batch && blk * 16 + row < st.rows) {
      const u32 at = ((row % 8) * 4 + b / 2) * 4 + (row / 8) * 2 + b % 2;
      float v = part[at];
#pragma unroll
      for (int s = 1; s < kSlices; ++s) v += part[s * kUnitFloats + at];
      if (st.pair && !(r & 1)) {
        gate = v;  // thread o holds the same (row, b) in the up round that follows
      } else {
        store(static_cast<int>(b), st.row0 + blk * 16 + row, v, gate);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

#if RG_MK_STREAM
// RG_MK_STREAM: the ring as one stream across a block's tensor-core GEMV tasks. Global
// group G (counted from the launch, Feed::issued) goes to ring slot G % kDepth and is
// consumed from it; the issuer stays at most kDepth - 1 groups ahead of the consumer, so a
// slot is refilled only after every lane has read it (the __syncwarp before each issue).
// A task's groups are issued while it waits (fill) or while it runs (gemv_fed): the same
// copies into the same slots as prefetch() and gemv(), only earlier.

// Wait until at most n of this thread's committed groups are pending (n: the real groups
// issued after the one about to be read; every commit here carries one, so this is exact).
template <int kDepth>
__device__ __forceinline__ void wait_ahead(u32 n) {
  static_assert(kDepth >= 2 && kDepth <= 5, "wait_ahead spells out waits 0..4");
  const u32 k = n < static_cast<u32>(kDepth - 1) ? n : static_cast<u32>(kDepth - 1);
  if (k == 0) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  } else if (k == 1) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  } else if (k == 2) {
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  } else if (k == 3) {
    asm volatile("cp.async.wait_group 3;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 4;\n" ::: "memory");
  }
}

// Before the task's counter wait: its groups not yet issued, up to kDepth - 1 in flight.
template <int kDepth>
__device__ __forceinline__ void fill(const TaskDesc& t, u32 index, const u64* buffers,
                                     uint4* ring, Feed* feeds, int warp, int lane) {
  Feed f = feeds[warp];
  if (f.task != index) {  // none of it issued yet (and nothing in flight: issued == consumed)
    f.task = index;
    f.group = 0;
  }
  const Stream st(t, buffers, warp);
  if (f.group < st.groups() && f.issued - f.consumed < static_cast<u32>(kDepth - 1)) {
    Cursor<kDepth> cur(st, f.group, ring_at<kDepth>(ring, warp, lane), lane);
    cur.slot = f.issued % kDepth;
    do {
      issue(st, cur, lane);
      ++f.group;
      ++f.issued;
    } while (f.group < st.groups() && f.issued - f.consumed < static_cast<u32>(kDepth - 1));
  }
  __syncwarp();
  if (lane == 0) feeds[warp] = f;
  __syncwarp();
}

// gemv() with the ring's state carried in `feeds`: each step issues the task's next group
// not yet in flight. Its consumer lines (the fragment addresses, the HMMAs of a group, a
// round's partials and sums) repeat gemv()'s on purpose: shared helpers reschedule both
// builds' SASS (nvcc 13.0.88, checked), and this build is the sealed one, byte for byte;
// they are factored out with the next change that re-seals the kernel anyway.
template <int kDepth, typename Store>
__device__ __forceinline__ void gemv_fed(const TaskDesc& t, const u64* buffers, uint4* ring,
                                         float* partials, const uint4* xs, int batch,
                                         Feed* feeds, Store store) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Stream st(t, buffers, warp);
  Feed f = feeds[warp];  // fill() left f.task = this task
  Cursor<kDepth> icur(st, f.group, ring_at<kDepth>(ring, warp, lane), lane);
  icur.slot = f.issued % kDepth;
  const u32 xb = static_cast<u32>(lane % 8) < static_cast<u32>(batch) ? lane % 8 : 0;
  const u32 x_at = static_cast<u32>(__cvta_generic_to_shared(xs + xb * st.K8 + st.kb0 * 4 +
                                                             lane / 8));
  const u32 m = static_cast<u32>(lane) / 8, row8 = static_cast<u32>(lane) % 8;
  const u32 a_off0 = ((m & 1) * kSlotChunks + swz(4 * row8 + (m >> 1))) * 16;
  const u32 a_off1 = ((m & 1) * kSlotChunks + swz(4 * row8 + (m >> 1) + 2)) * 16;
  const u32 ring0 = warp_ring<kDepth>(ring, warp);
  float gate = 0.0f;
  for (u32 r = 0; r < st.rounds; ++r) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 q = 0; q < st.groups_per_round; ++q) {
      __syncwarp();  // every lane's ldmatrix of the slot the issue refills is done (WAR)
      if (f.issued - f.consumed < static_cast<u32>(kDepth) && f.group < st.groups()) {
        issue(st, icur, lane);
        ++f.group;
        ++f.issued;
      }
      wait_ahead<kDepth>(f.issued - f.consumed - 1);
      __syncwarp();  // ldmatrix reads chunks other lanes copied: their copies are visible
      const u32 slot = ring0 + (f.consumed % kDepth) * kGroupBytes;
      ++f.consumed;
#pragma unroll
      for (int i = 0; i < kGroupBlocks; ++i) {
        u32 x[4], a0[4], a1[4];
        ldsm4(x, x_at + (kGroupBlocks * q + i) * 64);
        ldsm4(a0, slot + 2 * i * kSlotBytes + a_off0);
        ldsm4(a1, slot + 2 * i * kSlotBytes + a_off1);
        hmma(acc, a0, x[0], x[1]);
        hmma(acc, a1, x[2], x[3]);
      }
    }
    float* part = partials + (r % 2) * kSlices * kUnitFloats;
    reinterpret_cast<float4*>(part + warp * kUnitFloats)[lane] =
        make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    const u32 o = threadIdx.x, row = o % 16, b = o / 16, blk = r >> st.pair;
    if (o < kUnitFloats && static_cast<int>(b) < batch && blk * 16 + row < st.rows) {
      const u32 at = ((row % 8) * 4 + b / 2) * 4 + (row / 8) * 2 + b % 2;
      float v = part[at];
#pragma unroll
      for (int s = 1; s < kSlices; ++s) v += part[s * kUnitFloats + at];
      if (st.pair && !(r & 1)) {
        gate = v;
      } else {
        store(static_cast<int>(b), st.row0 + blk * 16 + row, v, gate);
      }
    }
  }
  __syncwarp();
  if (lane == 0) feeds[warp] = f;
  __syncwarp();
}
#endif

}  // namespace mma
