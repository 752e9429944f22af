// RoPE on the device: the cos/sin tables for a call's positions (inv_freq
// from rope_inv_freq(), the angle formed in f32 as the CPU does, cos and sin
// in double so the table matches to the last bit or one ulp), then the
// rotate_half rotation in place on bf16 q or k (vec8.cuh's rotate: products
// rounded, no fused multiply-add). One thread per (token, head, 8 pairs)
// with 16-byte accesses when half is a multiple of 8 and the pointers are
// 16-byte aligned, else one per (token, head, pair); the inverse rotation
// is the backward.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/rope_table.cuh"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_tables_kernel(RopeTablesCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < a.n_tokens * a.half) rope_table_entry(a, i);
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
  float y1, y2;
  dev::rotate(dev::ld(a.x, base + p), dev::ld(a.x, base + p + a.half), c, s, &y1, &y2);
  dev::st(a.x, base + p, y1);
  dev::st(a.x, base + p + a.half, y2);
}

__global__ void rope_apply8(RopeCudaArgs a) {
  const int64_t per = a.half / 8, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.n_head * per) return;
  const int64_t p = i % per * 8, th = i / per, t = th / a.n_head, base = th * 2 * a.half;
  float x1[8], x2[8], c[8], s[8];
  dev::ld8(a.x, base + p, x1);
  dev::ld8(a.x, base + p + a.half, x2);
  dev::ld8(a.cos, t * a.half + p, c);
  dev::ld8(a.sin, t * a.half + p, s);
#pragma unroll
  for (int e = 0; e < 8; ++e) dev::rotate(x1[e], x2[e], c[e], a.inverse ? -s[e] : s[e], &x1[e], &x2[e]);
  dev::st8(a.x, base + p, x1);
  dev::st8(a.x, base + p + a.half, x2);
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
  if (a.half % 8 == 0 && aligned16(a.x, a.cos, a.sin)) {
    rope_apply8<<<blocks_for(n / 8, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    rope_apply_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("rope_apply");
}

}  // namespace lathe::cuda
