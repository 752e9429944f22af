// Attention (CPU) against the naive reference: prefill, decode at an offset,
// GQA groups, sliding windows; vector and portable kernels.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_ops.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

struct AttentionCase {
  int64_t n, pos0, n_head, n_head_kv, head_dim;
  int window;
};

const AttentionCase kCases[] = {
    {1, 0, 1, 1, 8, 0},    {7, 0, 4, 2, 16, 0},   {1, 9, 4, 2, 16, 0},  {3, 5, 8, 2, 32, 0},
    {12, 0, 4, 4, 12, 0},  {12, 0, 4, 2, 16, 8},  {1, 20, 4, 1, 16, 8}, {5, 6, 6, 3, 20, 3},
    {40, 10, 4, 2, 64, 0},
};

class AttentionTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::set_portable_only(GetParam()); }
  void TearDown() override { cpu::set_portable_only(false); }
};

TEST_P(AttentionTest, MatchesReference) {
  uint32_t seed = 100;
  for (const AttentionCase& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " pos0=" << c.pos0 << " heads=" << c.n_head << "/"
                                      << c.n_head_kv << " d=" << c.head_dim << " window=" << c.window);
    const int64_t n_ctx = c.pos0 + c.n + 3;  // spare cache rows must be ignored
    Tensor q = testing::random_tensor(DType::F32, {c.n, c.n_head, c.head_dim}, seed++);
    Tensor k = testing::random_tensor(DType::F32, {n_ctx, c.n_head_kv, c.head_dim}, seed++);
    Tensor v = testing::random_tensor(DType::F32, {n_ctx, c.n_head_kv, c.head_dim}, seed++);
    Tensor out = Tensor::zeros(DType::F32, {c.n, c.n_head, c.head_dim});
    Tensor want = out.clone();
    Tensor lse = Tensor::zeros(DType::F32, {c.n, c.n_head}), lse_want = lse.clone();
    Tensor ws = Tensor::empty(DType::F32, {attention_workspace_floats(n_ctx, 4)});
    AttentionArgs args{.q = q, .k = k, .v = v, .out = out, .lse = lse, .workspace = ws,
                       .pos0 = int(c.pos0), .window = c.window, .scale = 1.0f / std::sqrt(float(c.head_dim))};
    ASSERT_TRUE(cpu::attention_forward(args).is_ok());
    args.out = want;
    args.lse = lse_want;
    ref::attention_forward(args);
    EXPECT_LE(testing::rel_error(out, want), 1e-5);
    EXPECT_LE(testing::rel_error(lse, lse_want), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "portable" : "vector"; });

TEST(Attention, RejectsOverflowAndBadGroups) {
  Tensor q = Tensor::zeros(DType::F32, {2, 3, 8});
  Tensor k = Tensor::zeros(DType::F32, {4, 2, 8});
  Tensor out = Tensor::zeros(DType::F32, {2, 3, 8});
  Tensor ws = Tensor::zeros(DType::F32, {16});
  Status s = cpu::attention_forward({.q = q, .k = k, .v = k, .out = out, .workspace = ws});
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message().rfind("attention: ", 0), 0u) << s.message();
  Tensor q2 = Tensor::zeros(DType::F32, {2, 4, 8});
  Tensor out2 = Tensor::zeros(DType::F32, {2, 4, 8});
  s = cpu::attention_forward({.q = q2, .k = k, .v = k, .out = out2, .workspace = ws, .pos0 = 3});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("exceed"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace lathe
