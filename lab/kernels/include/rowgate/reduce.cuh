// Warp-wide reductions (butterfly shuffles: every lane ends with the result).
#pragma once

namespace rowgate {

constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x += __shfl_xor_sync(kFullWarp, x, offset);
  }
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, offset));
  }
  return x;
}

}  // namespace rowgate
