// RoPE on the device: the cos/sin tables for a call's positions (inv_freq
// from rope_inv_freq(), the angle formed in f32 as the CPU does, cos and sin
// in double so the table matches to the last bit or one ulp), then the
// rotate_half rotation in place on bf16 q or k. One thread per (token, head,
// pair); the inverse rotation is the backward.
#include "backends/cuda/context_impl.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_tables_kernel(RopeTablesCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.half) return;
  const int64_t t = i / a.half, p = i % a.half;
  const float angle = static_cast<float>(a.positions[t]) * a.inv_freq[p];
  a.cos[i] = static_cast<float>(cos(static_cast<double>(angle)));
  a.sin[i] = static_cast<float>(sin(static_cast<double>(angle)));
}

__global__ void rope_apply_kernel(RopeCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.n_head * a.half) return;
  const int64_t p = i % a.half;
  const int64_t th = i / a.half;  // token * n_head + head
  const int64_t t = th / a.n_head;
  const float c = a.cos[t * a.half + p];
  const float s = a.inverse ? -a.sin[t * a.half + p] : a.sin[t * a.half + p];
  const int64_t base = th * 2 * a.half;
  const float x1 = dev::ld(a.x, base + p), x2 = dev::ld(a.x, base + p + a.half);
  dev::st(a.x, base + p, x1 * c - x2 * s);
  dev::st(a.x, base + p + a.half, x2 * c + x1 * s);
}

}  // namespace

Status rope_tables(CudaContext& ctx, const RopeTablesCudaArgs& a) {
  if (a.n_tokens < 0 || a.half <= 0) return invalid_argument("cuda rope: bad table shape ", a.n_tokens, "x", a.half);
  if (!a.inv_freq || !a.positions || !a.cos || !a.sin) return invalid_argument("cuda rope: null table argument");
  const int64_t n = a.n_tokens * a.half;
  if (n == 0) return Status::ok();
  rope_tables_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("rope_tables");
}

Status rope_apply(CudaContext& ctx, const RopeCudaArgs& a) {
  if (a.n_tokens < 0 || a.n_head <= 0 || a.half <= 0) {
    return invalid_argument("cuda rope: bad shape tokens=", a.n_tokens, " heads=", a.n_head, " half=", a.half);
  }
  if (!a.x || !a.cos || !a.sin) return invalid_argument("cuda rope: null argument");
  const int64_t n = a.n_tokens * a.n_head * a.half;
  if (n == 0) return Status::ok();
  rope_apply_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("rope_apply");
}

}  // namespace lathe::cuda
