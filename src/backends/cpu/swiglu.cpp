// SwiGLU on the CPU: out = silu(gate) * up with silu(x) = x / (1 + exp(-x)),
// as torch's silu kernel computes it.
#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status swiglu_forward(const SwigluArgs& a) {
  LATHE_TRY(validate(a));
  const float* g = a.gate.ptr<const float>();
  const float* u = a.up.ptr<const float>();
  float* o = a.out.ptr<float>();
  parallel_for(a.gate.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float silu = g[i] / (1.0f + std::exp(-g[i]));
      o[i] = silu * u[i];
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
