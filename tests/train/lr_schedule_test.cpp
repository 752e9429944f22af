// LR schedules at their boundaries: warmup start and peak, the first decay
// step, the midpoint, max_steps and beyond, against the formulas written out.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "train/lr_schedule.h"

namespace lathe {
namespace {

TEST(LrSchedule, CosineWithWarmupMatchesNemoFormulaAtBoundaries) {
  const LrScheduleConfig c{.kind = LrScheduleKind::kCosine, .max_lr = 1e-3, .min_lr = 1e-5,
                           .warmup_steps = 9, .max_steps = 109};
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 1e-3 * 1.0 / 10.0);  // first step: (0 + 1) / (W + 1)
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 1e-3 * 5.0 / 10.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 9), 1e-3);              // peak at s = W
  const double first = 1e-5 + (1e-3 - 1e-5) * 0.5 * (1.0 + std::cos(std::numbers::pi / 100.0));
  EXPECT_DOUBLE_EQ(lr_at(c, 10), first);
  EXPECT_LT(lr_at(c, 10), 1e-3);
  EXPECT_NEAR(lr_at(c, 59), 0.5 * (1e-3 + 1e-5), 1e-15);  // halfway through the decay
  EXPECT_NEAR(lr_at(c, 109), 1e-5, 1e-15);                  // min_lr at s = T
  EXPECT_DOUBLE_EQ(lr_at(c, 110), 1e-5);
  EXPECT_DOUBLE_EQ(lr_at(c, 100000), 1e-5);
  for (int64_t s = 10; s < 109; ++s) EXPECT_LT(lr_at(c, s + 1), lr_at(c, s)) << s;
}

TEST(LrSchedule, NoWarmupStartsAtPeak) {
  const LrScheduleConfig c{.kind = LrScheduleKind::kCosine, .max_lr = 2.0, .min_lr = 0.0,
                           .warmup_steps = 0, .max_steps = 4};
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 2.0);
  EXPECT_NEAR(lr_at(c, 2), 1.0, 1e-15);
  EXPECT_NEAR(lr_at(c, 4), 0.0, 1e-15);
}

TEST(LrSchedule, LinearDecaysToMinAtMaxSteps) {
  const LrScheduleConfig c{.kind = LrScheduleKind::kLinear, .max_lr = 1.0, .min_lr = 0.1,
                           .warmup_steps = 3, .max_steps = 13};
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 0.1 + 0.9 * 0.9);
  EXPECT_DOUBLE_EQ(lr_at(c, 8), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(lr_at(c, 13), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(c, 14), 0.1);
}

TEST(LrSchedule, ConstantHoldsAfterWarmup) {
  const LrScheduleConfig c{.kind = LrScheduleKind::kConstant, .max_lr = 0.5, .min_lr = 0.0,
                           .warmup_steps = 1, .max_steps = 10};
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(c, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(c, 10), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(c, 50), 0.5);
}

TEST(LrSchedule, WarmupEqualToMaxStepsNeverDividesByZero) {
  const LrScheduleConfig c{.kind = LrScheduleKind::kCosine, .max_lr = 1.0, .min_lr = 0.0,
                           .warmup_steps = 5, .max_steps = 5};
  ASSERT_TRUE(validate(c).is_ok());
  EXPECT_DOUBLE_EQ(lr_at(c, 5), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 6), 0.0);
}

TEST(LrSchedule, ValidateNamesTheProblem) {
  EXPECT_NE(validate(LrScheduleConfig{.max_lr = 1e-4, .min_lr = 1e-3}).message().find("min_lr"), std::string::npos);
  EXPECT_NE(validate(LrScheduleConfig{.warmup_steps = 20, .max_steps = 10}).message().find("warmup_steps"),
            std::string::npos);
  EXPECT_NE(validate(LrScheduleConfig{.max_steps = 0}).message().find("max_steps"), std::string::npos);
  EXPECT_TRUE(validate(LrScheduleConfig{}).is_ok());
}

TEST(LrSchedule, NamesRoundTripAndAcceptNemoClassNames) {
  for (LrScheduleKind k : {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kConstant}) {
    EXPECT_EQ(lr_schedule_from_name(lr_schedule_name(k)), k);
  }
  EXPECT_EQ(lr_schedule_from_name("CosineAnnealing"), LrScheduleKind::kCosine);
  EXPECT_EQ(lr_schedule_from_name("WarmupAnnealing"), LrScheduleKind::kLinear);
  EXPECT_FALSE(lr_schedule_from_name("cosine_annealing").has_value());
}

}  // namespace
}  // namespace lathe
