// Reference backward of linear, RMSNorm, SwiGLU and embedding, written from
// the derivatives of their definitions, scalar loops in double.
#include <cmath>
#include <vector>

#include "ops/reference/reference.h"

namespace lathe::ref {

void linear_backward(const LinearBackwardArgs& a) {
  const int64_t n = a.dy.shape[0], out = a.w.shape[0], in = a.w.shape[1];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < in && !a.dx.empty(); ++k) {
      double s = 0;
      for (int64_t r = 0; r < out; ++r) s += at(a.dy, t * out + r) * at(a.w, r * in + k);
      put(a.dx, t * in + k, a.accumulate_dx ? at(a.dx, t * in + k) + s : s);
    }
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t k = 0; k < in && !a.dw.empty(); ++k) {
      double s = 0;
      for (int64_t t = 0; t < n; ++t) s += at(a.dy, t * out + r) * at(a.x, t * in + k);
      add(a.dw, r * in + k, s);
    }
    if (a.db.empty()) continue;
    double s = 0;
    for (int64_t t = 0; t < n; ++t) s += at(a.dy, t * out + r);
    add(a.db, r, s);
  }
}

// y_i = w_i x_i ρ with ρ = (mean(x²) + eps)^(−1/2), so
// ∂y_i/∂x_k = w_i ρ δ_ik − w_i x_i ρ³ x_k / dim.
void rms_norm_backward(const RmsNormBackwardArgs& a) {
  const int64_t rows = a.x.shape[0], dim = a.x.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const double rho = at(a.rstd, r);
    double dot = 0;  // Σ_i dy_i w_i x_i
    for (int64_t i = 0; i < dim; ++i) dot += at(a.dy, r * dim + i) * at(a.w, i) * at(a.x, r * dim + i);
    std::vector<double> g(static_cast<size_t>(dim));
    for (int64_t k = 0; k < dim; ++k)
      g[size_t(k)] = at(a.dy, r * dim + k) * at(a.w, k) * rho - dot * rho * rho * rho * at(a.x, r * dim + k) / double(dim);
    for (int64_t i = 0; i < dim && !a.dw.empty(); ++i) add(a.dw, i, at(a.dy, r * dim + i) * at(a.x, r * dim + i) * rho);
    for (int64_t k = 0; k < dim; ++k)
      put(a.dx, r * dim + k, a.accumulate ? at(a.dx, r * dim + k) + g[size_t(k)] : g[size_t(k)]);
  }
}

void swiglu_backward(const SwigluBackwardArgs& a) {
  for (int64_t i = 0; i < a.gate.numel(); ++i) {
    const double g = at(a.gate, i), u = at(a.up, i), d = at(a.d_out, i);
    const double sig = 1.0 / (1.0 + std::exp(-g));
    put(a.d_up, i, d * g * sig);
    put(a.d_gate, i, d * u * (sig + g * sig * (1.0 - sig)));
  }
}

void embedding_backward(const EmbeddingBackwardArgs& a) {
  const int64_t n = a.tokens.shape[0], dim = a.d_table.shape[1];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i)
      add(a.d_table, a.tokens.ptr<const int32_t>()[t] * dim + i, at(a.d_out, t * dim + i));
}

}  // namespace lathe::ref
