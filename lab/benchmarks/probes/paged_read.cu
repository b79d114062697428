// The read ceiling of the E5M2 D128 paged decode's access pattern (benchmarks/deep_tma.py):
// each CTA of a split-KV grid reads exactly the bytes a split_kv CTA reads (its chunk's K
// rows, then its V rows, through the block table) with 16-byte streaming loads, eight in
// flight a thread, and no arithmetic but an XOR that keeps the loads. `order` 1 runs the
// grid heads fastest ((Hkv, splits, B) where split_kv launches (splits, Hkv, B)); `flat`
// reads the same number of bytes a CTA from one contiguous slice (no block table).
#include <cstdint>

extern "C" __global__ void __launch_bounds__(256) paged_read(
    const uint4* __restrict__ k, const uint4* __restrict__ v, const int* __restrict__ block_table,
    int bt_stride, int hkv, int page_shift, int chunk, int order, int flat,
    unsigned int* sink) {
  const int x = order ? blockIdx.y : blockIdx.x;  // the split
  const int h = order ? blockIdx.x : blockIdx.y;
  const int b = blockIdx.z;
  const int splits = order ? gridDim.y : gridDim.x;
  const int start = x * chunk;
  const int pieces = chunk * 8;  // 16-byte pieces of 128-byte rows
  const int* bt = block_table + (size_t)b * bt_stride;
  const size_t slice = (((size_t)b * hkv + h) * splits + x) * (size_t)chunk;
  uint4 acc = make_uint4(0u, 0u, 0u, 0u);
  for (int t = 0; t < 2; ++t) {
    const uint4* base = t ? v : k;
#pragma unroll 8
    for (int i = threadIdx.x; i < pieces; i += 256) {
      const int tok = start + (i >> 3);
      size_t row;
      if (flat) {
        row = slice + (i >> 3);
      } else {
        const int page = __ldg(bt + (tok >> page_shift));
        row = (((size_t)page * hkv + h) << page_shift) + (tok & ((1 << page_shift) - 1));
      }
      const uint4 w = __ldcs(base + row * 8 + (i & 7));
      acc.x ^= w.x; acc.y ^= w.y; acc.z ^= w.z; acc.w ^= w.w;
    }
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) atomicAdd(sink, 1u);  // keeps the loads
}

// The same bytes read by bulk copies alone (one thread a CTA, the copies' data never read):
// the DMA rate of the access pattern, for token rows of `row` bytes (128: E5M2 D128, 256:
// bf16 D128). Each CTA streams its segments through `kSlots`
// shared-memory slots of `seg` bytes, each completing on its mbarrier. mode 0: split_kv's
// segments (grid (splits, Hkv, B): for each page of the chunk, the head's page run, K then
// V); mode 1: whole pages, every head's run at once (grid (splits, 1, B)); mode 2: one
// contiguous slice of the same size a CTA (grid (splits, Hkv, B)).
constexpr int kSlots = 8;

__device__ __forceinline__ uint32_t saddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}

extern "C" __global__ void __launch_bounds__(32) paged_bulk_read(
    const uint8_t* __restrict__ k, const uint8_t* __restrict__ v,
    const int* __restrict__ block_table, int bt_stride, int hkv, int page_shift, int chunk,
    int seg, int mode, int row) {
  extern __shared__ __align__(128) uint8_t slots[];
  __shared__ __align__(8) unsigned long long bars[kSlots];
  if (threadIdx.x != 0) return;
  const int x = blockIdx.x, h = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
  const int page = 1 << page_shift;
  const size_t run = (size_t)page * row;                 // a head's page run
  const size_t unit = mode == 1 ? run * hkv : run;       // bytes a page a CTA
  const int pages = chunk >> page_shift;
  const int per_page = (int)(unit / seg);
  const int total = 2 * pages * per_page;
  for (int i = 0; i < kSlots; ++i)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bars[i])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const size_t slice = (((size_t)b * gridDim.y + h) * splits + x) * (size_t)pages * unit;
  for (int s = 0; s < total + kSlots; ++s) {
    const int slot = s % kSlots;
    const uint32_t bar = saddr(&bars[slot]);
    if (s >= kSlots) bar_wait(bar, ((s / kSlots) - 1) & 1);
    if (s >= total) continue;
    const int t = s / (pages * per_page), r = s % (pages * per_page);
    const int pg = r / per_page, piece = r % per_page;
    size_t off;
    if (mode == 2) {
      off = slice + (size_t)r * seg;
    } else {
      const int phys = __ldg(block_table + (size_t)b * bt_stride + (x * chunk >> page_shift) + pg);
      off = (size_t)phys * run * hkv + (mode == 1 ? 0 : (size_t)h * run) + (size_t)piece * seg;
    }
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(seg)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(saddr(slots + slot * seg)), "l"((t ? v : k) + off), "r"(seg), "r"(bar)
        : "memory");
  }
}
