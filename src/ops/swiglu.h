// SwiGLU gate of the Llama MLP: out = silu(gate) * up, silu(x) = x / (1 + e^−x),
// fp32. Views are borrowed; out may alias gate or up.
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct SwigluArgs {
  TensorView gate{};  // [n, ffn] f32
  TensorView up{};    // [n, ffn] f32
  TensorView out{};   // [n, ffn] f32
};
Status validate(const SwigluArgs& a);  // messages start with "swiglu: "

}  // namespace lathe
