// bf16 ↔ f32 conversion on the device (round to nearest even, as the host's
// f32_to_bf16). Eight elements per thread with 16-byte accesses when the
// pointers are 16-byte aligned, the tail (n mod 8) by the same threads'
// scalar twin; unaligned pointers take the scalar kernel throughout.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void bf16_to_f32_kernel(const bf16_bits* src, float* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = dev::ld(src, i);
}

__global__ void f32_to_bf16_kernel(const float* src, bf16_bits* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dev::st(dst, i, src[i]);
}

// Thread i converts elements [8i, 8i + 8); the first n mod 8 threads also
// convert one tail element each.
__global__ void bf16_to_f32_vec(const bf16_bits* src, float* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, body = n / 8 * 8;
  if (i * 8 < body) {
    float v[8];
    dev::ld8(src, i * 8, v);
    dev::st8(dst, i * 8, v);
  }
  if (body + i < n) dst[body + i] = dev::ld(src, body + i);
}

__global__ void f32_to_bf16_vec(const float* src, bf16_bits* dst, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, body = n / 8 * 8;
  if (i * 8 < body) {
    float v[8];
    dev::ld8(src, i * 8, v);
    dev::st8(dst, i * 8, v);
  }
  if (body + i < n) dev::st(dst, body + i, src[body + i]);
}

// Threads for the vector kernels: one per 8 elements, at least 8 (the tail).
int64_t vec_threads(int64_t n) { return n / 8 > 8 ? (n + 7) / 8 : 8; }

}  // namespace

Status bf16_to_f32(CudaContext& ctx, const bf16_bits* src, float* dst, int64_t n) {
  if (n < 0) return invalid_argument("cuda bf16_to_f32: negative size ", n);
  if (n == 0) return Status::ok();
  if (!src || !dst) return invalid_argument("cuda bf16_to_f32: null argument");
  if (aligned16(src, dst)) {
    const int64_t t = vec_threads(n);
    bf16_to_f32_vec<<<blocks_for(t, kThreads), kThreads, 0, stream_of(ctx)>>>(src, dst, n);
  } else {
    bf16_to_f32_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(src, dst, n);
  }
  return ctx.check_launch("bf16_to_f32");
}

Status f32_to_bf16(CudaContext& ctx, const float* src, bf16_bits* dst, int64_t n) {
  if (n < 0) return invalid_argument("cuda f32_to_bf16: negative size ", n);
  if (n == 0) return Status::ok();
  if (!src || !dst) return invalid_argument("cuda f32_to_bf16: null argument");
  if (aligned16(src, dst)) {
    const int64_t t = vec_threads(n);
    f32_to_bf16_vec<<<blocks_for(t, kThreads), kThreads, 0, stream_of(ctx)>>>(src, dst, n);
  } else {
    f32_to_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(src, dst, n);
  }
  return ctx.check_launch("f32_to_bf16");
}

}  // namespace lathe::cuda
