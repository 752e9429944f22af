// RMSNorm, RoPE, SwiGLU and embedding (CPU) against the naive references.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <numeric>

#include "backends/cpu/cpu_ops.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

TEST(RmsNorm, MatchesReference) {
  uint32_t seed = 200;
  for (auto [rows, dim, wt] : {std::tuple{1, 64, DType::F32}, {5, 33, DType::BF16}, {130, 16, DType::F16}}) {
    Tensor x = testing::random_tensor(DType::F32, {rows, dim}, seed++, 3.0f);
    Tensor w = testing::random_tensor(wt, {dim}, seed++);
    Tensor y = Tensor::zeros(DType::F32, {rows, dim}), want = y.clone();
    Tensor rstd = Tensor::zeros(DType::F32, {rows}), rstd_want = rstd.clone();
    RmsNormArgs args{.x = x, .w = w, .y = y, .rstd = rstd, .eps = 1e-5f};
    ASSERT_TRUE(cpu::rms_norm_forward(args).is_ok());
    args.y = want;
    args.rstd = rstd_want;
    ref::rms_norm_forward(args);
    EXPECT_LE(testing::rel_error(y, want), 1e-6);
    EXPECT_LE(testing::rel_error(rstd, rstd_want), 1e-6);
    // In place (y aliases x) gives the same.
    Tensor x2 = x.clone();
    ASSERT_TRUE(cpu::rms_norm_forward({.x = x2, .w = w, .y = x2, .eps = 1e-5f}).is_ok());
    EXPECT_LE(testing::rel_error(x2, want), 1e-6);
  }
}

TEST(Rope, TablesAndRotationMatchReference) {
  for (auto [n, n_head, head_dim, pos0] : {std::tuple{1, 4, 16, 0}, {7, 2, 32, 100}, {3, 3, 64, 4000}}) {
    auto inv = rope_inv_freq({.theta = 500000.0f}, head_dim);
    ASSERT_TRUE(inv.is_ok());
    Tensor inv_t = Tensor::wrap(inv->data(), DType::F32, {head_dim / 2}, nullptr);
    Tensor pos = Tensor::empty(DType::I32, {n});
    std::iota(pos.data<int32_t>(), pos.data<int32_t>() + n, pos0);
    Tensor c = Tensor::zeros(DType::F32, {n, head_dim / 2}), s = c.clone(), c_ref = c.clone(), s_ref = c.clone();
    ASSERT_TRUE(cpu::rope_tables({.inv_freq = inv_t, .positions = pos, .cos = c, .sin = s}).is_ok());
    ref::rope_tables({.inv_freq = inv_t, .positions = pos, .cos = c_ref, .sin = s_ref});
    EXPECT_EQ(testing::rel_error(c, c_ref), 0.0);
    EXPECT_EQ(testing::rel_error(s, s_ref), 0.0);
    Tensor x = testing::random_tensor(DType::F32, {n, n_head, head_dim}, uint32_t(n + head_dim));
    Tensor y = x.clone(), want = x.clone();
    ASSERT_TRUE(cpu::rope_forward({.x = y, .cos = c, .sin = s}).is_ok());
    ref::rope_forward({.x = want, .cos = c, .sin = s});
    EXPECT_LE(testing::rel_error(y, want), 1e-6);
    ASSERT_TRUE(cpu::rope_forward({.x = y, .cos = c, .sin = s, .inverse = true}).is_ok());
    EXPECT_LE(testing::rel_error(y, x), 1e-6);  // the inverse rotation undoes it
  }
}

TEST(Rope, InvFreqFollowsTheConfig) {
  auto plain = rope_inv_freq({.theta = 10000.0f}, 8);
  ASSERT_TRUE(plain.is_ok());
  EXPECT_FLOAT_EQ((*plain)[0], 1.0f);
  EXPECT_FLOAT_EQ((*plain)[2], 0.01f);
  auto l3 = rope_inv_freq({.theta = 500000.0f, .type = "llama3", .factor = 8.0f}, 128);
  ASSERT_TRUE(l3.is_ok());
  auto base = rope_inv_freq({.theta = 500000.0f}, 128);
  EXPECT_EQ((*l3)[0], (*base)[0]);                // short wavelengths kept
  EXPECT_FLOAT_EQ((*l3)[63], (*base)[63] / 8.0f);  // long ones divided by factor
  auto bad = rope_inv_freq({.type = "yarn"}, 8);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("yarn"), std::string::npos);
}

// Both paths (16 lanes with a tail where the machine has AVX-512, and the
// scalar one), with gates out to ±100 where exp(-x) alone would overflow.
TEST(Swiglu, MatchesReference) {
  Tensor g = testing::random_tensor(DType::F32, {9, 50}, 300, 4.0f);
  Tensor u = testing::random_tensor(DType::F32, {9, 50}, 301);
  const float extremes[] = {-100.0f, -88.0f, -30.0f, -0.0f, 0.0f, 30.0f, 88.0f, 100.0f};
  std::copy(std::begin(extremes), std::end(extremes), g.data<float>() + 17);
  for (bool portable : {false, true}) {
    cpu::set_portable_only(portable);
    Tensor out = Tensor::zeros(DType::F32, {9, 50}), want = out.clone();
    ASSERT_TRUE(cpu::swiglu_forward({.gate = g, .up = u, .out = out}).is_ok());
    ref::swiglu_forward({.gate = g, .up = u, .out = want});
    EXPECT_LE(testing::rel_error(out, want), 1e-6) << (portable ? "portable" : "vector");
  }
  cpu::set_portable_only(false);
}

TEST(Embedding, MatchesReferenceAndRejectsBadIds) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor table = testing::random_tensor(dt, {11, 24}, 400);
    Tensor ids = Tensor::empty(DType::I32, {4});
    int32_t v[] = {3, 0, 10, 3};
    std::copy(v, v + 4, ids.data<int32_t>());
    Tensor out = Tensor::zeros(DType::F32, {4, 24}), want = out.clone();
    ASSERT_TRUE(cpu::embedding_forward({.tokens = ids, .table = table, .out = out}).is_ok());
    ref::embedding_forward({.tokens = ids, .table = table, .out = want});
    EXPECT_EQ(testing::rel_error(out, want), 0.0);
    ids.data<int32_t>()[2] = 11;
    Status s = cpu::embedding_forward({.tokens = ids, .table = table, .out = out});
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.message(), "embedding: token id 11 at index 2 is out of range [0, 11)");
  }
}

}  // namespace
}  // namespace lathe
