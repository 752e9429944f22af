// RMSNorm: y = x * rsqrt(mean(x²) + eps) * w, in fp32 (as Hugging Face's
// LlamaRMSNorm: normalize in f32, then scale by the weight). Forward may save
// rstd for backward. Views are borrowed. Qwen3's q/k norm is the same op over
// rows of head_dim.
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct RmsNormArgs {
  TensorView x{};     // [n_rows, dim] f32
  TensorView w{};     // [dim] f32, bf16 or f16
  TensorView y{};     // [n_rows, dim] f32, may alias x
  TensorView rstd{};  // [n_rows] f32, empty when not training
  float eps = 1e-6f;
  // bf16-mixed: each row's sum runs in 16 double lanes where the CPU has
  // AVX-512 (the same exact terms, summed in another order); false: one
  // sequential double sum, the order the f32 path's results were fixed with.
  bool vector_sums = false;
};
Status validate(const RmsNormArgs& a);  // messages start with "rms_norm: "

// Backward: dx = rstd·(w⊙dy − x̂·mean(w⊙dy⊙x̂)) with x̂ = x·rstd (or dx += that
// when accumulating: the residual stream's gradient arrives there first), and
// dw += Σ_rows dy⊙x̂. Training weights are f32.
struct RmsNormBackwardArgs {
  TensorView x{};     // [n_rows, dim] f32, the forward input
  TensorView w{};     // [dim] f32
  TensorView rstd{};  // [n_rows] f32, saved by forward
  TensorView dy{};    // [n_rows, dim] f32
  TensorView dx{};    // [n_rows, dim] f32; may alias dy when not accumulating
  TensorView dw{};    // [dim] f32, accumulated; empty when the weight is frozen
  bool accumulate = false;
  bool vector_sums = false;  // as forward's (dx's row sums; dw's stay sequential)
};
Status validate(const RmsNormBackwardArgs& a);  // messages start with "rms_norm_backward: "

}  // namespace lathe
