// RMSNorm fused with the residual add, forward and backward. One block per
// row; the row is read twice (sum of squares, then scale), which keeps the
// forward free of dim-dependent shared memory. Backward strides blocks over
// rows and keeps each block's dw partial sums in shared memory, so dw takes
// one f32 atomic per column per block rather than per row.
#include "backends/cuda/context_impl.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;
// Backward: enough blocks to fill an H200 several times over; dw partials
// live in the default 48 KiB of shared memory (dim <= 12288).
constexpr int64_t kMaxBwdBlocks = 1024;
constexpr size_t kMaxDwShared = 48 * 1024;

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

// Blocks stride over rows; each thread owns the columns j ≡ threadIdx.x
// (mod blockDim.x) and keeps their dw partial sums in shared memory (no
// shared atomics needed), added to dw once per block at the end.
__global__ void rms_norm_residual_bwd(RmsNormResidualBackwardArgs a) {
  __shared__ float scratch[32];
  extern __shared__ float dw_part[];  // [dim] when a.dw
  if (a.dw) {
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) dw_part[j] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
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
      if (a.dw) dw_part[j] += dy * hn;
    }
  }
  if (a.dw) {
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) atomicAdd(&a.dw[j], dw_part[j]);
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
  const size_t shmem = a.dw ? static_cast<size_t>(a.dim) * sizeof(float) : 0;
  if (shmem > kMaxDwShared) {
    return unsupported("cuda rms_norm_backward: dim ", a.dim, " needs ", shmem, " bytes of shared memory for dw (at most ",
                       kMaxDwShared, ")");
  }
  const unsigned grid = static_cast<unsigned>(a.rows < kMaxBwdBlocks ? a.rows : kMaxBwdBlocks);
  rms_norm_residual_bwd<<<grid, kThreads, shmem, stream_of(ctx)>>>(a);
  return ctx.check_launch("rms_norm_residual_bwd");
}

}  // namespace lathe::cuda
