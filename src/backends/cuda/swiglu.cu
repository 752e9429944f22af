// SwiGLU forward and backward, elementwise in f32 over bf16 storage. Eight
// elements per thread with 16-byte accesses when every pointer is 16-byte
// aligned (the first n mod 8 threads also take one tail element each), else
// one thread per element; the outputs may alias the inputs since each
// thread reads its elements before writing them. The formulas are
// train_fused.cu's, term for term (swiglu_rows_backward_act's act is its
// forward's value bit for bit: the same expression, the same rounding).
#include "backends/cuda/context_impl.h"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float* dg, float* du) {
  const float s = 1.0f / (1.0f + expf(-g));
  *du = d * g * s;
  *dg = d * u * s * (1.0f + g * (1.0f - s));
}

__global__ void swiglu_fwd(SwigluCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  dev::st(a.out, i, silu_times(dev::ld(a.gate, i), dev::ld(a.up, i)));
}

__global__ void swiglu_bwd(SwigluBackwardCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  float dg, du;
  swiglu_grad(dev::ld(a.gate, i), dev::ld(a.up, i), dev::ld(a.d_out, i), &dg, &du);
  dev::st(a.d_up, i, du);
  dev::st(a.d_gate, i, dg);
}

__global__ void swiglu_fwd8(SwigluCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, body = a.n / 8 * 8;
  if (i * 8 < body) {
    float g[8], u[8];
    dev::ld8(a.gate, i * 8, g);
    dev::ld8(a.up, i * 8, u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = silu_times(g[e], u[e]);
    dev::st8(a.out, i * 8, g);
  }
  const int64_t j = body + i;
  if (j < a.n) dev::st(a.out, j, silu_times(dev::ld(a.gate, j), dev::ld(a.up, j)));
}

__global__ void swiglu_bwd8(SwigluBackwardCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, body = a.n / 8 * 8;
  if (i * 8 < body) {
    float g[8], u[8], d[8];
    dev::ld8(a.gate, i * 8, g);
    dev::ld8(a.up, i * 8, u);
    dev::ld8(a.d_out, i * 8, d);
#pragma unroll
    for (int e = 0; e < 8; ++e) swiglu_grad(g[e], u[e], d[e], &g[e], &u[e]);
    dev::st8(a.d_up, i * 8, u);
    dev::st8(a.d_gate, i * 8, g);
  }
  const int64_t j = body + i;
  if (j < a.n) {
    float dg, du;
    swiglu_grad(dev::ld(a.gate, j), dev::ld(a.up, j), dev::ld(a.d_out, j), &dg, &du);
    dev::st(a.d_up, j, du);
    dev::st(a.d_gate, j, dg);
  }
}

// SwigluRowsBackwardActArgs, one thread per feature.
__global__ void swiglu_rows_bwd_act(SwigluRowsBackwardActArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.inter) return;
  const int64_t t = i / a.inter, f = i % a.inter;
  const int64_t gb = t * a.ld_gu + f, db = t * a.ld_d_gu + f, ob = t * a.ld_d_out + f;
  const float g = dev::ld(a.gu, gb), u = dev::ld(a.gu, gb + a.inter), d = dev::ld(a.d_out, ob);
  float dg, du;
  swiglu_grad(g, u, d, &dg, &du);
  dev::st(a.d_gu, db + a.inter, du);
  dev::st(a.d_gu, db, dg);
  if (a.write_act) dev::st(a.d_out, ob, silu_times(g, u));
}

// The same, one thread per 8 features (16-byte accesses).
__global__ void swiglu_rows_bwd_act8(SwigluRowsBackwardActArgs a) {
  const int64_t per_row = a.inter / 8, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * per_row) return;
  const int64_t t = i / per_row, f = (i % per_row) * 8;
  const int64_t gb = t * a.ld_gu + f, db = t * a.ld_d_gu + f, ob = t * a.ld_d_out + f;
  float g[8], u[8], d[8], dg[8], du[8];
  dev::ld8(a.gu, gb, g);
  dev::ld8(a.gu, gb + a.inter, u);
  dev::ld8(a.d_out, ob, d);
#pragma unroll
  for (int e = 0; e < 8; ++e) swiglu_grad(g[e], u[e], d[e], &dg[e], &du[e]);
  dev::st8(a.d_gu, db, dg);
  dev::st8(a.d_gu, db + a.inter, du);
  if (a.write_act) {
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = silu_times(g[e], u[e]);
    dev::st8(a.d_out, ob, d);
  }
}

// Threads for the vector kernels: one per 8 elements, at least 8 (the tail).
unsigned vec_blocks(int64_t n) { return blocks_for(n / 8 > 8 ? (n + 7) / 8 : 8, kThreads); }

}  // namespace

Status swiglu_rows_backward_act(CudaContext& ctx, const SwigluRowsBackwardActArgs& args) {
  SwigluRowsBackwardActArgs a = args;
  if (a.n_tokens < 0 || a.inter < 0) return invalid_argument("cuda swiglu_rows_backward_act: negative size");
  const int64_t n = a.n_tokens * a.inter;
  if (n == 0) return Status::ok();
  if (!a.gu || !a.d_out || !a.d_gu) return invalid_argument("cuda swiglu_rows_backward_act: null argument");
  if (a.ld_gu == 0) a.ld_gu = 2 * a.inter;
  if (a.ld_d_gu == 0) a.ld_d_gu = 2 * a.inter;
  if (a.ld_d_out == 0) a.ld_d_out = a.inter;
  if (a.ld_gu < 2 * a.inter || a.ld_d_gu < 2 * a.inter || a.ld_d_out < a.inter)
    return invalid_argument("cuda swiglu_rows_backward_act: row stride shorter than a row (ld_gu ", a.ld_gu,
                            ", ld_d_gu ", a.ld_d_gu, ", ld_d_out ", a.ld_d_out, ", inter ", a.inter, ")");
  if (static_cast<const void*>(a.gu) == a.d_gu && a.ld_gu != a.ld_d_gu)
    return invalid_argument("cuda swiglu_rows_backward_act: d_gu aliases gu with another row stride");
  if (a.inter % 8 == 0 && a.ld_gu % 8 == 0 && a.ld_d_gu % 8 == 0 && a.ld_d_out % 8 == 0 &&
      aligned16(a.gu, a.d_out, a.d_gu)) {
    swiglu_rows_bwd_act8<<<blocks_for(n / 8, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    swiglu_rows_bwd_act<<<blocks_for(n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("swiglu_rows_bwd_act");
}

Status swiglu_forward(CudaContext& ctx, const SwigluCudaArgs& a) {
  if (a.n < 0) return invalid_argument("cuda swiglu: negative size ", a.n);
  if (a.n == 0) return Status::ok();
  if (!a.gate || !a.up || !a.out) return invalid_argument("cuda swiglu: null argument");
  if (aligned16(a.gate, a.up, a.out)) {
    swiglu_fwd8<<<vec_blocks(a.n), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    swiglu_fwd<<<blocks_for(a.n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("swiglu_fwd");
}

Status swiglu_backward(CudaContext& ctx, const SwigluBackwardCudaArgs& a) {
  if (a.n < 0) return invalid_argument("cuda swiglu_backward: negative size ", a.n);
  if (a.n == 0) return Status::ok();
  if (!a.gate || !a.up || !a.d_out || !a.d_gate || !a.d_up) {
    return invalid_argument("cuda swiglu_backward: null argument");
  }
  if (aligned16(a.gate, a.up, a.d_out, a.d_gate, a.d_up)) {
    swiglu_bwd8<<<vec_blocks(a.n), kThreads, 0, stream_of(ctx)>>>(a);
  } else {
    swiglu_bwd<<<blocks_for(a.n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  }
  return ctx.check_launch("swiglu_bwd");
}

}  // namespace lathe::cuda
