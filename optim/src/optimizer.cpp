#include "shardtensor/optim/optimizer.hpp"

#include <cmath>
#include <unordered_set>

#include "shardtensor/core/error.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/core/memory_tracker.hpp"

namespace shardtensor {

namespace {

/// `value` is a number >= 0 (NaN fails too).
void require_non_negative(double value, const char* option) {
  SHARDTENSOR_REQUIRE(std::isfinite(value) && value >= 0, "OptimizerOptions",
                      "option '" << option << "' must be a finite number >= 0, got " << value);
}

void require_beta(double value, const char* option) {
  SHARDTENSOR_REQUIRE(value >= 0 && value < 1, "OptimizerOptions",
                      "option '" << option << "' must lie in [0, 1), got " << value);
}

/// Calls update(slot, begin, end) for every run of `run_length` values of every parameter in
/// the table, in one kernel: a work item finds its parameter by bisection over the runs'
/// starts. Every value sees the same operations as in a kernel of its own.
template <class T, class Update>
void for_each_run(const char* label,
                  const Kokkos::View<const impl::ParameterSlot<T>*, DefaultMemorySpace>& slots,
                  std::size_t runs, const Update& update) {
  constexpr std::size_t run = Optimizer<T>::run_length;
  const std::size_t count = slots.extent(0);
  Kokkos::parallel_for(
      label, runs, KOKKOS_LAMBDA(const std::size_t item) {
        std::size_t low = 0, high = count;  // the last slot with first_run <= item
        while (high - low > 1) {
          const std::size_t mid = (low + high) / 2;
          if (slots(mid).first_run <= item)
            low = mid;
          else
            high = mid;
        }
        const impl::ParameterSlot<T> slot = slots(low);
        const std::size_t begin = (item - slot.first_run) * run;
        update(slot, begin, begin + run < slot.size ? begin + run : slot.size);
      });
}

}  // namespace

void validate(const OptimizerOptions& o) {
  SHARDTENSOR_REQUIRE(o.type == "sgd" || o.type == "adam" || o.type == "adamw", "OptimizerOptions",
                      "option 'type' is '" << o.type << "'; accepted: sgd, adam, adamw");
  require_non_negative(o.lr, "lr");
  require_non_negative(o.weight_decay, "weight_decay");
  if (o.type == "sgd") {
    require_non_negative(o.momentum, "momentum");
    require_non_negative(o.dampening, "dampening");
    SHARDTENSOR_REQUIRE(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "OptimizerOptions",
                        "option 'nesterov' needs momentum > 0 and dampening 0, got momentum "
                            << o.momentum << " and dampening " << o.dampening);
  } else {
    require_beta(o.beta1, "beta1");
    require_beta(o.beta2, "beta2");
    require_non_negative(o.eps, "eps");
  }
}

// ---------------------------------------------------------------------------------------
// Optimizer

template <class T>
Optimizer<T>::Optimizer(const NamedParameters<T>& parameters, double learning_rate,
                        std::string type)
    : learning_rate_(learning_rate), type_(std::move(type)) {
  std::unordered_set<std::string> names;
  std::unordered_set<const void*> nodes;
  for (const auto& [name, p] : parameters) {
    SHARDTENSOR_REQUIRE(p.defined() && !p.is_field(), "Optimizer",
                        "parameter '" << name << "' is not a replicated tensor");
    if (!p.requires_grad()) continue;  // frozen
    // Duplicates would be stepped twice and make state names ambiguous in checkpoints.
    SHARDTENSOR_REQUIRE(names.insert(name).second, "Optimizer",
                        "parameter name '" << name << "' appears twice");
    SHARDTENSOR_REQUIRE(nodes.insert(p.node().get()).second, "Optimizer",
                        "parameter '" << name << "' is listed twice under different names");
    MemoryCategoryScope memory(MemoryCategory::parameters);  // gradients count with parameters
    p.node()->grad_storage();  // allocate a missing gradient now (zeros), not inside step()
    parameters_.emplace_back(name, p);
  }
  set_learning_rate(learning_rate);
}

template <class T>
void Optimizer<T>::step() {
  ++step_count_;
  refresh_slots();
  update_all();
}

template <class T>
void Optimizer<T>::make_slots(const std::vector<ReplicatedView<T>>& first_state,
                              const std::vector<ReplicatedView<T>>& second_state) {
  MemoryCategoryScope memory(MemoryCategory::optimizer_state);
  slots_ = Kokkos::View<impl::ParameterSlot<T>*, DefaultMemorySpace>("optimizer slots",
                                                                     parameters_.size());
  host_slots_ = Kokkos::create_mirror_view(slots_);
  runs_ = 0;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    impl::ParameterSlot<T>& slot = host_slots_(i);
    slot.value = parameters_[i].second.data().data();
    slot.first_state = first_state.empty() ? nullptr : first_state[i].data();
    slot.second_state = second_state.empty() ? nullptr : second_state[i].data();
    slot.size = parameters_[i].second.data().extent(0);
    slot.first_run = runs_;
    runs_ += (slot.size + run_length - 1) / run_length;
  }
  refresh_slots();
}

template <class T>
void Optimizer<T>::refresh_slots() {
  bool moved = false;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    T* value = parameters_[i].second.data().data();
    T* grad = parameters_[i].second.node()->grad_storage().data();  // zeros stay known zeros
    moved = moved || host_slots_(i).value != value || host_slots_(i).grad != grad;
    host_slots_(i).value = value;
    host_slots_(i).grad = grad;
  }
  // On a host backend the mirror is the table itself.
  if (moved && host_slots_.data() != slots_.data()) Kokkos::deep_copy(slots_, host_slots_);
}

template <class T>
void Optimizer<T>::zero_grad() {
  refresh_slots();
  for_each_run<T>(
      "Optimizer::zero_grad", slots(), runs(),
      KOKKOS_LAMBDA(const impl::ParameterSlot<T>& slot, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) slot.grad[i] = T(0);
      });
  // The next backward's partial sums of each gradient may go into it (Node::grad_partial).
  for (auto& named : parameters_) named.second.node()->note_grad_zeroed();
}

template <class T>
void Optimizer<T>::set_learning_rate(double learning_rate) {
  SHARDTENSOR_REQUIRE(std::isfinite(learning_rate) && learning_rate >= 0,
                      "Optimizer::set_learning_rate",
                      "learning rate must be a finite number >= 0, got " << learning_rate);
  learning_rate_ = learning_rate;
}

template <class T>
void Optimizer<T>::set_step_count(std::int64_t count) {
  SHARDTENSOR_REQUIRE(count >= 0, "Optimizer::set_step_count",
                      "step count must be >= 0, got " << count);
  step_count_ = count;
}

template <class T>
std::vector<ReplicatedView<T>> Optimizer<T>::make_state(const std::string& kind) const {
  std::vector<ReplicatedView<T>> state;
  MemoryCategoryScope memory(MemoryCategory::optimizer_state);
  for (const auto& [name, p] : parameters_)
    state.emplace_back(kind + "/" + name, p.data().extent(0));  // zero-initialised
  return state;
}

template <class T>
void Optimizer<T>::append_state(NamedState<T>& out, const std::string& kind,
                                const std::vector<ReplicatedView<T>>& state) const {
  for (std::size_t i = 0; i < state.size(); ++i)
    out.emplace_back(kind + "/" + parameters_[i].first, state[i]);
}

// ---------------------------------------------------------------------------------------
// SGD

template <class T>
SGD<T>::SGD(const NamedParameters<T>& parameters, const OptimizerOptions& options)
    : Optimizer<T>(parameters, options.lr, "sgd"), options_(options) {
  options_.type = "sgd";
  validate(options_);
  if (options_.momentum != 0) momentum_ = this->make_state("momentum");
  this->make_slots(momentum_, {});
}

template <class T>
NamedState<T> SGD<T>::named_state() const {
  NamedState<T> out;
  this->append_state(out, "momentum", momentum_);
  return out;
}

template <class T>
void SGD<T>::update_all() {
  const T lr = static_cast<T>(this->learning_rate());
  const T weight_decay = static_cast<T>(options_.weight_decay);
  if (momentum_.empty()) {
    for_each_run<T>(
        "SGD::update", this->slots(), this->runs(),
        KOKKOS_LAMBDA(const impl::ParameterSlot<T>& slot, std::size_t begin, std::size_t end) {
          T* __restrict__ const pv = slot.value;
          const T* __restrict__ const pg = slot.grad;
          for (std::size_t i = begin; i < end; ++i) pv[i] -= lr * (pg[i] + weight_decay * pv[i]);
        });
    return;
  }
  const T momentum = static_cast<T>(options_.momentum);
  // PyTorch starts the buffer as a copy of the first gradient (no dampening then).
  const T keep = this->step_count() == 1 ? T(0) : momentum;
  const T add = this->step_count() == 1 ? T(1) : static_cast<T>(1 - options_.dampening);
  const bool nesterov = options_.nesterov;
  for_each_run<T>(
      "SGD::update_momentum", this->slots(), this->runs(),
      KOKKOS_LAMBDA(const impl::ParameterSlot<T>& slot, std::size_t begin, std::size_t end) {
        T* __restrict__ const pv = slot.value;
        const T* __restrict__ const pg = slot.grad;
        T* __restrict__ const pb = slot.first_state;
        for (std::size_t i = begin; i < end; ++i) {
          const T g = pg[i] + weight_decay * pv[i];
          const T b = keep * pb[i] + add * g;
          pb[i] = b;
          pv[i] -= lr * (nesterov ? g + momentum * b : b);
        }
      });
}

// ---------------------------------------------------------------------------------------
// Adam, AdamW

template <class T>
Adam<T>::Adam(const NamedParameters<T>& parameters, const OptimizerOptions& options, bool decoupled)
    : Optimizer<T>(parameters, options.lr, decoupled ? "adamw" : "adam"),
      options_(options),
      decoupled_(decoupled) {
  options_.type = this->type();
  validate(options_);
  exp_avg_ = this->make_state("exp_avg");
  exp_avg_sq_ = this->make_state("exp_avg_sq");
  this->make_slots(exp_avg_, exp_avg_sq_);
}

template <class T>
NamedState<T> Adam<T>::named_state() const {
  NamedState<T> out;
  for (std::size_t i = 0; i < exp_avg_.size(); ++i) {
    const std::string& name = this->parameters()[i].first;
    out.emplace_back("exp_avg/" + name, exp_avg_[i]);
    out.emplace_back("exp_avg_sq/" + name, exp_avg_sq_[i]);
  }
  return out;
}

template <class T>
void Adam<T>::update_all() {
  // Scalars in double, as PyTorch computes them in Python floats.
  const double lr = this->learning_rate();
  const double step = static_cast<double>(this->step_count());
  const double bias_correction1 = 1 - std::pow(options_.beta1, step);
  const double bias_correction2 = 1 - std::pow(options_.beta2, step);
  const T step_size = static_cast<T>(lr / bias_correction1);
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T beta1 = static_cast<T>(options_.beta1), beta2 = static_cast<T>(options_.beta2);
  const T one_minus_beta1 = static_cast<T>(1 - options_.beta1);
  const T one_minus_beta2 = static_cast<T>(1 - options_.beta2);
  const T eps = static_cast<T>(options_.eps);
  // Adam adds weight_decay * p to the gradient; AdamW shrinks p before the update.
  const T l2 = decoupled_ ? T(0) : static_cast<T>(options_.weight_decay);
  const T shrink = decoupled_ ? static_cast<T>(1 - lr * options_.weight_decay) : T(1);
  // On the host a work item updates a run of values through restrict pointers, a loop the
  // compiler vectorises (one value per item, with the four Views possibly aliasing, ran its
  // divisions and square root one at a time: 2 % of the main job's step); on a GPU one value
  // per thread. The same operations in the same order either way: the same bits.
  for_each_run<T>(
      "Adam::update", this->slots(), this->runs(),
      KOKKOS_LAMBDA(const impl::ParameterSlot<T>& slot, std::size_t begin, std::size_t end) {
        T* __restrict__ const pv = slot.value;
        const T* __restrict__ const pg = slot.grad;
        T* __restrict__ const pm = slot.first_state;
        T* __restrict__ const ps = slot.second_state;
        for (std::size_t i = begin; i < end; ++i) {
          const T p = pv[i] * shrink;
          const T g = pg[i] + l2 * p;
          const T mi = beta1 * pm[i] + one_minus_beta1 * g;
          const T vi = beta2 * ps[i] + one_minus_beta2 * g * g;
          pm[i] = mi;
          ps[i] = vi;
          const T denom = math::sqrt(vi) / bias_correction2_sqrt + eps;
          pv[i] = p - step_size * (mi / denom);
        }
      });
}

// ---------------------------------------------------------------------------------------

template <class T>
std::unique_ptr<Optimizer<T>> make_optimizer(const OptimizerOptions& options,
                                             const NamedParameters<T>& parameters) {
  validate(options);
  if (options.type == "sgd") return std::make_unique<SGD<T>>(parameters, options);
  if (options.type == "adamw") return std::make_unique<AdamW<T>>(parameters, options);
  return std::make_unique<Adam<T>>(parameters, options);
}

template class Optimizer<float>;
template class Optimizer<double>;
template class SGD<float>;
template class SGD<double>;
template class Adam<float>;
template class Adam<double>;
template std::unique_ptr<Optimizer<float>> make_optimizer(const OptimizerOptions&,
                                                          const NamedParameters<float>&);
template std::unique_ptr<Optimizer<double>> make_optimizer(const OptimizerOptions&,
                                                           const NamedParameters<double>&);

}  // namespace shardtensor
