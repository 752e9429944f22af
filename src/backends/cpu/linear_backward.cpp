// Linear backward on the CPU: two sgemms (dx = dy·w, dw += dyᵀ·x) and a
// column sum for the bias, all f32.
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status linear_backward(const LinearBackwardArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t n = a.dy.shape[0], out = a.w.shape[0], in = a.w.shape[1];
  const float* dy = a.dy.ptr<const float>();
  if (!a.dx.empty())
    sgemm(false, false, n, in, out, 1.0f, dy, out, a.w.ptr<const float>(), in, a.accumulate_dx ? 1.0f : 0.0f,
          a.dx.ptr<float>(), in);
  if (!a.dw.empty() && n > 0)
    sgemm(true, false, out, in, n, 1.0f, dy, out, a.x.ptr<const float>(), in, 1.0f, a.dw.ptr<float>(), in);
  if (!a.db.empty()) {
    float* db = a.db.ptr<float>();
    parallel_for(out, 64, [&](int64_t b, int64_t e) {
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = b; r < e; ++r) db[r] += dy[t * out + r];
    });
  }
  return Status::ok();
}

}  // namespace lathe::cpu
