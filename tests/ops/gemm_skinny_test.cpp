// sgemm_skinny (LoRA's f32 products) against a double-precision reference:
// every transpose combination, C widths on each register-tile size (16, 32,
// 48, wider) and past them, edge rows below every tile height, k of 1 and
// long k, leading dimensions wider than the matrices, alpha and beta; with
// beta 0 a NaN-filled C must not leak in; columns past n must stay as they
// were. Run on the vector path and on the forced portable one (OpenBLAS).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/gemm_skinny.h"

namespace lathe {
namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

const Case kCases[] = {
    {false, true, 1024, 48, 512, 0.5f, 0.0f},   // x·Aᵀ, grouped q/k/v
    {false, true, 37, 16, 300, 2.0f, 0.0f},     // x·Aᵀ, rank 16, ragged rows
    {false, true, 61, 515, 16, 1.0f, 1.0f},     // u·Bᵀ into y
    {false, false, 50, 16, 77, 1.0f, 0.0f},     // dy·B
    {true, false, 45, 16, 200, 1.0f, 1.0f},     // dyᵀ·u into dB
    {true, false, 48, 130, 99, 0.25f, 1.0f},    // duᵀ·x into dA
    {false, false, 100, 70, 48, 0.5f, 1.0f},    // du·A into dx
    {true, true, 13, 33, 21, -1.0f, 0.5f},      // both transposed, width 33 (NV 3), beta 0.5
    {false, false, 5, 1, 1, 3.0f, 0.0f},        // one column, k 1
    {false, false, 1, 64, 2, 1.0f, 1.0f},       // one row
    {true, false, 97, 31, 5, 1.0f, 0.0f},       // width 31 (NV 2), rows past 8 tiles of 12
};

double max_rel_err(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k, lda = a_cols + 3;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n, ldb = b_cols + 2, ldc = c.n + 5;
  std::vector<float> a(size_t(a_rows * lda)), b(size_t(b_rows * ldb)), c0(size_t(c.m * ldc));
  for (float& x : a) x = d(rng);
  for (float& x : b) x = d(rng);
  for (float& x : c0) x = c.beta == 0.0f ? NAN : d(rng);
  std::vector<float> got = c0;
  cpu::sgemm_skinny(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta, got.data(), ldc);
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const float g = got[size_t(i * ldc + j)];
      if (j >= c.n) {  // past the matrix: untouched (NaN stays NaN)
        const float w = c0[size_t(i * ldc + j)];
        if (!(g == w || (std::isnan(g) && std::isnan(w)))) return INFINITY;
        continue;
      }
      double s = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double av = c.ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)];
        const double bv = c.tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)];
        s += av * bv;
      }
      const double want = c.alpha * s + (c.beta == 0.0f ? 0.0 : c.beta * double(c0[size_t(i * ldc + j)]));
      if (std::isnan(g)) return INFINITY;
      diff = std::max(diff, std::abs(g - want));
      ref = std::max(ref, std::abs(want));
    }
  return diff / ref;
}

TEST(GemmSkinny, MatchesReference) {
  for (bool portable : {false, true}) {
    cpu::set_portable_only(portable);
    uint32_t seed = 3;
    for (const Case& c : kCases) {
      SCOPED_TRACE(::testing::Message() << (portable ? "portable " : "vector ") << "ta " << c.ta << " tb " << c.tb
                                        << " m " << c.m << " n " << c.n << " k " << c.k);
      // f32 sums of k terms: ~k · 2⁻²⁴ relative at worst, far less typically.
      EXPECT_LT(max_rel_err(c, seed++), 1e-6 * std::sqrt(double(c.k)) + 1e-6);
    }
  }
  cpu::set_portable_only(false);
}

}  // namespace
}  // namespace lathe
