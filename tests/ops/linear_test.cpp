// Linear (CPU) against the naive reference over a table of shapes, weight
// dtypes, bias and accumulate, on both the vector and portable kernels.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_ops.h"
#include "ops/op_test_util.h"
#include "ops/reference/reference.h"

namespace lathe {
namespace {

struct LinearCase {
  int64_t n, in, out;
  DType w_dtype;
  bool bias;
  bool accumulate;
};

const LinearCase kCases[] = {
    {1, 64, 64, DType::F32, false, false},   {1, 64, 67, DType::BF16, true, false},
    {1, 100, 33, DType::F16, false, true},   {2, 7, 5, DType::BF16, true, true},
    {3, 64, 130, DType::BF16, false, false}, {4, 136, 20, DType::F32, true, false},
    {5, 64, 64, DType::F32, false, true},    {5, 72, 150, DType::BF16, true, true},
    {17, 100, 67, DType::F16, true, false},  {33, 256, 129, DType::BF16, false, false},
    {1, 1, 1, DType::F32, true, false},      {9, 3, 2, DType::F32, false, false},
    {6, 40, 300, DType::F32, true, true},    {70, 48, 260, DType::BF16, true, true},
    {4, 100, 9, DType::BF16, true, true},    {1, 4100, 5, DType::BF16, false, false},
};

class LinearTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::set_portable_only(GetParam()); }
  void TearDown() override { cpu::set_portable_only(false); }
};

TEST_P(LinearTest, MatchesReference) {
  uint32_t seed = 1;
  for (const LinearCase& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " in=" << c.in << " out=" << c.out << " w="
                                      << dtype_name(c.w_dtype) << " bias=" << c.bias << " acc=" << c.accumulate);
    Tensor x = testing::random_tensor(DType::F32, {c.n, c.in}, seed++);
    Tensor w = testing::random_tensor(c.w_dtype, {c.out, c.in}, seed++);
    Tensor b = c.bias ? testing::random_tensor(c.w_dtype, {c.out}, seed++) : Tensor();
    Tensor y0 = testing::random_tensor(DType::F32, {c.n, c.out}, seed++);
    Tensor y = y0.clone(), want = y0.clone();
    Tensor ws = Tensor::empty(DType::F32, {std::max<int64_t>(1, linear_workspace_floats(c.n, c.in, c.w_dtype, int(seed % 3) + 1))});
    LinearArgs args{.x = x, .w = w, .bias = b, .y = y, .workspace = ws, .accumulate = c.accumulate};
    ASSERT_TRUE(cpu::linear_forward(args).is_ok());
    args.y = want;
    ref::linear_forward(args);
    EXPECT_LE(testing::rel_error(y, want), 1e-5);
  }
}

TEST_P(LinearTest, GroupMatchesSeparateCalls) {
  uint32_t seed = 500;
  for (int64_t n : {1, 3, 6}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int64_t in = 72;
    const struct { int64_t out; DType dt; bool bias; } layers[] = {{96, DType::BF16, true}, {33, DType::F32, false},
                                                                   {40, DType::F16, true}};
    Tensor x = testing::random_tensor(DType::F32, {n, in}, seed++);
    LinearArgs args[3];
    Tensor keep[3][4];
    for (int i = 0; i < 3; ++i) {
      keep[i][0] = testing::random_tensor(layers[i].dt, {layers[i].out, in}, seed++);
      keep[i][1] = layers[i].bias ? testing::random_tensor(layers[i].dt, {layers[i].out}, seed++) : Tensor();
      keep[i][2] = Tensor::zeros(DType::F32, {n, layers[i].out});
      keep[i][3] = Tensor::empty(DType::F32, {std::max<int64_t>(1, linear_workspace_floats(n, in, layers[i].dt, 2))});
      args[i] = {.x = x, .w = keep[i][0], .bias = keep[i][1], .y = keep[i][2], .workspace = keep[i][3]};
    }
    ASSERT_TRUE(cpu::linear_forward_group(args).is_ok());
    for (int i = 0; i < 3; ++i) {
      Tensor want = Tensor::zeros(DType::F32, {n, layers[i].out});
      LinearArgs one = args[i];
      one.y = want;
      ref::linear_forward(one);
      EXPECT_LE(testing::rel_error(keep[i][2], want), 1e-5) << "layer " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, LinearTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "portable" : "vector"; });

TEST(Linear, RejectsBadShapesNamingTheOp) {
  Tensor x = Tensor::zeros(DType::F32, {2, 4});
  Tensor w = Tensor::zeros(DType::F32, {3, 5});
  Tensor y = Tensor::zeros(DType::F32, {2, 3});
  Status s = cpu::linear_forward({.x = x, .w = w, .y = y});
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message().rfind("linear: ", 0), 0u) << s.message();
  Tensor w_ok = Tensor::zeros(DType::BF16, {3, 4});
  Tensor x_big = Tensor::zeros(DType::F32, {8, 4});
  Tensor y_big = Tensor::zeros(DType::F32, {8, 3});
  s = cpu::linear_forward({.x = x_big, .w = w_ok, .y = y_big});  // needs a workspace
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("workspace"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace lathe
