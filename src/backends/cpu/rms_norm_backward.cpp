// RMSNorm backward on the CPU. dw first (column blocks, each summing over all
// rows, so no two threads touch one weight), then dx row by row: dx may
// alias dy, which dw still reads. Row reductions accumulate in double, as
// the forward does.
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/simd.h"
#include "core/parallel.h"

namespace lathe::cpu {

namespace {
constexpr int64_t kColBlock = 64;
}

Status rms_norm_backward(const RmsNormBackwardArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t rows = a.x.shape[0], dim = a.x.shape[1];
  const float* x = a.x.ptr<const float>();
  const float* w = a.w.ptr<const float>();
  const float* rstd = a.rstd.ptr<const float>();
  const float* dy = a.dy.ptr<const float>();
  if (!a.dw.empty()) {
    float* dw = a.dw.ptr<float>();
    parallel_for(dim, kColBlock, [&](int64_t b, int64_t e) {
      double acc[kColBlock] = {};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = b; i < e; ++i) acc[i - b] += double(dy[r * dim + i]) * (x[r * dim + i] * rstd[r]);
      for (int64_t i = b; i < e; ++i) dw[i] += float(acc[i - b]);
    });
  }
  float* dx = a.dx.ptr<float>();
  const bool vec = a.vector_sums && has_avx512();
  parallel_for(rows, 16, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> wdy, xs;  // the rounded factors of dot's terms
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * dim;
      const float* dyr = dy + r * dim;
      const float s = rstd[r];
      double dot = 0;
      if (vec) {
        wdy.resize(size_t(dim)), xs.resize(size_t(dim));
        for (int64_t i = 0; i < dim; ++i) wdy[size_t(i)] = w[i] * dyr[i], xs[size_t(i)] = xr[i] * s;
        dot = simd::dot_f64_avx512(wdy.data(), xs.data(), dim);
      } else {
        for (int64_t i = 0; i < dim; ++i) dot += double(w[i] * dyr[i]) * (xr[i] * s);
      }
      const float c = float(dot / double(dim));
      float* dxr = dx + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        float g = s * (w[i] * dyr[i] - (xr[i] * s) * c);
        dxr[i] = a.accumulate ? dxr[i] + g : g;
      }
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
