// The fp32 LoRA kernels (backends/cuda/lora_ops.h) and the strided GEMM the
// trainer uses them with, against double references on the host: the 4-term
// copies sum back to their f32 values, the partial-product sums, and the
// two LoRA products x·Aᵀ (exact bf16 x, f32 A) and u·Bᵀ (both f32) at f32
// accuracy. Tolerances: x·Aᵀ has every term, so only f32 accumulation is
// left (1e-5 of max|ref|); u·Bᵀ drops u_lo·(B − B_hi) and u's third term
// (≤ 2⁻¹⁶ each: 1e-4 allowed). Both are ≥ 10× below what bf16 copies of A
// and u would give (~2⁻⁹). The factor gradients (lora_grad_reduce) against
// a double sum over the tokens: 1e-5 of max|ref| (f32 accumulation only;
// dropping the lo term would be ~2⁻⁹); the grouped u and du products
// (lora_project) against double products, read back as hi + lo of their
// 4-term copies (≤ 2⁻¹⁸ off by construction: 1e-5). Skips without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <optional>

#include "backends/cuda/lora_ops.h"
#include "cuda/cuda_test_util.h"

namespace lathe::cuda {
namespace {

using namespace lathe::cuda::testing;

std::vector<float> random_f32(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

CudaContext context() {
  auto c = CudaContext::create(0);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return std::move(c).value();
}

// Copies of A [r, in] (planes) and B [out, r] (by row) from one flat array.
struct SplitCase {
  int64_t r = 4, in = 24, out = 40;
  std::vector<float> flat;
  std::vector<float> copies;  // the 4-term copies, as floats
};

SplitCase split_case(CudaContext& ctx, int64_t r, int64_t in, int64_t out) {
  SplitCase c{.r = r, .in = in, .out = out};
  c.flat = random_f32(r * in + out * r, 7, 0.3f);
  const std::vector<LoraSplitFactor> table = {{.src = 0, .dst = 0, .rows = r, .cols = in, .by_row = 0},
                                              {.src = r * in, .dst = 4 * r * in, .rows = out, .cols = r, .by_row = 1}};
  DeviceBuffer src = upload(ctx, c.flat), tab = upload(ctx, table);
  auto dst = DeviceBuffer::alloc(0, size_t(4 * c.flat.size() * 2));
  EXPECT_TRUE(dst.is_ok());
  Status st = lora_split_weights(ctx, {.factors = dptr<LoraSplitFactor>(tab), .n_factors = 2,
                                       .max_numel = std::max(r * in, out * r), .src = dptr<float>(src),
                                       .dst = dptr<bf16_bits>(*dst)});
  EXPECT_TRUE(st.is_ok()) << st.message();
  c.copies = download_bf16(ctx, *dst, int64_t(4 * c.flat.size()));
  return c;
}

TEST(LoraOps, SplitWeightsSumBackToTheMasters) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  const SplitCase c = split_case(ctx, 4, 24, 40);
  const int64_t na = c.r * c.in, nb = c.out * c.r;
  auto check = [&](float v, float hi, float mid, float lo, float hi2, const char* what, int64_t i) {
    EXPECT_EQ(hi, round_bf16(v)) << what << " " << i;
    EXPECT_EQ(hi2, hi) << what << " " << i;
    EXPECT_LE(std::abs(double(hi) + mid + lo - v), 1e-6 * std::abs(v)) << what << " " << i;
  };
  for (int64_t i = 0; i < na; ++i)
    check(c.flat[size_t(i)], c.copies[size_t(i)], c.copies[size_t(na + i)], c.copies[size_t(2 * na + i)],
          c.copies[size_t(3 * na + i)], "A", i);
  for (int64_t o = 0; o < c.out; ++o)
    for (int64_t k = 0; k < c.r; ++k) {
      const float* row = c.copies.data() + 4 * na + o * 4 * c.r;
      check(c.flat[size_t(na + o * c.r + k)], row[k], row[c.r + k], row[2 * c.r + k], row[3 * c.r + k], "B", o);
    }
}

TEST(LoraOps, SumPartsAccumulatesAndSplits) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  const int64_t rows = 5, cols = 3, groups = 2, parts = 3, rs = 20, gs = 9, ps = 3;
  const std::vector<float> src = random_f32(rows * rs, 3), base = random_f32(rows * groups * cols, 4);
  DeviceBuffer dsrc = upload(ctx, src), dsum = upload(ctx, base);
  auto dsplit = DeviceBuffer::alloc(0, size_t(rows * groups * 4 * cols * 2));
  ASSERT_TRUE(dsplit.is_ok());
  Status st = lora_sum_parts(ctx, {.src = dptr<float>(dsrc), .rows = rows, .cols = cols, .n_groups = groups,
                                   .n_parts = parts, .row_stride = rs, .group_stride = gs, .part_stride = ps,
                                   .scale = 0.5f, .sum = dptr<float>(dsum), .accumulate = true,
                                   .split = dptr<bf16_bits>(*dsplit)});
  ASSERT_TRUE(st.is_ok()) << st.message();
  const std::vector<float> sum = download<float>(ctx, dsum, rows * groups * cols);
  const std::vector<float> split = download_bf16(ctx, *dsplit, rows * groups * 4 * cols);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t c = 0; c < cols; ++c) {
        double v = 0;
        for (int64_t p = 0; p < parts; ++p) v += src[size_t(t * rs + g * gs + p * ps + c)];
        v *= 0.5;
        const size_t i = size_t((t * groups + g) * cols + c);
        EXPECT_NEAR(sum[i], base[i] + v, 1e-5);
        const float* s = split.data() + (t * groups + g) * 4 * cols + c;
        EXPECT_EQ(s[0], s[cols]);
        EXPECT_EQ(s[0], s[2 * cols]);
        EXPECT_LE(std::abs(double(s[0]) + s[3 * cols] - v), std::ldexp(std::abs(v), -16));
      }
}

// u = x·Aᵀ with x bf16 [T, in] and A f32 [r, in] through the stacked GEMM
// and the parts sum, then y = u·Bᵀ through the 4-term K-concatenation.
TEST(LoraOps, ProductsOnTensorCoresAreF32Accurate) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  const int64_t T = 37, r = 8, in = 96, out = 72;
  const SplitCase c = split_case(ctx, r, in, out);
  const std::vector<float> x = random_bf16(T * in, 11);
  DeviceBuffer dx = upload_bf16(ctx, x), dcopies = upload_bf16(ctx, c.copies);
  auto dpart = DeviceBuffer::alloc(0, size_t(T * 4 * r * 4));
  auto du = DeviceBuffer::alloc(0, size_t(T * 4 * r * 2));
  auto dy = DeviceBuffer::alloc(0, size_t(T * out * 4));
  ASSERT_TRUE(dpart.is_ok() && du.is_ok() && dy.is_ok());
  const bf16_bits* a4 = dptr<bf16_bits>(dcopies);
  const bf16_bits* b4 = a4 + 4 * r * in;
  ASSERT_TRUE(gemm(ctx, {.a = dptr<bf16_bits>(dx), .b = a4, .c = dpart->data(), .m = T, .n = 4 * r, .k = in,
                         .trans_b = true, .c_dtype = DType::F32})
                  .is_ok());
  ASSERT_TRUE(lora_sum_parts(ctx, {.src = dptr<float>(*dpart), .rows = T, .cols = r, .n_parts = 3,
                                   .row_stride = 4 * r, .part_stride = r, .sum = nullptr,
                                   .split = dptr<bf16_bits>(*du)})
                  .is_ok());
  ASSERT_TRUE(gemm(ctx, {.a = dptr<bf16_bits>(*du), .b = b4, .c = dy->data(), .m = T, .n = out, .k = 4 * r,
                         .trans_b = true, .c_dtype = DType::F32})
                  .is_ok());
  const std::vector<float> parts = download<float>(ctx, *dpart, T * 4 * r);
  const std::vector<float> y = download<float>(ctx, *dy, T * out);
  std::vector<float> u_ref(size_t(T * r)), u_got(size_t(T * r)), y_ref(size_t(T * out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < r; ++k) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double(x[size_t(t * in + i)]) * c.flat[size_t(k * in + i)];
      u_ref[size_t(t * r + k)] = float(acc);
      const float* p = parts.data() + t * 4 * r + k;
      u_got[size_t(t * r + k)] = p[0] + p[r] + p[2 * r];
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += double(u_ref[size_t(t * r + k)]) * c.flat[size_t(r * in + o * r + k)];
      y_ref[size_t(t * out + o)] = float(acc);
    }
  EXPECT_LE(rel_error(u_got, u_ref), 1e-5);
  EXPECT_LE(rel_error(y, y_ref), 1e-4);
}

// A column block of a wider matrix through the row strides: C[:, 8:8+n] of
// a [m, 40] matrix = A[:, 4:4+k] (row stride 24) · B (packed), others kept.
TEST(LoraOps, GemmRowStridesAddressColumnBlocks) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  const int64_t m = 19, n = 16, k = 8, lda = 24, ldc = 40;
  const std::vector<float> a = random_bf16(m * lda, 1), b = random_bf16(k * n, 2), c0 = random_bf16(m * ldc, 3);
  DeviceBuffer da = upload_bf16(ctx, a), db = upload_bf16(ctx, b), dc = upload(ctx, c0);
  Status st = gemm(ctx, {.a = dptr<bf16_bits>(da) + 4, .b = dptr<bf16_bits>(db), .c = dptr<float>(dc) + 8, .m = m,
                         .n = n, .k = k, .c_dtype = DType::F32, .beta = 1.0f, .lda = lda, .ldc = ldc});
  ASSERT_TRUE(st.is_ok()) << st.message();
  const std::vector<float> c = download<float>(ctx, dc, m * ldc);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      double want = c0[size_t(i * ldc + j)];
      if (j >= 8 && j < 8 + n)
        for (int64_t p = 0; p < k; ++p) want += double(a[size_t(i * lda + 4 + p)]) * b[size_t(p * n + j - 8)];
      EXPECT_NEAR(c[size_t(i * ldc + j)], want, 1e-4 * (1 + std::abs(want))) << i << "," << j;
    }
  EXPECT_FALSE(gemm(ctx, {.a = dptr<bf16_bits>(da), .b = dptr<bf16_bits>(db), .c = dc.data(), .m = m, .n = n,
                          .k = k, .c_dtype = DType::F32, .lda = k - 1})
                   .is_ok());
}

// One lora_grad_reduce problem with a double reference: n_members members
// of n[k] columns, L rows of ldl values (member k's hi at k·4r + 2r, lo r
// after it, as in the trainer's 4-term u), R rows of ldr values (member k's
// columns from rcol[k]; shared = all members read columns 0..).
struct GradCase {
  int64_t T = 0, r = 0;
  std::vector<int64_t> n, rcol;
  bool transposed = false, accumulate = true;
  float scale = 1.0f;
  int64_t workspace_floats = 0;  // 0: none (one split, written directly)
};

double grad_case_error(const GradCase& c) {
  CudaContext ctx = make_context();
  const int nm = int(c.n.size());
  const int64_t ldl = nm * 4 * c.r;
  int64_t ldr = 0;
  for (int k = 0; k < nm; ++k) ldr = std::max(ldr, c.rcol[size_t(k)] + c.n[size_t(k)]);
  std::vector<float> l = random_bf16(c.T * ldl, 21), lo = random_bf16(c.T * ldl, 22, 1.0f / 512);
  for (int64_t t = 0; t < c.T; ++t)  // the lo block holds small values, like an f32 value's remainder
    for (int k = 0; k < nm; ++k)
      for (int64_t j = 0; j < c.r; ++j) {
        const size_t i = size_t(t * ldl + k * 4 * c.r + 3 * c.r + j);
        l[i] = lo[i];
      }
  const std::vector<float> rhs = random_bf16(c.T * ldr, 23);
  std::vector<std::vector<float>> base(static_cast<size_t>(nm)), want(static_cast<size_t>(nm));
  std::vector<DeviceBuffer> dout;
  DeviceBuffer dl = upload_bf16(ctx, l), dr = upload_bf16(ctx, rhs);
  LoraGradArgs a{.members = {}, .n_members = nm, .tokens = c.T, .r = c.r, .ldl = ldl, .ldr = ldr,
                 .transposed = c.transposed, .scale = c.scale, .accumulate = c.accumulate};
  for (int k = 0; k < nm; ++k) {
    const int64_t n = c.n[size_t(k)];
    base[size_t(k)] = random_f32(c.r * n, uint32_t(30 + k));
    want[size_t(k)].assign(size_t(c.r * n), 0.0f);
    for (int64_t j = 0; j < c.r; ++j)
      for (int64_t col = 0; col < n; ++col) {
        double acc = 0;
        for (int64_t t = 0; t < c.T; ++t) {
          const float* lr = l.data() + t * ldl + k * 4 * c.r + 2 * c.r;
          acc += (double(lr[j]) + lr[c.r + j]) * rhs[size_t(t * ldr + c.rcol[size_t(k)] + col)];
        }
        const size_t idx = size_t(c.transposed ? col * c.r + j : j * n + col);
        want[size_t(k)][idx] = float((c.accumulate ? base[size_t(k)][idx] : 0.0) + c.scale * acc);
      }
    dout.push_back(upload(ctx, base[size_t(k)]));
    a.members[k] = {.l = dptr<bf16_bits>(dl) + k * 4 * c.r + 2 * c.r, .rhs = dptr<bf16_bits>(dr) + c.rcol[size_t(k)],
                    .n = n, .out = dptr<float>(dout.back())};
  }
  std::optional<DeviceBuffer> ws;
  if (c.workspace_floats > 0) {
    auto b = DeviceBuffer::alloc(0, size_t(c.workspace_floats) * 4);
    EXPECT_TRUE(b.is_ok());
    ws.emplace(std::move(b).value());
    a.workspace = dptr<float>(*ws);
    a.workspace_floats = c.workspace_floats;
  }
  Status st = lora_grad_reduce(ctx, a);
  EXPECT_TRUE(st.is_ok()) << st.message();
  double worst = 0;
  for (int k = 0; k < nm; ++k) {
    const std::vector<float> got = download<float>(ctx, dout[size_t(k)], c.r * c.n[size_t(k)]);
    worst = std::max(worst, rel_error(got, want[size_t(k)]));
  }
  return worst;
}

// dB-shaped: three members of different widths (q, k, v), transposed,
// accumulated; split over tokens through the workspace, and in one split.
TEST(LoraGrad, MembersOfAGroupSplitAndDirect) {
  LATHE_SKIP_WITHOUT_GPU();
  GradCase c{.T = 1000, .r = 32, .n = {264, 40, 48}, .rcol = {0, 264, 304}, .transposed = true, .scale = 0.5f};
  c.workspace_floats = 1 << 20;
  EXPECT_LE(grad_case_error(c), 1e-5);
  c.workspace_floats = 0;
  EXPECT_LE(grad_case_error(c), 1e-5);
}

// dA-shaped: members share R (the group's x), plain layout, overwritten; a
// rank of 4 (rows not 16-byte aligned: the plain-copy path, also for R's
// unaligned columns) and one above 64 (two row chunks).
TEST(LoraGrad, SharedInputSmallAndLargeRanks) {
  LATHE_SKIP_WITHOUT_GPU();
  GradCase small{.T = 77, .r = 4, .n = {72, 72}, .rcol = {0, 0}, .accumulate = false, .workspace_floats = 1 << 16};
  EXPECT_LE(grad_case_error(small), 1e-5);
  GradCase odd{.T = 77, .r = 4, .n = {36, 36}, .rcol = {0, 36}, .workspace_floats = 1 << 16};
  EXPECT_LE(grad_case_error(odd), 1e-5);
  GradCase large{.T = 300, .r = 80, .n = {136}, .rcol = {8}, .workspace_floats = 1 << 18};
  EXPECT_LE(grad_case_error(large), 1e-5);
}

// The 4-term copy of an f32 value: hi, mid, lo (each bf16, summing back to
// v to f32 precision), then hi again.
std::array<float, 4> terms4(float v) {
  const float hi = round_bf16(v), mid = round_bf16(v - hi), lo = round_bf16(v - hi - mid);
  return {hi, mid, lo, hi};
}

// One lora_project problem with a double reference. by_row: member k's
// factor is B_k [k_k, r] (copy [k_k, 4, r]) and its X columns start at
// xcol[k]; otherwise A_k [r, k_k] (copy planes [4, r, k_k]).
struct ProjectCase {
  int64_t T = 0, r = 0;
  std::vector<int64_t> k, xcol;
  bool by_row = false;
  float scale = 1.0f;
  int block_tokens = 0;
};

double project_case_error(const ProjectCase& c) {
  CudaContext ctx = make_context();
  const int nm = int(c.k.size());
  const int64_t ldo = nm * 4 * c.r;
  int64_t ldx = 0;
  for (int m = 0; m < nm; ++m) ldx = std::max(ldx, c.xcol[size_t(m)] + c.k[size_t(m)]);
  const std::vector<float> x = random_bf16(c.T * ldx, 41);
  std::vector<DeviceBuffer> dfs;
  std::vector<std::vector<float>> fs;
  for (int m = 0; m < nm; ++m) {
    const int64_t k = c.k[size_t(m)];
    fs.push_back(random_f32(c.r * k, uint32_t(50 + m), 0.2f));  // A [r, k] or B [k, r]
    std::vector<float> copy(size_t(4 * c.r * k));
    for (int64_t i = 0; i < c.r * k; ++i) {
      const std::array<float, 4> t = terms4(fs.back()[size_t(i)]);
      for (int p = 0; p < 4; ++p) {
        const int64_t at = c.by_row ? (i / c.r) * 4 * c.r + p * c.r + i % c.r : p * c.r * k + i;
        copy[size_t(at)] = t[size_t(p)];
      }
    }
    dfs.push_back(upload_bf16(ctx, copy));
  }
  DeviceBuffer dx = upload_bf16(ctx, x);
  auto dout = DeviceBuffer::alloc(0, size_t(c.T * ldo * 2));
  EXPECT_TRUE(dout.is_ok());
  LoraProjectArgs a{.members = {}, .n_members = nm, .tokens = c.T, .r = c.r, .ldx = ldx, .by_row = c.by_row,
                    .scale = c.scale, .out = dptr<bf16_bits>(*dout), .ldo = ldo, .block_tokens = c.block_tokens};
  for (int m = 0; m < nm; ++m)
    a.members[m] = {.x = dptr<bf16_bits>(dx) + c.xcol[size_t(m)], .f = dptr<bf16_bits>(dfs[size_t(m)]),
                    .k = c.k[size_t(m)]};
  Status st = lora_project(ctx, a);
  EXPECT_TRUE(st.is_ok()) << st.message();
  const std::vector<float> out = download_bf16(ctx, *dout, c.T * ldo);
  std::vector<float> got, want;
  for (int64_t t = 0; t < c.T; ++t)
    for (int m = 0; m < nm; ++m)
      for (int64_t j = 0; j < c.r; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < c.k[size_t(m)]; ++i) {
          const float f = c.by_row ? fs[size_t(m)][size_t(i * c.r + j)] : fs[size_t(m)][size_t(j * c.k[size_t(m)] + i)];
          acc += double(x[size_t(t * ldx + c.xcol[size_t(m)] + i)]) * f;
        }
        const float* o = out.data() + t * ldo + m * 4 * c.r + j;
        EXPECT_EQ(o[0], o[c.r]);
        EXPECT_EQ(o[0], o[2 * c.r]);
        got.push_back(o[0] + o[3 * c.r]);
        want.push_back(float(c.scale * acc));
      }
  return rel_error(got, want);
}

// u = x·Aᵀ for q, k, v sharing x; du = s·dy·B for gate and up (their own
// columns of dy), each with 32- and 64-token blocks; small ranks through
// the plain copies; a rank above 64.
TEST(LoraProject, ForwardAndBackwardProducts) {
  LATHE_SKIP_WITHOUT_GPU();
  for (int rows : {32, 64}) {
    SCOPED_TRACE(rows);
    EXPECT_LE(project_case_error({.T = 150, .r = 32, .k = {200, 200, 200}, .xcol = {0, 0, 0}, .block_tokens = rows}),
              1e-5);
    EXPECT_LE(project_case_error({.T = 100, .r = 32, .k = {72, 136}, .xcol = {0, 72}, .by_row = true, .scale = 0.5f,
                                  .block_tokens = rows}),
              1e-5);
    EXPECT_LE(project_case_error({.T = 65, .r = 80, .k = {96}, .xcol = {8}, .by_row = true, .block_tokens = rows}),
              1e-5);
  }
  EXPECT_LE(project_case_error({.T = 70, .r = 4, .k = {40, 40}, .xcol = {0, 0}}), 1e-5);
  EXPECT_LE(project_case_error({.T = 70, .r = 4, .k = {24, 40}, .xcol = {0, 24}, .by_row = true}), 1e-5);
  EXPECT_LE(project_case_error({.T = 70, .r = 4, .k = {36, 36}, .xcol = {0, 36}}), 1e-5);  // unaligned rows
  EXPECT_LE(project_case_error({.T = 65, .r = 80, .k = {96}, .xcol = {8}}), 1e-5);
  EXPECT_LE(project_case_error({.T = 65, .r = 80, .k = {96}, .xcol = {8}, .by_row = true}), 1e-5);
}

TEST(LoraGrad, RejectsBadArguments) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = make_context();
  LoraGradArgs a{.members = {}, .n_members = 0, .tokens = 8, .r = 4, .ldl = 16, .ldr = 8};
  EXPECT_FALSE(lora_grad_reduce(ctx, a).is_ok());
  a.n_members = 1;
  a.members[0].n = 8;  // null pointers
  EXPECT_FALSE(lora_grad_reduce(ctx, a).is_ok());
  LoraProjectArgs pa{.members = {}, .n_members = 1, .tokens = 8, .r = 4, .ldx = 8, .ldo = 16};
  EXPECT_FALSE(lora_project(ctx, pa).is_ok());  // null output and member
}

}  // namespace
}  // namespace lathe::cuda
