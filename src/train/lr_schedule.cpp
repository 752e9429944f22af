// Learning-rate schedules (see lr_schedule.h for the formulas and their source).
#include "train/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace lathe {

std::string_view lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kCosine: return "cosine";
    case LrScheduleKind::kLinear: return "linear";
    case LrScheduleKind::kConstant: return "constant";
  }
  return "?";
}

std::optional<LrScheduleKind> lr_schedule_from_name(std::string_view name) {
  for (LrScheduleKind k : {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kConstant}) {
    if (lr_schedule_name(k) == name) return k;
  }
  // NeMo's scheduler class names, so NeMo configs carry over unchanged.
  if (name == "CosineAnnealing") return LrScheduleKind::kCosine;
  if (name == "WarmupAnnealing") return LrScheduleKind::kLinear;
  if (name == "WarmupPolicy") return LrScheduleKind::kConstant;
  return std::nullopt;
}

Status validate(const LrScheduleConfig& c) {
  if (!(c.max_lr > 0.0) || !std::isfinite(c.max_lr)) {
    return invalid_argument("lr schedule: max_lr must be a positive finite number, got ", c.max_lr);
  }
  if (!(c.min_lr >= 0.0) || c.min_lr > c.max_lr) {
    return invalid_argument("lr schedule: min_lr must be in [0, max_lr = ", c.max_lr, "], got ", c.min_lr);
  }
  if (c.warmup_steps < 0) return invalid_argument("lr schedule: warmup_steps must be >= 0, got ", c.warmup_steps);
  if (c.max_steps <= 0) return invalid_argument("lr schedule: max_steps must be > 0, got ", c.max_steps);
  if (c.warmup_steps > c.max_steps) {
    return invalid_argument("lr schedule: warmup_steps (", c.warmup_steps, ") exceeds max_steps (", c.max_steps,
                            "); lower optim.sched.warmup_steps");
  }
  return Status::ok();
}

double lr_at(const LrScheduleConfig& c, int64_t step) {
  const int64_t w = c.warmup_steps;
  if (w > 0 && step <= w) {
    // Negative steps never happen in a run; clamp so the value stays positive.
    const int64_t s = step < 0 ? 0 : step;
    return c.max_lr * static_cast<double>(s + 1) / static_cast<double>(w + 1);
  }
  if (c.kind == LrScheduleKind::kConstant) return c.max_lr;
  if (step > c.max_steps) return c.min_lr;
  // Here w < step <= max_steps (or w == 0 and step <= max_steps), so T - W > 0.
  const double progress = static_cast<double>(step - w) / static_cast<double>(c.max_steps - w);
  const double delta = c.max_lr - c.min_lr;
  if (c.kind == LrScheduleKind::kLinear) return c.min_lr + delta * (1.0 - progress);
  return c.min_lr + delta * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace lathe
