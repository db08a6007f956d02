#pragma once
// Optimizers over a model's named, replicated parameters: SGD (momentum, Nesterov), Adam and
// AdamW, with the update formulas of torch.optim in PyTorch 1.13.
//
// Every rank of a domain group holds the same parameters and, after backward(), the same
// complete gradients (and after Module::average_gradients, the same across data-parallel
// replicas), so every rank takes the same step without communication.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/core/execution.hpp"

namespace shardtensor {

/// Parameters as Module::named_parameters() returns them.
template <class T>
using NamedParameters = std::vector<std::pair<std::string, Variable<T>>>;

/// Optimizer state views, named "<kind>/<parameter name>".
template <class T>
using NamedState = std::vector<std::pair<std::string, ReplicatedView<T>>>;

namespace impl {

/// One parameter in an optimizer's fused update: its values, gradient and up to two state
/// arrays (null where the optimizer keeps fewer), and where its runs start in the update's
/// flat range of work items.
template <class T>
struct ParameterSlot {
  T* value = nullptr;
  T* grad = nullptr;
  T* first_state = nullptr;
  T* second_state = nullptr;
  std::size_t size = 0, first_run = 0;
};

}  // namespace impl

/// Settings of make_optimizer. Each optimizer reads the fields it uses (PyTorch's names and
/// defaults, except AdamW's weight_decay: PyTorch defaults it to 0.01, here it is 0 for all).
struct OptimizerOptions {
  std::string type = "adam";  ///< "sgd", "adam" or "adamw"
  double lr = 1e-3;           ///< learning rate, >= 0
  double momentum = 0.0;      ///< sgd: >= 0; 0 means plain SGD
  double dampening = 0.0;     ///< sgd: >= 0; must be 0 with nesterov
  double weight_decay = 0.0;  ///< >= 0; L2 added to the gradient (sgd, adam) or decoupled (adamw)
  double beta1 = 0.9;         ///< adam, adamw: in [0, 1)
  double beta2 = 0.999;       ///< adam, adamw: in [0, 1)
  double eps = 1e-8;          ///< adam, adamw: >= 0
  bool nesterov = false;      ///< sgd: needs momentum > 0 and dampening 0
};

/// Throws shardtensor::Error naming the first bad option and its value.
void validate(const OptimizerOptions& options);

/// Base class: the parameter list, learning rate and step count. Parameters that do not
/// require gradients are left out (frozen). A parameter whose gradient was never computed
/// has a zero gradient, so it still takes weight decay and momentum (PyTorch skips it).
template <class T>
class Optimizer {
 public:
  Optimizer(const NamedParameters<T>& parameters, double learning_rate, std::string type);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter from its current gradient; increments step_count().
  /// Kokkos kernels only; allocates nothing (state is allocated by the constructor).
  void step();

  /// Sets every parameter's gradient to zero (one kernel).
  void zero_grad();

  double learning_rate() const { return learning_rate_; }
  /// For schedules: call before step(), e.g. set_learning_rate(schedule.at(step_count())).
  void set_learning_rate(double learning_rate);

  /// Number of step() calls so far (Adam's bias correction uses it).
  std::int64_t step_count() const { return step_count_; }
  /// Restores the step count from a checkpoint, together with named_state().
  void set_step_count(std::int64_t count);

  /// The live state views, in a fixed order with names such as "exp_avg/<parameter>":
  /// writing into them (then set_step_count) restores a checkpoint. Empty for plain SGD.
  virtual NamedState<T> named_state() const = 0;

  const NamedParameters<T>& parameters() const { return parameters_; }
  const std::string& type() const { return type_; }

  /// Updates every parameter in one kernel (step_count() already counts this step). Public
  /// only because CUDA lambdas may not live in protected member functions.
  virtual void update_all() = 0;

  /// Values per work item of the fused update: a run the host vectorises, one on a GPU.
  static constexpr std::size_t run_length = kernels_run_on_host ? 256 : 1;

  /// The table of every parameter's addresses, on the device, pointed at the values' and
  /// gradients' current views: for other kernels over all parameters at once
  /// (clip_grad_norm). Copies it to the device only if a view moved.
  Kokkos::View<const impl::ParameterSlot<T>*, DefaultMemorySpace> parameter_table() {
    refresh_slots();
    return slots_;
  }

 protected:
  /// Builds the fused update's table over the parameters and these per-parameter states
  /// (each empty or one view per parameter). Call once, from the constructor.
  void make_slots(const std::vector<ReplicatedView<T>>& first_state,
                  const std::vector<ReplicatedView<T>>& second_state);
  /// The table, on the device, with the values' and gradients' current addresses.
  Kokkos::View<const impl::ParameterSlot<T>*, DefaultMemorySpace> slots() const { return slots_; }
  /// The number of work items of the fused update.
  std::size_t runs() const { return runs_; }

  /// One zero-initialised state view per parameter, labelled "<kind>/<parameter name>".
  std::vector<ReplicatedView<T>> make_state(const std::string& kind) const;
  /// Pairs "<kind>/<parameter name>" with each view of `state`.
  void append_state(NamedState<T>& out, const std::string& kind,
                    const std::vector<ReplicatedView<T>>& state) const;

 private:
  NamedParameters<T> parameters_;
  double learning_rate_;
  std::int64_t step_count_ = 0;
  std::string type_;
  Kokkos::View<impl::ParameterSlot<T>*, DefaultMemorySpace> slots_;
  typename Kokkos::View<impl::ParameterSlot<T>*, DefaultMemorySpace>::HostMirror host_slots_;
  std::size_t runs_ = 0;
  /// Points the table at the values' and gradients' current views (copies it only if one
  /// of them moved).
  void refresh_slots();
};

/// torch.optim.SGD: g = grad + weight_decay * p; with momentum, b = g on the first step and
/// b = momentum * b + (1 - dampening) * g after; g = nesterov ? g + momentum * b : b;
/// p -= lr * g. State: "momentum/<name>" (only when momentum != 0).
template <class T>
class SGD : public Optimizer<T> {
 public:
  SGD(const NamedParameters<T>& parameters, const OptimizerOptions& options);
  NamedState<T> named_state() const override;
  void update_all() override;

 private:
  OptimizerOptions options_;
  std::vector<ReplicatedView<T>> momentum_;
};

/// torch.optim.Adam (amsgrad off), and with `decoupled` torch.optim.AdamW. At step t:
/// Adam:  g = grad + weight_decay * p;   AdamW: g = grad, p *= 1 - lr * weight_decay;
/// m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2;
/// p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
/// State: "exp_avg/<name>", "exp_avg_sq/<name>" for each parameter in turn.
template <class T>
class Adam : public Optimizer<T> {
 public:
  Adam(const NamedParameters<T>& parameters, const OptimizerOptions& options,
       bool decoupled = false);
  NamedState<T> named_state() const override;
  void update_all() override;

 private:
  OptimizerOptions options_;
  bool decoupled_;
  std::vector<ReplicatedView<T>> exp_avg_, exp_avg_sq_;
};

/// torch.optim.AdamW: Adam with decoupled weight decay.
template <class T>
class AdamW : public Adam<T> {
 public:
  AdamW(const NamedParameters<T>& parameters, const OptimizerOptions& options)
      : Adam<T>(parameters, options, true) {}
};

/// The optimizer options.type names ("sgd", "adam", "adamw"), after validate(options).
template <class T>
std::unique_ptr<Optimizer<T>> make_optimizer(const OptimizerOptions& options,
                                             const NamedParameters<T>& parameters);

extern template class Optimizer<float>;
extern template class Optimizer<double>;
extern template class SGD<float>;
extern template class SGD<double>;
extern template class Adam<float>;
extern template class Adam<double>;
extern template std::unique_ptr<Optimizer<float>> make_optimizer(const OptimizerOptions&,
                                                                 const NamedParameters<float>&);
extern template std::unique_ptr<Optimizer<double>> make_optimizer(const OptimizerOptions&,
                                                                  const NamedParameters<double>&);

}  // namespace shardtensor
