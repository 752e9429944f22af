// bf16 ↔ f32 conversion on the device (round to nearest even, as the host's
// f32_to_bf16). One thread per element.
#include "backends/cuda/context_impl.h"

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

}  // namespace

Status bf16_to_f32(CudaContext& ctx, const bf16_bits* src, float* dst, int64_t n) {
  if (n < 0) return invalid_argument("cuda bf16_to_f32: negative size ", n);
  if (n == 0) return Status::ok();
  if (!src || !dst) return invalid_argument("cuda bf16_to_f32: null argument");
  bf16_to_f32_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(src, dst, n);
  return ctx.check_launch("bf16_to_f32");
}

Status f32_to_bf16(CudaContext& ctx, const float* src, bf16_bits* dst, int64_t n) {
  if (n < 0) return invalid_argument("cuda f32_to_bf16: negative size ", n);
  if (n == 0) return Status::ok();
  if (!src || !dst) return invalid_argument("cuda f32_to_bf16: null argument");
  f32_to_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(src, dst, n);
  return ctx.check_launch("f32_to_bf16");
}

}  // namespace lathe::cuda
