#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lathe {
namespace {

TEST(DType, Bf16RoundTripsExactValuesAndRoundsToNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-30f}) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(f)))));
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 and 1.015625: ties to even (1.015625).
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16MatchesIeeeHalfOnEdgeCases) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);   // rounds to inf
  EXPECT_EQ(f32_to_f16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.98023223876953125e-08f), 0x0000);  // half of it: ties to even → 0
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DType, SafetensorsNamesRoundTrip) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8, DType::BOOL}) {
    auto back = dtype_from_safetensors_name(dtype_safetensors_name(t));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("F128").has_value());
}

TEST(Tensor, ConvertsBetweenFloatTypes) {
  Tensor a = Tensor::empty(DType::F32, {2, 3});
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = static_cast<float>(i) * 0.5f;
  Tensor b = a.to(DType::BF16).to(DType::F16).to_f32();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(b.data<float>()[i], a.data<float>()[i]);
  EXPECT_EQ(b.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.view().slice_rows(1, 2).ptr<float>()[0], 1.5f);
}

Result<int> half_of(int x) {
  if (x % 2) return invalid_argument("half_of: ", x, " is odd");
  return x / 2;
}
Status use_half(int x, int* out) {
  LATHE_ASSIGN_OR_RETURN(*out, half_of(x));
  return Status::ok();
}

TEST(Status, ResultCarriesValueOrMessage) {
  int v = 0;
  EXPECT_TRUE(use_half(4, &v).is_ok());
  EXPECT_EQ(v, 2);
  Status s = use_half(3, &v);
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(), "half_of: 3 is odd");
  EXPECT_EQ(s.with_context("load x").message(), "load x: half_of: 3 is odd");
}

}  // namespace
}  // namespace lathe
