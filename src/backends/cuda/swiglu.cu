// SwiGLU forward and backward, elementwise in f32 over bf16 storage. One
// thread per element; the outputs may alias the inputs since each thread
// reads its element before writing it.
#include "backends/cuda/context_impl.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void swiglu_fwd(SwigluCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  const float g = dev::ld(a.gate, i), u = dev::ld(a.up, i);
  dev::st(a.out, i, g / (1.0f + expf(-g)) * u);
}

__global__ void swiglu_bwd(SwigluBackwardCudaArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  const float g = dev::ld(a.gate, i), u = dev::ld(a.up, i), d = dev::ld(a.d_out, i);
  const float s = 1.0f / (1.0f + expf(-g));
  dev::st(a.d_up, i, d * g * s);
  dev::st(a.d_gate, i, d * u * s * (1.0f + g * (1.0f - s)));
}

}  // namespace

Status swiglu_forward(CudaContext& ctx, const SwigluCudaArgs& a) {
  if (a.n < 0) return invalid_argument("cuda swiglu: negative size ", a.n);
  if (a.n == 0) return Status::ok();
  if (!a.gate || !a.up || !a.out) return invalid_argument("cuda swiglu: null argument");
  swiglu_fwd<<<blocks_for(a.n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("swiglu_fwd");
}

Status swiglu_backward(CudaContext& ctx, const SwigluBackwardCudaArgs& a) {
  if (a.n < 0) return invalid_argument("cuda swiglu_backward: negative size ", a.n);
  if (a.n == 0) return Status::ok();
  if (!a.gate || !a.up || !a.d_out || !a.d_gate || !a.d_up) {
    return invalid_argument("cuda swiglu_backward: null argument");
  }
  swiglu_bwd<<<blocks_for(a.n, kThreads), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("swiglu_bwd");
}

}  // namespace lathe::cuda
