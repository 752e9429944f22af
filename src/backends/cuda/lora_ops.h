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
//   split (bf16 [rows, n_groups, 4, cols]) = (hi, hi, hi, lo) of v.
// Either output may be null (not both).
struct LoraPartsArgs {
  const float* src = nullptr;
  int64_t rows = 0, cols = 0, n_groups = 1, n_parts = 1;
  int64_t row_stride = 0, group_stride = 0, part_stride = 0;
  float scale = 1.0f;
  float* sum = nullptr;
  bool accumulate = false;
  bf16_bits* split = nullptr;
};
Status lora_sum_parts(CudaContext& ctx, const LoraPartsArgs& a);

// A LoRA factor gradient, a product reduced over the tokens, for up to
// kLoraMaxMembers members of a fused group at once (lora_grad.cu):
//   C_k[j, c] = Σ_t (L_k[t, j] + L_k[t, r + j]) · R_k[t, c]   (j < r, c < n_k)
//   out_k (+)= scale · C_k, stored [r, n_k] or, transposed, [n_k, r]
// with L_k the hi and lo terms of a 4-term activation-side value (row
// stride ldl) and R_k an exact bf16 operand (row stride ldr). dB of a member
// is the transposed form with L = u, R = its columns of dy; dA the plain
// form with L = du, R = x. The products are f32-accurate (separate hi and lo
// accumulators); tokens are split across blocks, whose partials go to the
// workspace (f32, workspace_floats of room) and are summed in a fixed order.
// Without room for two splits' partials, one split writes out directly.
inline constexpr int kLoraMaxMembers = 4;
struct LoraGradMember {
  const bf16_bits* l = nullptr;    // row t: hi at l[t·ldl + j], lo at l[t·ldl + r + j]
  const bf16_bits* rhs = nullptr;  // row t: rhs[t·ldr + c]
  int64_t n = 0;                   // columns of rhs (and of the gradient)
  float* out = nullptr;
};
struct LoraGradArgs {
  LoraGradMember members[kLoraMaxMembers];
  int n_members = 0;
  int64_t tokens = 0, r = 0, ldl = 0, ldr = 0;
  bool transposed = false;  // out_k[c·r + j] (a B factor) instead of out_k[j·n_k + c]
  float scale = 1.0f;
  bool accumulate = true;  // out += scale·C, else out = scale·C
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};
Status lora_grad_reduce(CudaContext& ctx, const LoraGradArgs& a);

// An activation-side product of up to kLoraMaxMembers members of a fused
// group in one launch (lora_project.cu), written as its 4-term copy:
//   v_k[t, j] = scale · Σ_{term<3} Σ_{c<k} X_k[t, c] · F_k,term(c, j)   (j < r)
//   out[t·ldo + k·4r + (0, r, 2r)] = hi(v), out[... + 3r] = v − hi(v)
// The forward's u = x·Aᵀ takes f = A4 (planes [4, r, k], by_row false); the
// backward's du = s·dy·B takes f = B4 ([k, 4, r], by_row true) and X = the
// member's columns of dy. The three terms keep separate f32 accumulators,
// summed hi + mid + lo, then scaled (what a GEMM over the stacked terms and
// lora_sum_parts give).
struct LoraProjectMember {
  const bf16_bits* x = nullptr;  // row t: x[t·ldx + c], c < k
  const bf16_bits* f = nullptr;  // the factor's 4-term copy
  int64_t k = 0;                 // the reduction's length
};
struct LoraProjectArgs {
  LoraProjectMember members[kLoraMaxMembers];
  int n_members = 0;
  int64_t tokens = 0, r = 0, ldx = 0;
  bool by_row = false;
  float scale = 1.0f;
  bf16_bits* out = nullptr;  // [tokens, ldo]: member k's 4r values from k·4r
  int64_t ldo = 0;
  int block_tokens = 0;  // tokens per thread block: 0 chosen by shape, or 32 / 64 (tests)
};
Status lora_project(CudaContext& ctx, const LoraProjectArgs& a);

}  // namespace lathe::cuda
