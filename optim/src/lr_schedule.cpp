#include "shardtensor/optim/lr_schedule.hpp"

#include <cmath>
#include <utility>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

void validate(const ScheduleOptions& o) {
  const char* where = "ScheduleOptions";
  SHARDTENSOR_REQUIRE(o.type == "constant" || o.type == "step" || o.type == "cosine", where,
                      "option 'type' is '" << o.type << "'; accepted: constant, step, cosine");
  SHARDTENSOR_REQUIRE(std::isfinite(o.base_lr) && o.base_lr > 0, where,
                      "option 'base_lr' must be a finite number > 0, got " << o.base_lr);
  SHARDTENSOR_REQUIRE(o.warmup_steps >= 0, where,
                      "option 'warmup_steps' must be >= 0, got " << o.warmup_steps);
  SHARDTENSOR_REQUIRE(o.warmup_start >= 0 && o.warmup_start <= 1, where,
                      "option 'warmup_start' must lie in [0, 1], got " << o.warmup_start);
  if (o.type == "step") {
    SHARDTENSOR_REQUIRE(o.step_size >= 1, where,
                        "option 'step_size' must be >= 1, got " << o.step_size);
    SHARDTENSOR_REQUIRE(o.gamma > 0 && o.gamma <= 1, where,
                        "option 'gamma' must lie in (0, 1], got " << o.gamma);
  }
  if (o.type == "cosine") {
    SHARDTENSOR_REQUIRE(o.total_steps > o.warmup_steps, where,
                        "option 'total_steps' must exceed warmup_steps "
                            << o.warmup_steps << ", got " << o.total_steps);
    SHARDTENSOR_REQUIRE(
        o.min_lr >= 0 && o.min_lr <= o.base_lr, where,
        "option 'min_lr' must lie in [0, base_lr " << o.base_lr << "], got " << o.min_lr);
  }
}

LearningRateSchedule::LearningRateSchedule(ScheduleOptions options) : options_(std::move(options)) {
  validate(options_);
}

double LearningRateSchedule::at(std::int64_t step) const {
  SHARDTENSOR_REQUIRE(step >= 0, "LearningRateSchedule::at", "step must be >= 0, got " << step);
  const ScheduleOptions& o = options_;
  if (step < o.warmup_steps) {
    const double fraction = static_cast<double>(step) / static_cast<double>(o.warmup_steps);
    return o.base_lr * (o.warmup_start + (1 - o.warmup_start) * fraction);
  }
  const std::int64_t t = step - o.warmup_steps;
  if (o.type == "step") return o.base_lr * std::pow(o.gamma, static_cast<double>(t / o.step_size));
  if (o.type == "cosine") {
    const std::int64_t decay_steps = o.total_steps - o.warmup_steps;
    if (t >= decay_steps) return o.min_lr;
    const double pi = 3.14159265358979323846;
    const double progress = static_cast<double>(t) / static_cast<double>(decay_steps);
    return o.min_lr + (o.base_lr - o.min_lr) * 0.5 * (1 + std::cos(pi * progress));
  }
  return o.base_lr;
}

}  // namespace shardtensor
