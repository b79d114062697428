// Storage types and exact conversions shared by every kernel.
//
// bf16 and FP8-E5M2 are carried as raw bits (u16 / uint8_t) so these headers
// need no CUDA toolkit header: NVRTC 12.8 (sm_70) and nvcc 13 (sm_90, sm_110)
// compile them identically, with no include path (NVRTC has no <stdint.h>).
#pragma once

namespace rowgate {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
static_assert(sizeof(u16) == 2 && sizeof(u32) == 4, "unexpected integer widths");

using bf16_bits = u16;
using e5m2_bits = u8;

// bf16 is the top half of an IEEE float: widening is a shift, exact.
__device__ __forceinline__ float bf16_to_float(bf16_bits b) {
  return __uint_as_float(static_cast<u32>(b) << 16);
}

// Round to nearest even; NaN stays a (quiet) NaN instead of rounding to Inf.
__device__ __forceinline__ bf16_bits float_to_bf16(float f) {
  const u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<bf16_bits>((u >> 16) | 0x0040u);
  }
  const u32 rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>((u + rounding) >> 16);
}

// fp16 -> fp32 through the PTX conversion every arch has (sm_70 included).
__device__ __forceinline__ float half_bits_to_float(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// E5M2 is fp16 with the low mantissa byte dropped: byte << 8 is the fp16 value,
// so the conversion is exact on every arch (NaN/Inf included).
__device__ __forceinline__ float e5m2_to_float(e5m2_bits b) {
  return half_bits_to_float(static_cast<u16>(static_cast<u16>(b) << 8));
}

// Two E5M2 values (low byte first) to two floats. sm_89+ has a hardware
// e5m2x2 -> f16x2 conversion; older arches use the exact shift.
__device__ __forceinline__ void e5m2x2_to_float2(u16 pair, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  u32 h2;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(pair));
  lo = half_bits_to_float(static_cast<u16>(h2 & 0xffffu));
  hi = half_bits_to_float(static_cast<u16>(h2 >> 16));
#else
  lo = e5m2_to_float(static_cast<e5m2_bits>(pair & 0xffu));
  hi = e5m2_to_float(static_cast<e5m2_bits>(pair >> 8));
#endif
}

}  // namespace rowgate
