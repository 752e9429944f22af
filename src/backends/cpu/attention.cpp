// Causal GQA attention over a KV cache on the CPU. One task per (token,
// query head): scores against the visible keys into this thread's row of the
// workspace, a max-subtracted fp32 softmax, then the weighted sum of values.
// The number of threads is capped by the workspace the caller gave.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/simd.h"

namespace lathe::cpu {
namespace {

struct Attn {
  const AttentionArgs& a;
  int64_t n_head, n_head_kv, head_dim, n_ctx;
  bool vec;

  float dot(const float* p, const float* q) const {
    return vec ? simd::dot_avx2(p, q, head_dim) : simd::dot_portable(p, q, head_dim);
  }
  void axpy(float alpha, const float* x, float* y) const {
    vec ? simd::axpy_avx2(alpha, x, y, head_dim) : simd::axpy_portable(alpha, x, y, head_dim);
  }

  void run(int64_t task, float* scores) const {
    const int64_t t = task / n_head, h = task % n_head;
    const int64_t kvh = h / (n_head / n_head_kv);
    const int64_t pos = a.pos0 + t;
    const int64_t first = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
    const float* q = a.q.ptr<const float>() + (t * n_head + h) * head_dim;
    const float* k = a.k.ptr<const float>();
    const float* v = a.v.ptr<const float>();
    const int64_t kv_stride = n_head_kv * head_dim;
    float m = -INFINITY;
    for (int64_t j = first; j <= pos; ++j) {
      float s = dot(q, k + j * kv_stride + kvh * head_dim) * a.scale;
      scores[j] = s;
      m = std::max(m, s);
    }
    float sum = 0;
    for (int64_t j = first; j <= pos; ++j) {
      scores[j] = std::exp(scores[j] - m);
      sum += scores[j];
    }
    float* out = a.out.ptr<float>() + (t * n_head + h) * head_dim;
    std::memset(out, 0, sizeof(float) * size_t(head_dim));
    const float inv = 1.0f / sum;
    for (int64_t j = first; j <= pos; ++j) axpy(scores[j] * inv, v + j * kv_stride + kvh * head_dim, out);
    if (!a.lse.empty()) a.lse.ptr<float>()[t * n_head + h] = m + std::log(sum);
  }
};

}  // namespace

Status attention_forward(const AttentionArgs& a) {
  LATHE_TRY(validate(a));
  Attn at{a, a.q.shape[1], a.k.shape[1], a.q.shape[2], a.k.shape[0], has_avx2()};
  const int64_t tasks = a.q.shape[0] * at.n_head;
  if (tasks == 0) return Status::ok();
  const int64_t max_threads = std::max<int64_t>(1, a.workspace.numel() / std::max<int64_t>(1, at.n_ctx));
  const int threads = int(std::min<int64_t>({max_threads, int64_t(omp_get_max_threads()), tasks}));
  float* ws = a.workspace.ptr<float>();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && tasks * (a.pos0 + a.q.shape[0]) > 4096)
  for (int64_t task = 0; task < tasks; ++task) at.run(task, ws + int64_t(omp_get_thread_num()) * at.n_ctx);
  return Status::ok();
}

}  // namespace lathe::cpu
