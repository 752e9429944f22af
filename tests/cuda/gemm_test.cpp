// cuBLASLt bf16 GEMM against a double reference, for the three uses of a
// linear layer (forward x·Wᵀ, dX = dY·W, dW += dYᵀ·X) over several shapes,
// odd ones included, with bf16 and f32 outputs; plus the arena and plan.
// Tolerances: inputs are exact bf16 values and accumulation is f32, so an f32
// output is within ~k·2⁻²⁴ of the reference (1e-4 of max|C| allowed); a bf16
// output adds one rounding (2⁻⁹ relative: 4e-3 of max|C| allowed). The bias
// epilogue is checked to round once.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

struct Case {
  int64_t m, n, k;
};
const Case kShapes[] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 127}, {64, 48, 32}, {128, 256, 512}, {3, 1000, 64}};

// Row-major reference: C = alpha·op(A)·op(B) + beta·C0.
std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c0,
                             const GemmArgs& g) {
  std::vector<float> c(static_cast<size_t>(g.m * g.n));
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double av = g.trans_a ? a[p * g.m + i] : a[i * g.k + p];
        const double bv = g.trans_b ? b[j * g.k + p] : b[p * g.n + j];
        acc += av * bv;
      }
      c[i * g.n + j] = static_cast<float>(g.alpha * acc + (g.beta != 0 ? g.beta * double(c0[i * g.n + j]) : 0.0));
    }
  return c;
}

void run_case(CudaContext& ctx, const Case& s, bool trans_a, bool trans_b, DType out, float beta, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << trans_a
                                    << " tb=" << trans_b << " out=" << dtype_name(out) << " beta=" << beta);
  std::vector<float> a = random_bf16(s.m * s.k, seed), b = random_bf16(s.k * s.n, seed + 1);
  std::vector<float> c0 = random_bf16(s.m * s.n, seed + 2);
  DeviceBuffer da = upload_bf16(ctx, a), db = upload_bf16(ctx, b);
  DeviceBuffer dc = out == DType::F32 ? upload(ctx, c0) : upload_bf16(ctx, c0);
  GemmArgs g{.a = dptr<bf16_bits>(da), .b = dptr<bf16_bits>(db), .c = dc.data(), .m = s.m, .n = s.n, .k = s.k,
             .trans_a = trans_a, .trans_b = trans_b, .c_dtype = out, .alpha = 1.0f, .beta = beta};
  Status st = gemm(ctx, g);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> got = out == DType::F32 ? download<float>(ctx, dc, s.m * s.n) : download_bf16(ctx, dc, s.m * s.n);
  const double tol = out == DType::F32 ? 1e-4 : 4e-3;
  EXPECT_LE(rel_error(got, reference(a, b, c0, g)), tol);
}

TEST(CudaGemm, LinearForwardNT) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  uint32_t seed = 1;
  for (const Case& s : kShapes) {
    run_case(ctx, s, false, true, DType::BF16, 0.0f, seed += 3);
    run_case(ctx, s, false, true, DType::F32, 0.0f, seed += 3);
  }
}

TEST(CudaGemm, InputGradNN) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  uint32_t seed = 100;
  for (const Case& s : kShapes) {
    run_case(ctx, s, false, false, DType::BF16, 0.0f, seed += 3);
    run_case(ctx, s, false, false, DType::F32, 1.0f, seed += 3);
  }
}

TEST(CudaGemm, WeightGradTNAccumulates) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  uint32_t seed = 200;
  for (const Case& s : kShapes) {
    run_case(ctx, s, true, false, DType::F32, 1.0f, seed += 3);
    run_case(ctx, s, true, false, DType::F32, 0.0f, seed += 3);
    run_case(ctx, s, true, true, DType::BF16, 0.5f, seed += 3);
  }
}

TEST(CudaGemm, SecondCallOfAShapeReusesItsPlan) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  for (int rep = 0; rep < 3; ++rep) run_case(ctx, {37, 19, 41}, false, true, DType::F32, 0.0f, 7 + rep);
}

// The bias epilogue: C = bf16(x·Wᵀ + b) rounded once, into column blocks
// of a wider C (ldc). With a bias as large as the product, rounding the
// product first (what beta = 1 onto a bf16 C does) changes a large share of
// the outputs; rounded once, only near-ties of the f32 sum may differ from
// the exact sum rounded. The same shape without the bias (another plan)
// adds none.
TEST(CudaGemm, BiasEpilogueRoundsOnce) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  const int64_t m = 96, n = 80, k = 200, ldc = 136;
  std::vector<float> a = random_bf16(m * k, 31), w = random_bf16(n * k, 32), bias = random_bf16(n, 33, 4.0f);
  DeviceBuffer da = upload_bf16(ctx, a), dw = upload_bf16(ctx, w), db = upload_bf16(ctx, bias);
  DeviceBuffer dc = upload_bf16(ctx, std::vector<float>(size_t(m * ldc), 7.0f));
  GemmArgs g{.a = dptr<bf16_bits>(da), .b = dptr<bf16_bits>(dw), .c = dptr<bf16_bits>(dc) + 8, .m = m, .n = n,
             .k = k, .trans_b = true, .ldc = ldc, .bias = dptr<bf16_bits>(db)};
  Status st = gemm(ctx, g);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<float> got = download_bf16(ctx, dc, m * ldc);
  const std::vector<float> prod = reference(a, w, {}, {.m = m, .n = n, .k = k, .trans_b = true});
  int64_t once = 0, twice = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float v = got[size_t(i * ldc + j)];
      if (j < 8 || j >= 8 + n) {
        ASSERT_EQ(v, 7.0f) << "outside the block at " << i << "," << j;
        continue;
      }
      const float p = prod[size_t(i * n + j - 8)], b = bias[size_t(j - 8)];
      ASSERT_NEAR(v, p + b, 1e-2 * (std::fabs(p + b) + 1.0f)) << i << "," << j;
      once += v == round_bf16(p + b);
      twice += v == round_bf16(round_bf16(p) + b);
    }
  }
  EXPECT_GE(once, m * n * 99 / 100) << "rounded once: " << once << " of " << m * n << ", twice: " << twice;
  EXPECT_LT(twice, m * n * 95 / 100) << "the case does not tell one rounding from two";
  g.bias = nullptr;
  ASSERT_TRUE(gemm(ctx, g).is_ok());
  got = download_bf16(ctx, dc, m * ldc);
  int64_t plain = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) plain += got[size_t(i * ldc + 8 + j)] == round_bf16(prod[size_t(i * n + j)]);
  EXPECT_GE(plain, m * n * 99 / 100);
  g.bias = dptr<bf16_bits>(db);
  g.beta = 1.0f;  // a bias only with beta = 0 and a bf16 output
  EXPECT_FALSE(gemm(ctx, g).is_ok());
  g.beta = 0.0f;
  g.c_dtype = DType::F32;
  EXPECT_FALSE(gemm(ctx, g).is_ok());
}

TEST(CudaGemm, BadArgumentsAreErrors) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  GemmArgs g{.m = 4, .n = 4, .k = 4};
  EXPECT_FALSE(gemm(ctx, g).is_ok());  // null operands
  g.m = -1;
  EXPECT_FALSE(gemm(ctx, g).is_ok());
}

TEST(CudaArena, PlanAlignsEveryBuffer) {
  ArenaPlan plan;
  EXPECT_EQ(plan.add(1), 0u);
  EXPECT_EQ(plan.add(300), 256u);
  EXPECT_EQ(plan.add(0), 768u);
  EXPECT_EQ(plan.add(256), 768u);
  EXPECT_EQ(plan.total_bytes(), 1024u);
}

TEST(CudaArena, BumpsResetsAndReportsExhaustion) {
  LATHE_SKIP_WITHOUT_GPU();
  auto arena = DeviceArena::create(0, 4096);
  ASSERT_TRUE(arena.is_ok()) << arena.status().message();
  auto p1 = arena->alloc(10, "a");
  auto p2 = arena->alloc(300, "b");
  ASSERT_TRUE(p1.is_ok() && p2.is_ok());
  EXPECT_EQ(static_cast<char*>(*p2) - static_cast<char*>(*p1), 256);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p1) % 256, 0u);
  auto big = arena->alloc(8192, "activations");
  ASSERT_FALSE(big.is_ok());
  EXPECT_NE(big.status().message().find("activations"), std::string::npos) << big.status().message();
  arena->reset();
  EXPECT_EQ(arena->used(), 0u);
  EXPECT_EQ(arena->high_water(), 768u);
  auto p3 = arena->alloc(16, "c");
  ASSERT_TRUE(p3.is_ok());
  EXPECT_EQ(*p3, *p1);
}

TEST(CudaConvert, RoundTripMatchesHostRounding) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(10007);
  for (float& v : x) v = dist(rng);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = 1.0f + 1.0f / 256.0f;  // a tie: rounds to even
  x[3] = 3.0e38f;
  DeviceBuffer dx = upload(ctx, x);
  DeviceBuffer db = upload(ctx, std::vector<uint16_t>(x.size()));
  DeviceBuffer dy = upload(ctx, std::vector<float>(x.size()));
  ASSERT_TRUE(f32_to_bf16(ctx, dptr<float>(dx), dptr<bf16_bits>(db), int64_t(x.size())).is_ok());
  ASSERT_TRUE(bf16_to_f32(ctx, dptr<bf16_bits>(db), dptr<float>(dy), int64_t(x.size())).is_ok());
  std::vector<uint16_t> bits = download<uint16_t>(ctx, db, int64_t(x.size()));
  std::vector<float> back = download<float>(ctx, dy, int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bits[i], lathe::f32_to_bf16(x[i])) << "element " << i << " = " << x[i];
    ASSERT_EQ(back[i], lathe::bf16_to_f32(bits[i])) << "element " << i;
  }
}

}  // namespace
}  // namespace lathe::cuda
