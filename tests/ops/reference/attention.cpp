// Reference attention: for each query row and head, softmax over the visible
// keys (causal, optional sliding window) of q·k * scale, then Σ p v; all in
// double, GQA by integer division of the head index.
#include <cmath>
#include <vector>

#include "ops/reference/reference.h"

namespace lathe::ref {

void attention_forward(const AttentionArgs& a) {
  const int64_t n = a.q.shape[0], n_head = a.q.shape[1], d = a.q.shape[2], n_kv = a.k.shape[1];
  const int64_t group = n_head / n_kv;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t pos = a.pos0 + t, kvh = h / group;
      std::vector<double> p;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j <= pos; ++j) {
        if (a.window > 0 && !(j > pos - a.window)) continue;
        double s = 0;
        for (int64_t i = 0; i < d; ++i) s += at(a.q, (t * n_head + h) * d + i) * at(a.k, (j * n_kv + kvh) * d + i);
        p.push_back(s * a.scale);
        keys.push_back(j);
      }
      double m = -INFINITY, sum = 0;
      for (double s : p) m = std::max(m, s);
      for (double& s : p) sum += (s = std::exp(s - m));
      for (int64_t i = 0; i < d; ++i) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += p[j] / sum * at(a.v, (keys[j] * n_kv + kvh) * d + i);
        a.out.ptr<float>()[(t * n_head + h) * d + i] = float(o);
      }
      if (!a.lse.empty()) a.lse.ptr<float>()[t * n_head + h] = float(m + std::log(sum));
    }
}

}  // namespace lathe::ref
