// LoRA dropout on the GPU (lora_ops.h): the CPU trainer's counter-based
// masks (nn/lora.cpp's lora_dropout_keep: a splitmix64 finalizer of the
// seed and the element's index, kept when its top 53 bits, read as a
// fraction, are ≥ p) regenerated wherever a pass needs them, so nothing
// is stored between the forward and the backward. The fraction test is
// done in integers: u = (h >> 11)·2⁻⁵³ ≥ p ⇔ (h >> 11) ≥ ⌈p·2⁵³⌉, exact for
// every float p. One thread per element, grid-stride.
#include <cmath>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ bool keep(uint64_t seed, int64_t i, uint64_t threshold) {
  return (mix(seed ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull)) >> 11) >= threshold;
}

// ⌈p·2⁵³⌉: the smallest 53-bit draw that survives.
uint64_t threshold_of(float p) { return uint64_t(std::ceil(double(p) * 0x1.0p53)); }

__global__ void apply_kernel(LoraDropoutApplyArgs a, uint64_t threshold) {
  const int64_t n = a.rows * a.cols, ld_x = a.ld_x ? a.ld_x : a.cols, ld_out = a.ld_out ? a.ld_out : a.cols;
  const int64_t i0 = a.row0 * a.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / a.cols, col = i % a.cols;
    const bf16_bits v = a.x[row * ld_x + col];
    a.out[row * ld_out + col] = keep(a.mask.seed, i0 + i, threshold) ? v : bf16_bits(0);
  }
}

__global__ void add_kernel(LoraDropoutAddArgs a, uint64_t threshold) {
  const int64_t n = a.rows * a.cols, ld_out = a.ld_out ? a.ld_out : a.cols, i0 = a.row0 * a.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = a.acc[i];
    if (keep(a.mask.seed, i0 + i, threshold)) v = __fmaf_rn(a.scale, a.src[i], v);  // acc + scale·src, one rounding
    a.acc[i] = v;
    if (a.out) dev::st(a.out, (i / a.cols) * ld_out + i % a.cols, v);
  }
}

unsigned grid_for(int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b < 8192 ? b : 8192;
}

Status check_mask(const char* op, const LoraDropoutMask& m, int64_t rows, int64_t cols, int64_t row0) {
  if (!(m.p >= 0.0f && m.p < 1.0f)) return invalid_argument("cuda ", op, ": dropout ", m.p, " is outside [0, 1)");
  if (rows < 0 || cols < 0 || row0 < 0)
    return invalid_argument("cuda ", op, ": bad shape rows=", rows, " cols=", cols, " row0=", row0);
  return Status::ok();
}

}  // namespace

Status lora_dropout_apply(CudaContext& ctx, const LoraDropoutApplyArgs& a) {
  LATHE_TRY(check_mask("lora_dropout_apply", a.mask, a.rows, a.cols, a.row0));
  if (a.rows * a.cols == 0) return Status::ok();
  if (!a.x || !a.out) return invalid_argument("cuda lora_dropout_apply: null argument");
  if ((a.ld_x && a.ld_x < a.cols) || (a.ld_out && a.ld_out < a.cols))
    return invalid_argument("cuda lora_dropout_apply: a row stride is shorter than ", a.cols, " columns");
  apply_kernel<<<grid_for(a.rows * a.cols), kThreads, 0, stream_of(ctx)>>>(a, threshold_of(a.mask.p));
  return ctx.check_launch("lora_dropout_apply");
}

Status lora_dropout_add(CudaContext& ctx, const LoraDropoutAddArgs& a) {
  LATHE_TRY(check_mask("lora_dropout_add", a.mask, a.rows, a.cols, a.row0));
  if (a.rows * a.cols == 0) return Status::ok();
  if (!a.src || !a.acc) return invalid_argument("cuda lora_dropout_add: null argument");
  if (a.ld_out && a.ld_out < a.cols)
    return invalid_argument("cuda lora_dropout_add: ld_out ", a.ld_out, " is shorter than ", a.cols, " columns");
  add_kernel<<<grid_for(a.rows * a.cols), kThreads, 0, stream_of(ctx)>>>(a, threshold_of(a.mask.p));
  return ctx.check_launch("lora_dropout_add");
}

}  // namespace lathe::cuda
