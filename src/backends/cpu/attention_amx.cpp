// Training attention on AMX tiles (see attention_amx.h). Every product runs
// through gemm_amx's micro-kernel (a 32 x 32 block of f32 sums over k tiles
// of 32), so the operands are packed here into its two layouts:
//   A (rows x k): row pair p, k tile t at (p · kt + t) · 1024 bf16; each
//     tile 16 rows of 32 consecutive k;
//   B (n columns x k): column pair q, k tile t at (q · kt + t) · 512 words;
//     tile row p holds per column the pair (k 2p, k 2p + 1), low half even.
// Positions (queries or keys) come in tiles of 32, padded with zeros: a
// padded query row has P = dS = 0 and is never stored, a padded key column
// is masked like a future key. Per query block of 32 rows the scores land
// in an f32 strip [32 x visible keys]; softmax (forward) or P and dS
// (backward) are formed in place; P and dS then go to bf16, by rows for
// O = P·V and dQ = dS·K, and transposed (16 x 16 lane transposes) for
// dV = Pᵀ·dO and dK = dSᵀ·Q, which run per key pair after the last query
// block, each over every query tile that sees it, so dK and dV are stored
// once per head rather than accumulated per block.
#include "backends/cpu/attention_amx.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/simd.h"
#include "core/parallel.h"

#define LATHE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace lathe::cpu {
namespace {

constexpr int64_t kT = 32;          // positions per tile step, rows per block
constexpr int64_t kStepA = 1024;    // bf16 per A step (two tiles)
constexpr int64_t kStepB = 512;     // words per B step (two tiles)

struct Layout {
  int64_t n_head, n_head_kv, hd, ht, group, ldq, ldk;
  const int32_t* cu;
  int64_t n_docs;
  float scale;

  Layout(const TensorView& q, const TensorView& k, const TensorView& cu_seqlens, float sc)
      : n_head(q.shape[1]), n_head_kv(k.shape[1]), hd(q.shape[2]), ht(hd / kT), group(n_head / n_head_kv),
        ldq(n_head * hd), ldk(n_head_kv * hd), cu(cu_seqlens.ptr<const int32_t>()), n_docs(cu_seqlens.shape[0] - 1),
        scale(sc) {}
};

// One thread's packed operands and strips, kept from call to call.
struct Workspace {
  std::vector<uint16_t> qa, doa, pa, dsa, pta, dsta;
  std::vector<uint32_t> kb, vb, kkn, qkn, dokn;
  std::vector<float> s, dp, tmp;

  void size_for(int64_t lp, int64_t hd) {
    for (auto* v : {&qa, &doa}) v->resize(size_t(lp * hd));
    for (auto* v : {&pa, &dsa}) v->resize(size_t(kT * lp));
    for (auto* v : {&pta, &dsta}) v->resize(size_t(lp * lp));
    for (auto* v : {&kb, &vb, &kkn, &qkn, &dokn}) v->resize(size_t(lp * hd / 2));
    for (auto* v : {&s, &dp}) v->resize(size_t(kT * lp));
    tmp.resize(size_t(kT * hd));
  }
};

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : 0; }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (see simd.h)
#pragma GCC diagnostic ignored "-Wuninitialized"

// 32 values of row src[0, left) (zero past left) as bf16.
LATHE_AVX512BF16 inline __m512i bf16_row32(const float* src, int64_t left) {
  const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), src);
  const __m512 hi = left > 16 ? _mm512_maskz_loadu_ps(mask16(left - 16), src + 16) : _mm512_setzero_ps();
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// A layout of src [rows, k] (leading dimension ld), rows padded to pairs.
LATHE_AVX512BF16 void pack_a(const float* src, int64_t ld, int64_t rows, int64_t k, int64_t kt, uint16_t* dst) {
  const int64_t pairs = (rows + kT - 1) / kT, tiles = (k + kT - 1) / kT;
  for (int64_t i = 0; i < pairs * kT; ++i) {
    uint16_t* base = dst + (i / kT) * kt * kStepA + ((i % kT) / 16) * 512 + (i % 16) * kT;
    for (int64_t t = 0; t < tiles; ++t)
      _mm512_storeu_si512(base + t * kStepA,
                          i < rows ? bf16_row32(src + i * ld + t * kT, k - t * kT) : _mm512_setzero_si512());
  }
}

// Step ip of the A layout of srcᵀ: src is a strip [32, nkp · 32] (query
// rows of block ip, every row readable), its column pair jp becomes row
// pair jp's k tile ip.
LATHE_AVX512BF16 void pack_a_transposed(const float* src, int64_t ld, int64_t nkp, int64_t ip, int64_t kt,
                                        uint16_t* dst) {
  for (int64_t jp = 0; jp < nkp; ++jp)
    for (int h = 0; h < 2; ++h) {
      __m512i lo[16], hi[16];
      const float* s = src + jp * kT + h * 16;
      for (int r = 0; r < 16; ++r) {
        lo[r] = _mm512_castps_si512(_mm512_loadu_ps(s + r * ld));
        hi[r] = _mm512_castps_si512(_mm512_loadu_ps(s + (16 + r) * ld));
      }
      simd::transpose16(lo);
      simd::transpose16(hi);
      uint16_t* tile = dst + (jp * kt + ip) * kStepA + h * 512;
      for (int r = 0; r < 16; ++r)
        _mm512_storeu_si512(tile + r * kT,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi[r]), _mm512_castsi512_ps(lo[r])));
    }
}

// B layout with n = positions: src [n, k] by rows (K or V for Q·Kᵀ, dO·Vᵀ).
LATHE_AVX512BF16 void pack_b_nk(const float* src, int64_t ld, int64_t n, int64_t k, uint32_t* dst) {
  const int64_t panels = (n + kT - 1) / kT * 2, kt = (k + kT - 1) / kT;
  for (int64_t q = 0; q < panels; ++q)
    for (int64_t t = 0; t < kt; ++t) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t pos = q * 16 + j;
        r[j] = pos < n ? bf16_row32(src + pos * ld + t * kT, k - t * kT) : _mm512_setzero_si512();
      }
      simd::transpose16(r);
      uint32_t* tile = dst + ((q / 2) * kt + t) * kStepB + (q % 2) * 256;
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(tile + p * 16, r[p]);
    }
}

// B layout with k = positions: src [k, n] by rows (V, K, Q, dO as the right
// operand of P·V, dS·K, dSᵀ·Q, Pᵀ·dO); kt is the step stride.
LATHE_AVX512BF16 void pack_b_kn(const float* src, int64_t ld, int64_t k, int64_t n, int64_t kt, uint32_t* dst) {
  const int64_t panels = (n + kT - 1) / kT * 2, tiles = (k + kT - 1) / kT;
  for (int64_t q = 0; q < panels; ++q) {
    const __mmask16 cm = mask16(n - q * 16);
    for (int64_t t = 0; t < tiles; ++t) {
      uint32_t* tile = dst + ((q / 2) * kt + t) * kStepB + (q % 2) * 256;
      for (int p = 0; p < 16; ++p) {
        const int64_t e = t * kT + 2 * p;
        const __m512 r0 = e < k ? _mm512_maskz_loadu_ps(cm, src + e * ld + q * 16) : _mm512_setzero_ps();
        const __m512 r1 = e + 1 < k ? _mm512_maskz_loadu_ps(cm, src + (e + 1) * ld + q * 16) : _mm512_setzero_ps();
        const __m512i w0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(r0));
        const __m512i w1 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(r1));
        _mm512_storeu_si512(tile + p * 16, _mm512_or_si512(w0, _mm512_slli_epi32(w1, 16)));
      }
    }
  }
}

// Forward softmax of one score row s[0, width) (width a multiple of 16):
// the first vis entries are visible. s becomes P (0 where masked); returns
// the row's lse of scale · s.
LATHE_AVX512BF16 float softmax_row(float* s, int64_t vis, int64_t width, float scale) {
  const __m512 vsc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
  __m512 vmax = ninf;
  for (int64_t j = 0; j < vis; j += 16)
    vmax = _mm512_max_ps(vmax, _mm512_mul_ps(_mm512_mask_loadu_ps(ninf, mask16(vis - j), s + j), vsc));
  const float m = _mm512_reduce_max_ps(vmax);
  const __m512 vm = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < width; j += 16) {
    const __mmask16 mk = mask16(vis - j);
    const __m512 x = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), vsc), vm);
    const __m512 e = _mm512_maskz_mov_ps(mk, simd::exp_nonpositive(_mm512_mask_mov_ps(ninf, mk, x)));
    acc = _mm512_add_ps(acc, e);
    _mm512_storeu_ps(s + j, e);
  }
  const float sum = _mm512_reduce_add_ps(acc);
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (int64_t j = 0; j < vis; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
  return m + std::log(sum);
}

// Backward of one row: s (scores) becomes P = exp(scale · s − lse), dp
// becomes dS = P ⊙ (dP − rowdot); both 0 past vis.
LATHE_AVX512BF16 void grad_row(float* s, float* dp, int64_t vis, int64_t width, float scale, float lse, float rowdot) {
  const __m512 vsc = _mm512_set1_ps(scale), vl = _mm512_set1_ps(lse), vd = _mm512_set1_ps(rowdot);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < width; j += 16) {
    const __mmask16 mk = mask16(vis - j);
    const __m512 x = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(s + j), vsc), vl);
    const __m512 p = _mm512_maskz_mov_ps(mk, simd::exp_nonpositive(_mm512_mask_mov_ps(ninf, mk, _mm512_min_ps(x, _mm512_setzero_ps()))));
    _mm512_storeu_ps(s + j, p);
    _mm512_storeu_ps(dp + j, _mm512_maskz_mul_ps(mk, p, _mm512_sub_ps(_mm512_loadu_ps(dp + j), vd)));
  }
}

LATHE_AVX512BF16 float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16)
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask16(n - c), a + c), _mm512_maskz_loadu_ps(mask16(n - c), b + c), acc);
  return _mm512_reduce_add_ps(acc);
}

// rows of dst (leading dimension ld) = alpha · tmp [rows, n] (+ dst when add).
LATHE_AVX512BF16 void store_rows(const float* tmp, int64_t n, int64_t rows, float alpha, bool add, float* dst,
                                 int64_t ld) {
  const __m512 va = _mm512_set1_ps(alpha);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; c += 16) {
      __m512 v = _mm512_mul_ps(_mm512_loadu_ps(tmp + r * n + c), va);
      if (add) v = _mm512_add_ps(v, _mm512_loadu_ps(dst + r * ld + c));
      _mm512_storeu_ps(dst + r * ld + c, v);
    }
}

#pragma GCC diagnostic pop

void forward_task(const Layout& L, const AttentionVarlenArgs& a, int64_t d, int64_t h, AmxBlockFn block,
                  Workspace& w) {
  const int64_t s0 = L.cu[d], len = L.cu[d + 1] - s0, hd = L.hd, ht = L.ht, kvh = h / L.group;
  if (len == 0) return;
  const int64_t lt = (len + kT - 1) / kT, lp = lt * kT;
  const float* q = a.q.ptr<const float>() + s0 * L.ldq + h * hd;
  const float* k = a.k.ptr<const float>() + s0 * L.ldk + kvh * hd;
  const float* v = a.v.ptr<const float>() + s0 * L.ldk + kvh * hd;
  float* o = a.out.ptr<float>() + s0 * L.ldq + h * hd;
  float* lse = a.lse.ptr<float>() + s0 * L.n_head + h;
  w.size_for(lp, hd);
  pack_a(q, L.ldq, len, hd, ht, w.qa.data());
  pack_b_nk(k, L.ldk, len, hd, w.kb.data());
  pack_b_kn(v, L.ldk, len, hd, lt, w.vb.data());
  float* s = w.s.data();
  for (int64_t ip = 0; ip < lt; ++ip) {
    const int64_t rows = std::min(kT, len - ip * kT), nkp = ip + 1, width = nkp * kT;
    for (int64_t jp = 0; jp < nkp; ++jp)
      block(w.qa.data() + ip * ht * kStepA, w.kb.data() + jp * ht * kStepB, ht, s + jp * kT, lp);
    for (int64_t r = 0; r < kT; ++r) {
      float* sr = s + r * lp;
      if (r >= rows)
        std::fill(sr, sr + width, 0.0f);
      else
        lse[(ip * kT + r) * L.n_head] = softmax_row(sr, ip * kT + r + 1, width, L.scale);
    }
    pack_a(s, lp, kT, width, nkp, w.pa.data());
    for (int64_t c = 0; c < ht; ++c) block(w.pa.data(), w.vb.data() + c * lt * kStepB, nkp, w.tmp.data() + c * kT, hd);
    store_rows(w.tmp.data(), hd, rows, 1.0f, false, o + ip * kT * L.ldq, L.ldq);
  }
}

// Query head h's part of its kv head's backward: dQ of h stored, the
// strips Pᵀ and dSᵀ of every block left packed in w for dK and dV.
void backward_head_blocks(const Layout& L, const AttentionVarlenBackwardArgs& a, int64_t s0, int64_t len, int64_t h,
                          AmxBlockFn block, Workspace& w) {
  const int64_t hd = L.hd, ht = L.ht, lt = (len + kT - 1) / kT, lp = lt * kT, off = s0 * L.ldq + h * hd;
  const float* o = a.out.ptr<const float>() + off;
  const float* dout = a.d_out.ptr<const float>() + off;
  float* dq = a.d_q.ptr<float>() + off;
  const float* lse = a.lse.ptr<const float>() + s0 * L.n_head + h;
  float *s = w.s.data(), *dp = w.dp.data();
  for (int64_t ip = 0; ip < lt; ++ip) {
    const int64_t rows = std::min(kT, len - ip * kT), nkp = ip + 1, width = nkp * kT;
    for (int64_t jp = 0; jp < nkp; ++jp) {
      block(w.qa.data() + ip * ht * kStepA, w.kb.data() + jp * ht * kStepB, ht, s + jp * kT, lp);
      block(w.doa.data() + ip * ht * kStepA, w.vb.data() + jp * ht * kStepB, ht, dp + jp * kT, lp);
    }
    for (int64_t r = 0; r < kT; ++r) {
      float *sr = s + r * lp, *dr = dp + r * lp;
      const int64_t i = ip * kT + r;
      if (r >= rows) {
        std::fill(sr, sr + width, 0.0f);
        std::fill(dr, dr + width, 0.0f);
        continue;
      }
      grad_row(sr, dr, i + 1, width, L.scale, lse[i * L.n_head], dot(o + i * L.ldq, dout + i * L.ldq, hd));
    }
    pack_a_transposed(s, lp, nkp, ip, lt, w.pta.data());
    pack_a_transposed(dp, lp, nkp, ip, lt, w.dsta.data());
    pack_a(dp, lp, kT, width, nkp, w.dsa.data());
    for (int64_t c = 0; c < ht; ++c)
      block(w.dsa.data(), w.kkn.data() + c * lt * kStepB, nkp, w.tmp.data() + c * kT, hd);
    store_rows(w.tmp.data(), hd, rows, L.scale, false, dq + ip * kT * L.ldq, L.ldq);
  }
}

void backward_task(const Layout& L, const AttentionVarlenBackwardArgs& a, int64_t d, int64_t kvh, AmxBlockFn block,
                   Workspace& w) {
  const int64_t s0 = L.cu[d], len = L.cu[d + 1] - s0, hd = L.hd, ht = L.ht;
  if (len == 0) return;
  const int64_t lt = (len + kT - 1) / kT, lp = lt * kT;
  const float* k = a.k.ptr<const float>() + s0 * L.ldk + kvh * hd;
  const float* v = a.v.ptr<const float>() + s0 * L.ldk + kvh * hd;
  float* dk = a.d_k.ptr<float>() + s0 * L.ldk + kvh * hd;
  float* dv = a.d_v.ptr<float>() + s0 * L.ldk + kvh * hd;
  w.size_for(lp, hd);
  pack_b_nk(k, L.ldk, len, hd, w.kb.data());
  pack_b_nk(v, L.ldk, len, hd, w.vb.data());
  pack_b_kn(k, L.ldk, len, hd, lt, w.kkn.data());
  for (int64_t h = kvh * L.group; h < (kvh + 1) * L.group; ++h) {
    const int64_t off = s0 * L.ldq + h * hd;
    const float* q = a.q.ptr<const float>() + off;
    const float* dout = a.d_out.ptr<const float>() + off;
    pack_a(q, L.ldq, len, hd, ht, w.qa.data());
    pack_a(dout, L.ldq, len, hd, ht, w.doa.data());
    pack_b_kn(q, L.ldq, len, hd, lt, w.qkn.data());
    pack_b_kn(dout, L.ldq, len, hd, lt, w.dokn.data());
    backward_head_blocks(L, a, s0, len, h, block, w);
    const bool add = h > kvh * L.group;
    for (int64_t jp = 0; jp < lt; ++jp) {
      const int64_t keys = std::min(kT, len - jp * kT), steps = lt - jp;
      for (int64_t c = 0; c < ht; ++c)
        block(w.pta.data() + (jp * lt + jp) * kStepA, w.dokn.data() + (c * lt + jp) * kStepB, steps,
              w.tmp.data() + c * kT, hd);
      store_rows(w.tmp.data(), hd, keys, 1.0f, add, dv + jp * kT * L.ldk, L.ldk);
      for (int64_t c = 0; c < ht; ++c)
        block(w.dsta.data() + (jp * lt + jp) * kStepA, w.qkn.data() + (c * lt + jp) * kStepB, steps,
              w.tmp.data() + c * kT, hd);
      store_rows(w.tmp.data(), hd, keys, L.scale, add, dk + jp * kT * L.ldk, L.ldk);
    }
  }
}

// Runs task(t, workspace) for t in [0, tasks) over the threads, each thread
// holding the tile configuration for its share.
template <typename Task>
void run_tasks(int64_t tasks, AmxTiles tiles, const Task& task) {
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(num_threads(), tasks)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    thread_local Workspace w;
    amx_thread_begin(tiles);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) task(t, w);
    amx_thread_end(tiles);
  }
}

}  // namespace

bool attention_amx_fits(int64_t head_dim, int window, int64_t longest) {
  return head_dim > 0 && head_dim % kT == 0 && head_dim <= 256 && (window == 0 || window >= longest);
}

void attention_varlen_forward_amx(const AttentionVarlenArgs& a, AmxTiles tiles) {
  const Layout L(a.q, a.k, a.cu_seqlens, a.scale);
  const AmxBlockFn block = amx_block_kernel(tiles);
  run_tasks(L.n_docs * L.n_head, tiles,
            [&](int64_t t, Workspace& w) { forward_task(L, a, t / L.n_head, t % L.n_head, block, w); });
}

void attention_varlen_backward_amx(const AttentionVarlenBackwardArgs& a, AmxTiles tiles) {
  const Layout L(a.q, a.k, a.cu_seqlens, a.scale);
  const AmxBlockFn block = amx_block_kernel(tiles);
  run_tasks(L.n_docs * L.n_head_kv, tiles,
            [&](int64_t t, Workspace& w) { backward_task(L, a, t / L.n_head_kv, t % L.n_head_kv, block, w); });
}

}  // namespace lathe::cpu
