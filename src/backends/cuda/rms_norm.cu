// RMSNorm fused with the residual add, forward and backward. One block per
// row; the row is read twice (sum of squares, then scale), which keeps the
// kernel free of dim-dependent shared memory. Backward accumulates dw by f32
// atomics, one per element per row: simple and correct first; a per-block
// row tile with one atomic per column is the next step if it shows up.
#include "backends/cuda/context_impl.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_residual_fwd(RmsNormResidualArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * a.dim;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    float h = dev::ld(a.x, base + j);
    if (a.residual) {
      // The residual stream is stored in bf16: normalize what is stored.
      h = __bfloat162float(__float2bfloat16_rn(h + dev::ld(a.residual, base + j)));
      if (a.h_out) dev::st(a.h_out, base + j, h);
    } else if (a.h_out) {
      dev::st(a.h_out, base + j, h);
    }
    ss += h * h;
  }
  ss = dev::block_sum(ss, scratch);
  const float rstd = rsqrtf(ss / static_cast<float>(a.dim) + a.eps);
  if (a.rstd && threadIdx.x == 0) a.rstd[row] = rstd;
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    // h_out may alias x or residual (residual += x in place): read h back
    // from it; each thread reads only the elements it wrote.
    float h;
    if (a.h_out) {
      h = dev::ld(a.h_out, base + j);
    } else {
      h = dev::ld(a.x, base + j);
      if (a.residual) h = __bfloat162float(__float2bfloat16_rn(h + dev::ld(a.residual, base + j)));
    }
    dev::st(a.y, base + j, h * rstd * dev::ld(a.w, j));
  }
}

__global__ void rms_norm_residual_bwd(RmsNormResidualBackwardArgs a) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * a.dim;
  const float rstd = a.rstd[row];
  float dot = 0.0f;  // Σ (w⊙dy)·ĥ
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    dot += dev::ld(a.w, j) * dev::ld(a.dy, base + j) * dev::ld(a.h, base + j) * rstd;
  }
  dot = dev::block_sum(dot, scratch);
  const float mean = dot / static_cast<float>(a.dim);
  for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) {
    const float hn = dev::ld(a.h, base + j) * rstd;
    const float dy = dev::ld(a.dy, base + j);
    const float g = rstd * (dev::ld(a.w, j) * dy - hn * mean);
    a.dh[base + j] = a.accumulate ? a.dh[base + j] + g : g;
    if (a.dw) atomicAdd(&a.dw[j], dy * hn);
  }
}

}  // namespace

Status rms_norm_residual_forward(CudaContext& ctx, const RmsNormResidualArgs& a) {
  if (a.rows < 0 || a.dim <= 0) return invalid_argument("cuda rms_norm: bad shape rows=", a.rows, " dim=", a.dim);
  if (!a.x || !a.w || !a.y) return invalid_argument("cuda rms_norm: x, w and y are required");
  if (!(a.eps > 0.0f)) return invalid_argument("cuda rms_norm: eps must be > 0, got ", a.eps);
  if (a.rows == 0) return Status::ok();
  rms_norm_residual_fwd<<<static_cast<unsigned>(a.rows), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("rms_norm_residual_fwd");
}

Status rms_norm_residual_backward(CudaContext& ctx, const RmsNormResidualBackwardArgs& a) {
  if (a.rows < 0 || a.dim <= 0) {
    return invalid_argument("cuda rms_norm_backward: bad shape rows=", a.rows, " dim=", a.dim);
  }
  if (!a.h || !a.w || !a.rstd || !a.dy || !a.dh) {
    return invalid_argument("cuda rms_norm_backward: h, w, rstd, dy and dh are required");
  }
  if (a.rows == 0) return Status::ok();
  rms_norm_residual_bwd<<<static_cast<unsigned>(a.rows), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("rms_norm_residual_bwd");
}

}  // namespace lathe::cuda
