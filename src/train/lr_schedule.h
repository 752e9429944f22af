// Learning-rate schedules: linear warmup, then cosine, linear or constant.
// The schedule is a pure function of the optimizer-step index, so resuming a
// run needs only the step count. Formulas follow NeMo's WarmupPolicy family
// (CosineAnnealing with constant_steps = 0, WarmupAnnealing, WarmupPolicy), with
// s = 0-based index of the optimizer step about to run, W = warmup_steps,
// T = max_steps:
//   s <= W and W > 0 : lr = max_lr * (s + 1) / (W + 1)
//   s > T            : lr = min_lr                          (cosine, linear)
//   cosine           : lr = min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * (s - W) / (T - W)))
//   linear           : lr = min_lr + (max_lr - min_lr) * (1 - (s - W) / (T - W))
//   constant         : lr = max_lr
// The warmup peak is reached at s = W, and min_lr at s = T (one past the last
// step of a T-step run, as in NeMo, whose scheduler starts at step 0).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/status.h"

namespace lathe {

enum class LrScheduleKind : uint8_t { kCosine, kLinear, kConstant };

std::string_view lr_schedule_name(LrScheduleKind kind);  // "cosine", "linear", "constant"
// Also accepts NeMo's class names: CosineAnnealing, WarmupAnnealing, WarmupPolicy.
std::optional<LrScheduleKind> lr_schedule_from_name(std::string_view name);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double max_lr = 1e-4;       // peak, reached at the end of warmup
  double min_lr = 0.0;        // floor of the decay
  int64_t warmup_steps = 0;   // W
  int64_t max_steps = 1000;   // T: steps over which the decay runs
};
Status validate(const LrScheduleConfig& c);  // messages start with "lr schedule: "

// The learning rate for optimizer step `step` (0-based). Pure; any thread.
double lr_at(const LrScheduleConfig& c, int64_t step);

}  // namespace lathe
