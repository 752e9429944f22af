// SwiGLU forward and backward, elementwise in f32 over bf16 storage. Eight
// elements per thread with 16-byte accesses when every pointer is 16-byte
// aligned (the first n mod 8 threads also take one tail element each), else
// one thread per element; the outputs may alias the inputs since each
// thread reads its elements before writing them. The formulas are
// train_fused.cu's, term for term.
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

// Threads for the vector kernels: one per 8 elements, at least 8 (the tail).
unsigned vec_blocks(int64_t n) { return blocks_for(n / 8 > 8 ? (n + 7) / 8 : 8, kThreads); }

}  // namespace

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
