// Reference packed attention: each document on its own, each query row's
// softmax over its visible keys recomputed from scratch in double; the
// backward applies the softmax Jacobian row by row.
#include <cmath>
#include <vector>

#include "ops/reference/reference.h"

namespace lathe::ref {
namespace {

struct Geometry {
  int64_t n_head, n_kv, d;
  const int32_t* cu;
  int64_t n_docs;
  int window;
  double scale;
};

// Probabilities of query row t, head h over keys [j0, t] of its document.
std::vector<double> probs(const Geometry& g, const TensorView& q, const TensorView& k, int64_t t, int64_t h,
                          int64_t j0, double* lse) {
  const int64_t kvh = h / (g.n_head / g.n_kv);
  std::vector<double> p;
  double m = -INFINITY;
  for (int64_t j = j0; j <= t; ++j) {
    double s = 0;
    for (int64_t i = 0; i < g.d; ++i) s += at(q, (t * g.n_head + h) * g.d + i) * at(k, (j * g.n_kv + kvh) * g.d + i);
    p.push_back(s * g.scale);
    m = std::max(m, p.back());
  }
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - m));
  for (double& x : p) x /= sum;
  if (lse) *lse = m + std::log(sum);
  return p;
}

template <class Fn>
void each_row(const Geometry& g, Fn&& fn) {
  for (int64_t doc = 0; doc < g.n_docs; ++doc)
    for (int64_t t = g.cu[doc]; t < g.cu[doc + 1]; ++t) {
      int64_t j0 = g.cu[doc];
      if (g.window > 0) j0 = std::max<int64_t>(j0, t - g.window + 1);
      for (int64_t h = 0; h < g.n_head; ++h) fn(t, h, j0);
    }
}

}  // namespace

void attention_varlen_forward(const AttentionVarlenArgs& a) {
  Geometry g{a.q.shape[1], a.k.shape[1], a.q.shape[2], a.cu_seqlens.ptr<const int32_t>(),
             a.cu_seqlens.shape[0] - 1, a.window, a.scale};
  each_row(g, [&](int64_t t, int64_t h, int64_t j0) {
    double lse = 0;
    std::vector<double> p = probs(g, a.q, a.k, t, h, j0, &lse);
    const int64_t kvh = h / (g.n_head / g.n_kv);
    for (int64_t i = 0; i < g.d; ++i) {
      double o = 0;
      for (int64_t j = j0; j <= t; ++j) o += p[size_t(j - j0)] * at(a.v, (j * g.n_kv + kvh) * g.d + i);
      put(a.out, (t * g.n_head + h) * g.d + i, o);
    }
    put(a.lse, t * g.n_head + h, lse);
  });
}

void attention_varlen_backward(const AttentionVarlenBackwardArgs& a) {
  Geometry g{a.q.shape[1], a.k.shape[1], a.q.shape[2], a.cu_seqlens.ptr<const int32_t>(),
             a.cu_seqlens.shape[0] - 1, a.window, a.scale};
  for (const TensorView* v : {&a.d_q, &a.d_k, &a.d_v})
    for (int64_t i = 0; i < v->numel(); ++i) put(*v, i, 0.0);
  each_row(g, [&](int64_t t, int64_t h, int64_t j0) {
    std::vector<double> p = probs(g, a.q, a.k, t, h, j0, nullptr);
    const int64_t kvh = h / (g.n_head / g.n_kv), row = (t * g.n_head + h) * g.d;
    // dp_j = dO·v_j; ds_j = p_j (dp_j − Σ_l p_l dp_l)
    std::vector<double> dp(p.size());
    double mean = 0;
    for (int64_t j = j0; j <= t; ++j) {
      double s = 0;
      for (int64_t i = 0; i < g.d; ++i) s += at(a.d_out, row + i) * at(a.v, (j * g.n_kv + kvh) * g.d + i);
      dp[size_t(j - j0)] = s;
      mean += p[size_t(j - j0)] * s;
    }
    for (int64_t j = j0; j <= t; ++j) {
      const double pj = p[size_t(j - j0)], ds = pj * (dp[size_t(j - j0)] - mean) * g.scale;
      const int64_t kr = (j * g.n_kv + kvh) * g.d;
      for (int64_t i = 0; i < g.d; ++i) {
        add(a.d_v, kr + i, pj * at(a.d_out, row + i));
        add(a.d_q, row + i, ds * at(a.k, kr + i));
        add(a.d_k, kr + i, ds * at(a.q, row + i));
      }
    }
  });
}

}  // namespace lathe::ref
