// The frozen, packed LM head fused with cross-entropy on AMX tiles (see
// cross_entropy_amx.h). The logits never go to memory: the threads split
// the vocabulary (whole column pairs), and each runs over chunks of kRows
// rows, its share a block of kVocabBlock entries at a time:
//   L = h·W_blockᵀ (tiles, f32 in L2);  per row, online softmax: when the
//   row's running max m rises, its Σ and its gradient accumulator are
//   scaled by exp(m_old − m_new); e = exp(L − m) (f32, within 2 ulp) adds
//   to Σ and goes to bf16 in the tiles' A layout;  acc += e·W_block (tiles).
// The shares then merge per row: M = max m_t, Σ = Σ_t Σ_t·exp(m_t − M),
// lse = M + log Σ, loss = lse − logit[target], and
//   dh = scale·(Σ_t acc_t·exp(m_t − M) / Σ − W[target])
// (the one-hot term exactly, from the bf16 weight row). So the head's two
// GEMMs keep their operands in L2 and stream W once per row chunk, where
// materialized logits (4 bytes x rows x vocab) would be written, read back
// and re-packed through memory. Numerics: the products take bf16 operands
// (h and e rounded to nearest-even) with f32 sums, as the unfused bf16 head;
// e is relative to the running max instead of the row's, and Σ runs in f32
// per block, then double.
#include "backends/cpu/cross_entropy_amx.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/gemm_amx.h"
#include "backends/cpu/simd.h"
#include "core/dtype.h"
#include "core/parallel.h"

#define LATHE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace lathe::cpu {
namespace {

constexpr int64_t kRows = 256;        // rows per chunk (h packed, acc: in L2)
constexpr int64_t kVocabBlock = 256;  // vocabulary entries per block (k steps of the gradient product)
constexpr int64_t kPairs = kVocabBlock / 32;

// One thread's share of the vocabulary, per row of the call.
struct Share {
  std::vector<float> m, tl;   // running max; the target's logit where the share holds it
  std::vector<double> s;      // Σ exp(l − m)
  std::vector<float> acc;     // [rows, dim]: Σ exp(l − m)·W (with gradients)
  std::vector<uint16_t> ah, pa;
  std::vector<float> logits, tmp;
};

struct Problem {
  const float* h;
  int64_t m, dim, vocab, kt_dim, kt_vocab;
  const int32_t* targets;
  const uint32_t *wf, *wb;
  bool grads;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (see simd.h)
#pragma GCC diagnostic ignored "-Wuninitialized"

inline __mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n > 0 ? __mmask16((1u << n) - 1) : 0; }

// One row of a logits block l[0, width) (valid: the first `valid`): the
// online softmax update, e as bf16 into row (A layout, 1024 bf16 per
// step), acc_row (dim floats, or null) rescaled when the max rises.
LATHE_AVX512BF16 void row_block(const float* l, int64_t valid, int64_t width, float& m, double& s, float* acc_row,
                                int64_t dim, uint16_t* row) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 vm = ninf;
  for (int64_t j = 0; j < valid; j += 16) vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(ninf, mask16(valid - j), l + j));
  const float bmax = _mm512_reduce_max_ps(vm);
  if (bmax > m) {
    const float f = m == -INFINITY ? 0.0f : std::exp(m - bmax);
    s *= double(f);
    if (acc_row) {
      const __m512 vf = _mm512_set1_ps(f);
      for (int64_t c = 0; c < dim; c += 16) _mm512_storeu_ps(acc_row + c, _mm512_mul_ps(_mm512_loadu_ps(acc_row + c), vf));
    }
    m = bmax;
  }
  const __m512 bm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < width / 32; ++t) {
    __m512 e[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t j = t * 32 + h * 16;
      const __mmask16 mk = mask16(valid - j);
      const __m512 x = _mm512_mask_sub_ps(ninf, mk, _mm512_loadu_ps(l + j), bm);
      e[h] = _mm512_maskz_mov_ps(mk, simd::exp_nonpositive(_mm512_min_ps(x, _mm512_setzero_ps())));
      sum = _mm512_add_ps(sum, e[h]);
    }
    _mm512_storeu_si512(row + t * 1024, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
  }
  s += double(_mm512_reduce_add_ps(sum));
}

// acc rows [0, rows) (leading dimension dim) += tmp [32 x 32] at column c0.
LATHE_AVX512BF16 void add_block(const float* tmp, int64_t rows, float* acc, int64_t dim, int64_t c0) {
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < 2; ++h) {
      float* a = acc + r * dim + c0 + h * 16;
      _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(tmp + r * 32 + h * 16)));
    }
}

#pragma GCC diagnostic pop

// Rows [r0, r0 + rows) against the share's column pairs [q0, q1).
void share_chunk(const Problem& P, int64_t r0, int64_t rows, int64_t q0, int64_t q1, AmxBlockFn block, Share& w) {
  const int64_t pairs = (rows + 31) / 32;
  amx_pack_a(P.h + r0 * P.dim, P.dim, rows, P.dim, w.ah.data());
  std::fill(w.m.begin() + r0, w.m.begin() + r0 + rows, -INFINITY);
  std::fill(w.s.begin() + r0, w.s.begin() + r0 + rows, 0.0);
  std::fill(w.tl.begin() + r0, w.tl.begin() + r0 + rows, NAN);
  if (P.grads) std::fill(w.acc.begin() + r0 * P.dim, w.acc.begin() + (r0 + rows) * P.dim, 0.0f);
  float* L = w.logits.data();
  for (int64_t qb = q0; qb < q1; qb += kPairs) {
    const int64_t nq = std::min(kPairs, q1 - qb), v0 = qb * 32, valid = std::min(nq * 32, P.vocab - v0);
    for (int64_t ip = 0; ip < pairs; ++ip)
      for (int64_t jq = 0; jq < nq; ++jq)
        block(w.ah.data() + ip * P.kt_dim * 1024, P.wf + (qb + jq) * P.kt_dim * 512, P.kt_dim,
              L + ip * 32 * kVocabBlock + jq * 32, kVocabBlock);
    for (int64_t r = 0; r < pairs * 32; ++r) {
      uint16_t* prow = w.pa.data() + (r / 32) * kPairs * 1024 + ((r % 32) / 16) * 512 + (r % 16) * 32;
      if (r >= rows) {
        for (int64_t t = 0; t < nq; ++t) std::memset(prow + t * 1024, 0, 64);
        continue;
      }
      const int64_t i = r0 + r, tgt = P.targets[i] - v0;
      if (tgt >= 0 && tgt < valid) w.tl[size_t(i)] = L[r * kVocabBlock + tgt];
      row_block(L + r * kVocabBlock, valid, nq * 32, w.m[size_t(i)], w.s[size_t(i)],
                P.grads ? w.acc.data() + i * P.dim : nullptr, P.dim, prow);
    }
    if (!P.grads) continue;
    for (int64_t ip = 0; ip < pairs; ++ip)
      for (int64_t c = 0; c < P.dim / 32; ++c) {
        block(w.pa.data() + ip * kPairs * 1024, P.wb + (c * P.kt_vocab + qb) * 512, nq, w.tmp.data(), 32);
        add_block(w.tmp.data(), std::min<int64_t>(32, rows - ip * 32), w.acc.data() + (r0 + ip * 32) * P.dim, P.dim,
                  c * 32);
      }
  }
}

}  // namespace

bool cross_entropy_amx_fits(int64_t dim) { return dim > 0 && dim % 32 == 0; }

void cross_entropy_head_amx(const float* h, int64_t m, const int32_t* targets, float grad_scale,
                            const PackedBf16Weight& head, float* loss, float* dh, AmxTiles tiles) {
  const int64_t dim = head.in(), vocab = head.out();
  const Problem P{h, m, dim, vocab, dim / 32, (vocab + 31) / 32, targets, head.packed_forward(), head.packed_backward(),
                  dh != nullptr};
  const int64_t col_pairs = P.kt_vocab;
  constexpr int64_t kMaxShares = 64;
  const int threads =
      int(std::max<int64_t>(1, std::min<int64_t>({int64_t(num_threads()), (col_pairs + kPairs - 1) / kPairs, kMaxShares})));
  thread_local std::vector<Share> kept;  // the caller's, kept from call to call
  std::vector<Share>& shares = kept;     // (named inside the region, kept would be each thread's own)
  if (shares.size() < size_t(threads)) shares.resize(size_t(threads));
  const AmxBlockFn block = amx_block_kernel(tiles);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num();
    Share& w = shares[size_t(t)];
    w.m.resize(size_t(m)), w.s.resize(size_t(m)), w.tl.resize(size_t(m));
    if (P.grads) w.acc.resize(size_t(m * dim));
    w.ah.resize(size_t(amx_packed_a_elems(kRows, dim)));
    w.pa.resize(size_t(amx_packed_a_elems(kRows, kVocabBlock)));
    w.logits.resize(size_t(kRows * kVocabBlock));
    w.tmp.resize(32 * 32);
    std::fill(w.m.begin(), w.m.end(), -INFINITY);  // a thread without a share adds nothing
    std::fill(w.tl.begin(), w.tl.end(), NAN);
    // Whole blocks of kPairs column pairs per thread, as even as they come.
    const int64_t blocks = (col_pairs + kPairs - 1) / kPairs;
    const int64_t q0 = std::min(col_pairs, blocks * t / threads * kPairs);
    const int64_t q1 = std::min(col_pairs, blocks * (t + 1) / threads * kPairs);
    amx_thread_begin(tiles);
    for (int64_t r0 = 0; r0 < m && q0 < q1; r0 += kRows) share_chunk(P, r0, std::min(kRows, m - r0), q0, q1, block, w);
    amx_thread_end(tiles);
  }
  const uint16_t* w16 = head.weight();
  parallel_for(m, 16, [&](int64_t b, int64_t e) {
    std::vector<float> wrow(static_cast<size_t>(dim));
    for (int64_t i = b; i < e; ++i) {
      float mx = -INFINITY, tl = NAN;
      for (int t = 0; t < threads; ++t) {
        mx = std::max(mx, shares[size_t(t)].m[size_t(i)]);
        if (!std::isnan(shares[size_t(t)].tl[size_t(i)])) tl = shares[size_t(t)].tl[size_t(i)];
      }
      double sum = 0;
      float f[kMaxShares];
      for (int t = 0; t < threads; ++t) {
        const float mt = shares[size_t(t)].m[size_t(i)];
        f[t] = mt == -INFINITY ? 0.0f : std::exp(mt - mx);
        sum += shares[size_t(t)].s[size_t(i)] * double(f[t]);
      }
      loss[i] = mx + float(std::log(sum)) - tl;
      if (!dh) continue;
      convert_to_f32(w16 + int64_t(targets[i]) * dim, DType::BF16, wrow.data(), dim);
      float* d = dh + i * dim;
      for (int64_t c = 0; c < dim; ++c) d[c] = -wrow[size_t(c)];
      for (int t = 0; t < threads; ++t) {
        if (f[t] == 0.0f) continue;
        const float k = float(double(f[t]) / sum);
        const float* a = shares[size_t(t)].acc.data() + i * dim;
        for (int64_t c = 0; c < dim; ++c) d[c] += a[c] * k;
      }
      for (int64_t c = 0; c < dim; ++c) d[c] *= grad_scale;
    }
  });
}

}  // namespace lathe::cpu
