// Reference SwiGLU: out = gate * sigmoid(gate) * up.
#include <cmath>

#include "ops/reference/reference.h"

namespace lathe::ref {

void swiglu_forward(const SwigluArgs& a) {
  for (int64_t i = 0; i < a.gate.numel(); ++i) {
    double g = at(a.gate, i);
    put(a.out, i, g / (1.0 + std::exp(-g)) * at(a.up, i));
  }
}

}  // namespace lathe::ref
