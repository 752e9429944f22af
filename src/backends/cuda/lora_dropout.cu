// LoRA dropout on the GPU (lora_ops.h): the CPU trainer's counter-based
// masks (nn/lora.cpp's lora_dropout_keep: a splitmix64 finalizer of the
// seed and the element's index, kept when its top 53 bits, read as a
// fraction, are ≥ p) regenerated wherever a pass needs them, so nothing
// is stored between the forward and the backward. The fraction test is
// done in integers: u = (h >> 11)·2⁻⁵³ ≥ p ⇔ (h >> 11) ≥ ⌈p·2⁵³⌉, exact for
// every float p. Rows over the grid's y, a row's columns eight at a time
// (16-byte accesses) where aligned, else one at a time.
#include <algorithm>
#include <cmath>

#include "backends/cuda/context_impl.h"
#include "backends/cuda/lora_ops.h"
#include "backends/cuda/vec8.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool keep(uint64_t seed, int64_t i, uint64_t threshold) {
  return (dev::mix64(seed ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull)) >> 11) >= threshold;
}

// ⌈p·2⁵³⌉: the smallest 53-bit draw that survives.
uint64_t threshold_of(float p) { return uint64_t(std::ceil(double(p) * 0x1.0p53)); }

// Rows over the grid's y (striding), each row's columns in vectors of V
// elements over x: one row offset per row, no division per element. V = 8
// moves 16 bytes of bf16 (or two float4) at a time where the host found the
// rows aligned for it; V = 1 anywhere.
template <int V>
__global__ void apply_kernel(LoraDropoutApplyArgs a, uint64_t threshold) {
  const int64_t ld_x = a.ld_x ? a.ld_x : a.cols, ld_out = a.ld_out ? a.ld_out : a.cols, per_row = a.cols / V;
  for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
    const int64_t i_row = (a.row0 + row) * a.cols;
    const bf16_bits* x = a.x + row * ld_x;
    bf16_bits* out = a.out + row * ld_out;
    for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < per_row;
         v += int64_t(gridDim.x) * blockDim.x) {
      const int64_t col = v * V;
      if constexpr (V == 8) {
        union {
          uint4 word;
          bf16_bits b[8];
        } u;
        u.word = *reinterpret_cast<const uint4*>(x + col);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (!keep(a.mask.seed, i_row + col + e, threshold)) u.b[e] = 0;
        *reinterpret_cast<uint4*>(out + col) = u.word;
      } else {
        out[col] = keep(a.mask.seed, i_row + col, threshold) ? x[col] : bf16_bits(0);
      }
    }
  }
}

template <int V>
__global__ void add_kernel(LoraDropoutAddArgs a, uint64_t threshold) {
  const int64_t ld_out = a.ld_out ? a.ld_out : a.cols, per_row = a.cols / V;
  for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
    const int64_t i_row = (a.row0 + row) * a.cols;
    const float* src = a.src + row * a.cols;
    float* acc = a.acc + row * a.cols;
    bf16_bits* out = a.out ? a.out + row * ld_out : nullptr;
    for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < per_row;
         v += int64_t(gridDim.x) * blockDim.x) {
      const int64_t col = v * V;
      float s[V], c[V];
      if constexpr (V == 8) {
        dev::ld8(src, col, s);
        dev::ld8(acc, col, c);
      } else {
        s[0] = src[col], c[0] = acc[col];
      }
#pragma unroll
      for (int e = 0; e < V; ++e)  // acc + scale·src, one rounding
        if (keep(a.mask.seed, i_row + col + e, threshold)) c[e] = __fmaf_rn(a.scale, s[e], c[e]);
      if constexpr (V == 8) {
        if (out) dev::st8(out, col, c);
        else dev::st8(acc, col, c);
      } else {
        if (out) dev::st(out, col, c[0]);
        else acc[col] = c[0];
      }
    }
  }
}

// Blocks over a row's vectors (x) and rows (y).
dim3 grid_for(int64_t rows, int64_t per_row) {
  const int64_t bx = std::min<int64_t>((per_row + kThreads - 1) / kThreads, 1024);
  return dim3(unsigned(std::max<int64_t>(bx, 1)), unsigned(std::clamp<int64_t>(rows, 1, 65535)));
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
  const int64_t ld_x = a.ld_x ? a.ld_x : a.cols, ld_out = a.ld_out ? a.ld_out : a.cols;
  if (a.cols % 8 == 0 && ld_x % 8 == 0 && ld_out % 8 == 0 && aligned16(a.x, a.out))
    apply_kernel<8><<<grid_for(a.rows, a.cols / 8), kThreads, 0, stream_of(ctx)>>>(a, threshold_of(a.mask.p));
  else
    apply_kernel<1><<<grid_for(a.rows, a.cols), kThreads, 0, stream_of(ctx)>>>(a, threshold_of(a.mask.p));
  return ctx.check_launch("lora_dropout_apply");
}

Status lora_dropout_add(CudaContext& ctx, const LoraDropoutAddArgs& a) {
  LATHE_TRY(check_mask("lora_dropout_add", a.mask, a.rows, a.cols, a.row0));
  if (a.rows * a.cols == 0) return Status::ok();
  if (!a.src || !a.acc) return invalid_argument("cuda lora_dropout_add: null argument");
  if (a.ld_out && a.ld_out < a.cols)
    return invalid_argument("cuda lora_dropout_add: ld_out ", a.ld_out, " is shorter than ", a.cols, " columns");
  const int64_t ld_out = a.ld_out ? a.ld_out : a.cols;
  if (a.cols % 8 == 0 && ld_out % 8 == 0 && aligned16(a.src, a.acc, a.out))
    add_kernel<8><<<grid_for(a.rows, a.cols / 8), kThreads, 0, stream_of(ctx)>>>(a, threshold_of(a.mask.p));
  else
    add_kernel<1><<<grid_for(a.rows, a.cols), kThreads, 0, stream_of(ctx)>>>(a, threshold_of(a.mask.p));
  return ctx.check_launch("lora_dropout_add");
}

}  // namespace lathe::cuda
