// Reference RMSNorm: y = x / sqrt(mean(x²) + eps) * w.
#include <cmath>

#include "ops/reference/reference.h"

namespace lathe::ref {

void rms_norm_forward(const RmsNormArgs& a) {
  const int64_t rows = a.x.shape[0], dim = a.x.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += at(a.x, r * dim + i) * at(a.x, r * dim + i);
    double rstd = 1.0 / std::sqrt(ss / double(dim) + double(a.eps));
    if (!a.rstd.empty()) put(a.rstd, r, rstd);
    for (int64_t i = 0; i < dim; ++i) put(a.y, r * dim + i, at(a.x, r * dim + i) * rstd * at(a.w, i));
  }
}

}  // namespace lathe::ref
