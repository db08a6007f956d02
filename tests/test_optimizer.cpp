// Optimizers, learning-rate schedules and gradient clipping: every update equals scalar
// double code written from PyTorch 1.13's formulas (torch.optim.SGD, Adam, AdamW,
// clip_grad_norm_); optimizer state round trips bit for bit; bad options are named.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "shardtensor/core/kernel_counter.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/optim/grad_clip.hpp"
#include "shardtensor/optim/lr_schedule.hpp"
#include "shardtensor/optim/optimizer.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

/// Parameter sizes: several, including a scalar, and some of several runs of the fused
/// update's work items on the host (256 values), one of them a run and a value long.
const std::vector<Index> parameter_sizes{7, 33, 1, 16, 300, 257, 1000};

template <class T>
std::vector<double> to_host(const ReplicatedView<T>& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<double>(host.data(), host.data() + host.extent(0));
}

template <class T>
void from_host(const ReplicatedView<T>& view, const std::vector<double>& values) {
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = static_cast<T>(values[i]);
  Kokkos::deep_copy(view, host);
}

/// Random values in [-1, 1), rounded to T so the double reference starts from the same
/// numbers as the optimizer.
template <class T>
std::vector<double> random_values(Index n, std::uint64_t seed) {
  std::vector<double> out(n);
  for (Index i = 0; i < n; ++i) out[i] = static_cast<T>(hashed_uniform(seed, i));
  return out;
}

/// Random parameters "layer<i>.weight" of parameter_sizes.
template <class T>
NamedParameters<T> random_parameters(std::uint64_t seed) {
  NamedParameters<T> out;
  for (std::size_t i = 0; i < parameter_sizes.size(); ++i) {
    const std::string name = "layer" + std::to_string(i) + ".weight";
    ReplicatedView<T> values(name, parameter_sizes[i]);
    from_host(values, random_values<T>(parameter_sizes[i], seed + 17 * i));
    out.emplace_back(name, Variable<T>::replicated(values, {parameter_sizes[i]}, true, name));
  }
  return out;
}

/// Parameters with the same values in new views.
template <class T>
NamedParameters<T> copy_parameters(const NamedParameters<T>& parameters) {
  NamedParameters<T> out;
  for (const auto& [name, p] : parameters) {
    ReplicatedView<T> values(name, p.data().extent(0));
    Kokkos::deep_copy(values, p.data());
    out.emplace_back(name, Variable<T>::replicated(values, p.shape(), true, name));
  }
  return out;
}

/// All parameter values (or gradients) one after the other.
template <class T>
std::vector<double> flat_values(const NamedParameters<T>& parameters, bool gradients = false) {
  std::vector<double> out;
  for (const auto& named : parameters) {
    const auto v = to_host(gradients ? named.second.data_grad() : named.second.data());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

/// Sets random gradients for step `step` and returns them, flat.
template <class T>
std::vector<double> set_random_gradients(const NamedParameters<T>& parameters, int step) {
  std::vector<double> all;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const ReplicatedView<T> grad = parameters[i].second.data_grad();
    const auto g = random_values<T>(grad.extent(0), 1000 + 100 * step + i);
    from_host(grad, g);
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

/// PyTorch 1.13's update rules on flat double vectors (all are elementwise).
struct Reference {
  OptimizerOptions o;
  std::vector<double> p, buffer, exp_avg_sq;  // buffer: momentum or exp_avg
  std::int64_t t = 0;

  Reference(OptimizerOptions options, std::vector<double> values)
      : o(std::move(options)), p(std::move(values)), buffer(p.size()), exp_avg_sq(p.size()) {}

  void step(const std::vector<double>& grad) {
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (o.type == "sgd") {
        g += o.weight_decay * p[i];
        if (o.momentum != 0) {
          buffer[i] = t == 1 ? g : o.momentum * buffer[i] + (1 - o.dampening) * g;
          g = o.nesterov ? g + o.momentum * buffer[i] : buffer[i];
        }
        p[i] -= o.lr * g;
        continue;
      }
      if (o.type == "adamw")
        p[i] *= 1 - o.lr * o.weight_decay;
      else
        g += o.weight_decay * p[i];
      buffer[i] = o.beta1 * buffer[i] + (1 - o.beta1) * g;
      exp_avg_sq[i] = o.beta2 * exp_avg_sq[i] + (1 - o.beta2) * g * g;
      const double bias_correction1 = 1 - std::pow(o.beta1, double(t));
      const double bias_correction2 = 1 - std::pow(o.beta2, double(t));
      const double denom = std::sqrt(exp_avg_sq[i]) / std::sqrt(bias_correction2) + o.eps;
      p[i] -= o.lr / bias_correction1 * buffer[i] / denom;
    }
  }
};

OptimizerOptions options_of(std::string type, double lr) {
  OptimizerOptions o;
  o.type = std::move(type);
  o.lr = lr;
  return o;
}

/// One of each feature: plain, L2, momentum, dampening, Nesterov; Adam and AdamW.
std::vector<OptimizerOptions> optimizer_cases() {
  std::vector<OptimizerOptions> cases;
  cases.push_back(options_of("sgd", 0.1));
  cases.push_back(options_of("sgd", 0.05));
  cases.back().weight_decay = 0.01;
  cases.push_back(options_of("sgd", 0.1));
  cases.back().momentum = 0.9;
  cases.push_back(options_of("sgd", 0.07));
  cases.back().momentum = 0.8;
  cases.back().dampening = 0.3;
  cases.back().weight_decay = 0.02;
  cases.push_back(options_of("sgd", 0.05));
  cases.back().momentum = 0.7;
  cases.back().nesterov = true;
  cases.back().weight_decay = 0.03;
  cases.push_back(options_of("adam", 0.01));
  cases.push_back(options_of("adam", 0.02));
  cases.back().weight_decay = 0.05;
  cases.back().beta1 = 0.8;
  cases.back().beta2 = 0.99;
  cases.back().eps = 1e-6;
  cases.push_back(options_of("adamw", 0.01));
  cases.back().weight_decay = 0.1;
  return cases;
}

std::string describe(const OptimizerOptions& o) {
  std::ostringstream s;
  s << o.type << " lr " << o.lr << " momentum " << o.momentum << " dampening " << o.dampening
    << " nesterov " << o.nesterov << " weight_decay " << o.weight_decay << " betas " << o.beta1
    << "," << o.beta2 << " eps " << o.eps;
  return s.str();
}

template <class T>
double tolerance() {
  return std::is_same<T, float>::value ? 1e-5 : 1e-12;
}

/// Largest |a - b| / max(1, |b|).
double max_error(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  return worst;
}

/// Copies `from`'s state into `to` by name (as a checkpoint would).
template <class T>
void copy_state(const Optimizer<T>& from, Optimizer<T>& to) {
  std::map<std::string, ReplicatedView<T>> saved;
  for (const auto& [name, view] : from.named_state()) saved[name] = view;
  const NamedState<T> target = to.named_state();
  REQUIRE(target.size() == saved.size());
  for (const auto& [name, view] : target) {
    INFO("state " << name);
    REQUIRE(saved.count(name) == 1);
    Kokkos::deep_copy(view, saved[name]);
  }
  to.set_step_count(from.step_count());
}

/// A module with a parameter and a child, to see its names in the optimizer state.
template <class T>
class TinyModule : public Module<T> {
 public:
  explicit TinyModule(bool with_child) {
    this->register_parameter("weight", {3, 2}, 0.5, 11);
    if (with_child) this->register_module("child", std::make_shared<TinyModule>(false));
  }
  Variable<T> forward(const Variable<T>& input) override { return input; }
};

}  // namespace

TEMPLATE_TEST_CASE("optimizers follow PyTorch's update formulas", "[optimizer]", float, double) {
  for (const OptimizerOptions& options : optimizer_cases()) {
    INFO(describe(options));
    const auto parameters = random_parameters<TestType>(7);
    auto optimizer = make_optimizer<TestType>(options, parameters);
    CHECK(optimizer->type() == options.type);
    Reference reference(options, flat_values(parameters));
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      // A changing rate, as a schedule sets it.
      const double lr = options.lr * (1 + 0.2 * step);
      optimizer->set_learning_rate(lr);
      reference.o.lr = lr;
      reference.step(set_random_gradients(parameters, step));
      optimizer->step();
      CHECK(optimizer->step_count() == step + 1);
      CHECK(max_error(flat_values(parameters), reference.p) <= tolerance<TestType>());
    }
  }
}

TEST_CASE("a step, and zero_grad, update every parameter in one kernel", "[optimizer][launches]") {
  for (const OptimizerOptions& options : optimizer_cases()) {
    INFO(describe(options));
    const auto parameters = random_parameters<float>(3);
    auto optimizer = make_optimizer<float>(options, parameters);
    set_random_gradients(parameters, 0);
    optimizer->step();
    KernelCounter counter;
    optimizer->step();
    const KernelCounts c = counter.counts();
    CHECK(c.launches == 1);
    CHECK(c.deep_copies == 0);  // the table of gradients is copied only when one moves
    CHECK(c.allocations == 0);
    counter.reset();
    optimizer->zero_grad();
    CHECK(counter.counts().launches == 1);
    for (const double g : flat_values(parameters, true)) REQUIRE(g == 0);
  }
}

/// A replicated scalar whose backward adds into w's gradient, in `order`: 'p' a rank-local
/// partial sum (rank + 1)(i + 1) (summed over the ranks by the autodiff), 'w' a whole
/// gradient 0.5 (i + 1).
Variable<double> reads_weight(const Communicator& comm, const Variable<double>& w,
                              const std::string& order) {
  auto node = make_result_node<double>("reads_weight", {w.node()});
  node->is_field = false;
  node->data = ReplicatedView<double>("reads_weight", 1);
  node->shape = {1};
  node->backward = [comm, order](impl::Node<double>& self) {
    impl::Node<double>& weight = *self.inputs[0];
    for (const char kind : order) {
      const ReplicatedView<double> g =
          kind == 'p' ? weight.grad_partial(comm) : weight.grad_data();
      const double scale = kind == 'p' ? comm.rank() + 1.0 : 0.5;
      Kokkos::parallel_for(
          "reads_weight", g.extent(0), KOKKOS_LAMBDA(const std::size_t i) {
            g(i) += scale * double(i + 1);
          });
    }
  };
  return Variable<double>(node);
}

TEST_CASE(
    "partial gradient sums go into a zeroed gradient in place, and still add up where it is "
    "not",
    "[autograd][partial]") {
  // A parameter's rank-local partial sums are summed over the ranks into its gradient. Where
  // the gradient holds zeros (new, after zero_grad, after Optimizer::zero_grad) they go into
  // it and are summed in place: no second buffer. Where it does not (accumulation over two
  // backward calls), or a whole gradient joins them, the sums still add up exactly.
  const Communicator comm;
  const double ranks_sum = comm.size() * (comm.size() + 1) / 2.0;  // sum of rank + 1
  const auto w = Variable<double>::replicated(ReplicatedView<double>("w", 300), {300}, true, "w");
  const auto gradient_is = [&](double partials, double wholes) {
    const std::vector<double> g = to_host(w.data_grad());
    bool exact = true;
    for (std::size_t i = 0; i < g.size(); ++i)
      exact = exact && g[i] == (partials * ranks_sum + 0.5 * wholes) * double(i + 1);
    return exact;
  };
  const auto separate_buffer = [&] { return w.node()->partial_grad.extent(0) != 0; };
  backward(reads_weight(comm, w, "p"));
  CHECK(gradient_is(1, 0));
  CHECK_FALSE(separate_buffer());
  backward(reads_weight(comm, w, "p"));  // accumulates: the gradient holds the first
  CHECK(gradient_is(2, 0));
  CHECK(separate_buffer());
  w.zero_grad();
  backward(reads_weight(comm, w, "pwp"));  // a whole gradient between partial sums
  CHECK(gradient_is(2, 1));
  w.zero_grad();
  backward(reads_weight(comm, w, "wp"));
  CHECK(gradient_is(1, 1));
  OptimizerOptions sgd;
  sgd.type = "sgd";
  auto optimizer = make_optimizer<double>(sgd, {{"w", w}});
  optimizer->zero_grad();
  backward(reads_weight(comm, w, "pp"));
  CHECK(gradient_is(2, 0));
  CHECK_FALSE(separate_buffer());  // in place again: the other path's buffer went
}

TEST_CASE("Adam minimises a quadratic", "[optimizer]") {
  // f(x) = sum a_i (x_i - c_i)^2 / 2 with curvatures a_i in [0.5, 1.5].
  const Index n = 40;
  ReplicatedView<double> x("x", n), a("a", n), c("c", n);
  from_host(x, random_values<double>(n, 1));
  from_host(c, random_values<double>(n, 2));
  auto curvature = random_values<double>(n, 3);
  for (double& v : curvature) v = 1 + 0.5 * v;
  from_host(a, curvature);
  const auto parameter = Variable<double>::replicated(x, {n}, true, "x");
  OptimizerOptions options = options_of("adam", 0.05);
  auto optimizer = make_optimizer<double>(options, {{"x", parameter}});
  ScheduleOptions schedule_options;
  schedule_options.type = "cosine";
  schedule_options.base_lr = 0.05;
  schedule_options.warmup_steps = 20;
  schedule_options.total_steps = 1500;
  const LearningRateSchedule schedule(schedule_options);
  auto distance = [&] {
    const auto xv = to_host(x), cv = to_host(c);
    double worst = 0;
    for (Index i = 0; i < n; ++i) worst = std::max(worst, std::abs(xv[i] - cv[i]));
    return worst;
  };
  const double initial = distance();
  REQUIRE(initial > 0.5);
  const ReplicatedView<double> grad = parameter.data_grad();
  for (int step = 0; step < 1500; ++step) {
    Kokkos::parallel_for(
        "quadratic_gradient", n, KOKKOS_LAMBDA(const Index i) { grad(i) = a(i) * (x(i) - c(i)); });
    optimizer->set_learning_rate(schedule.at(optimizer->step_count()));
    optimizer->step();
  }
  CHECK(distance() < 1e-4);
}

TEST_CASE("learning-rate schedules at warmup and boundaries", "[schedule]") {
  ScheduleOptions o;
  o.base_lr = 0.1;
  SECTION("constant, no warmup") {
    const LearningRateSchedule s(o);
    CHECK(s.at(0) == 0.1);
    CHECK(s.at(123456) == 0.1);
  }
  SECTION("constant with linear warmup from zero") {
    o.warmup_steps = 4;
    const LearningRateSchedule s(o);
    CHECK(s.at(0) == 0.0);
    CHECK(s.at(1) == Approx(0.025).epsilon(1e-15));
    CHECK(s.at(3) == Approx(0.075).epsilon(1e-15));
    CHECK(s.at(4) == 0.1);
    CHECK(s.at(1000) == 0.1);
  }
  SECTION("warmup from a start factor") {
    o.warmup_steps = 10;
    o.warmup_start = 0.2;
    const LearningRateSchedule s(o);
    CHECK(s.at(0) == Approx(0.02).epsilon(1e-15));
    CHECK(s.at(5) == Approx(0.06).epsilon(1e-15));
    CHECK(s.at(10) == 0.1);
  }
  SECTION("step decay after warmup") {
    o.type = "step";
    o.warmup_steps = 2;
    o.step_size = 3;
    o.gamma = 0.5;
    const LearningRateSchedule s(o);
    CHECK(s.at(1) == Approx(0.05).epsilon(1e-15));
    CHECK(s.at(2) == 0.1);
    CHECK(s.at(4) == 0.1);
    CHECK(s.at(5) == Approx(0.05).epsilon(1e-15));
    CHECK(s.at(7) == Approx(0.05).epsilon(1e-15));
    CHECK(s.at(8) == Approx(0.025).epsilon(1e-15));
    CHECK(s.at(2 + 3 * 10) == Approx(0.1 * std::pow(0.5, 10)).epsilon(1e-15));
  }
  SECTION("cosine to min_lr") {
    o.type = "cosine";
    o.base_lr = 1.0;
    o.min_lr = 0.1;
    o.warmup_steps = 10;
    o.total_steps = 110;
    const LearningRateSchedule s(o);
    const double pi = std::acos(-1.0);
    CHECK(s.at(5) == Approx(0.5).epsilon(1e-15));
    CHECK(s.at(10) == 1.0);
    CHECK(s.at(35) == Approx(0.1 + 0.45 * (1 + std::cos(pi / 4))).epsilon(1e-14));
    CHECK(s.at(60) == Approx(0.55).epsilon(1e-14));
    CHECK(s.at(109) == Approx(0.1 + 0.45 * (1 + std::cos(pi * 99 / 100))).epsilon(1e-14));
    CHECK(s.at(110) == 0.1);
    CHECK(s.at(5000) == 0.1);
  }
}

TEST_CASE("schedules reject bad options, naming them", "[schedule][errors]") {
  auto rejects = [](ScheduleOptions o, const std::string& text) {
    INFO(text);
    CHECK_THROWS_WITH(LearningRateSchedule(o), Contains("ScheduleOptions: ") && Contains(text));
  };
  ScheduleOptions o;
  o.type = "exponential";
  rejects(o, "option 'type' is 'exponential'; accepted: constant, step, cosine");
  o = {};
  o.base_lr = -0.5;
  rejects(o, "option 'base_lr' must be a finite number > 0, got -0.5");
  o = {};
  o.warmup_steps = -3;
  rejects(o, "option 'warmup_steps' must be >= 0, got -3");
  o = {};
  o.warmup_start = 1.5;
  rejects(o, "option 'warmup_start' must lie in [0, 1], got 1.5");
  o = {};
  o.type = "step";
  o.step_size = 0;
  rejects(o, "option 'step_size' must be >= 1, got 0");
  o.step_size = 2;
  o.gamma = 1.5;
  rejects(o, "option 'gamma' must lie in (0, 1], got 1.5");
  o = {};
  o.type = "cosine";
  o.warmup_steps = 10;
  o.total_steps = 10;
  rejects(o, "option 'total_steps' must exceed warmup_steps 10, got 10");
  o.total_steps = 100;
  o.min_lr = 0.5;
  rejects(o, "option 'min_lr' must lie in [0, base_lr 0.001], got 0.5");
  CHECK_THROWS_WITH(LearningRateSchedule(ScheduleOptions{}).at(-1),
                    Contains("LearningRateSchedule::at: step must be >= 0, got -1"));
}

TEMPLATE_TEST_CASE("clip_grad_norm follows clip_grad_norm_", "[clip]", float, double) {
  const auto parameters = random_parameters<TestType>(3);
  // A frozen parameter with a gradient: neither counted nor scaled.
  ReplicatedView<TestType> frozen_values("frozen", 5);
  const auto frozen = Variable<TestType>::replicated(frozen_values, {5}, false, "frozen");
  from_host(frozen.data_grad(), random_values<TestType>(5, 99));
  auto with_frozen = parameters;
  with_frozen.emplace_back("frozen", frozen);
  const auto frozen_grad = to_host(frozen.data_grad());

  const auto grads = set_random_gradients(parameters, 0);
  double sum = 0;
  for (double g : grads) sum += g * g;
  const double norm = std::sqrt(sum);

  // Above the norm: nothing changes, bit for bit.
  CHECK(clip_grad_norm(with_frozen, 2 * norm) == Approx(norm).epsilon(1e-13));
  CHECK(flat_values(parameters, true) == grads);

  // Below the norm: scaled to max_norm.
  const double max_norm = 0.3 * norm;
  CHECK(clip_grad_norm(with_frozen, max_norm) == Approx(norm).epsilon(1e-13));
  const auto scale = static_cast<TestType>(max_norm / (norm + 1e-6));
  std::vector<double> expected;
  for (double g : grads) expected.push_back(static_cast<TestType>(g) * scale);
  CHECK(max_error(flat_values(parameters, true), expected) <= tolerance<TestType>() * 1e-2);
  CHECK(to_host(frozen.data_grad()) == frozen_grad);
  // Now max_norm * norm / (norm + 1e-6).
  CHECK(clip_grad_norm(with_frozen, 1e30) == Approx(max_norm).epsilon(1e-5));

  CHECK_THROWS_WITH(clip_grad_norm(parameters, 0.0),
                    Contains("clip_grad_norm: max_norm must be a finite number > 0, got 0"));
}

TEMPLATE_TEST_CASE("clip_grad_norm over an optimizer's table: the same bits in one kernel each",
                   "[clip][launches]", float, double) {
  const auto parameters = random_parameters<TestType>(5);
  auto optimizer = make_optimizer<TestType>(options_of("sgd", 0.1), parameters);
  const auto grads = set_random_gradients(parameters, 0);
  double sum = 0;
  for (double g : grads) sum += g * g;
  const double norm = std::sqrt(sum);

  // Above the norm: one kernel for every parameter's sum of squares, nothing scaled.
  KernelCounter counter;
  const double through_table = clip_grad_norm(*optimizer, 2 * norm);
  CHECK(counter.counts().launches == 1);
  CHECK(through_table == Approx(norm).epsilon(1e-13));
  CHECK(through_table == clip_grad_norm(parameters, 2 * norm));  // the same bits
  CHECK(flat_values(parameters, true) == grads);

  // Below: one more kernel scales every gradient.
  const double max_norm = 0.3 * norm;
  counter.reset();
  CHECK(clip_grad_norm(*optimizer, max_norm) == through_table);
  CHECK(counter.counts().launches == 2);
  const auto scale = static_cast<TestType>(max_norm / (through_table + 1e-6));
  std::vector<double> expected;
  for (double g : grads) expected.push_back(static_cast<TestType>(g * scale));
  CHECK(flat_values(parameters, true) == expected);  // one rounding per value, as g * scale
}

TEMPLATE_TEST_CASE("optimizer state round trips to a bit-identical run", "[optimizer][state]",
                   float, double) {
  for (const OptimizerOptions& options : optimizer_cases()) {
    INFO(describe(options));
    // Uninterrupted: six steps.
    const auto straight = random_parameters<TestType>(5);
    auto straight_optimizer = make_optimizer<TestType>(options, straight);
    for (int step = 0; step < 6; ++step) {
      set_random_gradients(straight, step);
      straight_optimizer->step();
    }
    // Three steps, then "restart": new parameters and optimizer from the saved state.
    const auto first = random_parameters<TestType>(5);
    auto first_optimizer = make_optimizer<TestType>(options, first);
    for (int step = 0; step < 3; ++step) {
      set_random_gradients(first, step);
      first_optimizer->step();
    }
    const auto resumed = copy_parameters(first);
    auto resumed_optimizer = make_optimizer<TestType>(options, resumed);
    copy_state(*first_optimizer, *resumed_optimizer);
    for (int step = 3; step < 6; ++step) {
      set_random_gradients(resumed, step);
      resumed_optimizer->step();
    }
    CHECK(resumed_optimizer->step_count() == 6);
    CHECK(flat_values(resumed) == flat_values(straight));
    // The state too.
    const auto a = straight_optimizer->named_state(), b = resumed_optimizer->named_state();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(to_host(a[i].second) == to_host(b[i].second));
  }
}

TEST_CASE("optimizer state names follow the parameters", "[optimizer][state]") {
  const TinyModule<float> module(true);
  auto names_of = [](const NamedState<float>& state) {
    std::vector<std::string> names;
    for (const auto& named : state) names.push_back(named.first);
    return names;
  };
  auto adam = make_optimizer<float>(options_of("adamw", 0.1), module.named_parameters());
  CHECK(names_of(adam->named_state()) ==
        std::vector<std::string>{"exp_avg/weight", "exp_avg_sq/weight", "exp_avg/child.weight",
                                 "exp_avg_sq/child.weight"});
  OptimizerOptions momentum = options_of("sgd", 0.1);
  momentum.momentum = 0.9;
  auto sgd = make_optimizer<float>(momentum, module.named_parameters());
  CHECK(names_of(sgd->named_state()) ==
        std::vector<std::string>{"momentum/weight", "momentum/child.weight"});
  CHECK(make_optimizer<float>(options_of("sgd", 0.1), module.named_parameters())
            ->named_state()
            .empty());
  // Each state view has its parameter's size.
  for (const auto& [name, view] : adam->named_state()) CHECK(view.extent(0) == 6);

  // Frozen parameters are left out, and not stepped.
  ReplicatedView<float> values("frozen", 4);
  Kokkos::deep_copy(values, 0.5f);
  const auto frozen = Variable<float>::replicated(values, {4}, false, "frozen");
  Kokkos::deep_copy(frozen.data_grad(), 1.0f);
  auto with_frozen = module.named_parameters();
  with_frozen.emplace_back("frozen", frozen);
  auto optimizer = make_optimizer<float>(options_of("adam", 0.1), with_frozen);
  CHECK(optimizer->parameters().size() == 2);
  optimizer->step();
  CHECK(to_host(values) == std::vector<double>(4, 0.5));
}

TEST_CASE("optimizers reject bad options, naming them", "[optimizer][errors]") {
  const auto parameters = random_parameters<double>(1);
  auto rejects = [&](const OptimizerOptions& o, const std::string& text) {
    INFO(text);
    CHECK_THROWS_WITH(make_optimizer<double>(o, parameters),
                      Contains("OptimizerOptions: ") && Contains(text));
  };
  rejects(options_of("rmsprop", 0.1), "option 'type' is 'rmsprop'; accepted: sgd, adam, adamw");
  rejects(options_of("adam", -0.1), "option 'lr' must be a finite number >= 0, got -0.1");
  rejects(options_of("sgd", std::nan("")), "option 'lr' must be a finite number >= 0, got nan");
  OptimizerOptions o = options_of("adam", 0.1);
  o.beta1 = 1.0;
  rejects(o, "option 'beta1' must lie in [0, 1), got 1");
  o = options_of("adamw", 0.1);
  o.beta2 = -0.5;
  rejects(o, "option 'beta2' must lie in [0, 1), got -0.5");
  o = options_of("adam", 0.1);
  o.eps = -1e-8;
  rejects(o, "option 'eps' must be a finite number >= 0, got -1e-08");
  o = options_of("adamw", 0.1);
  o.weight_decay = -0.01;
  rejects(o, "option 'weight_decay' must be a finite number >= 0, got -0.01");
  o = options_of("sgd", 0.1);
  o.momentum = -0.9;
  rejects(o, "option 'momentum' must be a finite number >= 0, got -0.9");
  o = options_of("sgd", 0.1);
  o.nesterov = true;
  rejects(o, "option 'nesterov' needs momentum > 0 and dampening 0, got momentum 0");
  o.momentum = 0.9;
  o.dampening = 0.1;
  rejects(o,
          "option 'nesterov' needs momentum > 0 and dampening 0, got momentum 0.9 and "
          "dampening 0.1");
  // The classes check too, not only the factory.
  o = options_of("sgd", 0.1);
  o.momentum = -1;
  CHECK_THROWS_WITH(SGD<double>(parameters, o), Contains("option 'momentum'"));
  o = options_of("adam", 0.1);
  o.beta1 = 2;
  CHECK_THROWS_WITH(AdamW<double>(parameters, o), Contains("option 'beta1'"));

  auto optimizer = make_optimizer<double>(options_of("sgd", 0.1), parameters);
  CHECK_THROWS_WITH(optimizer->set_learning_rate(-2),
                    Contains("Optimizer::set_learning_rate: learning rate must be a finite "
                             "number >= 0, got -2"));
  CHECK_THROWS_WITH(optimizer->set_step_count(-1),
                    Contains("Optimizer::set_step_count: step count must be >= 0, got -1"));
  auto twice = parameters;
  twice.push_back(parameters.front());
  CHECK_THROWS_WITH(make_optimizer<double>(options_of("sgd", 0.1), twice),
                    Contains("Optimizer: parameter name 'layer0.weight' appears twice"));
  twice.back().first = "alias";
  CHECK_THROWS_WITH(make_optimizer<double>(options_of("sgd", 0.1), twice),
                    Contains("parameter 'alias' is listed twice under different names"));
}
