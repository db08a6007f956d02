// Pointwise ops, skip connections, shared layers, reductions and losses: sharded == one rank
// and finite-difference gradients.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

const std::vector<Index> extents{14, 12};

ConvOptions conv3x3(int in, int out, std::uint64_t seed) {
  ConvOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.kernel = {3, 3};
  o.padding = {1, 1};
  o.seed = seed;
  return o;
}

/// y = (x + act(conv(x))) * conv(conv(x)): a skip connection, a product, and one conv used
/// twice (shared parameters, gradients from both uses).
template <class T>
class ResidualBlock : public Module<T> {
 public:
  ResidualBlock(const Communicator& comm, Activation kind) : kind_(kind) {
    conv_ = std::make_shared<Conv<T>>(comm, conv3x3(2, 2, 5), "conv");
    shared_ = std::make_shared<Conv<T>>(comm, conv3x3(2, 2, 9), "shared");
    this->register_module("conv", conv_);
    this->register_module("shared", shared_);
  }
  Variable<T> forward(const Variable<T>& x) override {
    const Variable<T> skip = add(x, activate(conv_->forward(x), kind_, 0.1));
    return multiply(skip, shared_->forward(shared_->forward(x)));
  }

 private:
  Activation kind_;
  std::shared_ptr<Conv<T>> conv_, shared_;
};

template <class T>
test::ModuleFactory<T> block_factory(Activation kind) {
  return
      [kind](const Communicator& comm) { return std::make_shared<ResidualBlock<T>>(comm, kind); };
}

/// A loss against a random target field, from the module's output.
template <class T>
test::LossFunction<T> loss_against_target(int which) {
  return [which](const Communicator& comm, const Variable<T>& output) {
    const ShardTensor<T>& y = output.value();
    const auto target = Variable<T>::field(
        test::random_shard<T>(y.decomposition(), comm.rank(), y.batch(), y.channels(), 31), false,
        "target");
    switch (which) {
      case 0:
        return mse_loss(comm, output, target);
      case 1:
        return l1_loss(comm, output, target);
      case 2:
        return relative_l2_loss(comm, output, target);
      default:
        return mean(comm, output);
    }
  };
}

/// conv -> times a trained value per channel -> channel shuffle (2 groups) -> plus one
/// trained value: an imported graph's layer scale and ShuffleNet's shuffle.
template <class T>
class ScaledShuffle : public Module<T> {
 public:
  explicit ScaledShuffle(const Communicator& comm) : comm_(comm) {
    conv_ = std::make_shared<Conv<T>>(comm, conv3x3(2, 4, 3), "conv");
    this->register_module("conv", conv_);
    scale_ = this->register_parameter("scale", {4}, 1.0, 11);
    offset_ = this->register_parameter("offset", {1}, 1.0, 12);
  }
  Variable<T> forward(const Variable<T>& x) override {
    const Variable<T> scaled =
        channel_parameter(comm_, ChannelOp::multiply, conv_->forward(x), scale_);
    return channel_parameter(comm_, ChannelOp::add, channel_shuffle(scaled, 2), offset_);
  }

 private:
  Communicator comm_;
  std::shared_ptr<Conv<T>> conv_;
  Variable<T> scale_, offset_;
};

const std::vector<Activation> all_activations{Activation::relu, Activation::leaky_relu,
                                              Activation::gelu, Activation::silu,
                                              Activation::tanh, Activation::sigmoid};

}  // namespace

TEMPLATE_TEST_CASE("activations, skips and shared layers: sharded equals one rank",
                   "[pointwise][equivalence]", float, double) {
  for (Activation kind : all_activations) {
    INFO("activation " << int(kind));
    for (const Decomposition& d :
         test::test_decompositions(extents, test::world_size(), {false, false}, 2))
      test::check_equivalence<TestType>(block_factory<TestType>(kind), d, 2, 2);
  }
}

TEMPLATE_TEST_CASE("trained per-channel factors and a channel shuffle: sharded equals one rank",
                   "[pointwise][equivalence]", float, double) {
  const test::ModuleFactory<TestType> make = [](const Communicator& comm) {
    return std::make_shared<ScaledShuffle<TestType>>(comm);
  };
  for (const Decomposition& d :
       test::test_decompositions(extents, test::world_size(), {false, false}, 2))
    test::check_equivalence<TestType>(make, d, 2, 2);
  const auto ds = test::test_decompositions(extents, test::world_size(), {false, false}, 2);
  if (std::is_same<TestType, double>::value && !ds.empty())
    test::check_gradients_by_finite_differences(
        test::ModuleFactory<double>([](const Communicator& comm) {
          return std::make_shared<ScaledShuffle<double>>(comm);
        }),
        ds.back(), 1, 2);
}

TEST_CASE("channel_shuffle moves channel b (C / g) + a to a g + b, as nn.ChannelShuffle", "[pointwise]") {
  const Communicator self(MPI_COMM_SELF);
  ShardTensor<double> x(Decomposition({2}, {1}), 0, 1, 6);
  test::fill(x, [](Index, Index c, const SpatialIndex&, const SpatialIndex& g) {
    return double(10 * c + g[0]);
  });
  const auto y = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), channel_shuffle(Variable<double>::field(x), 3).value().view());
  // torch.nn.ChannelShuffle(3) of channels 0..5: 0, 2, 4, 1, 3, 5.
  const int expected[6] = {0, 2, 4, 1, 3, 5};
  for (int c = 0; c < 6; ++c)
    for (int i = 0; i < 2; ++i) CHECK(y(0, c, i, 0, 0) == double(10 * expected[c] + i));
  CHECK_THROWS_WITH(channel_shuffle(Variable<double>::field(x), 4),
                    Contains("4 groups for the 6 channels"));
}

TEST_CASE("an activation handed over without a graph writes over its input, and only then",
          "[pointwise][inference]") {
  // A Sequential hands each child its running value (Module::forward_handed_over). Without a
  // graph an ActivationLayer then writes over the input's field where nothing else holds it:
  // forward's values, no new field. Held elsewhere (another Variable, a copy of its View, a
  // caller's array wrapped without a copy) or in a graph, the input stays as it was.
  const Communicator world;
  const Decomposition d = Decomposition::automatic({12, 10}, world.size());
  const ShardTensor<float> values = test::random_shard<float>(d, world.rank(), 2, 3, 11);
  const std::vector<double> original = test::host_values(values.view());
  const auto copy_of_values = [&] {
    const ShardTensor<float> x(d, world.rank(), 2, 3);
    Kokkos::deep_copy(x.view(), values.view());
    return x;
  };
  for (const Activation kind : all_activations) {
    INFO("activation " << int(kind));
    ActivationLayer<float> layer(kind);
    const std::vector<double> expected =
        test::host_values(layer.forward(Variable<float>::field(values)).value().view());
    {
      const NoGradGuard no_graph;
      Variable<float> sole = Variable<float>::field(copy_of_values());
      const float* data = sole.value().view().data();
      const Variable<float> y = layer.forward_handed_over(std::move(sole));
      CHECK(y.value().view().data() == data);
      CHECK(test::host_values(y.value().view()) == expected);

      Variable<float> shared = Variable<float>::field(copy_of_values());
      const Variable<float> other = shared;
      const Variable<float> y_shared = layer.forward_handed_over(std::move(shared));
      CHECK(test::host_values(other.value().view()) == original);
      CHECK(test::host_values(y_shared.value().view()) == expected);

      const ShardTensor<float> held = copy_of_values();
      const Variable<float> y_held = layer.forward_handed_over(Variable<float>::field(held));
      CHECK(test::host_values(held.view()) == original);
      CHECK(test::host_values(y_held.value().view()) == expected);

      const ShardTensor<float> owner = copy_of_values();
      const Variable<float> y_wrapped = layer.forward_handed_over(Variable<float>::field(
          ShardTensor<float>::wrap(owner.view().data(), d, world.rank(), 2, 3)));
      CHECK(test::host_values(owner.view()) == original);
      CHECK(test::host_values(y_wrapped.value().view()) == expected);
    }
    Variable<float> in_graph = Variable<float>::field(copy_of_values(), true);
    const float* data = in_graph.value().view().data();
    const Variable<float> y_graph = layer.forward_handed_over(std::move(in_graph));
    CHECK(y_graph.value().view().data() != data);
    CHECK(test::host_values(y_graph.value().view()) == expected);
  }
}

TEMPLATE_TEST_CASE("losses and reductions: sharded equals one rank", "[loss][equivalence]", float,
                   double) {
  for (int which = 0; which < 4; ++which) {
    INFO("loss " << which);
    for (const Decomposition& d :
         test::test_decompositions(extents, test::world_size(), {true, false}, 2))
      test::check_equivalence<TestType>(block_factory<TestType>(Activation::gelu), d, 2, 2,
                                        loss_against_target<TestType>(which));
  }
}

TEST_CASE("pointwise ops and losses match finite differences", "[pointwise][loss][gradient]") {
  const auto decompositions =
      test::test_decompositions(extents, test::world_size(), {false, false}, 2);
  REQUIRE(!decompositions.empty());
  for (Activation kind : all_activations) {
    INFO("activation " << int(kind));
    test::check_gradients_by_finite_differences(block_factory<double>(kind), decompositions.back(),
                                                1, 2);
  }
  for (int which = 0; which < 4; ++which) {
    INFO("loss " << which);
    test::check_gradients_by_finite_differences(block_factory<double>(Activation::silu),
                                                decompositions.back(), 2, 2,
                                                loss_against_target<double>(which));
  }
}

TEST_CASE("float GELU and its derivative match the exact values, tails included",
          "[pointwise][gelu]") {
  // x from -10 to 10 on 1003 cells (not a multiple of 16: the vector kernels' last lanes),
  // split over the ranks. Reference: x Phi(x) and Phi(x) + x phi(x) in double from the same
  // float x. 1 + erf(x / sqrt 2) in float has no correct digit left below x = -5.5.
  const Communicator comm;
  const Index cells = 1003;
  const Decomposition d = Decomposition::automatic({cells}, comm.size());
  ShardTensor<float> x(d, comm.rank(), 1, 1);
  const Index first = x.global_box().lower[0];
  auto host = Kokkos::create_mirror_view(x.interior());
  for (Index i = 0; i < x.local_extent(0); ++i)
    host(0, 0, i, 0, 0) = float(-10.0 + 20.0 * double(first + i) / double(cells - 1));
  Kokkos::deep_copy(x.interior(), host);
  const auto input = Variable<float>::field(x, true, "x");
  const Variable<float> y = activate(input, Activation::gelu);
  backward(sum(comm, y));  // dL/dy = 1: the input gradient is the derivative
  auto value = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.value().interior());
  auto slope = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), input.grad().interior());
  double worst_value = 0, worst_slope = 0;
  for (Index i = 0; i < x.local_extent(0); ++i) {
    const double v = host(0, 0, i, 0, 0);
    const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    const double exact = v * cdf, exact_slope = cdf + v * pdf;
    if (exact != 0)
      worst_value = std::max(worst_value, std::abs(value(0, 0, i, 0, 0) - exact) / std::abs(exact));
    worst_slope = std::max(worst_slope, std::abs(slope(0, 0, i, 0, 0) - exact_slope) /
                                            (std::abs(cdf) + std::abs(v * pdf)));
  }
  INFO("largest relative error: GELU " << worst_value << ", derivative " << worst_slope);
  CHECK(worst_value <= 1e-5);
  CHECK(worst_slope <= 1e-5);
}

TEST_CASE("pointwise ops and losses reject fields that do not match", "[pointwise][errors]") {
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({12, 10}, comm.size());
  const auto a = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2), false, "a");
  const auto b = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 3), false, "b");
  CHECK_THROWS_WITH(
      add(a, b), Contains("add: 'a' (batch 1, channels 2") && Contains("'b' (batch 1, channels 3"));
  CHECK_THROWS_WITH(mse_loss(comm, a, b), Contains("mse_loss:"));
  const auto scalar = sum(comm, a);
  // A replicated tensor takes the elementwise functions too (a pooled vector's gate).
  CHECK(activate(scalar, Activation::neg).item() == -scalar.item());
  CHECK_THROWS_WITH(activate(Variable<float>(), Activation::relu),
                    Contains("activate: the input is undefined"));
  CHECK_THROWS_WITH(backward(a),
                    Contains("backward: the loss must be a replicated scalar, got 'a'"));
}

TEST_CASE("losses take a prediction split elsewhere than the target", "[loss][errors]") {
  // Same global field, other split points (a model whose pooling moved them): the losses
  // redistribute the prediction onto the target's split, with the values and gradients of
  // the same split; anything else is refused with both layouts and their split points.
  const Communicator comm;
  const Index n = 22;
  const Decomposition target_split =
      Decomposition::from_split_points({balanced_split_points(n, comm.size()), {0, 5}});
  std::vector<Index> moved = balanced_split_points(n, comm.size());
  for (std::size_t i = 1; i + 1 < moved.size(); ++i) moved[i] += moved[i] % 2;  // 15 -> 16
  const Decomposition output_split = Decomposition::from_split_points({moved, {0, 5}});
  const auto t = test::random_shard<double>(target_split, comm.rank(), 2, 3, 5);
  const auto same = test::random_shard<double>(target_split, comm.rank(), 2, 3, 9);
  const auto other = test::random_shard<double>(output_split, comm.rank(), 2, 3, 9);
  using Loss =
      Variable<double> (*)(const Communicator&, const Variable<double>&, const Variable<double>&);
  for (Loss loss :
       {Loss(&mse_loss<double>), Loss(&l1_loss<double>), Loss(&relative_l2_loss<double>)}) {
    const auto target = Variable<double>::field(t, false, "target");
    const auto p_same = Variable<double>::field(same, true, "p");
    const auto p_other = Variable<double>::field(other, true, "p");
    const Variable<double> l_same = loss(comm, p_same, target);
    const Variable<double> l_other = loss(comm, p_other, target);
    CHECK(l_other.item() == l_same.item());
    backward(l_same);
    backward(l_other);
    CHECK(p_other.grad().decomposition() == output_split);
    CHECK(test::relative_error(all_gather(comm, p_other.grad()), all_gather(comm, p_same.grad())) ==
          0);
  }
  // Another global size: refused, naming both layouts with their split points.
  const Decomposition smaller =
      Decomposition::from_split_points({balanced_split_points(n - 2, comm.size()), {0, 5}});
  const auto small = Variable<double>::field(
      test::random_shard<double>(smaller, comm.rank(), 2, 3, 9), false, "p");
  const std::string m = test::error_message_of(
      [&] { mse_loss(comm, small, Variable<double>::field(t, false, "target")); });
  CHECK_THAT(m, Contains("20x5 cells") && Contains("22x5 cells"));
  if (comm.size() > 1) CHECK_THAT(m, Contains("split x at 0,"));
}

TEST_CASE("data-parallel groups average gradients to the full-batch gradient", "[data_parallel]") {
  // P ranks as a (groups x domain) mesh: each group takes its own sample of a global batch,
  // split over its domain ranks; averaged gradients equal one rank's gradient of the mean
  // loss over the whole batch.
  const Communicator world;
  for (int groups = 1; groups <= world.size(); ++groups) {
    if (world.size() % groups != 0) continue;
    INFO(groups << " data-parallel groups");
    const RankMesh mesh = world.mesh(groups);
    const Decomposition full({14, 12}, {1, 1});
    const Decomposition split = Decomposition::automatic({14, 12}, mesh.domain.size());
    // Batch of `groups` samples: sample s is the random field of seed 100 + s.
    auto sample = [&](const Decomposition& d, int rank, int s) {
      return test::random_shard<double>(d, rank, 1, 2, 100 + s);
    };
    auto target_of = [&](const Decomposition& d, int rank, int s) {
      return test::random_shard<double>(d, rank, 1, 2, 200 + s);
    };
    ResidualBlock<double> replica(mesh.domain, Activation::tanh);
    const auto x =
        Variable<double>::field(sample(split, mesh.domain.rank(), mesh.data_group), false);
    const auto t =
        Variable<double>::field(target_of(split, mesh.domain.rank(), mesh.data_group), false);
    backward(mse_loss(mesh.domain, replica.forward(x), t));
    replica.average_gradients(mesh.data);

    const Communicator self(MPI_COMM_SELF);
    ResidualBlock<double> reference(self, Activation::tanh);
    // Reference: the same samples stacked in one batch on one rank.
    ShardTensor<double> xs(full, 0, groups, 2), ts(full, 0, groups, 2);
    for (int s = 0; s < groups; ++s) {
      Kokkos::deep_copy(
          Kokkos::subview(xs.view(), s, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
          Kokkos::subview(sample(full, 0, s).view(), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL,
                          Kokkos::ALL));
      Kokkos::deep_copy(
          Kokkos::subview(ts.view(), s, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
          Kokkos::subview(target_of(full, 0, s).view(), 0, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL,
                          Kokkos::ALL));
    }
    backward(mse_loss(self, reference.forward(Variable<double>::field(xs)),
                      Variable<double>::field(ts)));
    const auto a = replica.named_parameters(), b = reference.named_parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(test::relative_error(a[i].second.data_grad(), b[i].second.data_grad()) <= 1e-12);
    }
  }
}
