#pragma once
// LearningRateSchedule: the learning rate as a pure function of the optimizer step, so a
// restarted run (or any rank) computes the same rate from the step count alone.

#include <cstdint>
#include <string>

namespace shardtensor {

/// Settings of a LearningRateSchedule. `step` counts optimizer steps from 0: at(s) is the
/// rate for the update made when Optimizer::step_count() == s.
///
/// Warmup, for s < warmup_steps:  lr(s) = base_lr * (w + (1 - w) * s / warmup_steps),
/// with w = warmup_start (0: from zero), reaching base_lr at s = warmup_steps. Then, with
/// t = s - warmup_steps:
///   constant: base_lr
///   step:     base_lr * gamma^floor(t / step_size)
///   cosine:   min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2 for t < T, then
///             min_lr, where T = total_steps - warmup_steps (total_steps counts the warmup)
struct ScheduleOptions {
  std::string type = "constant";  ///< "constant", "step" or "cosine"
  double base_lr = 1e-3;          ///< rate after warmup, > 0
  std::int64_t warmup_steps = 0;  ///< >= 0; 0 means no warmup
  double warmup_start = 0.0;      ///< warmup's first rate as a fraction of base_lr, in [0, 1]
  std::int64_t step_size = 1;     ///< step: steps between decays, >= 1
  double gamma = 0.1;             ///< step: decay factor, in (0, 1]
  std::int64_t total_steps = 0;   ///< cosine: > warmup_steps
  double min_lr = 0.0;            ///< cosine: final rate, in [0, base_lr]
};

/// Throws shardtensor::Error naming the first bad option and its value.
void validate(const ScheduleOptions& options);

class LearningRateSchedule {
 public:
  explicit LearningRateSchedule(ScheduleOptions options);

  /// The learning rate at optimizer step `step` >= 0. Typical use, before each update:
  ///   optimizer.set_learning_rate(schedule.at(optimizer.step_count())); optimizer.step();
  double at(std::int64_t step) const;

  const ScheduleOptions& options() const { return options_; }

 private:
  ScheduleOptions options_;
};

}  // namespace shardtensor
