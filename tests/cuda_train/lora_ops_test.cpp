// The fp32 LoRA kernels (backends/cuda/lora_ops.h) and the strided GEMM the
// trainer uses them with, against double references on the host: the 4-term
// copies sum back to their f32 values, the partial-product sums, and the
// two LoRA products x·Aᵀ (exact bf16 x, f32 A) and u·Bᵀ (both f32) at f32
// accuracy. Tolerances: x·Aᵀ has every term, so only f32 accumulation is
// left (1e-5 of max|ref|); u·Bᵀ drops u_lo·(B − B_hi) and u's third term
// (≤ 2⁻¹⁶ each: 1e-4 allowed). Both are ≥ 10× below what bf16 copies of A
// and u would give (~2⁻⁹). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

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

// Columns a multiple of 4 (4 a thread) and odd ones (one value a thread).
TEST(LoraOps, SplitWeightsSumBackToTheMasters) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  for (const int64_t in : {24, 23}) {
    SCOPED_TRACE(::testing::Message() << "in " << in << ", r " << (in == 24 ? 4 : 3));
    const SplitCase c = split_case(ctx, in == 24 ? 4 : 3, in, 40);
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

// The copies written with a row stride (the trainer keeps them inside its
// projections' extended weights, row stride ldw: A's planes as rows
// [0, 4r), B beside W's rows at column `in`): bitwise the packed copies,
// everything around them untouched; and the parts' split with a row stride
// (into the GEMM input's LoRA columns) bitwise the packed split.
TEST(LoraOps, StridedCopiesAreThePackedOnes) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  const int64_t r = 4, in = 24, out = 40, ld = in + 4 * r + 8;
  const SplitCase c = split_case(ctx, r, in, out);
  const int64_t na = r * in;
  // A's planes at rows [out, out + 4r) of a [out + 4r, ld] matrix, columns
  // [0, in); B at rows [0, out), columns [in, in + 4r).
  const std::vector<LoraSplitFactor> table = {
      {.src = 0, .dst = out * ld, .rows = r, .cols = in, .by_row = 0, .ld = ld},
      {.src = r * in, .dst = in, .rows = out, .cols = r, .by_row = 1, .ld = ld}};
  DeviceBuffer src = upload(ctx, c.flat), tab = upload(ctx, table);
  DeviceBuffer dst = upload_bf16(ctx, std::vector<float>(size_t((out + 4 * r) * ld), 9.0f));
  Status st = lora_split_weights(ctx, {.factors = dptr<LoraSplitFactor>(tab), .n_factors = 2,
                                       .max_numel = std::max(r * in, out * r), .src = dptr<float>(src),
                                       .dst = dptr<bf16_bits>(dst)});
  ASSERT_TRUE(st.is_ok()) << st.message();
  const std::vector<float> w = download_bf16(ctx, dst, (out + 4 * r) * ld);
  for (int64_t i = 0; i < out + 4 * r; ++i)
    for (int64_t j = 0; j < ld; ++j) {
      float want = 9.0f;
      if (i >= out && j < in) want = c.copies[size_t((i - out) * in + j)];         // A plane rows
      if (i < out && j >= in && j < in + 4 * r) want = c.copies[size_t(4 * na + i * 4 * r + j - in)];  // B rows
      ASSERT_EQ(w[size_t(i * ld + j)], want) << i << "," << j;
    }
  // The parts' split into columns [off, off + groups·4·cols) of wider rows.
  const int64_t rows = 6, cols = 5, groups = 2, split_ld = 64, off = 16;
  const std::vector<float> parts = random_f32(rows * groups * 3 * cols, 12);
  DeviceBuffer dsrc = upload(ctx, parts);
  DeviceBuffer packed = upload_bf16(ctx, std::vector<float>(size_t(rows * groups * 4 * cols)));
  DeviceBuffer wide = upload_bf16(ctx, std::vector<float>(size_t(rows * split_ld), 9.0f));
  LoraPartsArgs pa{.src = dptr<float>(dsrc), .rows = rows, .cols = cols, .n_groups = groups, .n_parts = 3,
                   .row_stride = groups * 3 * cols, .group_stride = 3 * cols, .part_stride = cols, .scale = 0.25f,
                   .split = dptr<bf16_bits>(packed)};
  ASSERT_TRUE(lora_sum_parts(ctx, pa).is_ok());
  pa.split = dptr<bf16_bits>(wide) + off;
  pa.split_ld = split_ld;
  ASSERT_TRUE(lora_sum_parts(ctx, pa).is_ok());
  const std::vector<float> p = download_bf16(ctx, packed, rows * groups * 4 * cols);
  const std::vector<float> q = download_bf16(ctx, wide, rows * split_ld);
  const int64_t per = groups * 4 * cols;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < split_ld; ++j) {
      const bool in_block = j >= off && j < off + per;
      ASSERT_EQ(q[size_t(t * split_ld + j)], in_block ? p[size_t(t * per + j - off)] : 9.0f) << t << "," << j;
    }
  pa.split_ld = per - 1;  // shorter than a row
  EXPECT_FALSE(lora_sum_parts(ctx, pa).is_ok());
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

// Several sums in one call (lora_sum_parts_many: up to 8 a launch, 4
// columns a thread where strides and pointers allow) are bitwise the sums
// one call each, and those of the one-thread-per-value kernel: the
// trainer's shapes (the forward's split into wider rows, dB and dA
// accumulated into gradients with a scale), an odd shape that takes the
// scalar kernel in the same call, and more jobs than one launch holds.
TEST(LoraOps, SumPartsManyIsBitwiseOneAtATime) {
  LATHE_SKIP_WITHOUT_GPU();
  CudaContext ctx = context();
  struct Shape {
    int64_t rows, cols, groups, parts;
    bool split;
  };
  const std::vector<Shape> shapes = {{37, 8, 3, 3, true},  {40, 8, 1, 2, false}, {8, 96, 1, 2, false},
                                     {29, 8, 2, 3, true},  {13, 5, 2, 3, true},  {24, 8, 1, 2, false},
                                     {8, 64, 1, 2, false}, {6, 12, 1, 2, false}, {16, 8, 1, 2, false},
                                     {8, 40, 1, 2, false}};
  std::vector<int64_t> src_at, out_at, split_at;
  int64_t n_src = 0, n_out = 0, n_split = 0;
  for (const Shape& h : shapes) {
    src_at.push_back(n_src), out_at.push_back(n_out), split_at.push_back(n_split);
    n_src += (h.rows * h.groups * 4 * h.cols + 3) / 4 * 4;  // rows 4 parts wide (one unused)
    n_out += (h.rows * h.groups * h.cols + 3) / 4 * 4;
    n_split += h.split ? h.rows * (h.groups * 4 * h.cols + 8) : 0;
  }
  const std::vector<float> src = random_f32(n_src, 31), base = random_f32(n_out, 32);
  DeviceBuffer dsrc = upload(ctx, src);
  std::vector<float> sums[3];
  std::vector<uint16_t> splits[3];
  for (int way = 0; way < 3; ++way) {  // many, many on the scalar kernel, one call each
    DeviceBuffer dsum = upload(ctx, base), dsplit = upload(ctx, std::vector<uint16_t>(size_t(n_split), 0x7f7f));
    std::vector<LoraPartsArgs> jobs;
    for (size_t j = 0; j < shapes.size(); ++j) {
      const Shape& h = shapes[j];
      jobs.push_back({.src = dptr<float>(dsrc) + src_at[j], .rows = h.rows, .cols = h.cols, .n_groups = h.groups,
                      .n_parts = h.parts, .row_stride = h.groups * 4 * h.cols, .group_stride = 4 * h.cols,
                      .part_stride = h.cols, .scale = h.split ? 0.37f : 1.3f,
                      .sum = h.split && j % 2 == 0 ? nullptr : dptr<float>(dsum) + out_at[j], .accumulate = j % 3 != 1,
                      .split = h.split ? dptr<bf16_bits>(dsplit) + split_at[j] : nullptr,
                      .split_ld = h.split ? h.groups * 4 * h.cols + 8 : 0});
    }
    if (way < 2) {
      Status st = lora_sum_parts_many(ctx, jobs.data(), int(jobs.size()), way == 1);
      ASSERT_TRUE(st.is_ok()) << st.message();
    } else {
      for (const LoraPartsArgs& a : jobs) ASSERT_TRUE(lora_sum_parts(ctx, a).is_ok());
    }
    sums[way] = download<float>(ctx, dsum, n_out);
    splits[way] = download<uint16_t>(ctx, dsplit, n_split);
  }
  for (int way = 1; way < 3; ++way) {
    ASSERT_EQ(std::memcmp(sums[0].data(), sums[way].data(), sums[0].size() * 4), 0) << "sums, way " << way;
    ASSERT_EQ(splits[0], splits[way]) << "splits, way " << way;
  }
  // And against a double sum: the parts summed, scaled, added where accumulating.
  for (size_t j = 0; j < shapes.size(); ++j) {
    const Shape& h = shapes[j];
    if (h.split && j % 2 == 0) continue;  // no sum
    for (int64_t t = 0; t < h.rows; ++t)
      for (int64_t g = 0; g < h.groups; ++g)
        for (int64_t c = 0; c < h.cols; ++c) {
          double v = 0;
          for (int64_t p = 0; p < h.parts; ++p)
            v += src[size_t(src_at[j] + t * h.groups * 4 * h.cols + g * 4 * h.cols + p * h.cols + c)];
          const size_t i = size_t(out_at[j] + (t * h.groups + g) * h.cols + c);
          v = v * (h.split ? 0.37 : 1.3) + (j % 3 != 1 ? base[i] : 0.0);
          ASSERT_NEAR(sums[0][i], v, 1e-5 * (1 + std::abs(v))) << "job " << j << " at " << t << "," << g << "," << c;
        }
  }
}

}  // namespace
}  // namespace lathe::cuda
