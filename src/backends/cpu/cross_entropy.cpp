// Fused LM head + cross-entropy on the CPU (src/ops/cross_entropy.h),
// chunked over tokens. Per chunk of up to chunk_rows supervised rows:
//   gather hidden rows → logits = H·wᵀ (sgemm) → per row: max, Σ exp (f32
//   runs summed in double), lse, loss = lse − logit[target], and in place the gradient
//   grad_scale·(softmax − onehot) → dH = G·w, dw += Gᵀ·H (sgemms) → scatter dH.
// Workspace layout: logits [chunk, vocab], H [chunk, dim], dH [chunk, dim],
// row losses [chunk], row indices [chunk] (as i32). A bf16 head (frozen)
// takes the bf16 GEMM for logits and dH: hidden rows and the logits'
// gradient are rounded to bf16 as they are packed, sums stay f32; its rows
// take the AVX-512 softmax below (exp within 2 ulp of libm's). The f32 head
// keeps the scalar libm path, so f32 results do not move. A head packed
// ahead (PackedBf16Weight) spares both GEMMs the re-packing of all of w;
// its logits GEMM takes the whole chunk (w streams once per chunk, so larger
// chunks pay), its input gradient 256 rows at a time (with k = vocab, more
// rows push the kernel's working set out of L2). On AMX tiles a packed
// head takes cross_entropy_amx.h instead, which never writes the logits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/cross_entropy_amx.h"
#include "backends/cpu/gemm_bf16.h"
#include "backends/cpu/simd.h"
#include "core/parallel.h"

namespace lathe::cpu {
namespace {

constexpr int64_t kDxRows = 256;  // rows per input-gradient GEMM of a packed head

struct Chunk {
  float* logits;  // [chunk, vocab]
  float* h;       // [chunk, dim]
  float* dh;      // [chunk, dim]
  float* loss;    // [chunk]
  int32_t* rows;  // [chunk]
};

// Softmax statistics and (when grads) the scaled gradient of one logits row,
// in place. One exp per logit: e_j = exp(l_j − max) is kept and rescaled.
float row_loss(float* l, int64_t vocab, int32_t target, bool grads, float scale) {
  float m = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) m = std::max(m, l[j]);
  const float target_logit = l[target];
  double sum = 0;
  float part = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    const float e = std::exp(l[j] - m);
    if (grads) l[j] = e;
    part += e;
    if ((j & 255) == 255) sum += part, part = 0;  // f32 runs of 256, summed in double
  }
  sum += part;
  const float loss = m + float(std::log(sum)) - target_logit;
  if (grads) {
    const float k = float(double(scale) / sum);
    for (int64_t j = 0; j < vocab; ++j) l[j] *= k;
    l[target] -= scale;
  }
  return loss;
}

// GCC 12's AVX-512 headers seed some intrinsics with an undefined vector and
// then warn that it may be uninitialized; the warning is about the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

__attribute__((target("avx512f"))) inline float lanes_max(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  return *std::max_element(t, t + 16);
}

__attribute__((target("avx512f"))) inline double lanes_sum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  double s = 0;
  for (float x : t) s += x;
  return s;
}

// row_loss with 16-lane max, exp and scaling; sums as row_loss does (f32
// runs of 256, then double).
__attribute__((target("avx512f"))) float row_loss_avx512(float* l, int64_t vocab, int32_t target, bool grads,
                                                         float scale) {
  const int64_t vec = vocab / 16 * 16;
  __m512 vm = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < vec; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(l + j));
  float m = lanes_max(vm);
  for (int64_t j = vec; j < vocab; ++j) m = std::max(m, l[j]);
  const float target_logit = l[target];
  const __m512 bm = _mm512_set1_ps(m);
  double sum = 0;
  for (int64_t j0 = 0; j0 < vec; j0 += 256) {
    __m512 part = _mm512_setzero_ps();
    for (int64_t j = j0; j < std::min(j0 + 256, vec); j += 16) {
      const __m512 e = simd::exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(l + j), bm));
      if (grads) _mm512_storeu_ps(l + j, e);
      part = _mm512_add_ps(part, e);
    }
    sum += lanes_sum(part);
  }
  for (int64_t j = vec; j < vocab; ++j) {
    const float e = std::exp(l[j] - m);
    if (grads) l[j] = e;
    sum += e;
  }
  const float loss = m + float(std::log(sum)) - target_logit;
  if (grads) {
    const float k = float(double(scale) / sum);
    const __m512 bk = _mm512_set1_ps(k);
    for (int64_t j = 0; j < vec; j += 16) _mm512_storeu_ps(l + j, _mm512_mul_ps(_mm512_loadu_ps(l + j), bk));
    for (int64_t j = vec; j < vocab; ++j) l[j] *= k;
    l[target] -= scale;
  }
  return loss;
}

#pragma GCC diagnostic pop

}  // namespace

Result<CrossEntropyStats> cross_entropy(const CrossEntropyArgs& a, const PackedBf16Weight* packed_head) {
  LATHE_TRY(validate(a));
  if (packed_head && (a.w.dtype != DType::BF16 || packed_head->weight() != a.w.ptr<const uint16_t>() ||
                      packed_head->out() != a.w.shape[0] || packed_head->in() != a.w.shape[1]))
    return invalid_argument("cross_entropy: the packed head is not w ", a.w.shape.str(), " (", dtype_name(a.w.dtype),
                            ")");
  const int64_t n = a.hidden.shape[0], dim = a.hidden.shape[1], vocab = a.w.shape[0];
  const int64_t chunk = a.chunk_rows > 0 ? a.chunk_rows : cross_entropy_chunk_rows(vocab);
  const bool grads = !a.d_hidden.empty();
  const float* hidden = a.hidden.ptr<const float>();
  const bool bf16 = a.w.dtype == DType::BF16;
  const float* w = bf16 ? nullptr : a.w.ptr<const float>();
  const uint16_t* w16 = bf16 ? a.w.ptr<const uint16_t>() : nullptr;
  const bool vec_softmax = bf16 && has_avx512_bf16();
  const int32_t* targets = a.targets.ptr<const int32_t>();
  float* ws = a.workspace.ptr<float>();
  Chunk c{ws, ws + chunk * vocab, ws + chunk * (vocab + dim), ws + chunk * (vocab + 2 * dim),
          reinterpret_cast<int32_t*>(ws + chunk * (vocab + 2 * dim + 1))};
  if (grads) std::memset(a.d_hidden.data, 0, size_t(a.d_hidden.nbytes()));
  const bool fused = packed_head && packed_head->packed() && a.d_w.empty() && cross_entropy_amx_fits(dim) &&
                     bf16_gemm_path() == Bf16GemmPath::kAmx;
  std::vector<int32_t> fused_targets;
  CrossEntropyStats stats;
  int64_t next = 0;
  while (true) {
    int64_t m = 0;
    for (; next < n && m < chunk; ++next)
      if (targets[next] != kCrossEntropyIgnore) c.rows[m++] = int32_t(next);
    if (m == 0) break;
    for (int64_t r = 0; r < m; ++r) std::memcpy(c.h + r * dim, hidden + c.rows[r] * dim, sizeof(float) * size_t(dim));
    if (fused) {
      std::vector<int32_t>& tg = fused_targets;
      tg.resize(size_t(m));
      for (int64_t r = 0; r < m; ++r) tg[size_t(r)] = targets[c.rows[r]];
      cross_entropy_head_amx(c.h, m, tg.data(), a.grad_scale, *packed_head, c.loss, grads ? c.dh : nullptr);
    } else {
      if (packed_head)
        packed_head->forward(m, 1.0f, c.h, dim, false, c.logits, vocab);
      else if (bf16)
        gemm_bf16(true, m, vocab, dim, 1.0f, c.h, dim, w16, dim, false, c.logits, vocab);
      else
        sgemm(false, true, m, vocab, dim, 1.0f, c.h, dim, w, dim, 0.0f, c.logits, vocab);
      parallel_for(m, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          c.loss[r] = vec_softmax
                          ? row_loss_avx512(c.logits + r * vocab, vocab, targets[c.rows[r]], grads, a.grad_scale)
                          : row_loss(c.logits + r * vocab, vocab, targets[c.rows[r]], grads, a.grad_scale);
      });
    }
    for (int64_t r = 0; r < m; ++r) stats.loss_sum += c.loss[r];
    stats.n_valid += m;
    if (!grads) continue;
    if (fused) {
      // dH is in c.dh already.
    } else if (packed_head) {  // k = vocab: rows kDxRows at a time keep the AMX kernel's blocks of A and C in L2
      for (int64_t r0 = 0; r0 < m; r0 += kDxRows)
        packed_head->backward(std::min(kDxRows, m - r0), 1.0f, c.logits + r0 * vocab, vocab, false, c.dh + r0 * dim,
                              dim);
    } else if (bf16) {
      gemm_bf16(false, m, dim, vocab, 1.0f, c.logits, vocab, w16, dim, false, c.dh, dim);
    } else {
      sgemm(false, false, m, dim, vocab, 1.0f, c.logits, vocab, w, dim, 0.0f, c.dh, dim);
    }
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(a.d_hidden.ptr<float>() + c.rows[r] * dim, c.dh + r * dim, sizeof(float) * size_t(dim));
    if (!a.d_w.empty()) sgemm(true, false, vocab, dim, m, 1.0f, c.logits, vocab, c.h, dim, 1.0f, a.d_w.ptr<float>(), dim);
  }
  return stats;
}

}  // namespace lathe::cpu
