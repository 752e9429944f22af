// SwiGLU backward on the CPU, elementwise: every input element is read
// before its outputs are written, so d_gate may alias gate and d_up up.
#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status swiglu_backward(const SwigluBackwardArgs& a) {
  LATHE_TRY(validate(a));
  const float* g = a.gate.ptr<const float>();
  const float* u = a.up.ptr<const float>();
  const float* d = a.d_out.ptr<const float>();
  float* dg = a.d_gate.ptr<float>();
  float* du = a.d_up.ptr<float>();
  parallel_for(a.gate.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = g[i], ui = u[i], di = d[i];
      const float s = 1.0f / (1.0f + std::exp(-gi));
      du[i] = di * (gi * s);
      dg[i] = di * ui * s * (1.0f + gi * (1.0f - s));
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
