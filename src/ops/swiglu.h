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

// Backward: with s = sigmoid(gate), d_up = d_out·silu(gate) and
// d_gate = d_out·up·s·(1 + gate·(1 − s)). Elementwise: d_gate may alias gate
// and d_up may alias up.
struct SwigluBackwardArgs {
  TensorView gate{};    // [n, ffn] f32
  TensorView up{};      // [n, ffn] f32
  TensorView d_out{};   // [n, ffn] f32
  TensorView d_gate{};  // [n, ffn] f32
  TensorView d_up{};    // [n, ffn] f32
};
Status validate(const SwigluBackwardArgs& a);  // messages start with "swiglu_backward: "

}  // namespace lathe
