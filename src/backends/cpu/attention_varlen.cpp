// Training attention over packed documents on the CPU (src/ops/attention.h,
// AttentionVarlenArgs). Work is cut into query blocks of kAttentionBlockRows
// rows of one head of one document; a block sees the keys from the window
// start (or the document start) up to its last row, and runs as sgemms:
//   forward   S = scale·Q·Kᵀ, P = softmax(mask(S)), O = P·V, lse per row
//   backward  P = exp(S − lse), dP = dO·Vᵀ, dS = P⊙(dP − rowsum(dO⊙O)),
//             dV += Pᵀ·dO, dQ = scale·dS·K, dK += scale·dSᵀ·Q
// Forward tasks are (document, head); backward tasks are (document, kv head)
// so that each task owns the dK and dV rows it accumulates. Each thread uses
// its own slice of the workspace. With AVX-512 the exps run 16 at a time
// in f64 (as exact as libm's expf once rounded) and row sums are kept in f64.
// With bf16_products (bf16-mixed) the call goes to the AMX kernel
// (attention_amx.h) where the bf16 GEMM path is AMX; elsewhere it stays
// here, with f32 exps (within 2 ulp) and f32 row sums.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/attention_amx.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm_bf16.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/simd.h"
#include "core/parallel.h"

namespace lathe::cpu {
namespace {

constexpr int64_t kB = kAttentionBlockRows;

struct Layout {
  int64_t n_head, n_head_kv, head_dim, group, ldq, ldk;
  const int32_t* cu;
  int64_t n_docs, longest;
  int window;
  float scale;
  bool f32_exp;  // bf16-mixed: exps in f32

  Layout(const TensorView& q, const TensorView& k, const TensorView& cu_seqlens, int win, float sc, bool bf16)
      : n_head(q.shape[1]), n_head_kv(k.shape[1]), head_dim(q.shape[2]), group(n_head / n_head_kv),
        ldq(n_head * head_dim), ldk(n_head_kv * head_dim), cu(cu_seqlens.ptr<const int32_t>()),
        n_docs(cu_seqlens.shape[0] - 1), longest(0), window(win), scale(sc), f32_exp(bf16) {
    for (int64_t d = 0; d < n_docs; ++d) longest = std::max<int64_t>(longest, cu[d + 1] - cu[d]);
  }
  // First key visible to row i of a document.
  int64_t first_key(int64_t i) const { return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0; }
  int threads_for(int64_t tasks, const TensorView& ws) const {
    int64_t per = attention_varlen_workspace_floats(longest, 1);
    return int(std::max<int64_t>(1, std::min<int64_t>({int64_t(num_threads()), ws.numel() / per, tasks})));
  }
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (see simd.h)
#pragma GCC diagnostic ignored "-Wuninitialized"

bool vector_exp() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return supported && has_avx2();  // has_avx2() is false while the portable kernels are forced
}

// s[j] = exp(s[j] − shift) for j in [lo, hi]; returns Σ of the exps (in
// double, before rounding). The exps are libm's quality (simd.h).
__attribute__((target("avx512f,avx512dq"))) double exp_shifted_avx512(float* s, int64_t lo, int64_t hi,
                                                                       float shift) {
  const __m512 vs = _mm512_set1_ps(shift), neg_inf = _mm512_set1_ps(-INFINITY);
  __m512d acc = _mm512_setzero_pd();
  for (int64_t j = lo; j <= hi; j += 16) {
    const int64_t left = hi + 1 - j;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m512 x = _mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, m, s + j), vs);  // masked lanes: e^−∞ = 0
    const __m512d e0 = simd::exp_nonpositive_f64(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    const __m512d e1 = simd::exp_nonpositive_f64(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)));
    acc = _mm512_add_pd(acc, _mm512_add_pd(e0, e1));
    const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(e0)), _mm512_cvtpd_ps(e1), 1);
    _mm512_mask_storeu_ps(s + j, m, e);
  }
  return _mm512_reduce_add_pd(acc);
}

// The same with f32 exps (simd::exp_nonpositive, within 2 ulp) and an f32 sum.
__attribute__((target("avx512f,avx512dq"))) float exp_shifted_f32(float* s, int64_t lo, int64_t hi, float shift) {
  const __m512 vs = _mm512_set1_ps(shift), neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = lo; j <= hi; j += 16) {
    const int64_t left = hi + 1 - j;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m512 x = _mm512_sub_ps(_mm512_mask_loadu_ps(neg_inf, m, s + j), vs);
    const __m512 e = _mm512_maskz_mov_ps(m, simd::exp_nonpositive(_mm512_min_ps(x, _mm512_setzero_ps())));
    acc = _mm512_add_ps(acc, e);
    _mm512_mask_storeu_ps(s + j, m, e);
  }
  return _mm512_reduce_add_ps(acc);
}

#pragma GCC diagnostic pop

// Scores of query rows [i0, i0 + rows) against keys [j0, i0 + rows) into s
// (leading dimension nk), turned into probabilities: masked entries are 0.
// With lse_in the row normalizers are given (backward); else they are
// computed and written to lse_out.
void block_probs(const Layout& L, const float* q, const float* k, int64_t i0, int64_t rows, int64_t j0, float* s,
                 const float* lse_in, float* lse_out, int64_t lse_stride) {
  const int64_t nk = i0 + rows - j0;
  const bool vec = vector_exp();
  sgemm(false, true, rows, nk, L.head_dim, L.scale, q + i0 * L.ldq, L.ldq, k + j0 * L.ldk, L.ldk, 0.0f, s, nk);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r, lo = L.first_key(i) - j0, hi = i - j0;  // visible: [lo, hi]
    float* sr = s + r * nk;
    if (lse_in) {
      const float l = lse_in[i * lse_stride];
      if (vec && L.f32_exp)
        exp_shifted_f32(sr, lo, hi, l);
      else if (vec)
        exp_shifted_avx512(sr, lo, hi, l);
      else
        for (int64_t j = lo; j <= hi; ++j) sr[j] = std::exp(sr[j] - l);
    } else {
      float m = -INFINITY;
      for (int64_t j = lo; j <= hi; ++j) m = std::max(m, sr[j]);
      float inv, log_sum;
      if (vec && L.f32_exp) {
        const float sum = exp_shifted_f32(sr, lo, hi, m);
        inv = 1.0f / sum;
        log_sum = std::log(sum);
      } else if (vec) {
        const double sum = exp_shifted_avx512(sr, lo, hi, m);
        inv = float(1.0 / sum);
        log_sum = float(std::log(sum));
      } else {
        float sum = 0;
        for (int64_t j = lo; j <= hi; ++j) sum += (sr[j] = std::exp(sr[j] - m));
        inv = 1.0f / sum;
        log_sum = std::log(sum);
      }
      for (int64_t j = lo; j <= hi; ++j) sr[j] *= inv;
      lse_out[i * lse_stride] = m + log_sum;
    }
    for (int64_t j = 0; j < lo; ++j) sr[j] = 0.0f;
    for (int64_t j = hi + 1; j < nk; ++j) sr[j] = 0.0f;
  }
}

void forward_head(const Layout& L, const AttentionVarlenArgs& a, int64_t d, int64_t h, float* ws) {
  const int64_t s0 = L.cu[d], len = L.cu[d + 1] - s0, kvh = h / L.group;
  const float* q = a.q.ptr<const float>() + s0 * L.ldq + h * L.head_dim;
  const float* k = a.k.ptr<const float>() + s0 * L.ldk + kvh * L.head_dim;
  const float* v = a.v.ptr<const float>() + s0 * L.ldk + kvh * L.head_dim;
  float* o = a.out.ptr<float>() + s0 * L.ldq + h * L.head_dim;
  float* lse = a.lse.ptr<float>() + s0 * L.n_head + h;
  for (int64_t i0 = 0; i0 < len; i0 += kB) {
    const int64_t rows = std::min(kB, len - i0), j0 = L.first_key(i0), nk = i0 + rows - j0;
    block_probs(L, q, k, i0, rows, j0, ws, nullptr, lse, L.n_head);
    sgemm(false, false, rows, L.head_dim, nk, 1.0f, ws, nk, v + j0 * L.ldk, L.ldk, 0.0f, o + i0 * L.ldq, L.ldq);
  }
}

void backward_kv_head(const Layout& L, const AttentionVarlenBackwardArgs& a, int64_t d, int64_t kvh, float* ws) {
  const int64_t s0 = L.cu[d], len = L.cu[d + 1] - s0, hd = L.head_dim;
  const float* k = a.k.ptr<const float>() + s0 * L.ldk + kvh * hd;
  const float* v = a.v.ptr<const float>() + s0 * L.ldk + kvh * hd;
  float* dk = a.d_k.ptr<float>() + s0 * L.ldk + kvh * hd;
  float* dv = a.d_v.ptr<float>() + s0 * L.ldk + kvh * hd;
  for (int64_t j = 0; j < len; ++j) {
    std::memset(dk + j * L.ldk, 0, sizeof(float) * size_t(hd));
    std::memset(dv + j * L.ldk, 0, sizeof(float) * size_t(hd));
  }
  float* p = ws;
  float* dp = ws + kB * L.longest;
  float* rowdot = dp + kB * L.longest;
  for (int64_t h = kvh * L.group; h < (kvh + 1) * L.group; ++h) {
    const int64_t off = s0 * L.ldq + h * hd;
    const float* q = a.q.ptr<const float>() + off;
    const float* o = a.out.ptr<const float>() + off;
    const float* dout = a.d_out.ptr<const float>() + off;
    float* dq = a.d_q.ptr<float>() + off;
    const float* lse = a.lse.ptr<const float>() + s0 * L.n_head + h;
    for (int64_t i0 = 0; i0 < len; i0 += kB) {
      const int64_t rows = std::min(kB, len - i0), j0 = L.first_key(i0), nk = i0 + rows - j0;
      block_probs(L, q, k, i0, rows, j0, p, lse, nullptr, L.n_head);
      sgemm(false, true, rows, nk, hd, 1.0f, dout + i0 * L.ldq, L.ldq, v + j0 * L.ldk, L.ldk, 0.0f, dp, nk);
      for (int64_t r = 0; r < rows; ++r) {
        const float* orow = o + (i0 + r) * L.ldq;
        const float* drow = dout + (i0 + r) * L.ldq;
        float acc = 0;
        for (int64_t c = 0; c < hd; ++c) acc += orow[c] * drow[c];
        rowdot[r] = acc;
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < nk; ++j) dp[r * nk + j] = p[r * nk + j] * (dp[r * nk + j] - rowdot[r]);
      sgemm(true, false, nk, hd, rows, 1.0f, p, nk, dout + i0 * L.ldq, L.ldq, 1.0f, dv + j0 * L.ldk, L.ldk);
      sgemm(false, false, rows, hd, nk, L.scale, dp, nk, k + j0 * L.ldk, L.ldk, 0.0f, dq + i0 * L.ldq, L.ldq);
      sgemm(true, false, nk, hd, rows, L.scale, dp, nk, q + i0 * L.ldq, L.ldq, 1.0f, dk + j0 * L.ldk, L.ldk);
    }
  }
}

}  // namespace

Status attention_varlen_forward(const AttentionVarlenArgs& a) {
  LATHE_TRY(validate(a));
  const Layout L(a.q, a.k, a.cu_seqlens, a.window, a.scale, a.bf16_products);
  if (L.n_docs * L.n_head == 0 || a.q.shape[0] == 0) return Status::ok();
  if (a.bf16_products && bf16_gemm_path() == Bf16GemmPath::kAmx &&
      attention_amx_fits(L.head_dim, L.window, L.longest)) {
    attention_varlen_forward_amx(a, AmxTiles::kHardware);
    return Status::ok();
  }
  const int64_t tasks = L.n_docs * L.n_head, per = attention_varlen_workspace_floats(L.longest, 1);
  if (tasks == 0 || a.q.shape[0] == 0) return Status::ok();
  const int threads = L.threads_for(tasks, a.workspace);
  float* ws = a.workspace.ptr<float>();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (int64_t t = 0; t < tasks; ++t) forward_head(L, a, t / L.n_head, t % L.n_head, ws + omp_get_thread_num() * per);
  return Status::ok();
}

Status attention_varlen_backward(const AttentionVarlenBackwardArgs& a) {
  LATHE_TRY(validate(a));
  const Layout L(a.q, a.k, a.cu_seqlens, a.window, a.scale, a.bf16_products);
  if (L.n_docs * L.n_head_kv == 0 || a.q.shape[0] == 0) return Status::ok();
  if (a.bf16_products && bf16_gemm_path() == Bf16GemmPath::kAmx &&
      attention_amx_fits(L.head_dim, L.window, L.longest)) {
    attention_varlen_backward_amx(a, AmxTiles::kHardware);
    return Status::ok();
  }
  const int64_t tasks = L.n_docs * L.n_head_kv, per = attention_varlen_workspace_floats(L.longest, 1);
  if (tasks == 0 || a.q.shape[0] == 0) return Status::ok();
  const int threads = L.threads_for(tasks, a.workspace);
  float* ws = a.workspace.ptr<float>();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
  for (int64_t t = 0; t < tasks; ++t)
    backward_kv_head(L, a, t / L.n_head_kv, t % L.n_head_kv, ws + omp_get_thread_num() * per);
  return Status::ok();
}

}  // namespace lathe::cpu
