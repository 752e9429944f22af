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
};
Status validate(const RmsNormArgs& a);  // messages start with "rms_norm: "

}  // namespace lathe
