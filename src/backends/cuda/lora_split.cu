// The two elementwise kernels of the fp32 LoRA branch (lora_ops.h): the
// 4-term bf16 copies of the f32 factors, rewritten after each optimizer
// step, and the sum of a stacked GEMM's partial products (into an f32
// gradient, or into the 4-term copy of an activation-side value). Both are
// one thread per f32 value, grid-stride.
#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

// hi + mid + lo = v: each difference is exact in f32.
__device__ __forceinline__ void split3(float v, float* hi, float* mid, float* lo) {
  *hi = __bfloat162float(__float2bfloat16_rn(v));
  const float r1 = v - *hi;
  *mid = __bfloat162float(__float2bfloat16_rn(r1));
  *lo = r1 - *mid;
}

__global__ void split_weights_kernel(LoraSplitWeightsArgs a) {
  const LoraSplitFactor f = a.factors[blockIdx.y];
  const int64_t numel = f.rows * f.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    float t[4];
    split3(a.src[f.src + i], &t[0], &t[1], &t[2]);
    t[3] = t[0];
    bf16_bits* d = a.dst + f.dst;
    const int64_t row = i / f.cols, col = i % f.cols;
    if (f.by_row) {
      const int64_t ld = f.ld ? f.ld : 4 * f.cols;
      for (int p = 0; p < 4; ++p) dev::st(d, row * ld + p * f.cols + col, t[p]);
    } else {
      const int64_t ld = f.ld ? f.ld : f.cols;
      for (int p = 0; p < 4; ++p) dev::st(d, (p * f.rows + row) * ld + col, t[p]);
    }
  }
}

__global__ void sum_parts_kernel(LoraPartsArgs a) {
  const int64_t per_row = a.n_groups * a.cols, n = a.rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, gc = i % per_row, g = gc / a.cols, col = gc % a.cols;
    const float* s = a.src + row * a.row_stride + g * a.group_stride + col;
    float v = 0.0f;
    for (int64_t p = 0; p < a.n_parts; ++p) v += s[p * a.part_stride];
    v *= a.scale;
    if (a.sum) a.sum[i] = a.accumulate ? a.sum[i] + v : v;
    if (a.split) {
      const float hi = __bfloat162float(__float2bfloat16_rn(v));
      bf16_bits* d = a.split + row * (a.split_ld ? a.split_ld : 4 * per_row) + g * 4 * a.cols + col;
      dev::st(d, 0, hi);
      dev::st(d, a.cols, hi);
      dev::st(d, 2 * a.cols, hi);
      dev::st(d, 3 * a.cols, v - hi);
    }
  }
}

// Blocks for n values, at most `cap` (the loops stride over the rest).
unsigned grid_for(int64_t n, unsigned cap) {
  const unsigned b = blocks_for(n, kThreads);
  return b < cap ? b : cap;
}

}  // namespace

Status lora_split_weights(CudaContext& ctx, const LoraSplitWeightsArgs& a) {
  if (a.n_factors < 0 || a.max_numel < 0) return invalid_argument("cuda lora_split_weights: negative size");
  if (a.n_factors == 0 || a.max_numel == 0) return Status::ok();
  if (!a.factors || !a.src || !a.dst) return invalid_argument("cuda lora_split_weights: null argument");
  if (a.n_factors > 65535) return unsupported("cuda lora_split_weights: ", a.n_factors, " factors (at most 65535)");
  // Hundreds of factors of very different sizes: few blocks per factor.
  const dim3 grid(grid_for(a.max_numel, 64), unsigned(a.n_factors));
  split_weights_kernel<<<grid, kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("lora_split_weights");
}

Status lora_sum_parts(CudaContext& ctx, const LoraPartsArgs& a) {
  if (a.rows < 0 || a.cols < 0 || a.n_groups < 1 || a.n_parts < 1)
    return invalid_argument("cuda lora_sum_parts: bad shape rows=", a.rows, " cols=", a.cols, " groups=", a.n_groups,
                            " parts=", a.n_parts);
  const int64_t n = a.rows * a.n_groups * a.cols;
  if (n == 0) return Status::ok();
  if (!a.src || (!a.sum && !a.split)) return invalid_argument("cuda lora_sum_parts: null argument");
  if (a.split_ld != 0 && a.split_ld < 4 * a.n_groups * a.cols)
    return invalid_argument("cuda lora_sum_parts: split_ld ", a.split_ld, " is shorter than a row (",
                            4 * a.n_groups * a.cols, ")");
  sum_parts_kernel<<<grid_for(n, 4096), kThreads, 0, stream_of(ctx)>>>(a);
  return ctx.check_launch("lora_sum_parts");
}

}  // namespace lathe::cuda
