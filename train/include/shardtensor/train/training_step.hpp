#pragma once
// One optimizer step on a batch: what `shardtensor train` and an embedding solver's
// online training (Session::train_step) both run, so the two train identically.

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/layers/loss.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/optim/grad_clip.hpp"
#include "shardtensor/optim/lr_schedule.hpp"
#include "shardtensor/optim/optimizer.hpp"

namespace shardtensor {

/// The loss a config names (training.loss: mse, l1 or relative_l2), over the global field.
template <class T>
Variable<T> loss_by_name(const std::string& kind, const Communicator& domain,
                         const Variable<T>& prediction, const Variable<T>& target) {
  if (kind == "mse") return mse_loss(domain, prediction, target);
  if (kind == "l1") return l1_loss(domain, prediction, target);
  if (kind == "relative_l2") return relative_l2_loss(domain, prediction, target);
  SHARDTENSOR_FAIL("training.loss", "unknown loss '" << kind << "' (mse, l1, relative_l2)");
}

/// The value of a scalar Variable (the same on every rank of its communicator).
template <class T>
double scalar_value(const Variable<T>& v) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v.data());
  return double(host(0));
}

struct StepOutcome {
  double loss = 0;       ///< this data group's loss (the same on its domain ranks)
  double grad_norm = 0;  ///< global gradient norm before clipping; 0 when not clipping
  double learning_rate = 0;
};

/// forward, loss over `domain`, backward, gradient mean over `data_parallel`, clipping to
/// `max_grad_norm` (0: none), the schedule's learning rate, the update, zero_grad.
/// Collective over the model's communicators. What forward and backward allocate counts as
/// activations (layers' own scopes take workspaces, buffers and parameter gradients out);
/// a memory budget (set_memory_budget) is checked after the forward pass and after backward,
/// every rank throwing together.
template <class T>
StepOutcome training_step(Module<T>& model, Optimizer<T>& optimizer,
                          const LearningRateSchedule& schedule, const Communicator& domain,
                          const Communicator& data_parallel, const std::string& loss,
                          double max_grad_norm, const ShardTensor<T>& input,
                          const ShardTensor<T>& target) {
  MemoryCategoryScope graph_memory(MemoryCategory::activations);
  Variable<T> value;
  {  // Only the loss holds the prediction: its value and gradient go as backward passes them.
    const Variable<T> prediction = model.forward(Variable<T>::field(input));
    value = loss_by_name(loss, domain, prediction, Variable<T>::field(target));
  }
  check_memory_budget(domain, data_parallel);
  backward(value);
  check_memory_budget(domain, data_parallel);
  model.average_gradients(data_parallel);
  StepOutcome outcome;
  if (max_grad_norm > 0) outcome.grad_norm = clip_grad_norm(optimizer, max_grad_norm);
  outcome.learning_rate = schedule.at(optimizer.step_count());
  optimizer.set_learning_rate(outcome.learning_rate);
  optimizer.step();
  optimizer.zero_grad();
  outcome.loss = scalar_value(value);
  return outcome;
}

}  // namespace shardtensor
