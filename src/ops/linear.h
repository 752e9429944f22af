// Linear: y = x · wᵀ (+ bias), or y += x · wᵀ (+ bias) when accumulating (the
// residual add of a decoder block folds in here for free). The weight may stay
// in its file dtype (f32, bf16, f16); compute and accumulation are fp32.
// Views are borrowed; the CPU implementation needs a workspace of
// linear_workspace_floats() floats (per thread, one bf16/f16 weight tile
// widened for the GEMM; for a bf16 GEMV, x rearranged for the kernel).
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct LinearArgs {
  TensorView x{};          // [n, in] f32
  TensorView w{};          // [out, in] f32, bf16 or f16
  TensorView bias{};       // [out] f32, bf16 or f16; empty for none
  TensorView y{};          // [n, out] f32, must not overlap x
  TensorView workspace{};  // [>= linear_workspace_floats(...)] f32; may be empty when that is 0
  bool accumulate = false;
};
Status validate(const LinearArgs& a);  // messages start with "linear: "

// Rows of weight one thread multiplies at a time in the GEMM path (widened to
// f32 first when the weight is half precision).
constexpr int64_t kLinearTileRows = 64;
// Tokens up to which the CPU takes the GEMV path (weights streamed once,
// never converted); above it a GEMM.
constexpr int64_t kLinearGemvMaxRows = 4;
// Workspace for n tokens of `in` features with n_threads threads; fewer
// floats than that make the CPU kernel use fewer threads, never fail, as long
// as one tile fits.
int64_t linear_workspace_floats(int64_t n, int64_t in, DType w_dtype, int n_threads);

// Backward of y = x·wᵀ + b: dx = dy·w (or += when accumulate_dx: several
// projections read the same input), dw += dyᵀ·x, db += Σ_rows dy. Training
// weights are f32. Any of dx, dw, db may be empty (not wanted).
struct LinearBackwardArgs {
  TensorView x{};   // [n, in] f32, the forward input (needed for dw)
  TensorView w{};   // [out, in] f32
  TensorView dy{};  // [n, out] f32
  TensorView dx{};  // [n, in] f32, must not overlap dy
  TensorView dw{};  // [out, in] f32, accumulated
  TensorView db{};  // [out] f32, accumulated
  bool accumulate_dx = false;
};
Status validate(const LinearBackwardArgs& a);  // messages start with "linear_backward: "

}  // namespace lathe
