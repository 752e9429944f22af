// The LoRA branch of the GPU trainer at fp32 precision on bf16 tensor cores.
// An f32 value v is carried as bf16 terms: hi = bf16(v), mid = bf16(v − hi),
// lo = bf16(v − hi − mid), with hi + mid + lo = v to f32 precision (each
// subtraction is exact). A product of an exact bf16 operand (an activation,
// an incoming gradient) with a split f32 one is then a bf16 GEMM with fp32
// accumulation over the stacked terms, as accurate as an f32 GEMM; a product
// of two f32 operands keeps the three largest cross terms, u·B ≈ u_hi·B +
// u_lo·B_hi, off by ~2⁻¹⁶ relative (bf16 itself: 2⁻⁸).
//
// Layouts ("4-term" copies, terms in the order hi, mid, lo, hi):
//   a factor A [r, in]: four planes [4, r, in] (A4, read as [4r, in]);
//   a factor B [out, r]: [out, 4, r] (B4, read as [out, 4r]);
//   an activation-side f32 value u [rows, cols]: [rows, 4, cols] holding
//   (hi, hi, hi, lo), so that [hi|hi|hi|lo]·A4 = hi·A + lo·A_hi.
// Each may be a block of a wider row-major matrix (a destination row
// stride): the GPU trainer keeps A4 and B4 inside its projections' extended
// weights and the split activations inside the extended GEMM inputs, so the
// LoRA terms ride in the base GEMM's K dimension (train/cuda_model_impl.h).
// LoRA dropout (lora_dropout.cu) draws the CPU trainer's masks: element
// i = row·cols + col of a projection's input [rows, cols] survives when
// nn/lora.h's lora_dropout_keep(seed, i, p) says so (the same hash, ported).
// The masked input stays exact bf16 (x or 0); the 1/(1 − p) is applied in
// f32 by the caller (a GEMM's or lora_sum_parts' scale).
// Calls enqueue on the context's stream; in a build without CUDA they return
// "no CUDA" (lora_stub.cpp).
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_ops.h"

namespace lathe::cuda {

// One f32 matrix of the flat LoRA parameters and where its 4-term copy goes.
struct LoraSplitFactor {
  int64_t src = 0;   // offset of the f32 values [rows, cols]
  int64_t dst = 0;   // offset of the bf16 copy (4·rows·cols elements)
  int64_t rows = 0, cols = 0;
  int64_t by_row = 0;  // 0: planes [4, rows, cols] (A); 1: [rows, 4, cols] (B)
  int64_t ld = 0;      // the copy's row stride in elements (a row: cols of A, 4·cols of B); 0: packed
};

// Rewrites every factor's 4-term copy from the f32 masters in one launch.
// `factors` is a device array of n_factors entries; max_numel bounds rows·cols.
struct LoraSplitWeightsArgs {
  const LoraSplitFactor* factors = nullptr;  // device
  int n_factors = 0;
  int64_t max_numel = 0;
  const float* src = nullptr;  // flat f32 parameters
  bf16_bits* dst = nullptr;    // flat 4-term copies
};
Status lora_split_weights(CudaContext& ctx, const LoraSplitWeightsArgs& a);

// Sums the n_parts f32 partial products of a stacked GEMM:
//   v[row, g, col] = scale · Σ_p src[row·row_stride + g·group_stride + p·part_stride + col]
// for rows × n_groups × cols values, then
//   sum (f32 [rows, n_groups·cols]) = v, or += v with accumulate, and/or
//   split (bf16 [rows, n_groups, 4, cols], rows split_ld elements apart) =
//   (hi, hi, hi, lo) of v.
// Either output may be null (not both).
struct LoraPartsArgs {
  const float* src = nullptr;
  int64_t rows = 0, cols = 0, n_groups = 1, n_parts = 1;
  int64_t row_stride = 0, group_stride = 0, part_stride = 0;
  float scale = 1.0f;
  float* sum = nullptr;
  bool accumulate = false;
  bf16_bits* split = nullptr;
  int64_t split_ld = 0;  // split's row stride in elements; 0: n_groups·4·cols
};
Status lora_sum_parts(CudaContext& ctx, const LoraPartsArgs& a);
// Several such sums, in as few launches as they allow (one for up to 8
// whose strides and pointers are multiples of 4 floats): the same values as
// one lora_sum_parts each, in order. No job's output may overlap another's
// output or input. one_per_value: the one-thread-per-value kernel for all
// (an A/B switch for benches and tests; the same bits).
Status lora_sum_parts_many(CudaContext& ctx, const LoraPartsArgs* jobs, int n_jobs, bool one_per_value = false);

// One adapter's dropout mask in one pass.
struct LoraDropoutMask {
  uint64_t seed = 0;  // the adapter's seed for the pass
  float p = 0.0f;     // drop probability, [0, 1)
};

// out[row, col] = x[row, col] where the mask keeps element
// (row0 + row)·cols + col, else 0 (the rows are rows [row0, row0 + rows) of
// the adapter's input).
struct LoraDropoutApplyArgs {
  const bf16_bits* x = nullptr;  // [rows, cols], rows ld_x elements apart
  int64_t ld_x = 0;              // 0: cols
  bf16_bits* out = nullptr;      // [rows, cols], rows ld_out apart; must not overlap x
  int64_t ld_out = 0;            // 0: cols
  int64_t rows = 0, cols = 0;
  int64_t row0 = 0;
  LoraDropoutMask mask;
};
Status lora_dropout_apply(CudaContext& ctx, const LoraDropoutApplyArgs& a);

// v = acc[row, col] + scale · src[row, col] (one fused multiply-add) where
// the mask keeps (row0 + row)·cols + col, else acc[row, col] (f32, both
// packed [rows, cols]); v goes to acc, or with out to out[row, col] as
// bf16 (rows ld_out apart: the one rounding of a gradient summed in f32;
// acc is then left as it was). out must not overlap src or acc.
struct LoraDropoutAddArgs {
  const float* src = nullptr;
  float* acc = nullptr;
  float scale = 1.0f;
  bf16_bits* out = nullptr;  // or null
  int64_t ld_out = 0;        // 0: cols
  int64_t rows = 0, cols = 0;
  int64_t row0 = 0;
  LoraDropoutMask mask;
};
Status lora_dropout_add(CudaContext& ctx, const LoraDropoutAddArgs& a);

}  // namespace lathe::cuda
