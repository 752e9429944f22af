// RMSNorm on the CPU: one row per task; the sum of squares accumulates in
// double (rows are short next to a matmul, and it removes the summation order
// from the comparison with the reference): sequentially, or with
// vector_sums (bf16-mixed) in 16 double lanes.
#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/simd.h"
#include "core/parallel.h"

namespace lathe::cpu {

Status rms_norm_forward(const RmsNormArgs& a) {
  LATHE_TRY(validate(a));
  const int64_t rows = a.x.shape[0], dim = a.x.shape[1];
  const float* x = a.x.ptr<const float>();
  float* y = a.y.ptr<float>();
  float* rstd_out = a.rstd.empty() ? nullptr : a.rstd.ptr<float>();
  const bool w_f32 = a.w.dtype == DType::F32;
  const bool vec = a.vector_sums && has_avx512();
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      double ss = 0;
      if (vec)
        ss = simd::dot_f64_avx512(xr, xr, dim);
      else
        for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
      float rstd = 1.0f / std::sqrt(float(ss / double(dim)) + a.eps);
      if (rstd_out) rstd_out[r] = rstd;
      if (w_f32) {
        const float* w = a.w.ptr<const float>();
        for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * rstd);
      } else {
        for (int64_t i = 0; i < dim; ++i) yr[i] = simd::to_f32(a.w.data, a.w.dtype, i) * (xr[i] * rstd);
      }
    }
  });
  return Status::ok();
}

}  // namespace lathe::cpu
