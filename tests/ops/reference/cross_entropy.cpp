// Reference LM head + cross-entropy: all logits at once, softmax in double.
#include <cmath>
#include <vector>

#include "ops/reference/reference.h"

namespace lathe::ref {

CrossEntropyStats cross_entropy(const CrossEntropyArgs& a) {
  const int64_t n = a.hidden.shape[0], dim = a.hidden.shape[1], vocab = a.w.shape[0];
  CrossEntropyStats st;
  for (int64_t i = 0; i < n * dim && !a.d_hidden.empty(); ++i) put(a.d_hidden, i, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t target = a.targets.ptr<const int32_t>()[t];
    if (target == kCrossEntropyIgnore) continue;
    std::vector<double> z(static_cast<size_t>(vocab));
    double m = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      double s = 0;
      for (int64_t i = 0; i < dim; ++i) s += at(a.hidden, t * dim + i) * at(a.w, v * dim + i);
      z[size_t(v)] = s;
      m = std::max(m, s);
    }
    double sum = 0;
    for (double x : z) sum += std::exp(x - m);
    const double lse = m + std::log(sum);
    st.loss_sum += lse - z[size_t(target)];
    st.n_valid += 1;
    if (a.d_hidden.empty()) continue;
    for (int64_t v = 0; v < vocab; ++v) {
      const double g = (std::exp(z[size_t(v)] - lse) - (v == target ? 1.0 : 0.0)) * a.grad_scale;
      for (int64_t i = 0; i < dim; ++i) {
        add(a.d_hidden, t * dim + i, g * at(a.w, v * dim + i));
        if (!a.d_w.empty()) add(a.d_w, v * dim + i, g * at(a.hidden, t * dim + i));
      }
    }
  }
  return st;
}

}  // namespace lathe::ref
