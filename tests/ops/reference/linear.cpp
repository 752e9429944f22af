// Reference linear: y[t, r] = (accumulate ? y : 0) + Σ_k x[t, k] w[r, k] + b[r].
#include "ops/reference/reference.h"

namespace lathe::ref {

double at(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::F32: return v.ptr<const float>()[i];
    case DType::F64: return v.ptr<const double>()[i];
    case DType::BF16: return bf16_to_f32(v.ptr<const uint16_t>()[i]);
    case DType::F16: return f16_to_f32(v.ptr<const uint16_t>()[i]);
    default: LATHE_CHECK(false, "ref::at on dtype ", dtype_name(v.dtype));
  }
  return 0;
}

void put(const TensorView& v, int64_t i, double x) {
  if (v.dtype == DType::F64) {
    v.ptr<double>()[i] = x;
  } else {
    LATHE_CHECK(v.dtype == DType::F32, "ref::put on dtype ", dtype_name(v.dtype));
    v.ptr<float>()[i] = float(x);
  }
}

void linear_forward(const LinearArgs& a) {
  const int64_t n = a.x.shape[0], in = a.x.shape[1], out = a.w.shape[0];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < out; ++r) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += at(a.x, t * in + k) * at(a.w, r * in + k);
      if (!a.bias.empty()) s += at(a.bias, r);
      put(a.y, t * out + r, a.accumulate ? at(a.y, t * out + r) + s : s);
    }
}

}  // namespace lathe::ref
