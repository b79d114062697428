// Split-KV paged decode attention (one query token per sequence), GQA, KV cache
// in bf16 or FP8 E5M2 with a per-tensor scale.
//
// Layout (all contiguous):
//   q, out        [B, Hkv*G, D] bf16           (query head i reads KV head i / G)
//   k/v cache     [pages, Hkv, page_size, D]   bf16 or e5m2 bytes
//   block_table   [B, bt_stride] int32          logical page -> physical page
//   seq_lens      [B] int32 (>= 1; <= gridDim.x * chunk)
//   ws_acc        [B, Hkv, gridDim.x, G, D] f32  unnormalised partial outputs
//   ws_ml         [B, Hkv, gridDim.x, 2, G] f32  partial max (log2 domain) and sum
//   counters      [B * Hkv] int32, zero on entry; left zero on exit
//
// Grid (splits, Hkv, B), 256 threads. One CTA owns `chunk` tokens of one
// (sequence, KV head) and all G query heads of the group. Phases, in the order
// the SM70 row names them:
//   A  K load + conversion, QK (per-warp 16-token tiles), score publication to smem
//   -- __syncthreads
//   B  softmax over the chunk (max, exp2, sum), per head
//   -- __syncthreads
//   C  V load + conversion, PV accumulate
//   -- reduction over lanes and warps, partial written; the last CTA of the
//      (sequence, head) to finish merges the splits in split order.
// Every sum is taken in a fixed order that does not depend on which variant
// runs or which CTA finishes last, so the baseline (PIPE=false) and the
// software-pipelined candidate (PIPE=true) are bitwise equal by construction.
// The candidate differs only in when loads are issued: for E5M2 the next
// tile's K (V) rows stream through a cp.async shared-memory ring while the
// current tile is converted and multiplied, the first V tiles are requested
// before the softmax barrier (with the K rows, when a warp has one tile); for
// bf16 the next tile is prefetched into registers.
//
// Two math paths, one schedule: sm_80+ uses mma.sync (m16n8k16, f16 operands
// for E5M2, bf16 for bf16, f32 accumulators); sm_70/75 use f32 FMAs with
// shuffle reduce-scatter. E5M2 -> f16 is exact (a byte permute), so QK on the
// tensor cores sees exactly the cached values; P is rounded to the operand type.
//
// RG_PHASE selects a timing variant for phase attribution (never for results):
//   0 full  1 no K load  2 no V load  3 QK twice  4 PV twice  5 conversion twice
//   6 no __syncthreads between phases  7 no score publication (smem writes)
// No CUDA toolkit headers beyond what nvcc includes itself (the wheel toolchains
// carry no CCCL): bf16 travels as raw bits, conversions are PTX (rowgate/dtypes.cuh).
#include "rowgate/dtypes.cuh"

#ifndef RG_PHASE
#define RG_PHASE 0
#endif
// RG_UNIT keeps a build to one kernels.toml unit's entry points and their code: the
// baselines and one candidate family (1 the ring `_pipe`, 2 bulk, 3 deep), so that the
// three units of this file do not each seal every entry point (a sealed bundle held three
// identical cubins, 2026-12-04); unset (0), every entry point (the benchmarks build so).
#ifndef RG_UNIT
#define RG_UNIT 0
#endif

namespace {

using rowgate::bf16_bits;
using rowgate::u32;
using rowgate::u8;
using uint8_t = rowgate::u8;
using uint32_t = rowgate::u32;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 16;  // tokens per warp tile; divides every supported page size

struct E5M2 { static constexpr int kBytes = 1; };
struct BF16 { static constexpr int kBytes = 2; };
static_assert(E5M2::kBytes == 1 && BF16::kBytes == 2, "cache element sizes");

template <class KV, int D, int G>
struct Cfg {
  // 16-byte loads where the accumulators fit in registers, 8-byte ones for G = 8 FP8.
  static constexpr int VEC = (KV::kBytes == 1 && G <= 4) ? 16 : 8;   // elements per lane
  static constexpr int WORDS = VEC * KV::kBytes / 4;
  static constexpr int LPT = D / VEC;          // lanes per token row
  static constexpr int GROUPS = 32 / LPT;      // tokens per warp load instruction
  static constexpr int U = kTile / GROUPS;     // loads per lane per tile
  static constexpr int NV = U * G;             // partial dots per lane per tile
  static constexpr int R = NV / LPT;           // scores per lane after reduce-scatter
  static_assert(NV % LPT == 0 && R >= 1, "reduce-scatter needs NV a multiple of LPT");
  static_assert(kTile % GROUPS == 0, "tile must cover whole load instructions");
};

template <int W> struct Raw { uint32_t w[W]; };

// Keeps the compiler from merging repeated work in the phase-attribution variants.
[[maybe_unused]] __device__ __forceinline__ void opaque(float& x) { asm volatile("" : "+f"(x)); }
[[maybe_unused]] __device__ __forceinline__ void opaque(uint32_t& x) { asm volatile("" : "+r"(x)); }

template <int W>
__device__ __forceinline__ void load_raw(Raw<W>& r, const uint8_t* p) {
  if constexpr (W == 4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    r.w[0] = v.x; r.w[1] = v.y; r.w[2] = v.z; r.w[3] = v.w;
  } else {
    static_assert(W == 2, "8- or 16-byte loads only");
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    r.w[0] = v.x; r.w[1] = v.y;
  }
}

[[maybe_unused]] __device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h2) {
  return make_float2(rowgate::half_bits_to_float(static_cast<rowgate::u16>(h2 & 0xffffu)),
                     rowgate::half_bits_to_float(static_cast<rowgate::u16>(h2 >> 16)));
}

// E5M2 is the top byte of an IEEE half: a byte permute makes two halves at once.
template <class KV, int VEC>
__device__ __forceinline__ void to_float(const Raw<VEC * KV::kBytes / 4>& r, float (&f)[VEC]) {
  constexpr int W = VEC * KV::kBytes / 4;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    uint32_t w = r.w[i];
#if RG_PHASE == 5
    opaque(w);
#endif
    if constexpr (KV::kBytes == 1) {
      const float2 a = half2_bits_to_float2(__byte_perm(w, 0u, 0x1404u));
      const float2 b = half2_bits_to_float2(__byte_perm(w, 0u, 0x3424u));
      f[4 * i] = a.x; f[4 * i + 1] = a.y; f[4 * i + 2] = b.x; f[4 * i + 3] = b.y;
    } else {
      f[2 * i] = __uint_as_float(w << 16);
      f[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
    }
  }
#if RG_PHASE == 5
  // conversion twice: the second result is folded in so it cannot be dropped
#pragma unroll
  for (int i = 0; i < W; ++i) {
    uint32_t w = r.w[i];
    opaque(w);
    if constexpr (KV::kBytes == 1) {
      const float2 a = half2_bits_to_float2(__byte_perm(w, 0u, 0x1404u));
      const float2 b = half2_bits_to_float2(__byte_perm(w, 0u, 0x3424u));
      f[4 * i] = fminf(f[4 * i], a.x); f[4 * i + 1] = fminf(f[4 * i + 1], a.y);
      f[4 * i + 2] = fminf(f[4 * i + 2], b.x); f[4 * i + 3] = fminf(f[4 * i + 3], b.y);
    } else {
      f[2 * i] = fminf(f[2 * i], __uint_as_float(w << 16));
      f[2 * i + 1] = fminf(f[2 * i + 1], __uint_as_float(w & 0xffff0000u));
    }
  }
#endif
}

// Reduce N partial sums across LPT lanes, halving the values at each step:
// afterwards lane l holds the sums of indices (l % LPT) * (N / LPT) + i.
template <int N, int OFF>
struct ReduceScatter {
  __device__ __forceinline__ static void run(float* v, int lane) {
    const bool upper = lane & OFF;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? v[i] : v[i + N / 2];
      const float keep = upper ? v[i + N / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
    }
    ReduceScatter<N / 2, OFF / 2>::run(v, lane);
  }
};
template <int N>
struct ReduceScatter<N, 0> {
  __device__ __forceinline__ static void run(float*, int) {}
};

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct Params {
  const bf16_bits* q;
  const uint8_t* k;
  const uint8_t* v;
  const int* block_table;
  const int* seq_lens;
  bf16_bits* out;
  float* ws_acc;
  float* ws_ml;
  int* counters;
  int bt_stride, num_kv_heads, page_shift, chunk;
  float qk_scale_log2, v_scale;
};

// Where one tile's rows start for this lane (a tile never crosses a page).
template <class KV, int D, int VEC>
__device__ __forceinline__ const uint8_t* tile_base(const Params& p, const uint8_t* cache,
                                                    int b, int h, int tok0, int sub) {
  const int page = __ldg(p.block_table + (size_t)b * p.bt_stride + (tok0 >> p.page_shift));
  const int in_page = tok0 & ((1 << p.page_shift) - 1);
  const size_t row = (((size_t)page * p.num_kv_heads + h) << p.page_shift) + in_page;
  return cache + (row * D + (size_t)sub * VEC) * KV::kBytes;
}

template <class KV, int D, int G>
__device__ __forceinline__ void load_tile(Raw<Cfg<KV, D, G>::WORDS> (&r)[Cfg<KV, D, G>::U],
                                          const uint8_t* base, int valid, int grp) {
  using C = Cfg<KV, D, G>;
#pragma unroll
  for (int u = 0; u < C::U; ++u) {
    const int tt = u * C::GROUPS + grp;
    if (tt < valid) {
      load_raw(r[u], base + (size_t)tt * D * KV::kBytes);
    } else {
#pragma unroll
      for (int i = 0; i < C::WORDS; ++i) r[u].w[i] = 0u;
    }
  }
}

// Stand-in for a skipped load: data that depends on the tile, so the math stays.
template <class KV, int D, int G>
__device__ __forceinline__ void fake_tile(Raw<Cfg<KV, D, G>::WORDS> (&r)[Cfg<KV, D, G>::U],
                                          int tok0, int lane) {
  using C = Cfg<KV, D, G>;
#pragma unroll
  for (int u = 0; u < C::U; ++u)
#pragma unroll
    for (int i = 0; i < C::WORDS; ++i)
      r[u].w[i] = (KV::kBytes == 1 ? 0x38383838u : 0x3f803f80u) ^ ((tok0 + u + lane + i) & 0x03030303u);
}

template <class KV, int D, int G>
__device__ __forceinline__ void qk_tile(const float (&qf)[G][Cfg<KV, D, G>::VEC],
                                        const Raw<Cfg<KV, D, G>::WORDS> (&kr)[Cfg<KV, D, G>::U],
                                        float (&part)[Cfg<KV, D, G>::NV]) {
  using C = Cfg<KV, D, G>;
#pragma unroll
  for (int u = 0; u < C::U; ++u) {
    float kf[C::VEC];
    to_float<KV, C::VEC>(kr[u], kf);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) acc = fmaf(qf[g][j], kf[j], acc);
#if RG_PHASE == 3
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) { float k2 = kf[j]; opaque(k2); acc = fmaf(qf[g][j], k2, acc); }
#endif
      part[u * G + g] = acc;
    }
  }
}

template <class KV, int D, int G>
__device__ __forceinline__ void pv_tile(const float* scores, int t, int valid, int grp,
                                        const Raw<Cfg<KV, D, G>::WORDS> (&vr)[Cfg<KV, D, G>::U],
                                        float (&acc)[G][Cfg<KV, D, G>::VEC]) {
  using C = Cfg<KV, D, G>;
#pragma unroll
  for (int u = 0; u < C::U; ++u) {
    const int tt = u * C::GROUPS + grp;
    float pr[G];
    if (tt < valid) {
      const float4* s4 = reinterpret_cast<const float4*>(scores + (size_t)(t * kTile + tt) * G);
#pragma unroll
      for (int g4 = 0; g4 < G / 4; ++g4) {
        const float4 x = s4[g4];
        pr[4 * g4] = x.x; pr[4 * g4 + 1] = x.y; pr[4 * g4 + 2] = x.z; pr[4 * g4 + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int g = 0; g < G; ++g) pr[g] = 0.f;
    }
    float vf[C::VEC];
    to_float<KV, C::VEC>(vr[u], vf);
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) acc[g][j] = fmaf(pr[g], vf[j], acc[g][j]);
#if RG_PHASE == 4
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) { float v2 = vf[j]; opaque(v2); acc[g][j] = fmaf(pr[g], v2, acc[g][j]); }
#endif
  }
}

__device__ __forceinline__ void phase_barrier() {
#if RG_PHASE != 6
  __syncthreads();
#endif
}

struct Ctx {  // what every phase of one CTA knows
  int b, h, hq, start, n_tok, n_tiles, tid, warp, lane;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
// ============================================================ FMA path (sm_70/75)
// One lane group of LPT lanes per token row; partial dots reduce-scattered.

template <class KV, int D, int G, bool PIPE>
__device__ __forceinline__ void phase_a(const Params& p, const Ctx& c, float* scores, uint8_t*) {
  using C = Cfg<KV, D, G>;
  const int sub = c.lane % C::LPT, grp = c.lane / C::LPT;
  float qf[G][C::VEC];
  const bf16_bits* qb = p.q + ((size_t)c.b * c.hq + c.h * G) * D + sub * C::VEC;
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int k = 0; k < C::VEC / 8; ++k) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(qb + (size_t)g * D) + k);
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qf[g][8 * k + 2 * i] = __uint_as_float(w[i] << 16) * p.qk_scale_log2;
        qf[g][8 * k + 2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u) * p.qk_scale_log2;
      }
    }
  }
  Raw<C::WORDS> kr[C::U], kn[C::U];
  int t = c.warp;
  if (PIPE && t < c.n_tiles)
    load_tile<KV, D, G>(kr, tile_base<KV, D, C::VEC>(p, p.k, c.b, c.h, c.start + t * kTile, sub),
                        min(kTile, c.n_tok - t * kTile), grp);
  for (; t < c.n_tiles; t += kWarps) {
    const int tok0 = c.start + t * kTile;
    const int valid = min(kTile, c.n_tok - t * kTile);
#if RG_PHASE == 1
    fake_tile<KV, D, G>(kr, tok0, c.lane);
#else
    if (PIPE) {
      const int tn = t + kWarps;
      if (tn < c.n_tiles)
        load_tile<KV, D, G>(kn, tile_base<KV, D, C::VEC>(p, p.k, c.b, c.h, c.start + tn * kTile, sub),
                            min(kTile, c.n_tok - tn * kTile), grp);
    } else {
      load_tile<KV, D, G>(kr, tile_base<KV, D, C::VEC>(p, p.k, c.b, c.h, tok0, sub), valid, grp);
    }
#endif
    float part[C::NV];
    qk_tile<KV, D, G>(qf, kr, part);
    ReduceScatter<C::NV, C::LPT / 2>::run(part, c.lane);
#pragma unroll
    for (int i = 0; i < C::R; ++i) {
      const int idx = sub * C::R + i, u = idx / G, g = idx % G;
      const int tt = u * C::GROUPS + grp;
#if RG_PHASE == 7
      if (tt < valid && part[i] == 12345.f)  // practically never: keeps the math alive
#else
      if (tt < valid)
#endif
        scores[(size_t)(t * kTile + tt) * G + g] = part[i];
    }
    if (PIPE) {
#pragma unroll
      for (int u = 0; u < C::U; ++u) kr[u] = kn[u];
    }
  }
}

template <class KV, int D, int G, bool PIPE>
struct PhaseC {
  using C = Cfg<KV, D, G>;
  Raw<C::WORDS> vr[C::U], vn[C::U];

  // The candidate starts its first V tile before the softmax barrier.
  __device__ __forceinline__ void prefetch(const Params& p, const Ctx& c, uint8_t*) {
    if (PIPE && c.warp < c.n_tiles && RG_PHASE != 2)
      load_tile<KV, D, G>(vr, tile_base<KV, D, C::VEC>(p, p.v, c.b, c.h, c.start + c.warp * kTile,
                                                        c.lane % C::LPT),
                          min(kTile, c.n_tok - c.warp * kTile), c.lane / C::LPT);
  }

  // PV over the warp's tiles, then the per-warp result into red[warp][G][D].
  __device__ __forceinline__ void run(const Params& p, const Ctx& c, float* scores, uint8_t*) {
    const int sub = c.lane % C::LPT, grp = c.lane / C::LPT;
    float acc[G][C::VEC];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < C::VEC; ++j) acc[g][j] = 0.f;
    for (int t = c.warp; t < c.n_tiles; t += kWarps) {
      const int tok0 = c.start + t * kTile;
      const int valid = min(kTile, c.n_tok - t * kTile);
#if RG_PHASE == 2
      fake_tile<KV, D, G>(vr, tok0, c.lane);
#else
      if (PIPE) {
        const int tn = t + kWarps;
        if (tn < c.n_tiles)
          load_tile<KV, D, G>(vn, tile_base<KV, D, C::VEC>(p, p.v, c.b, c.h, c.start + tn * kTile, sub),
                              min(kTile, c.n_tok - tn * kTile), grp);
      } else {
        load_tile<KV, D, G>(vr, tile_base<KV, D, C::VEC>(p, p.v, c.b, c.h, tok0, sub), valid, grp);
      }
#endif
      pv_tile<KV, D, G>(scores, t, valid, grp, vr, acc);
      if (PIPE) {
#pragma unroll
        for (int u = 0; u < C::U; ++u) vr[u] = vn[u];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < C::VEC; ++j)
#pragma unroll
        for (int o = C::LPT; o < 32; o <<= 1) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], o);
    __syncthreads();  // every warp is done reading scores: the buffer is reused
    float* red = scores;
    if (grp == 0) {
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int j = 0; j < C::VEC; ++j) red[(c.warp * G + g) * D + sub * C::VEC + j] = acc[g][j];
    }
  }
};

#else
// ============================================================ MMA path (sm_80+)
// mma.sync m16n8k16 with f32 accumulators. QK computes S^T = Q K^T (rows: the
// G query heads, padded to 16; columns: 8 tokens); its accumulator layout is
// the B-operand layout PV needs, so P goes through shared memory only as the
// softmax's publication. Dimensions are permuted consistently inside each
// product so that every lane's operands are contiguous in memory (16-byte
// loads, no shuffles): a dot product does not depend on the order of its terms'
// labels, and the output's permutation is undone when it is written.

template <class KV, int D>
struct Mma {
  static constexpr int SPAN = D / 4;                // K elements per lane per token
  static constexpr int HALF = SPAN / 2;             // two contiguous halves
  static constexpr int HB = HALF * KV::kBytes;      // bytes per half
  static constexpr int KW = SPAN * KV::kBytes / 4;  // K words per lane per token
  static constexpr int VD = D / 8;                  // V dims per lane per token
  static constexpr int VW = VD * KV::kBytes / 4;    // V words per lane per token
  static constexpr int STEPS = D / 16;              // k16 steps of QK = m16 tiles of PV
};

template <int N>
__device__ __forceinline__ void load_words(uint32_t* w, const uint8_t* ptr) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(ptr) + i);
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  } else {
    static_assert(N == 2, "8-byte or multiple-of-16-byte pieces");
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(ptr));
    w[0] = v.x; w[1] = v.y;
  }
}

template <class KV>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (KV::kBytes == 1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t prmt(uint32_t x, uint32_t y, uint32_t s) {
  return __byte_perm(x, y, s);
}

// Two floats as the MMA's 16-bit pair (low = first).
template <class KV>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;  // cvt packs its first source into the upper half
  if constexpr (KV::kBytes == 1)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ const uint8_t* row_ptr(const Params& p, const uint8_t* cache, int b,
                                                  int h, int tok0, int kbytes, int dim) {
  const int page = __ldg(p.block_table + (size_t)b * p.bt_stride + (tok0 >> p.page_shift));
  const int in_page = tok0 & ((1 << p.page_shift) - 1);
  const size_t row = (((size_t)page * p.num_kv_heads + h) << p.page_shift) + in_page;
  return cache + row * dim * kbytes;
}

template <int N>
__device__ __forceinline__ void fake_words(uint32_t* w, int tok0, int lane, uint32_t base) {
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = base ^ ((tok0 + lane + i) & 0x03030303u);
}

// ---- the candidate's E5M2 staging: cp.async into a per-lane shared-memory ring.
// Each lane reads back only the bytes it copied itself, so completion needs no
// barrier (cp.async.wait_group orders a thread's own copies), and in-flight
// loads cost no registers: the occupancy of the baseline is kept.
constexpr int kStages = 2;

// A warp with a single tile requests its V rows together with its K rows, into
// the ring's last stage (which its K loop then never writes).
__device__ __forceinline__ bool early_v(int n_tiles) { return n_tiles <= kWarps; }

// Ring size in bytes: kWarps * kStages * 4 pieces * 32 lanes * PB (the launcher
// adds it to the dynamic shared memory of the E5M2 candidate).
template <class KV, int D>
struct Ring {
  static constexpr int PB = D / 8 * KV::kBytes;  // bytes per piece: a K half-span or a V slice
};

__device__ __forceinline__ uint8_t* ring_slot(uint8_t* ring, int warp, int stage, int piece,
                                              int lane, int pb) {
  return ring + ((((warp * kStages + stage) * 4 + piece) * 32) + lane) * pb;
}

template <int PB>
__device__ __forceinline__ void cp_async(uint8_t* dst, const uint8_t* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int n = valid ? PB : 0;  // 0: zero-fill, the source is not read
  // .ca: through L1, so the two 16-byte halves of a 32-byte sector cost one L2 read
  if constexpr (PB == 16)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <int PB>
__device__ __forceinline__ void lds_words(uint32_t* w, const uint8_t* src) {
  if constexpr (PB == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    w[0] = v.x; w[1] = v.y;
  }
}

// Copies of one K tile into ring stage `stage` (an empty group past the end).
template <class KV, int D>
__device__ __forceinline__ void issue_k(const Params& p, const Ctx& c, uint8_t* ring, int t,
                                        int stage) {
  using R = Ring<KV, D>;
  if (t < c.n_tiles) {
    const int grp = c.lane >> 2, tig = c.lane & 3;
    const uint8_t* tile = row_ptr(p, p.k, c.b, c.h, c.start + t * kTile, KV::kBytes, D);
    const int valid = min(kTile, c.n_tok - t * kTile);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int tt = nt * 8 + grp;
      const bool ok = tt < valid;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint8_t* src = tile + ((size_t)tt * D + half * (D / 2)) * KV::kBytes + tig * R::PB;
        cp_async<R::PB>(ring_slot(ring, c.warp, stage, nt * 2 + half, c.lane, R::PB),
                        ok ? src : tile, ok);
      }
    }
  }
  cp_commit();
}

template <class KV, int D>
__device__ __forceinline__ void issue_v(const Params& p, const Ctx& c, uint8_t* ring, int t,
                                        int stage) {
  using R = Ring<KV, D>;
  if (t < c.n_tiles) {
    const int grp = c.lane >> 2, tig = c.lane & 3;
    const uint8_t* tile = row_ptr(p, p.v, c.b, c.h, c.start + t * kTile, KV::kBytes, D);
    const int valid = min(kTile, c.n_tok - t * kTile);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tt = 2 * tig + (r & 1) + (r >> 1) * 8;
      const bool ok = tt < valid;
      const uint8_t* src = tile + ((size_t)tt * D + grp * (D / 8)) * KV::kBytes;
      cp_async<R::PB>(ring_slot(ring, c.warp, stage, r, c.lane, R::PB), ok ? src : tile, ok);
    }
  }
  cp_commit();
}

// K rows of one 16-token tile: n-tile nt's token nt*8 + grp, this lane's span.
template <class KV, int D>
__device__ __forceinline__ void load_k(uint32_t (&kw)[2][Mma<KV, D>::KW], const uint8_t* tile,
                                       int valid, int grp, int tig) {
  using M = Mma<KV, D>;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int tt = nt * 8 + grp;
    if (tt < valid) {
      const uint8_t* row = tile + (size_t)tt * D * KV::kBytes;
      load_words<M::KW / 2>(kw[nt], row + tig * M::HB);
      load_words<M::KW / 2>(kw[nt] + M::KW / 2, row + (D / 2) * KV::kBytes + tig * M::HB);
    } else {
#pragma unroll
      for (int i = 0; i < M::KW; ++i) kw[nt][i] = 0u;
    }
  }
}

// V rows of one tile: tokens 2tig, 2tig+1, 2tig+8, 2tig+9; dims grp*VD .. +VD.
template <class KV, int D>
__device__ __forceinline__ void load_v(uint32_t (&vw)[4][Mma<KV, D>::VW], const uint8_t* tile,
                                       int valid, int grp, int tig) {
  using M = Mma<KV, D>;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int tt = 2 * tig + (r & 1) + (r >> 1) * 8;
    if (tt < valid) {
      load_words<M::VW>(vw[r], tile + ((size_t)tt * D + grp * M::VD) * KV::kBytes);
    } else {
#pragma unroll
      for (int i = 0; i < M::VW; ++i) vw[r][i] = 0u;
    }
  }
}

template <class KV, int D, int G, bool PIPE>
__device__ __forceinline__ void phase_a(const Params& p, const Ctx& c, float* scores,
                                        uint8_t* ring) {
  using M = Mma<KV, D>;
  constexpr bool kAsync = PIPE && KV::kBytes == 1;  // E5M2 candidate: cp.async ring
  const int grp = c.lane >> 2, tig = c.lane & 3;
  // Q as the A operand: row grp = head grp (rows >= G and 8..15 are zero).
  uint32_t qa[M::STEPS][2];
  if (grp < G) {
    const uint8_t* qh = reinterpret_cast<const uint8_t*>(
        p.q + ((size_t)c.b * c.hq + c.h * G + grp) * D);
    uint32_t qw[M::SPAN / 2];  // bf16 pairs of this lane's span
    load_words<M::SPAN / 4>(qw, qh + tig * M::HALF * 2);
    load_words<M::SPAN / 4>(qw + M::SPAN / 4, qh + (D / 2 + tig * M::HALF) * 2);
#pragma unroll
    for (int s = 0; s < M::STEPS; ++s) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t w = qw[2 * s + e];
        if constexpr (KV::kBytes == 1)
          qa[s][e] = pack2<KV>(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
        else
          qa[s][e] = w;
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < M::STEPS; ++s) qa[s][0] = qa[s][1] = 0u;
  }
  uint32_t kr[2][M::KW], kn[2][M::KW];
  int t = c.warp;
  if (kAsync) {
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) issue_k<KV, D>(p, c, ring, t + st * kWarps, st);
    if (early_v(c.n_tiles) && RG_PHASE != 2) issue_v<KV, D>(p, c, ring, t, kStages - 1);
  } else if (PIPE && t < c.n_tiles)
    load_k<KV, D>(kr, row_ptr(p, p.k, c.b, c.h, c.start + t * kTile, KV::kBytes, D),
                  min(kTile, c.n_tok - t * kTile), grp, tig);
  for (int i = 0; t < c.n_tiles; t += kWarps, ++i) {
    const int tok0 = c.start + t * kTile;
    const int valid = min(kTile, c.n_tok - t * kTile);
#if RG_PHASE == 1
    fake_words<M::KW>(kr[0], tok0, c.lane, KV::kBytes == 1 ? 0x38383838u : 0x3f803f80u);
    fake_words<M::KW>(kr[1], tok0 + 8, c.lane, KV::kBytes == 1 ? 0x38383838u : 0x3f803f80u);
#else
    if (kAsync) {  // this tile's K is read from the ring per n-tile, below
      issue_k<KV, D>(p, c, ring, t + (kStages - 1) * kWarps, (i + kStages - 1) % kStages);
      cp_wait<kStages - 1>();
    } else if (PIPE) {
      const int tn = t + kWarps;
      if (tn < c.n_tiles)
        load_k<KV, D>(kn, row_ptr(p, p.k, c.b, c.h, c.start + tn * kTile, KV::kBytes, D),
                      min(kTile, c.n_tok - tn * kTile), grp, tig);
    } else {
      load_k<KV, D>(kr, row_ptr(p, p.k, c.b, c.h, tok0, KV::kBytes, D), valid, grp, tig);
    }
#endif
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#if RG_PHASE != 1
      if (kAsync) {
        using R = Ring<KV, D>;
#pragma unroll
        for (int half = 0; half < 2; ++half)
          lds_words<R::PB>(kr[nt] + half * (M::KW / 2),
                           ring_slot(ring, c.warp, i % kStages, nt * 2 + half, c.lane, R::PB));
      }
#endif
      float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int st = 0; st < M::STEPS; ++st) {
        uint32_t b0, b1;
        if constexpr (KV::kBytes == 1) {
          uint32_t w = kr[nt][st];
#if RG_PHASE == 5
          b0 = prmt(w, 0u, 0x1404u); b1 = prmt(w, 0u, 0x3424u);
          opaque(w);
          b0 ^= prmt(w, 0u, 0x1404u) & 0x00010001u; b1 ^= prmt(w, 0u, 0x3424u) & 0x00010001u;
#else
          b0 = prmt(w, 0u, 0x1404u); b1 = prmt(w, 0u, 0x3424u);
#endif
        } else {
          b0 = kr[nt][2 * st]; b1 = kr[nt][2 * st + 1];
        }
        mma16816<KV>(s, qa[st][0], 0u, qa[st][1], 0u, b0, b1);
#if RG_PHASE == 3
        opaque(b0); opaque(b1);
        mma16816<KV>(s, qa[st][0], 0u, qa[st][1], 0u, b0, b1);
#endif
      }
      // s[0], s[1]: head grp, tokens nt*8 + 2tig, +1
      if (grp < G) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tt = nt * 8 + 2 * tig + e;
#if RG_PHASE == 7
          if (tt < valid && s[e] == 12345.f)  // practically never: keeps the math alive
#else
          if (tt < valid)
#endif
            scores[(size_t)(t * kTile + tt) * G + grp] = s[e] * p.qk_scale_log2;
        }
      }
    }
    if (PIPE && !kAsync) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int w = 0; w < M::KW; ++w) kr[nt][w] = kn[nt][w];
    }
  }
  if (kAsync) cp_wait<0>();
}

// The warp's PV result into red[warp][G][D]: o[m] holds dims grp*VD + 2m (+1 for
// o[m][2..3]) of heads 2tig, 2tig+1.
template <class KV, int D, int G>
__device__ __forceinline__ void store_warp_partial(const Ctx& c,
                                                   const float (&o)[Mma<KV, D>::STEPS][4],
                                                   float* red) {
  using M = Mma<KV, D>;
  const int grp = c.lane >> 2, tig = c.lane & 3;
#pragma unroll
  for (int m = 0; m < M::STEPS; ++m) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int g = 2 * tig + e;
      if (g < G) {
        float* r = red + (c.warp * G + g) * D + grp * M::VD + 2 * m;
        r[0] = o[m][e];
        r[1] = o[m][2 + e];
      }
    }
  }
}

template <class KV, int D, int G, bool PIPE>
struct PhaseC {
  using M = Mma<KV, D>;
  static constexpr bool kAsync = PIPE && KV::kBytes == 1;  // E5M2 candidate: cp.async ring
  uint32_t vr[4][M::VW], vn[4][M::VW];

  // The candidate starts its first V tile before the softmax barrier.
  __device__ __forceinline__ void prefetch(const Params& p, const Ctx& c, uint8_t* ring) {
    if (kAsync) {
      if (!early_v(c.n_tiles) && RG_PHASE != 2) {
#pragma unroll
        for (int st = 0; st < kStages - 1; ++st)
          issue_v<KV, D>(p, c, ring, c.warp + st * kWarps, st);
      }
    } else if (PIPE && c.warp < c.n_tiles && RG_PHASE != 2)
      load_v<KV, D>(vr, row_ptr(p, p.v, c.b, c.h, c.start + c.warp * kTile, KV::kBytes, D),
                    min(kTile, c.n_tok - c.warp * kTile), c.lane >> 2, c.lane & 3);
  }

  // O^T = V^T P^T over the warp's tiles, then the per-warp result into red[warp][G][D].
  __device__ __forceinline__ void run(const Params& p, const Ctx& c, float* scores,
                                      uint8_t* ring) {
    const int grp = c.lane >> 2, tig = c.lane & 3;
    float o[M::STEPS][4];
#pragma unroll
    for (int m = 0; m < M::STEPS; ++m) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
    for (int t = c.warp, i = 0; t < c.n_tiles; t += kWarps, ++i) {
      const int tok0 = c.start + t * kTile;
      const int valid = min(kTile, c.n_tok - t * kTile);
#if RG_PHASE == 2
#pragma unroll
      for (int r = 0; r < 4; ++r)
        fake_words<M::VW>(vr[r], tok0 + r, c.lane, KV::kBytes == 1 ? 0x38383838u : 0x3f803f80u);
#else
      if (kAsync) {
        const int off = early_v(c.n_tiles) ? kStages - 1 : 0;
        issue_v<KV, D>(p, c, ring, t + (kStages - 1) * kWarps, (i + kStages - 1 + off) % kStages);
        cp_wait<kStages - 1>();
        using R = Ring<KV, D>;
#pragma unroll
        for (int r = 0; r < 4; ++r)
          lds_words<R::PB>(vr[r], ring_slot(ring, c.warp, (i + off) % kStages, r, c.lane, R::PB));
      } else if (PIPE) {
        const int tn = t + kWarps;
        if (tn < c.n_tiles)
          load_v<KV, D>(vn, row_ptr(p, p.v, c.b, c.h, c.start + tn * kTile, KV::kBytes, D),
                        min(kTile, c.n_tok - tn * kTile), grp, tig);
      } else {
        load_v<KV, D>(vr, row_ptr(p, p.v, c.b, c.h, tok0, KV::kBytes, D), valid, grp, tig);
      }
#endif
      // P^T as the B operand: tokens 2tig, 2tig+1 | 2tig+8, 2tig+9 of head grp.
      float pr[4] = {0.f, 0.f, 0.f, 0.f};
      if (grp < G) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int tt = 2 * tig + (r & 1) + (r >> 1) * 8;
          if (tt < valid) pr[r] = scores[(size_t)(t * kTile + tt) * G + grp];
        }
      }
      const uint32_t b0 = pack2<KV>(pr[0], pr[1]), b1 = pack2<KV>(pr[2], pr[3]);
#pragma unroll
      for (int m = 0; m < M::STEPS; ++m) {
        uint32_t a0, a1, a2, a3;
        if constexpr (KV::kBytes == 1) {
          const int w = m >> 1;
          const uint32_t sel = (m & 1) ? 0x7362u : 0x5140u;
          uint32_t z01 = prmt(vr[0][w], vr[1][w], sel), z23 = prmt(vr[2][w], vr[3][w], sel);
#if RG_PHASE == 5
          opaque(z01); opaque(z23);
          z01 = prmt(z01, vr[0][w] & 0x01010101u, 0x3210u); z23 = prmt(z23, vr[2][w] & 0x01010101u, 0x3210u);
#endif
          a0 = prmt(z01, 0u, 0x1404u); a1 = prmt(z01, 0u, 0x3424u);
          a2 = prmt(z23, 0u, 0x1404u); a3 = prmt(z23, 0u, 0x3424u);
        } else {
          a0 = prmt(vr[0][m], vr[1][m], 0x5410u); a1 = prmt(vr[0][m], vr[1][m], 0x7632u);
          a2 = prmt(vr[2][m], vr[3][m], 0x5410u); a3 = prmt(vr[2][m], vr[3][m], 0x7632u);
        }
        mma16816<KV>(o[m], a0, a1, a2, a3, b0, b1);
#if RG_PHASE == 4
        opaque(a0); opaque(a1); opaque(a2); opaque(a3);
        mma16816<KV>(o[m], a0, a1, a2, a3, b0, b1);
#endif
      }
      if (PIPE && !kAsync) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int w = 0; w < M::VW; ++w) vr[r][w] = vn[r][w];
      }
    }
    if (kAsync) cp_wait<0>();
    __syncthreads();  // every warp is done reading scores and the ring: both are reused
    store_warp_partial<KV, D, G>(c, o, scores);
  }
};
#endif

// ============================================================ shared phases

template <int G>
__device__ __forceinline__ void softmax(float* scores, float* s_ml, const Ctx& c) {
  for (int g = c.warp; g < G; g += kWarps) {
    float m = -__int_as_float(0x7f800000);
    for (int i = c.lane; i < c.n_tok; i += 32) m = fmaxf(m, scores[i * G + g]);
    m = warp_max(m);
    float l = 0.f;
    for (int i = c.lane; i < c.n_tok; i += 32) {
      const float e = fast_exp2(scores[i * G + g] - m);
      scores[i * G + g] = e;
      l += e;
    }
    l = warp_sum(l);
    if (c.lane == 0) { s_ml[g] = m; s_ml[G + g] = l; }
  }
}

// A barrier of the 8 math warps: all of the CTA for the baseline and the ring
// candidate; for the bulk candidate a named barrier its producer warp never joins.
template <bool NAMED>
__device__ __forceinline__ void cta_sync() {
  if constexpr (NAMED) {
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
  } else {
    __syncthreads();
  }
}

// The CTA's partial output: the warps' partials summed in warp order, each element to
// `keep(i, o)`, or normalized into the output when the sequence has one split.
template <int D, int G, class Keep>
__device__ __forceinline__ void sum_warps(const Params& p, const Ctx& c, const float* red,
                                          const float* s_ml, int nsplit, Keep keep) {
  for (int i = c.tid; i < G * D; i += kThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += red[w * G * D + i];
    const int g = i / D;
    if (nsplit == 1)
      p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(o / s_ml[G + g] * p.v_scale);
    else
      keep(i, o);
  }
}

// Sum the warps' partials (fixed order); write the output (one split) or the
// partial and take the (sequence, head)'s ticket. True in the CTA that finished last
// of several splits: it merges them. TICKET = false (the deep candidate's timing-only
// RG_DEEP_ABLATE 10) stops after the stores: no fence, no ticket, no merge.
template <int D, int G, bool NAMED = false, bool TICKET = true>
__device__ __forceinline__ bool finish_partial(const Params& p, const Ctx& c, const float* red,
                                               const float* s_ml, int nsplit, int* s_last) {
  const int s = (int)blockIdx.x;
  const size_t bh = (size_t)c.b * p.num_kv_heads + c.h;
  cta_sync<NAMED>();
  // sum_warps' loop, written out: through its lambda ptxas allocates the bulk candidate's
  // registers otherwise, and its cubin is the one measured (the other users' are unchanged)
  for (int i = c.tid; i < G * D; i += kThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += red[w * G * D + i];
    const int g = i / D;
    if (nsplit == 1)
      p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(o / s_ml[G + g] * p.v_scale);
    else
      p.ws_acc[(bh * gridDim.x + s) * G * D + i] = o;
  }
  if (nsplit == 1) return false;
  if (c.tid < 2 * G) p.ws_ml[(bh * gridDim.x + s) * 2 * G + c.tid] = s_ml[c.tid];
  if constexpr (!TICKET) return false;

  __threadfence();
  cta_sync<NAMED>();
  if (c.tid == 0) *s_last = atomicAdd(p.counters + bh, 1) == nsplit - 1;
  cta_sync<NAMED>();
  return *s_last;
}

// The splits' states merged in split order: the running max first, then each split
// weighted by exp2(its max - the max), summed with FMAs in split order.
template <int D, int G>
__device__ __forceinline__ void merge_splits(const Params& p, const Ctx& c, int nsplit) {
  const size_t bh = (size_t)c.b * p.num_kv_heads + c.h;
  __threadfence();
  const float* ml = p.ws_ml + bh * gridDim.x * 2 * G;
  const float* pa = p.ws_acc + bh * gridDim.x * G * D;
  for (int i = c.tid; i < G * D; i += kThreads) {
    const int g = i / D;
    float m = -__int_as_float(0x7f800000);
    for (int sp = 0; sp < nsplit; ++sp) m = fmaxf(m, __ldcg(ml + sp * 2 * G + g));
    float l = 0.f, o = 0.f;
    for (int sp = 0; sp < nsplit; ++sp) {
      const float w = fast_exp2(__ldcg(ml + sp * 2 * G + g) - m);
      l = fmaf(w, __ldcg(ml + sp * 2 * G + G + g), l);
      o = fmaf(w, __ldcg(pa + (size_t)sp * G * D + i), o);
    }
    p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(o / l * p.v_scale);
  }
  if (c.tid == 0) p.counters[bh] = 0;
}

template <int D, int G, bool NAMED = false>
__device__ __forceinline__ void finish(const Params& p, const Ctx& c, const float* red,
                                       const float* s_ml, int nsplit, int* s_last) {
  if (finish_partial<D, G, NAMED>(p, c, red, s_ml, nsplit, s_last)) merge_splits<D, G>(p, c, nsplit);
}

template <class KV, int D, int G, bool PIPE>
__device__ __forceinline__ void split_kv(const Params& p) {
  static_assert(G == 2 || G == 4 || G == 8, "GQA groups of 2, 4 or 8 query heads");
  extern __shared__ __align__(16) float smem[];
  __shared__ float s_ml[2 * G];
  __shared__ int s_last;

  Ctx c;
  c.b = blockIdx.z; c.h = blockIdx.y;
  c.tid = threadIdx.x; c.warp = c.tid >> 5; c.lane = c.tid & 31;
  c.hq = p.num_kv_heads * G;
  const int len = p.seq_lens[c.b];
  const int nsplit = min((len + p.chunk - 1) / p.chunk, (int)gridDim.x);
  if (len <= 0) {  // nothing to attend to: a defined output instead of a stale one
    if (blockIdx.x == 0)
      for (int i = c.tid; i < G * D; i += kThreads)
        p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(0.f);
    return;
  }
  if ((int)blockIdx.x >= nsplit) return;
  c.start = blockIdx.x * p.chunk;
  c.n_tok = min(len, c.start + p.chunk) - c.start;
  c.n_tiles = (c.n_tok + kTile - 1) / kTile;
  // [chunk][G] scores, then the candidate's staging ring; the cross-warp
  // reduction reuses the space from the start once both are consumed.
  float* scores = smem;
  uint8_t* ring = reinterpret_cast<uint8_t*>(smem + (size_t)p.chunk * G);

  phase_a<KV, D, G, PIPE>(p, c, scores, ring);    // K load + conversion, QK, publication
  PhaseC<KV, D, G, PIPE> pc;
  pc.prefetch(p, c, ring);
  phase_barrier();
  softmax<G>(scores, s_ml, c);
  phase_barrier();
  pc.run(p, c, scores, ring);                     // V load + conversion, PV
  finish<D, G>(p, c, scores, s_ml, nsplit, &s_last);
}

// The sm_90+ candidates (bulk, deep): not in the phase-attribution builds, whose
// RG_ONLY_E5M2_D128_G4 keeps the baseline and ring entry points alone.
#if (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900) && !defined(RG_ONLY_E5M2_D128_G4) && \
    RG_UNIT != 1
// ============================================================ bulk candidate (sm_90+)
// A producer warp streams the chunk's K and V through two shared-memory rings
// of 64-token slots: whole page slabs (one cp.async.bulk per page piece of a
// slot; a 64-token page is one 8 KB copy for E5M2 D128) completing on an
// mbarrier per slot, issued as soon as a slot is free and never held by the
// math warps' barriers (those are named barriers of the 8 math warps only).
// The math warps run the baseline's arithmetic in the baseline's order on the
// same operand values (rows past the sequence are zero-filled in registers
// exactly as the baseline does), so the candidate is bitwise equal to it; the
// two-pass softmax is kept for that reason (a one-pass online softmax rescales
// by running maxima and rounds differently). The `_bulkc` entry points are
// launched as clusters of 8 splits: the last step merges the splits' partial
// states through distributed shared memory in split order instead of a global
// workspace, a device-scope fence and an atomic ticket (same arithmetic).
constexpr int kClusterSplits = 8;
#if RG_UNIT != 3  // the bulk candidate's alone (RG_UNIT: the deep unit leaves them out)
constexpr int kMaxChunk = 512;  // kernels.toml's max_chunk for split_kv_bulk
constexpr int kSlotTokens = 64;
constexpr int kBulkThreads = kThreads + 32;  // 8 math warps + the producer warp
constexpr int kBarrierBytes = 256;           // 4 x 8 mbarriers of 8 bytes

__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

// Ring sizes: three CTAs per SM (72 registers, 72 KB) where four slots fit beside
// MAX_CHUNK tokens of scores and the math fits the registers without spilling (not the
// D128 bf16 or D128 group-of-8 math: ptxas spills them at 72), else two CTAs per SM in
// 110 KB. src/rowgate/ops/decode_attention.py mirrors this to size the dynamic shared memory.
template <class KV, int D, int G>
struct BulkCfg {
  static constexpr int SLOT = kSlotTokens * D * KV::kBytes;  // bytes per slot
  static constexpr int SCORES = kMaxChunk * G * 4;
  static constexpr bool REGS3 = !(D == 128 && (KV::kBytes == 2 || G == 8));
  static constexpr bool THREE = REGS3 && (72 * 1024 - SCORES) / SLOT >= 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  static constexpr int BLOCKS = 1;  // sm_110's allocation spills at sm_90's caps
#else
  static constexpr int BLOCKS = THREE ? 3 : 2;  // __launch_bounds__: the register cap
#endif
  static constexpr int BUDGET = THREE ? 72 * 1024 : 110 * 1024;
  // Both rings hold an even number of slots: a 64-token slot's four tiles belong to
  // warps 0-3 (even slots) or 4-7 (odd slots), so with an even ring every use of a ring
  // slot is consumed by the same four warps. With an odd ring two warp sets alternate on
  // one slot, and a set can wait for a use two phases away from the barrier's current
  // one: the parity wait cannot tell them apart (measured: an odd K ring faulted).
  static constexpr int SLOTS = (BUDGET - SCORES) / SLOT / 2 * 2;
  static constexpr int NK = cmin(8, (SLOTS + 2) / 4 * 2);
  static constexpr int NV = cmin(8, SLOTS - NK);
  static_assert(NK >= 2 && NV >= 2 && NK % 2 == 0 && NV % 2 == 0, "even rings of >= 2 slots");
  static_assert(kWarps * G * D * 4 <= NK * SLOT, "the cross-warp reduction reuses the K ring");
  static_assert(G * D * 4 <= NV * SLOT, "the cluster partial reuses the V ring");
};
#endif  // RG_UNIT != 3

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#if RG_UNIT != 3
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}
// Global -> shared bulk copy completing on `bar` (bytes a multiple of 16, both ends
// 16-byte aligned: a token row is D * element bytes >= 64).
__device__ __forceinline__ void bulk_copy(uint32_t dst, const uint8_t* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

struct Bars {  // the 32 mbarriers at the start of dynamic shared memory
  uint32_t base;
  __device__ __forceinline__ uint32_t full_k(int i) const { return base + 8 * i; }
  __device__ __forceinline__ uint32_t empty_k(int i) const { return base + 8 * (8 + i); }
  __device__ __forceinline__ uint32_t full_v(int i) const { return base + 8 * (16 + i); }
  __device__ __forceinline__ uint32_t empty_v(int i) const { return base + 8 * (24 + i); }
};

// One slot (tokens [64 s, 64 s + 64) of the chunk, clipped to the sequence): one
// expect-tx for all its bytes, then one bulk copy per page piece. Every lane of the
// producer warp runs this (the page numbers travel by shuffle); lane 0 issues.
template <class KV, int D>
__device__ __forceinline__ void produce_slot(const Params& p, const Ctx& c, const uint8_t* cache,
                                             uint32_t dst, uint32_t full, int s, int my_page) {
  constexpr int kRow = D * KV::kBytes;
  const int t0 = s * kSlotTokens;
  const int n = min(kSlotTokens, c.n_tok - t0);
  const int page_tokens = 1 << p.page_shift;
  const int piece = min(page_tokens, kSlotTokens);
  if (c.lane == 0) mbar_expect_tx(full, static_cast<uint32_t>(n * kRow));
  for (int i = 0; i < n; i += piece) {
    const int rel = t0 + i;  // token offset in the chunk; chunks start on a page
    const int page = __shfl_sync(0xffffffffu, my_page, rel >> p.page_shift);
    if (c.lane == 0) {
      const int in_page = rel & (page_tokens - 1);
      const size_t row = (((size_t)page * p.num_kv_heads + c.h) << p.page_shift) + in_page;
      bulk_copy(dst + i * kRow, cache + row * kRow, static_cast<uint32_t>(min(piece, n - i) * kRow),
                full);
    }
  }
}

// The producer warp: the first slots of K, then of V, then each further slot as
// soon as the math warps release the one it reuses.
template <class KV, int D, int G>
__device__ __forceinline__ void produce(const Params& p, const Ctx& c, uint32_t kring,
                                        uint32_t vring, const Bars& bars) {
  using B = BulkCfg<KV, D, G>;
  // A chunk is at most 512 tokens and pages are >= 16: at most 32 pages, one per lane.
  const int npages = (c.n_tok + (1 << p.page_shift) - 1) >> p.page_shift;
  const int my_page = c.lane < npages
      ? __ldg(p.block_table + (size_t)c.b * p.bt_stride + (c.start >> p.page_shift) + c.lane) : 0;
  const int nslots = (c.n_tok + kSlotTokens - 1) / kSlotTokens;
  const int nk0 = min(B::NK, nslots), nv0 = min(B::NV, nslots);
  for (int s = 0; s < nk0; ++s)
    produce_slot<KV, D>(p, c, p.k, kring + s * B::SLOT, bars.full_k(s), s, my_page);
  for (int s = 0; s < nv0; ++s)
    produce_slot<KV, D>(p, c, p.v, vring + s * B::SLOT, bars.full_v(s), s, my_page);
  for (int s = nk0; s < nslots; ++s) {
    const int i = s % B::NK;
    mbar_wait(bars.empty_k(i), (s / B::NK - 1) & 1);
    produce_slot<KV, D>(p, c, p.k, kring + i * B::SLOT, bars.full_k(i), s, my_page);
  }
  for (int s = nv0; s < nslots; ++s) {
    const int i = s % B::NV;
    mbar_wait(bars.empty_v(i), (s / B::NV - 1) & 1);
    produce_slot<KV, D>(p, c, p.v, vring + i * B::SLOT, bars.full_v(i), s, my_page);
  }
}
#endif  // RG_UNIT != 3

template <int N>
__device__ __forceinline__ void lds_u32(uint32_t* w, const uint8_t* ptr) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(ptr)[i];
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  } else {
    static_assert(N == 2, "8-byte or multiple-of-16-byte pieces");
    const uint2 v = *reinterpret_cast<const uint2*>(ptr);
    w[0] = v.x; w[1] = v.y;
  }
}

// ---- the baseline's MMA-path arithmetic on operands already in registers, shared by the
// sm_90+ candidates (bulk, deep) so each runs the baseline's operations in its order.

// Q as the A operand: row grp = head grp (rows >= G and 8..15 are zero).
template <class KV, int D, int G>
__device__ __forceinline__ void q_operand(const Params& p, const Ctx& c,
                                          uint32_t (&qa)[Mma<KV, D>::STEPS][2]) {
  using M = Mma<KV, D>;
  const int grp = c.lane >> 2, tig = c.lane & 3;
  if (grp < G) {
    const uint8_t* qh = reinterpret_cast<const uint8_t*>(
        p.q + ((size_t)c.b * c.hq + c.h * G + grp) * D);
    uint32_t qw[M::SPAN / 2];
    load_words<M::SPAN / 4>(qw, qh + tig * M::HALF * 2);
    load_words<M::SPAN / 4>(qw + M::SPAN / 4, qh + (D / 2 + tig * M::HALF) * 2);
#pragma unroll
    for (int s = 0; s < M::STEPS; ++s) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t w = qw[2 * s + e];
        if constexpr (KV::kBytes == 1)
          qa[s][e] = pack2<KV>(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
        else
          qa[s][e] = w;
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < M::STEPS; ++s) qa[s][0] = qa[s][1] = 0u;
  }
}

// QK of one n-tile (tokens nt*8 .. nt*8+7 of tile t) and its score publication.
template <class KV, int D, int G>
__device__ __forceinline__ void qk_ntile(const Params& p, const uint32_t (&qa)[Mma<KV, D>::STEPS][2],
                                         const uint32_t (&k)[Mma<KV, D>::KW], float* scores,
                                         int t, int nt, int valid, int lane) {
  using M = Mma<KV, D>;
  const int grp = lane >> 2, tig = lane & 3;
  float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int st = 0; st < M::STEPS; ++st) {
    uint32_t b0, b1;
    if constexpr (KV::kBytes == 1) {
      const uint32_t w = k[st];
      b0 = prmt(w, 0u, 0x1404u); b1 = prmt(w, 0u, 0x3424u);
    } else {
      b0 = k[2 * st]; b1 = k[2 * st + 1];
    }
    mma16816<KV>(s, qa[st][0], 0u, qa[st][1], 0u, b0, b1);
  }
  // s[0], s[1]: head grp, tokens nt*8 + 2tig, +1
  if (grp < G) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tt = nt * 8 + 2 * tig + e;
      if (tt < valid) scores[(size_t)(t * kTile + tt) * G + grp] = s[e] * p.qk_scale_log2;
    }
  }
}

// QK of one 16-token tile as S = K Q^T: K's rows grp (n-tile 0's) and grp + 8 (n-tile 1's)
// as the A operand, Q as the B operand (qa: q_operand's registers are the B fragment too).
// Each score sums the 16 products qk_ntile sums, in its k order: the operands' roles
// swapped, half the MMAs (8 tokens' worth of them computed padded rows) and no zero rows.
// k0/k1: load_k's words of n-tile 0 / 1. Publishes the scores of tokens grp and grp + 8,
// heads 2tig and 2tig + 1, and takes them into mx, this lane's maxima of the two heads.
template <class KV, int D, int G>
__device__ __forceinline__ void qk_tile_kq(const Params& p,
                                           const uint32_t (&qa)[Mma<KV, D>::STEPS][2],
                                           const uint32_t (&k0)[Mma<KV, D>::KW],
                                           const uint32_t (&k1)[Mma<KV, D>::KW], float* scores,
                                           int t, int valid, int lane, float (&mx)[2]) {
  using M = Mma<KV, D>;
  const int grp = lane >> 2, tig = lane & 3;
  float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int st = 0; st < M::STEPS; ++st) {
    uint32_t a0, a1, a2, a3;
    if constexpr (KV::kBytes == 1) {
      a0 = prmt(k0[st], 0u, 0x1404u); a2 = prmt(k0[st], 0u, 0x3424u);
      a1 = prmt(k1[st], 0u, 0x1404u); a3 = prmt(k1[st], 0u, 0x3424u);
    } else {
      a0 = k0[2 * st]; a2 = k0[2 * st + 1];
      a1 = k1[2 * st]; a3 = k1[2 * st + 1];
    }
    mma16816<KV>(s, a0, a1, a2, a3, qa[st][0], qa[st][1]);
  }
  // s[0], s[1]: token grp, heads 2tig, 2tig + 1; s[2], s[3]: token grp + 8
  if (2 * tig < G) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tt = grp + 8 * h;
      if (tt < valid) {
        const float2 x = make_float2(s[2 * h] * p.qk_scale_log2, s[2 * h + 1] * p.qk_scale_log2);
        *reinterpret_cast<float2*>(scores + (size_t)(t * kTile + tt) * G + 2 * tig) = x;
        mx[0] = fmaxf(mx[0], x.x);
        mx[1] = fmaxf(mx[1], x.y);
      }
    }
  }
}

// PV of one tile: P^T (tokens 2tig, 2tig+1 | 2tig+8, 2tig+9 of head grp, rounded to the
// operand type) as the B operand, V^T from this lane's rows as the A operand. With EXP the
// scores are raw and P is the softmax's exp2(score - m) of head grp's max m, taken here.
template <class KV, int D, int G, bool EXP = false>
__device__ __forceinline__ void pv_tile_mma(const float* scores,
                                            const uint32_t (&vr)[4][Mma<KV, D>::VW],
                                            float (&o)[Mma<KV, D>::STEPS][4], int t, int valid,
                                            int lane, float m = 0.f) {
  using M = Mma<KV, D>;
  const int grp = lane >> 2, tig = lane & 3;
  float pr[4] = {0.f, 0.f, 0.f, 0.f};
  if (grp < G) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tt = 2 * tig + (r & 1) + (r >> 1) * 8;
      if (tt < valid) {
        const float x = scores[(size_t)(t * kTile + tt) * G + grp];
        pr[r] = EXP ? fast_exp2(x - m) : x;
      }
    }
  }
  const uint32_t b0 = pack2<KV>(pr[0], pr[1]), b1 = pack2<KV>(pr[2], pr[3]);
#pragma unroll
  for (int m = 0; m < M::STEPS; ++m) {
    uint32_t a0, a1, a2, a3;
    if constexpr (KV::kBytes == 1) {
      const int w = m >> 1;
      const uint32_t sel = (m & 1) ? 0x7362u : 0x5140u;
      const uint32_t z01 = prmt(vr[0][w], vr[1][w], sel), z23 = prmt(vr[2][w], vr[3][w], sel);
      a0 = prmt(z01, 0u, 0x1404u); a1 = prmt(z01, 0u, 0x3424u);
      a2 = prmt(z23, 0u, 0x1404u); a3 = prmt(z23, 0u, 0x3424u);
    } else {
      a0 = prmt(vr[0][m], vr[1][m], 0x5410u); a1 = prmt(vr[0][m], vr[1][m], 0x7632u);
      a2 = prmt(vr[2][m], vr[3][m], 0x5410u); a3 = prmt(vr[2][m], vr[3][m], 0x7632u);
    }
    mma16816<KV>(o[m], a0, a1, a2, a3, b0, b1);
  }
}

#if RG_UNIT != 3
// Phase A from the K ring: the baseline's loads (load_k) from shared memory, then its
// MMA and score publication.
template <class KV, int D, int G>
__device__ __forceinline__ void phase_a_bulk(const Params& p, const Ctx& c, float* scores,
                                             const uint8_t* kring, const Bars& bars) {
  using M = Mma<KV, D>;
  using B = BulkCfg<KV, D, G>;
  const int grp = c.lane >> 2, tig = c.lane & 3;
  uint32_t qa[M::STEPS][2];
  q_operand<KV, D, G>(p, c, qa);
  for (int t = c.warp; t < c.n_tiles; t += kWarps) {
    const int valid = min(kTile, c.n_tok - t * kTile);
    const int slot = t / (kSlotTokens / kTile), ring = slot % B::NK;
    mbar_wait(bars.full_k(ring), (slot / B::NK) & 1);
    const uint8_t* tile = kring + ring * B::SLOT + (t % (kSlotTokens / kTile)) * kTile * D * KV::kBytes;
    uint32_t kr[2][M::KW];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int tt = nt * 8 + grp;
      if (tt < valid) {
        const uint8_t* row = tile + (size_t)tt * D * KV::kBytes;
        lds_u32<M::KW / 2>(kr[nt], row + tig * M::HB);
        lds_u32<M::KW / 2>(kr[nt] + M::KW / 2, row + (D / 2) * KV::kBytes + tig * M::HB);
      } else {
#pragma unroll
        for (int i = 0; i < M::KW; ++i) kr[nt][i] = 0u;
      }
    }
    __syncwarp();
    mbar_arrive(bars.empty_k(ring));  // this warp is done with its tile of the slot
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) qk_ntile<KV, D, G>(p, qa, kr[nt], scores, t, nt, valid, c.lane);
  }
}

// Phase C from the V ring: the baseline's loads (load_v) from shared memory and its PV
// MMA; the per-warp result into red[warp][G][D] (the K ring, idle by now).
template <class KV, int D, int G>
__device__ __forceinline__ void phase_c_bulk(const Ctx& c, const float* scores, float* red,
                                             const uint8_t* vring, const Bars& bars) {
  using M = Mma<KV, D>;
  using B = BulkCfg<KV, D, G>;
  const int grp = c.lane >> 2, tig = c.lane & 3;
  float o[M::STEPS][4];
#pragma unroll
  for (int m = 0; m < M::STEPS; ++m) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
  for (int t = c.warp; t < c.n_tiles; t += kWarps) {
    const int valid = min(kTile, c.n_tok - t * kTile);
    const int slot = t / (kSlotTokens / kTile), ring = slot % B::NV;
    mbar_wait(bars.full_v(ring), (slot / B::NV) & 1);
    const uint8_t* tile = vring + ring * B::SLOT + (t % (kSlotTokens / kTile)) * kTile * D * KV::kBytes;
    uint32_t vr[4][M::VW];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tt = 2 * tig + (r & 1) + (r >> 1) * 8;
      if (tt < valid) {
        lds_u32<M::VW>(vr[r], tile + ((size_t)tt * D + grp * M::VD) * KV::kBytes);
      } else {
#pragma unroll
        for (int i = 0; i < M::VW; ++i) vr[r][i] = 0u;
      }
    }
    __syncwarp();
    mbar_arrive(bars.empty_v(ring));
    pv_tile_mma<KV, D, G>(scores, vr, o, t, valid, c.lane);
  }
  store_warp_partial<KV, D, G>(c, o, red);
}
#endif  // RG_UNIT != 3

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
}
#if RG_UNIT != 3
// A float in CTA `rank`'s shared memory at the address `p` has in this CTA.
__device__ __forceinline__ float ld_cluster(const float* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// The cluster's ending: every split keeps its partial (the baseline's sum over warps)
// in its own shared memory, then split 0 merges them in split order with the
// baseline's last-CTA arithmetic, reading the others through distributed shared memory.
template <int D, int G>
__device__ __forceinline__ void finish_cluster(const Params& p, const Ctx& c, const float* red,
                                               const float* s_ml, float* part, int nsplit) {
  cta_sync<true>();
  sum_warps<D, G>(p, c, red, s_ml, nsplit, [&](int i, float o) { part[i] = o; });
}

template <int D, int G>
__device__ __forceinline__ void merge_cluster(const Params& p, const Ctx& c, const float* s_ml,
                                              const float* part, int nsplit) {
  for (int i = c.tid; i < G * D; i += kThreads) {
    const int g = i / D;
    float m = -__int_as_float(0x7f800000);
    for (int sp = 0; sp < nsplit; ++sp) m = fmaxf(m, ld_cluster(s_ml + g, sp));
    float l = 0.f, o = 0.f;
    for (int sp = 0; sp < nsplit; ++sp) {
      const float w = fast_exp2(ld_cluster(s_ml + g, sp) - m);
      l = fmaf(w, ld_cluster(s_ml + G + g, sp), l);
      o = fmaf(w, ld_cluster(part + i, sp), o);
    }
    p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(o / l * p.v_scale);
  }
}

template <class KV, int D, int G, bool CLUSTER>
__device__ __forceinline__ void split_kv_bulk(const Params& p) {
  static_assert(G == 2 || G == 4 || G == 8, "GQA groups of 2, 4 or 8 query heads");
  using B = BulkCfg<KV, D, G>;
  extern __shared__ __align__(16) uint8_t bulk_smem[];
  __shared__ float s_ml[2 * G];
  __shared__ int s_last;

  Ctx c;
  c.b = blockIdx.z; c.h = blockIdx.y;
  c.tid = threadIdx.x; c.warp = c.tid >> 5; c.lane = c.tid & 31;
  c.hq = p.num_kv_heads * G;
  const int len = p.seq_lens[c.b];
  const int nsplit = min((len + p.chunk - 1) / p.chunk, (int)gridDim.x);
  if (len <= 0) {  // the whole cluster (one sequence and head) leaves together
    if (blockIdx.x == 0)
      for (int i = c.tid; i < G * D; i += kBulkThreads)
        p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(0.f);
    return;
  }
  const bool active = (int)blockIdx.x < nsplit;
  if (!CLUSTER && !active) return;
  c.start = blockIdx.x * p.chunk;
  c.n_tok = active ? min(len, c.start + p.chunk) - c.start : 0;
  c.n_tiles = (c.n_tok + kTile - 1) / kTile;
  const Bars bars{smem_addr(bulk_smem)};
  uint8_t* kring = bulk_smem + kBarrierBytes;
  uint8_t* vring = kring + B::NK * B::SLOT;
  float* scores = reinterpret_cast<float*>(vring + B::NV * B::SLOT);
  if (c.tid == 0) {
    for (int i = 0; i < 8; ++i) {
      mbar_init(bars.full_k(i), 1);
      mbar_init(bars.full_v(i), 1);
      mbar_init(bars.empty_k(i), (kSlotTokens / kTile) * 32);  // the 4 warps of a slot
      mbar_init(bars.empty_v(i), (kSlotTokens / kTile) * 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the only barrier of all 288 threads: the mbarriers are ready
  if (active) {
    if (c.warp == kWarps) {
      produce<KV, D, G>(p, c, smem_addr(kring), smem_addr(vring), bars);
    } else {
      phase_a_bulk<KV, D, G>(p, c, scores, kring, bars);
      cta_sync<true>();
      softmax<G>(scores, s_ml, c);
      cta_sync<true>();
      float* red = reinterpret_cast<float*>(kring);
      phase_c_bulk<KV, D, G>(c, scores, red, vring, bars);
      if constexpr (CLUSTER)
        finish_cluster<D, G>(p, c, red, s_ml, reinterpret_cast<float*>(vring), nsplit);
      else
        finish<D, G, true>(p, c, red, s_ml, nsplit, &s_last);
    }
  }
  if constexpr (CLUSTER) {
    __syncwarp();
    cluster_sync_all();  // every split's partial is in its shared memory
    if (blockIdx.x % kClusterSplits == 0 && nsplit > 1 && c.warp < kWarps)
      merge_cluster<D, G>(p, c, s_ml, reinterpret_cast<const float*>(vring), nsplit);
    cluster_sync_all();  // no split leaves while split 0 reads its shared memory
  }
}
#endif  // RG_UNIT != 3

#if RG_UNIT != 2
// ============================================================ deep candidate (sm_90+)
// Each math warp streams its own tiles' K rows, then their V rows, through one cp.async
// ring of S stages in the order it consumes them: load j of the warp's stream (K of its
// tiles 0..n-1, then V of the same tiles) lands in stage j % S, issued the moment load
// j - S has been consumed, so the V stream runs under the QK work and the softmax. One
// commit group per load (an empty one past the stream's end) keeps the wait constant: when
// load j is due, the groups committed after it are always S - 1. Each lane reads back only
// the bytes it copied, so no barrier orders the ring. The issue is lean because the SMs
// were issue-bound here (H200, 2026-12-04: ~48 % issue-active, one eligible warp per
// scheduler, ~500 instructions a 16-token tile): a tile's four pieces go from one tile
// pointer with the pieces' offsets as immediates, full tiles without zero-fill predicates,
// and the CTA's pages come with the sequence length in one round trip, one per lane (a
// page of the table past the sequence is read, inside the table, and never used). QK runs
// as S = K Q^T (qk_tile_kq) and the softmax has no pass of its own (publish_max). The
// arithmetic is the baseline's MMA path on the same operand values (rows past the sequence
// zero-filled by the copies, as the baseline fills them), in its order, so the candidate
// is bitwise equal to the baseline. `_deepc` runs as clusters of 8 splits and merges them
// by push (push_partial, merge_landed).
// The deep candidate's largest chunk (kernels.toml's max_chunk for split_kv_deep): 1024
// tokens, 8 tiles a warp. Against 512 it halves the CTAs' prologues, partial stores and
// merge inputs at B16x16K: 155.9 -> 151.0 us E5M2, 267.5 -> 262.1 us bf16; 2048 lost
// (166.6 / 278.8 us: 2.6 waves of CTAs) (H200, 2026-12-04).
constexpr int kDeepMaxChunk = 1024;
constexpr int kMaxWarpTiles = kDeepMaxChunk / kTile / kWarps;

// A chunk's pages, two a lane: lane l holds the chunk's pages l and 32 + l (1024 tokens of
// 16-token pages are 64 pages); `i` is warp-uniform.
struct Pages {
  int lo, hi;
};
__device__ __forceinline__ int page_at(const Pages& pg, int i) {
  return __shfl_sync(0xffffffffu, i < 32 ? pg.lo : pg.hi, i & 31);
}

// RG_DEEP_ABLATE selects a timing variant of the deep candidate for B1x1K's attribution
// (benchmarks/decode_attention.py; never for results): 1 no cluster merge (each split writes
// its own normalized partial; no cluster barrier), 2 no K/V copies (the math on whatever the
// ring holds), 3 the prologue alone (the length and pages read, the output zeroed); with
// no copies either (B16x16K's attribution, benchmarks/deep_ceiling.py): 4 no partial store
// or merge, 5 no PV, 6 no QK MMAs (the scores the ring's bytes); with the copies (how much
// of each part the stream leaves exposed): 7 no QK MMAs, 8 no PV MMAs (V still read from
// the ring), 9 no partial store or merge, 10 the partial stored, no fence, ticket or merge.
#ifndef RG_DEEP_ABLATE
#define RG_DEEP_ABLATE 0
#endif

template <class KV, int D, int G>
struct DeepCfg {
  static constexpr int PB = D / 8 * KV::kBytes;  // bytes per lane and piece
  // Whole lines (D128): a tile's rows are copied whole and swizzled (issue_lines).
  static constexpr bool LINES = D == 128;
  static constexpr int STAGE = 4 * 32 * PB;      // one warp's tile: 4 pieces x 32 lanes
  // Three CTAs per SM where the math fits 80 registers (ptxas spills the D128 bf16 math
  // there), else two. sm_110 allocates more: one.
  static constexpr bool REGS3 = !(D == 128 && KV::kBytes == 2);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  static constexpr int BLOCKS = 1 + 0 * REGS3;
#else
  static constexpr int BLOCKS = REGS3 ? 3 : 2;
#endif
  // Three stages for E5M2 D128 up to 4 heads a group, whose three CTAs still fit an SM with
  // 1024-token chunks: 147.1 against 150.3 us at B16x16K (H200, 2026-12-04); two
  // elsewhere: bf16 lost with three (281.2 against 262.4 us, two CTAs an SM), a group of 8
  // would drop to two CTAs an SM, and with per-lane pieces and 512-token chunks deeper rings
  // lost at every point (.ca copies hold an L1 line in flight).
  static constexpr int S = KV::kBytes == 1 && D == 128 && G <= 4 ? 3 : 2;
  static constexpr int RING = kWarps * S * STAGE;
  static_assert(S >= 2, "a ring of at least two stages");
};

// One 16-byte (8: D64 E5M2) cp.async at immediate offsets from the lane's bases; with ZFILL
// it copies `bytes` (PB or 0: zero-fill, the source not read). .ca: .cg (L2 only) measured
// 36 % slower at B16x16K with per-lane pieces and 16 % with whole lines (H200, 2026-12-04);
// L2 prefetch sizes (.L2::128B / 256B) and an evict-first policy measured no faster
// (148.9 / 152.6 / 149.8 against 148.8 us).
template <int BYTES, int DST, int SRC, bool ZFILL = false>
__device__ __forceinline__ void cp_piece(uint32_t dst, const uint8_t* src, int bytes = BYTES) {
  if constexpr (ZFILL)
    asm volatile("cp.async.ca.shared.global [%0+%2], [%1+%3], %4, %5;\n" ::"r"(dst), "l"(src),
                 "n"(DST), "n"(SRC), "n"(BYTES), "r"(bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0+%2], [%1+%3], %4;\n" ::"r"(dst), "l"(src),
                 "n"(DST), "n"(SRC), "n"(BYTES) : "memory");
}

// Piece P of a tile (load_k's / load_v's rows for this lane): the row it holds (for the
// zero-fill test) and its byte offset from the lane's row-0 base.
template <class KV, int D, bool IS_V, int P>
struct Piece {
  static constexpr int PB = D / 8 * KV::kBytes;
  // K: n-tile P/2's token P/2*8 + grp, half P%2 of this lane's span; V: token
  // 2tig + P%2 + P/2*8, dims grp*D/8 .. +D/8
  static constexpr int ROW = IS_V ? (P & 1) + (P >> 1) * 8 : (P >> 1) * 8;  // + the lane's
  static constexpr int SRC = (ROW * D + (IS_V ? 0 : (P & 1) * (D / 2))) * KV::kBytes;
  static constexpr int DST = P * 32 * PB;
};

template <class KV, int D, bool IS_V, int P, bool ZFILL>
__device__ __forceinline__ void tile_piece(uint32_t dst, const uint8_t* src, int lane_row,
                                           int valid) {
  using Pc = Piece<KV, D, IS_V, P>;
  constexpr int PB = Pc::PB;
  const int bytes = ZFILL && Pc::ROW + lane_row >= valid ? 0 : (PB > 16 ? 16 : PB);
  cp_piece<(PB > 16 ? 16 : PB), Pc::DST, Pc::SRC, ZFILL>(dst, src, bytes);
  if constexpr (PB == 32)  // a bf16 D128 piece: two 16-byte copies
    cp_piece<16, Pc::DST + 16, Pc::SRC + 16, ZFILL>(dst, src, bytes);
}

template <class KV, int D, bool IS_V, bool ZFILL>
__device__ __forceinline__ void tile_pieces(uint32_t dst, const uint8_t* src, int lane_row,
                                            int valid) {
  tile_piece<KV, D, IS_V, 0, ZFILL>(dst, src, lane_row, valid);
  tile_piece<KV, D, IS_V, 1, ZFILL>(dst, src, lane_row, valid);
  tile_piece<KV, D, IS_V, 2, ZFILL>(dst, src, lane_row, valid);
  tile_piece<KV, D, IS_V, 3, ZFILL>(dst, src, lane_row, valid);
}

// The lane's part of one tile (t: the tile's index in the chunk) of K or V into `dst`
// (the lane's slot in a stage); zero-fills rows at or past `valid`.
template <class KV, int D, bool IS_V>
__device__ __forceinline__ void issue_tile(const Params& p, const Ctx& c, uint32_t dst, int t,
                                           const Pages& pg) {
  const int rel = t * kTile;
  const int page = page_at(pg, rel >> p.page_shift);
  const size_t row = (((size_t)page * p.num_kv_heads + c.h) << p.page_shift) +
                     (rel & ((1 << p.page_shift) - 1));
  const int grp = c.lane >> 2, tig = c.lane & 3;
  const int lane_row = IS_V ? 2 * tig : grp;
  const int lane_off = IS_V ? (lane_row * D + grp * (D / 8)) * KV::kBytes
                            : lane_row * D * KV::kBytes + tig * (D / 8 * KV::kBytes);
  const uint8_t* src = (IS_V ? p.v : p.k) + row * D * KV::kBytes + lane_off;
  const int valid = c.n_tok - rel;
  if (valid >= kTile)  // a full tile: no zero-fill predicates
    tile_pieces<KV, D, IS_V, false>(dst, src, lane_row, valid);
  else
    tile_pieces<KV, D, IS_V, true>(dst, src, lane_row, valid);
}

// Whole lines (DeepCfg::LINES, D128): each copy instruction of a warp reads whole rows
// (E5M2: four 128-byte rows, lane l row 4i + l / 8, 16-byte chunk l % 8; bf16: two 256-byte
// rows, lane l row 2i + l / 16, chunk l % 16), where per-lane pieces read half rows: the L2
// partitions' fabric ran 82 % busy at 69 % of DRAM bandwidth with those (H200, 2026-12-04).
// Chunk c of row r lands at chunk c ^ line_swz(r), which puts the 16-byte reads of
// a quarter warp in eight different bank groups: the QK's (rows grp and grp + 1, chunks
// c of the same parity (bf16) or the same half (E5M2)) and the PV's (rows 2tig.., chunk
// grp (E5M2) or 2grp + u (bf16)). The lanes read each other's copies: a __syncwarp follows
// each wait and precedes each reuse of a stage.
template <class KV>
__device__ __forceinline__ int line_swz(int row) {
  const int q = (row >> 1) & 3;
  if constexpr (KV::kBytes == 1)
    return (q << 1) ^ ((row & 1) << 2);  // bits 1-2: odd rows' halves swapped
  else
    return ((q & 1) | ((q >> 1) << 2)) ^ (row & 1);  // bits 0 and 2: odd rows' parity flipped
}

template <class KV, int D>
struct Lines {
  static constexpr int ROW = D * KV::kBytes;
  static constexpr int CH = ROW / 16;         // 16-byte chunks a row
  static constexpr int RPI = 32 / CH;         // rows a copy instruction
  static constexpr int NC = kTile / RPI;      // copy instructions a tile
  static constexpr int NOFF = 8 / RPI;        // a lane's rows' swizzles (they repeat every 8)
  static constexpr int KU = Mma<KV, D>::HB / 16;              // chunks of a K half a lane
  static constexpr int VU = Mma<KV, D>::VD * KV::kBytes / 16;  // chunks of V a lane
};

// This lane's offsets for whole lines, computed once: where its copies land (rows r0 +
// RPI k, k < NOFF; rows 8 further land 8 rows further), its source bytes from a tile's row
// 0, its K chunks (row grp, half h, chunk u) and its V chunks (rows 2tig + r % 2, chunk u).
struct LineOffs {
  int dst[4];
  int src;
  int k[4];
  int v[4];
};

template <class KV, int D>
__device__ __forceinline__ LineOffs line_offs(int lane) {
  using L = Lines<KV, D>;
  LineOffs lo{};
  const int r0 = lane / L::CH, ch = lane % L::CH, grp = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int k = 0; k < L::NOFF; ++k) {
    const int row = r0 + L::RPI * k;
    lo.dst[k] = row * L::ROW + ((ch ^ line_swz<KV>(row)) << 4);
  }
  lo.src = r0 * L::ROW + ch * 16;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int u = 0; u < L::KU; ++u)
      lo.k[h * L::KU + u] =
          grp * L::ROW + (((h * L::CH / 2 + tig * L::KU + u) ^ line_swz<KV>(grp)) << 4);
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int u = 0; u < L::VU; ++u)
      lo.v[r * L::VU + u] = (2 * tig + r) * L::ROW +
                            (((grp * L::VU + u) ^ line_swz<KV>(2 * tig + r)) << 4);
  return lo;
}

// A full tile's copies, copy I at immediate offsets from the lane's bases.
template <class KV, int D, int I = 0>
__device__ __forceinline__ void copy_lines(uint32_t stage, const uint8_t* src, const LineOffs& lo) {
  using L = Lines<KV, D>;
  if constexpr (I < L::NC) {
    cp_piece<16, (I / L::NOFF) * 8 * L::ROW, I * L::RPI * L::ROW>(stage + lo.dst[I % L::NOFF], src);
    copy_lines<KV, D, I + 1>(stage, src, lo);
  }
}

template <class KV, int D>
__device__ __forceinline__ void issue_lines(const Params& p, const Ctx& c, uint32_t stage,
                                            int t, const Pages& pg, bool is_v,
                                            const LineOffs& lo) {
  using L = Lines<KV, D>;
  const int rel = t * kTile;
  const int page = page_at(pg, rel >> p.page_shift);
  const size_t row0 = (((size_t)page * p.num_kv_heads + c.h) << p.page_shift) +
                      (rel & ((1 << p.page_shift) - 1));
  const uint8_t* src = (is_v ? p.v : p.k) + row0 * L::ROW + lo.src;
  const int valid = c.n_tok - rel;
  __syncwarp();  // every lane is done reading the stage's previous tile
  if (valid >= kTile) {
    copy_lines<KV, D>(stage, src, lo);
    return;
  }
  const int r0 = c.lane / L::CH;
#pragma unroll
  for (int i = 0; i < L::NC; ++i) {
    const bool ok = r0 + L::RPI * i < valid;
    cp_piece<16, 0, 0, true>(stage + lo.dst[i % L::NOFF] + (i / L::NOFF) * 8 * L::ROW,
                             src + (ok ? i * L::RPI * L::ROW : 0), ok ? 16 : 0);
  }
}

// Load j of the warp's stream (K of its tile j for j < nw, V of its tile j - nw next) into
// stage j % S, or an empty group past the stream's end.
template <class KV, int D, int G>
__device__ __forceinline__ void deep_load(const Params& p, const Ctx& c, uint32_t wring, int j,
                                          int nw, const Pages& pg, const LineOffs& lo) {
  using DC = DeepCfg<KV, D, G>;
  const uint32_t stage = wring + (j % DC::S) * DC::STAGE;
  const uint32_t dst = stage + c.lane * DC::PB;
  const bool copies = RG_DEEP_ABLATE != 2 && (RG_DEEP_ABLATE < 4 || RG_DEEP_ABLATE > 6);
  if constexpr (DC::LINES) {
    if (copies && j < 2 * nw)
      issue_lines<KV, D>(p, c, stage, c.warp + (j < nw ? j : j - nw) * kWarps, pg, j >= nw, lo);
  } else if (copies && j < nw) {
    issue_tile<KV, D, false>(p, c, dst, c.warp + j * kWarps, pg);
  } else if (copies && j < 2 * nw) {
    issue_tile<KV, D, true>(p, c, dst, c.warp + (j - nw) * kWarps, pg);
  }
  cp_commit();
}

// The deep candidate's softmax has no pass of its own: each warp takes its heads' maxima
// while it publishes its scores (fmax: the same maxima in any order), P is exp2(score - max)
// taken in the PV (the softmax pass's values, rounded as it rounds them), and warp g sums
// head g's exponentials after its PV in the softmax pass's lane order: one barrier and one
// pass over the scores fewer, the sum beside the other warps' PV.

// The warp's maxima of heads 2tig, 2tig + 1 (mx, per lane) into wmax[warp][G].
template <int G>
__device__ __forceinline__ void publish_max(float (&mx)[2], float* wmax, const Ctx& c) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o));
  const int tig = c.lane & 3;
  if (c.lane < 4 && 2 * tig < G) {
    wmax[c.warp * G + 2 * tig] = mx[0];
    wmax[c.warp * G + 2 * tig + 1] = mx[1];
  }
}

template <int G>
__device__ __forceinline__ float head_max(const float* wmax, int g) {
  float m = -__int_as_float(0x7f800000);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, wmax[w * G + g]);
  return m;
}

// The softmax pass's sums (warp g: head g, lane-strided, then the butterfly) of the raw
// scores' exponentials, with the heads' maxima, into s_ml.
template <int G>
__device__ __forceinline__ void head_sums(const float* scores, const float* wmax, float* s_ml,
                                          const Ctx& c) {
  for (int g = c.warp; g < G; g += kWarps) {
    const float m = head_max<G>(wmax, g);
    float l = 0.f;
    for (int i = c.lane; i < c.n_tok; i += 32) l += fast_exp2(scores[i * G + g] - m);
    l = warp_sum(l);
    if (c.lane == 0) { s_ml[g] = m; s_ml[G + g] = l; }
  }
}

// Phases A, softmax and C of one CTA from the warps' rings; the warps' PV results end in
// red[warp][G][D] at the start of shared memory.
template <class KV, int D, int G>
__device__ __forceinline__ void deep_attend(const Params& p, const Ctx& c, uint8_t* smem,
                                            float* scores, float* s_ml, float* wmax,
                                            const Pages& pg) {
  using M = Mma<KV, D>;
  using DC = DeepCfg<KV, D, G>;
  const int nw = c.warp < c.n_tiles ? (c.n_tiles - c.warp + kWarps - 1) / kWarps : 0;
  const uint8_t* wst = smem + c.warp * DC::S * DC::STAGE;  // this warp's stages
  const uint8_t* lring = wst + c.lane * DC::PB;             // this lane's pieces
  // whole lines: this lane's copy and read offsets (unused by the per-lane pieces)
  LineOffs lo{};
  if constexpr (DC::LINES) lo = line_offs<KV, D>(c.lane);
  const uint32_t wring = smem_addr(wst);
#pragma unroll
  for (int j = 0; j < DC::S; ++j) deep_load<KV, D, G>(p, c, wring, j, nw, pg, lo);
  uint32_t qa[M::STEPS][2];
  q_operand<KV, D, G>(p, c, qa);  // in flight beside the first copies
  float mx[2] = {-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)};
#pragma unroll
  for (int i = 0; i < kMaxWarpTiles; ++i) {  // K of the warp's tile i is load i
    if (i >= nw) break;
    const int t = c.warp + i * kWarps;
    cp_wait<DC::S - 1>();
    uint32_t k0[M::KW], k1[M::KW];
    if constexpr (DC::LINES) {  // rows grp and 8 + grp (swizzled alike), the lane's chunks
      using L = Lines<KV, D>;
      __syncwarp();
      const uint8_t* st = wst + (i % DC::S) * DC::STAGE;
#pragma unroll
      for (int q = 0; q < 2 * L::KU; ++q) {
        lds_u32<4>(k0 + 4 * q, st + lo.k[q]);
        lds_u32<4>(k1 + 4 * q, st + 8 * L::ROW + lo.k[q]);
      }
    } else {
      const uint8_t* src = lring + (i % DC::S) * DC::STAGE;
      lds_u32<M::KW / 2>(k0, src);
      lds_u32<M::KW / 2>(k0 + M::KW / 2, src + 32 * DC::PB);
      lds_u32<M::KW / 2>(k1, src + 2 * 32 * DC::PB);
      lds_u32<M::KW / 2>(k1 + M::KW / 2, src + 3 * 32 * DC::PB);
    }
#if RG_DEEP_ABLATE == 6 || RG_DEEP_ABLATE == 7
    if (c.lane < 4) scores[t * kTile * G + c.lane] = __uint_as_float(k0[0] ^ k1[1]);
#else
    qk_tile_kq<KV, D, G>(p, qa, k0, k1, scores, t, min(kTile, c.n_tok - t * kTile), c.lane, mx);
#endif
    // after the scores are stored: the stage's bytes are used
    deep_load<KV, D, G>(p, c, wring, i + DC::S, nw, pg, lo);
  }
  publish_max<G>(mx, wmax, c);
  __syncthreads();
  const float m = head_max<G>(wmax, min(c.lane >> 2, G - 1));  // head grp's max (the PV's row)
  float o[M::STEPS][4];
#pragma unroll
  for (int mm = 0; mm < M::STEPS; ++mm) o[mm][0] = o[mm][1] = o[mm][2] = o[mm][3] = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxWarpTiles; ++i) {  // V of the warp's tile i is load nw + i
#if RG_DEEP_ABLATE == 5
    break;
#endif
    if (i >= nw) break;
    const int t = c.warp + i * kWarps;
    cp_wait<DC::S - 1>();
    uint32_t vr[4][M::VW];
    if constexpr (DC::LINES) {  // rows 2tig + r % 2 (+ 8: swizzled alike), the lane's chunks
      using L = Lines<KV, D>;
      __syncwarp();
      const uint8_t* st = wst + ((nw + i) % DC::S) * DC::STAGE;
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < L::VU; ++u)
          lds_u32<4>(vr[r] + 4 * u, st + (r >> 1) * 8 * L::ROW + lo.v[(r & 1) * L::VU + u]);
    } else {
      const uint8_t* src = lring + ((nw + i) % DC::S) * DC::STAGE;
#pragma unroll
      for (int r = 0; r < 4; ++r) lds_u32<M::VW>(vr[r], src + r * 32 * DC::PB);
    }
#if RG_DEEP_ABLATE == 8
    o[t & (M::STEPS - 1)][0] += __uint_as_float(vr[0][0] ^ vr[3][M::VW - 1]);
#else
    pv_tile_mma<KV, D, G, true>(scores, vr, o, t, min(kTile, c.n_tok - t * kTile), c.lane, m);
#endif
    deep_load<KV, D, G>(p, c, wring, nw + i + DC::S, nw, pg, lo);
  }
  // (head g's sum inside warp g's PV loop instead, the same terms in the same order, measured
  // 160.9 against 146.6 us at B16x16K E5M2: H200, 2026-12-04)
  head_sums<G>(scores, wmax, s_ml, c);
  __syncthreads();  // every warp is done with its ring and the scores: red reuses them
  store_warp_partial<KV, D, G>(c, o, reinterpret_cast<float*>(smem));
}

// merge_splits' arithmetic in its order, with its loads in parallel: every split's (max,
// sum) staged in shared memory in one round trip, the partials read 16 splits at a time
// (the baseline's loop waits on ~nsplit / 2 dependent L2 round trips); a merge of more
// splits than `stage` holds (`cap`) takes the baseline's loop.
template <int D, int G>
__device__ __forceinline__ void merge_splits_staged(const Params& p, const Ctx& c, int nsplit,
                                                    float* stage, int cap) {
  const unsigned splits = gridDim.x;  // the plan's splits: the workspace's stride
  if (nsplit > cap) {
    merge_splits<D, G>(p, c, nsplit);
    return;
  }
  constexpr int kBatch = 16;
  const size_t bh = (size_t)c.b * p.num_kv_heads + c.h;
  __threadfence();
  const float* ml = p.ws_ml + bh * splits * 2 * G;
  const float* pa = p.ws_acc + bh * splits * G * D;
  for (int k = c.tid; k < nsplit * 2 * G; k += kThreads) stage[k] = __ldcg(ml + k);
  __syncthreads();
  for (int i = c.tid; i < G * D; i += kThreads) {
    const int g = i / D;
    float m = -__int_as_float(0x7f800000);
    for (int sp = 0; sp < nsplit; ++sp) m = fmaxf(m, stage[sp * 2 * G + g]);
    float l = 0.f, o = 0.f;
    int sp = 0;
    for (; sp + kBatch <= nsplit; sp += kBatch) {
      float x[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) x[u] = __ldcg(pa + (size_t)(sp + u) * G * D + i);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float w = fast_exp2(stage[(sp + u) * 2 * G + g] - m);
        l = fmaf(w, stage[(sp + u) * 2 * G + G + g], l);
        o = fmaf(w, x[u], o);
      }
    }
    for (; sp < nsplit; ++sp) {
      const float w = fast_exp2(stage[sp * 2 * G + g] - m);
      l = fmaf(w, stage[sp * 2 * G + G + g], l);
      o = fmaf(w, __ldcg(pa + (size_t)sp * G * D + i), o);
    }
    p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(o / l * p.v_scale);
  }
  if (c.tid == 0) p.counters[bh] = 0;
}

// CTA `rank`'s address of this CTA's shared-memory pointer p.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  return remote;
}
// Arrive early, wait before the first store into another CTA's shared memory: that CTA has
// then started (distributed shared memory may be accessed only once it has).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
__device__ __forceinline__ void st_cluster(uint32_t remote, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}

// The cluster's merge by push: each split stores its (max, sum) and partial (the warps' sum
// in warp order, finish_cluster's) into split 0's landing area (kClusterSplits states of
// 2G + G*D floats past the scores, used for nothing else) before the cluster barrier, whose
// release orders the stores before split 0's reads; split 0 then merges from its own shared
// memory with merge_cluster's arithmetic in its order. (Pulling the states after the
// barrier cost B1x1K ~1.6 us on the H200, 2026-12-04: remote round trips and a
// second barrier that kept every split until split 0 was done reading.)
template <int D, int G>
__device__ __forceinline__ void push_partial(const Params& p, const Ctx& c, const float* red,
                                             const float* s_ml, float* landing, int nsplit) {
  constexpr int kState = 2 * G + G * D;
  cta_sync<true>();
  if (nsplit > 1) cluster_wait();  // split 0 has started: its arrival at entry
  const uint32_t dst = cluster_addr(landing + blockIdx.x * kState, 0);
  sum_warps<D, G>(p, c, red, s_ml, nsplit,
                  [&](int i, float o) { st_cluster(dst + 4 * (2 * G + i), o); });
  if (nsplit > 1 && c.tid < 2 * G) st_cluster(dst + 4 * c.tid, s_ml[c.tid]);
}

template <int D, int G>
__device__ __forceinline__ void merge_landed(const Params& p, const Ctx& c, const float* landing,
                                             int nsplit) {
  constexpr int kState = 2 * G + G * D;
  for (int i = c.tid; i < G * D; i += kThreads) {
    const int g = i / D;
    float m = -__int_as_float(0x7f800000);
    for (int sp = 0; sp < nsplit; ++sp) m = fmaxf(m, landing[sp * kState + g]);
    float l = 0.f, o = 0.f;
    for (int sp = 0; sp < nsplit; ++sp) {
      const float w = fast_exp2(landing[sp * kState + g] - m);
      l = fmaf(w, landing[sp * kState + G + g], l);
      o = fmaf(w, landing[sp * kState + 2 * G + i], o);
    }
    p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(o / l * p.v_scale);
  }
}

// RG_DEEP_TRACE=1 (benchmarks/deep_trace.py; timing-only, no result comes from it): each
// CTA of the deep candidate writes, as it leaves, its start and end on the global timer (ns)
// and its SM over q (3 words a CTA, in the grid's linear order), so the launch's ramp, its
// slots' occupancy and its drain can be read from the CTAs themselves.
#ifndef RG_DEEP_TRACE
#define RG_DEEP_TRACE 0
#endif
#if RG_DEEP_TRACE
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// the start kept in shared memory, not in a register through the kernel (E5M2 D128 spilled)
struct DeepTrace {
  const Params& p;
  unsigned long long& t0;
  __device__ DeepTrace(const Params& params, unsigned long long& at) : p(params), t0(at) {
    if (threadIdx.x == 0) t0 = global_ns();
  }
  __device__ ~DeepTrace() {  // at every return of split_kv_deep
    if (threadIdx.x != 0) return;
    const size_t cta = blockIdx.x + (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z);
    auto* w = reinterpret_cast<unsigned long long*>(const_cast<bf16_bits*>(p.q)) + 3 * cta;
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    w[0] = t0;
    w[1] = global_ns();
    w[2] = sm;
  }
};
#endif

template <class KV, int D, int G, bool CLUSTER>
__device__ __forceinline__ void split_kv_deep(const Params& p) {
  static_assert(G == 2 || G == 4 || G == 8, "GQA groups of 2, 4 or 8 query heads");
  using DC = DeepCfg<KV, D, G>;
  extern __shared__ __align__(16) uint8_t deep_smem[];  // ring | scores | (`_deepc`) landing
  __shared__ float s_ml[2 * G];
  __shared__ float s_wmax[kWarps * G];  // the warps' maxima of each head
  __shared__ int s_last;
#if RG_DEEP_TRACE
  __shared__ unsigned long long s_t0;
  const DeepTrace trace(p, s_t0);
#endif

  if (p.chunk > kDeepMaxChunk) return;  // outside the operator's plan (max_chunk): nothing written
  Ctx c;
  c.b = blockIdx.z; c.h = blockIdx.y;
  c.tid = threadIdx.x; c.warp = c.tid >> 5; c.lane = c.tid & 31;
  c.hq = p.num_kv_heads * G;
  c.start = blockIdx.x * p.chunk;
  // at most 1024 / 16 = 64 pages a chunk, two a lane (the second only past 32); read
  // beside the length
  const int* bt = p.block_table + (size_t)c.b * p.bt_stride;
  const int first = c.start >> p.page_shift;
  Pages pg{__ldg(bt + min(first + c.lane, p.bt_stride - 1)), 0};
  if ((p.chunk >> p.page_shift) > 32) pg.hi = __ldg(bt + min(first + 32 + c.lane, p.bt_stride - 1));
  const int len = p.seq_lens[c.b];
  const int nsplit = min((len + p.chunk - 1) / p.chunk, (int)gridDim.x);
  if (len <= 0) {  // a cluster is one sequence and head: it leaves together
    if ((int)blockIdx.x == 0)
      for (int i = c.tid; i < G * D; i += kThreads)
        p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(0.f);
    return;
  }
  const bool active = (int)blockIdx.x < nsplit;
#if RG_DEEP_ABLATE == 3
  if (blockIdx.x == 0 && pg.lo != -7)  // (uses the page read, so it stays in the prologue)
    for (int i = c.tid; i < G * D; i += kThreads)
      p.out[((size_t)c.b * c.hq + c.h * G) * D + i] = rowgate::float_to_bf16(0.f);
  return;
#endif
  if (!CLUSTER && !active) return;
  // `_deepc` with several splits: every split arrives now and waits before it stores into
  // split 0 (push_partial), then meets the others again before split 0 merges
  const bool merges = CLUSTER && RG_DEEP_ABLATE != 1 && nsplit > 1;
  if (merges) cluster_arrive_relaxed();
  c.n_tok = active ? min(len, c.start + p.chunk) - c.start : 0;
  c.n_tiles = (c.n_tok + kTile - 1) / kTile;
  float* red = reinterpret_cast<float*>(deep_smem);  // the warps' PV results (in the ring)
  float* scores = reinterpret_cast<float*>(deep_smem + DC::RING);
  float* landing = scores + p.chunk * G;  // `_deepc`: split 0 receives the splits' states
  if (active) {
    deep_attend<KV, D, G>(p, c, deep_smem, scores, s_ml, s_wmax, pg);
    // The epilogue (partial, fence and ticket, merge) is ~11.5 us of B16x16K's 148.8 with
    // the copies on (RG_DEEP_ABLATE 9 and 10: 137.3 without it, 142.3 with the partial
    // stored alone). Tickets taken at the start with fire-and-forget finish marks, and the
    // likely successor's first tiles prefetched into L2 before it, measured no faster
    // (149.0 and 153.1-161.2 us; H200, 2026-12-04), and so did the merge as a kernel of its
    // own after the split kernel (bit for bit, no faster on the H100 or the H200; it is in
    // commit fc06221).
    if constexpr (CLUSTER)
      push_partial<D, G>(p, c, red, s_ml, landing, merges ? nsplit : 1);
#if RG_DEEP_ABLATE == 4 || RG_DEEP_ABLATE == 9
    else if (c.tid >= kThreads && s_last)  // never: the partials stay in shared memory
#elif RG_DEEP_ABLATE == 10
    else if (finish_partial<D, G, false, false>(p, c, red, s_ml, nsplit, &s_last))
#else
    else if (finish_partial<D, G>(p, c, red, s_ml, nsplit, &s_last))
#endif
      merge_splits_staged<D, G>(p, c, nsplit, red, kWarps * D / 2);  // red is spent
  } else if (merges) {
    cluster_wait();  // a split past the sequence's end takes part in both barriers
  }
  if (merges) {  // one sequence and head a cluster: every split takes the same branch
    cluster_sync_all();  // every split's state is in split 0's landing area
    if (blockIdx.x % kClusterSplits == 0) merge_landed<D, G>(p, c, landing, nsplit);
  }
}

#endif  // RG_UNIT != 2
#endif  // sm_90+

}  // namespace

// Two CTAs per SM keep the MMA path under 128 registers; the FMA path needs more.
// The E5M2 candidate keeps its loads in flight in shared memory, not registers,
// so it can ask for three CTAs per SM (80 registers) without spilling.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define RG_BLOCKS(KV, PIPE) 1
#else
#define RG_BLOCKS(KV, PIPE) ((PIPE) && KV::kBytes == 1 ? 3 : 2)
#endif
// One entry point of the contract's parameter list (scalar arguments, not a struct:
// launchers, cuda.core's too, pass scalars and pointers) that runs BODY(p); THREADS and
// BLOCKS are its launch bounds, the trailing arguments its attributes (a cluster shape).
// BODY and BLOCKS in parentheses where they hold template arguments.
#define RG_ENTRY(NAME, BODY, THREADS, BLOCKS, ...)                                      \
  extern "C" __global__ void __VA_ARGS__ __launch_bounds__(THREADS, BLOCKS) NAME(        \
      const bf16_bits* q, const uint8_t* k, const uint8_t* v, const int* block_table,  \
      const int* seq_lens, bf16_bits* out, float* ws_acc, float* ws_ml, int* counters, \
      int bt_stride, int num_kv_heads, int page_shift, int chunk, float qk_scale_log2,     \
      float v_scale) {                                                                   \
    const Params p{q, k, v, block_table, seq_lens, out, ws_acc, ws_ml, counters,         \
                   bt_stride, num_kv_heads, page_shift, chunk, qk_scale_log2, v_scale};  \
    BODY(p);                                                                             \
  }
#define RG_KERNEL(NAME, KV, D, G, PIPE) \
  RG_ENTRY(NAME, (split_kv<KV, D, G, PIPE>), kThreads, (RG_BLOCKS(KV, PIPE)))
#if RG_UNIT == 0 || RG_UNIT == 1
#define RG_PIPE(NAME, KV, D, G) RG_KERNEL(NAME, KV, D, G, true)
#else
#define RG_PIPE(NAME, KV, D, G)
#endif

#ifdef RG_ONLY_E5M2_D128_G4
RG_KERNEL(split_kv_e5m2_d128_g4_base, E5M2, 128, 4, false)
RG_KERNEL(split_kv_e5m2_d128_g4_pipe, E5M2, 128, 4, true)
#else
RG_KERNEL(split_kv_e5m2_d128_g4_base, E5M2, 128, 4, false)
RG_PIPE(split_kv_e5m2_d128_g4_pipe, E5M2, 128, 4)
RG_KERNEL(split_kv_e5m2_d128_g8_base, E5M2, 128, 8, false)
RG_PIPE(split_kv_e5m2_d128_g8_pipe, E5M2, 128, 8)
RG_KERNEL(split_kv_e5m2_d64_g4_base, E5M2, 64, 4, false)
RG_PIPE(split_kv_e5m2_d64_g4_pipe, E5M2, 64, 4)
RG_KERNEL(split_kv_e5m2_d64_g8_base, E5M2, 64, 8, false)
RG_PIPE(split_kv_e5m2_d64_g8_pipe, E5M2, 64, 8)
RG_KERNEL(split_kv_bf16_d128_g4_base, BF16, 128, 4, false)
RG_PIPE(split_kv_bf16_d128_g4_pipe, BF16, 128, 4)
RG_KERNEL(split_kv_bf16_d128_g8_base, BF16, 128, 8, false)
RG_PIPE(split_kv_bf16_d128_g8_pipe, BF16, 128, 8)
RG_KERNEL(split_kv_bf16_d64_g4_base, BF16, 64, 4, false)
RG_PIPE(split_kv_bf16_d64_g4_pipe, BF16, 64, 4)
RG_KERNEL(split_kv_bf16_d64_g8_base, BF16, 64, 8, false)
RG_PIPE(split_kv_bf16_d64_g8_pipe, BF16, 64, 8)
// GQA groups of 2 (e.g. 16 query heads over 8 KV heads): the bf16 cache of the
// fused reference engine (lab/rowgate_lab/engines/fused.py).
RG_KERNEL(split_kv_bf16_d128_g2_base, BF16, 128, 2, false)
RG_PIPE(split_kv_bf16_d128_g2_pipe, BF16, 128, 2)
RG_KERNEL(split_kv_bf16_d64_g2_base, BF16, 64, 2, false)
RG_PIPE(split_kv_bf16_d64_g2_pipe, BF16, 64, 2)

#if (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900) && RG_UNIT != 1
// The sm_90+ candidates' shapes, each a pair: the candidate and its cluster entry point,
// launched as clusters of 8 splits (docs/kernels.md).
#define RG_SM90_SHAPES(PAIR)                                                             \
  PAIR(e5m2, E5M2, 128, 4) PAIR(e5m2, E5M2, 128, 8) PAIR(e5m2, E5M2, 64, 4)                \
  PAIR(e5m2, E5M2, 64, 8) PAIR(bf16, BF16, 128, 2) PAIR(bf16, BF16, 128, 4)                \
  PAIR(bf16, BF16, 128, 8) PAIR(bf16, BF16, 64, 2) PAIR(bf16, BF16, 64, 4)                 \
  PAIR(bf16, BF16, 64, 8)
#define RG_SM90_PAIR(SUFFIX, FN, THREADS, CFG, KV_NAME, KV, D, G)                        \
  RG_ENTRY(split_kv_##KV_NAME##_d##D##_g##G##_##SUFFIX, (FN<KV, D, G, false>), THREADS,    \
           (CFG<KV, D, G>::BLOCKS))                                                      \
  RG_ENTRY(split_kv_##KV_NAME##_d##D##_g##G##_##SUFFIX##c, (FN<KV, D, G, true>), THREADS,  \
           (CFG<KV, D, G>::BLOCKS), __cluster_dims__(kClusterSplits, 1, 1))
// The bulk candidate (cp.async.bulk + mbarriers): 288 threads, 8 math warps and the
// producer warp.
#define RG_BULK_PAIR(...) RG_SM90_PAIR(bulk, split_kv_bulk, kBulkThreads, BulkCfg, __VA_ARGS__)
// The deep candidate: 256 threads.
#define RG_DEEP_PAIR(...) RG_SM90_PAIR(deep, split_kv_deep, kThreads, DeepCfg, __VA_ARGS__)
#if RG_UNIT == 0 || RG_UNIT == 2
RG_SM90_SHAPES(RG_BULK_PAIR)
#endif
#if RG_UNIT == 0 || RG_UNIT == 3
RG_SM90_SHAPES(RG_DEEP_PAIR)
#endif
#endif
#endif
