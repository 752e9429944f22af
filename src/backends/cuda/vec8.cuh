// Eight-element vector access for the pointwise and row kernels: one
// 16-byte load or store moves eight bf16 (or two moves eight f32), which is
// what it takes for these kernels to run near the memory bandwidth. Callers
// check alignment on the host (aligned16) and that counts are multiples of 8.
// The RoPE rotation lives here too, so the fused q|k|v kernels and rope.cu
// round the same products: y1 = x1·c − x2·s and y2 = x2·c + x1·s, each
// product rounded to f32 and then the difference or sum (no fused
// multiply-add), whatever the compiler would contract.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

// True when every pointer is 16-byte aligned (null pointers pass).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
template <class... P>
bool aligned16(const void* p, const P*... rest) {
  return aligned16(p) && aligned16(static_cast<const void*>(rest)...);
}

namespace dev {

union Bf16x8 {
  uint4 word;
  __nv_bfloat16 h[8];
};

// v[0..8) = p[i..i + 8) as f32; i a multiple of 8.
__device__ __forceinline__ void ld8(const bf16_bits* p, int64_t i, float (&v)[8]) {
  Bf16x8 u;
  u.word = *reinterpret_cast<const uint4*>(p + i);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = __bfloat162float(u.h[e]);
}

// p[i..i + 8) = v rounded to nearest even.
__device__ __forceinline__ void st8(bf16_bits* p, int64_t i, const float (&v)[8]) {
  Bf16x8 u;
#pragma unroll
  for (int e = 0; e < 8; ++e) u.h[e] = __float2bfloat16_rn(v[e]);
  *reinterpret_cast<uint4*>(p + i) = u.word;
}

__device__ __forceinline__ void ld8(const float* p, int64_t i, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p + i), b = *reinterpret_cast<const float4*>(p + i + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void st8(float* p, int64_t i, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// x rounded to bf16 and back (the value a bf16 store keeps).
__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// rotate_half RoPE of the pair (x1, x2) by the angle with cosine c and sine s.
__device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float* y1, float* y2) {
  *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Sum over aligned groups of kWidth lanes (a power of two, at most 32) of a
// warp; every lane of the warp must call it.
template <int kWidth>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace dev
}  // namespace lathe::cuda
