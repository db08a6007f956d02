// Normalization layers (GroupNorm, LayerNorm, BatchNorm in training and evaluation): sharded
// equals one rank on 1-D, 2-D and 3-D fields (uneven splits included), finite-difference
// gradients, a directly computed reference, running statistics, and bad input.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "equivalence.hpp"
#include "shardtensor/layers/conv.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

const std::vector<std::vector<Index>> all_extents{{13}, {9, 7}, {6, 5, 4}};
constexpr Index batch = 2, channels = 4;

enum class Kind { group, group_per_channel, group_plain, layer, batch_train, batch_eval };
const std::vector<Kind> all_kinds{Kind::group, Kind::group_per_channel, Kind::group_plain,
                                  Kind::layer, Kind::batch_train,       Kind::batch_eval};

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::group:
      return "GroupNorm(2, 4)";
    case Kind::group_per_channel:
      return "GroupNorm(4, 4)";
    case Kind::group_plain:
      return "GroupNorm(2, 4, affine=false)";
    case Kind::layer:
      return "LayerNorm(4)";
    case Kind::batch_train:
      return "BatchNorm(4) training";
    default:
      return "BatchNorm(4) evaluation";
  }
}

/// Sets a replicated tensor to base + spread * U(-1, 1) (the same on every rank).
template <class T>
void set_values(const ReplicatedView<T>& values, double base, double spread, std::uint64_t seed) {
  auto host = Kokkos::create_mirror_view(values);
  for (std::size_t i = 0; i < host.extent(0); ++i)
    host(i) = static_cast<T>(base + spread * hashed_uniform(seed, i));
  Kokkos::deep_copy(values, host);
}

/// Affine parameters away from ones and zeros, so the weight enters every gradient.
template <class T>
void randomize_affine(const Variable<T>& weight, const Variable<T>& bias) {
  if (weight.defined()) set_values(weight.data(), 1.0, 0.5, 41);
  if (bias.defined()) set_values(bias.data(), 0.0, 0.3, 43);
}

template <class T>
std::shared_ptr<Module<T>> make_norm(Kind kind, const Communicator& comm) {
  switch (kind) {
    case Kind::group:
    case Kind::group_per_channel:
    case Kind::group_plain: {
      const int groups = kind == Kind::group_per_channel ? 4 : 2;
      auto m = std::make_shared<GroupNorm<T>>(comm, groups, channels, 1e-5,
                                              kind != Kind::group_plain, "gn");
      randomize_affine(m->weight(), m->bias());
      return m;
    }
    case Kind::layer: {
      auto m = std::make_shared<LayerNorm<T>>(comm, channels, 1e-5, true, "ln");
      randomize_affine(m->weight(), m->bias());
      return m;
    }
    default: {
      auto m = std::make_shared<BatchNorm<T>>(comm, channels, 0.1, 1e-5, true, "bn");
      randomize_affine(m->weight(), m->bias());
      if (kind == Kind::batch_eval) {
        set_values(m->running_mean(), 0.0, 0.2, 47);
        set_values(m->running_var(), 0.6, 0.4, 53);
        m->eval();
      }
      return m;
    }
  }
}

template <class T>
test::ModuleFactory<T> factory(Kind kind) {
  return [kind](const Communicator& comm) { return make_norm<T>(kind, comm); };
}

std::vector<Decomposition> decompositions_of(const std::vector<Index>& extents) {
  return test::test_decompositions(extents, test::world_size(),
                                   std::vector<bool>(extents.size(), false), 1);
}

/// Host copy of a gathered whole field in double, indexed (n, c, flat cell).
struct HostField {
  Index batch = 0, channels = 0, cells = 0;
  std::vector<double> values;
  double& at(Index n, Index c, Index i) { return values[(n * channels + c) * cells + i]; }
};

template <class T>
HostField host_field(const FieldView<T>& global) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), global);
  HostField f;
  f.batch = host.extent(0);
  f.channels = host.extent(1);
  f.cells = host.extent(2) * host.extent(3) * host.extent(4);
  f.values.assign(host.data(), host.data() + host.span());
  return f;
}

/// Direct reference: statistics of the cells (n, c, i) with stat(n, c) == s, two-pass in
/// long double; returns the normalized field (before affine) and the per-statistic moments.
template <class StatOf>
HostField reference_normalize(HostField x, Index stats, StatOf stat_of, double eps,
                              std::vector<double>& mean_out, std::vector<double>& var_out) {
  std::vector<long double> sum(stats, 0), sq(stats, 0), count(stats, 0);
  for (Index n = 0; n < x.batch; ++n)
    for (Index c = 0; c < x.channels; ++c)
      for (Index i = 0; i < x.cells; ++i) {
        sum[stat_of(n, c)] += x.at(n, c, i);
        count[stat_of(n, c)] += 1;
      }
  mean_out.assign(stats, 0);
  for (Index s = 0; s < stats; ++s) mean_out[s] = double(sum[s] / count[s]);
  for (Index n = 0; n < x.batch; ++n)
    for (Index c = 0; c < x.channels; ++c)
      for (Index i = 0; i < x.cells; ++i) {
        const long double d =
            x.at(n, c, i) - (long double)(sum[stat_of(n, c)] / count[stat_of(n, c)]);
        sq[stat_of(n, c)] += d * d;
      }
  var_out.assign(stats, 0);
  for (Index s = 0; s < stats; ++s) var_out[s] = double(sq[s] / count[s]);
  for (Index n = 0; n < x.batch; ++n)
    for (Index c = 0; c < x.channels; ++c)
      for (Index i = 0; i < x.cells; ++i) {
        const Index s = stat_of(n, c);
        x.at(n, c, i) = double((x.at(n, c, i) - (long double)(sum[s] / count[s])) /
                               std::sqrt((long double)var_out[s] + eps));
      }
  return x;
}

/// A sharded input field with values offset + spread * U(-1, 1), per global cell.
ShardTensor<double> offset_field(const Decomposition& d, int rank, double offset, double spread) {
  ShardTensor<double> t(d, rank, batch, channels);
  test::fill(t, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
    return offset +
           spread * (1 + c) * hashed_uniform(7, test::global_linear_index(d, channels, n, c, g));
  });
  return t;
}


/// Whether two fields hold the same bits, ghosts included.
template <class T>
bool same_bits(const ShardTensor<T>& a, const ShardTensor<T>& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.view());
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.view());
  return ha.span() == hb.span() &&
         std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(T)) == 0;
}

template <class T>
bool same_bits(const ReplicatedView<T>& a, const ReplicatedView<T>& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  return ha.span() == hb.span() &&
         std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(T)) == 0;
}

/// The normalization `kind` with `activation` fused into it (fuse_activation), or (`fused`
/// false) followed by the activation as an op of its own.
template <class T>
class NormActivation : public Module<T> {
 public:
  NormActivation(Kind kind, Activation activation, bool fused, const Communicator& comm)
      : activation_(activation), fused_(fused) {
    norm_ = make_norm<T>(kind, comm);
    if (fused) {
      if (auto* g = dynamic_cast<GroupNorm<T>*>(norm_.get())) g->fuse_activation(activation);
      if (auto* b = dynamic_cast<BatchNorm<T>*>(norm_.get())) b->fuse_activation(activation);
    }
    this->register_module("norm", norm_);
  }
  Variable<T> forward(const Variable<T>& input) override {
    const Variable<T> y = norm_->forward(input);
    return fused_ ? y : activate(y, activation_);
  }

 private:
  std::shared_ptr<Module<T>> norm_;
  Activation activation_;
  bool fused_;
};

const std::vector<Activation> fused_activations{Activation::gelu, Activation::relu,
                                                Activation::silu, Activation::sigmoid};

}  // namespace

TEMPLATE_TEST_CASE("normalization layers: sharded equals one rank", "[normalization][equivalence]",
                   float, double) {
  for (Kind kind : all_kinds)
    for (const auto& extents : all_extents) {
      INFO(kind_name(kind) << ", " << extents.size() << "-D");
      const auto decompositions = decompositions_of(extents);
      REQUIRE(!decompositions.empty());
      for (const Decomposition& d : decompositions)
        test::check_equivalence<TestType>(factory<TestType>(kind), d, batch, channels);
    }
}

TEMPLATE_TEST_CASE("a normalization reuses its scratch once no graph holds it, per shape",
                   "[normalization][plan]", float, double) {
  for (Kind kind : all_kinds) {
    INFO(kind_name(kind));
    test::check_module_reused_across_shapes<TestType>(
        factory<TestType>(kind), test::reuse_shapes({9, 7}, {6, 10}, 1, batch), channels);
  }
}

TEMPLATE_TEST_CASE("a normalization applied twice in one graph keeps each call's scratch",
                   "[normalization][plan]", float, double) {
  // The first call's statistics are still held by the graph when the second runs: the second
  // must not reuse (overwrite) them. Against two layers with the same parameters.
  const Communicator comm;
  const Decomposition d = decompositions_of({9, 7}).back();
  for (Kind kind : all_kinds) {
    INFO(kind_name(kind));
    const auto run = [&](const std::shared_ptr<Module<TestType>>& first,
                         const std::shared_ptr<Module<TestType>>& second) {
      const auto x = Variable<TestType>::field(
          test::random_shard<TestType>(d, comm.rank(), batch, channels, 11), true, "input");
      const Variable<TestType> y = second->forward(first->forward(x));
      backward(test::weighted_sum(comm, y));
      return std::make_pair(test::host_values(y.value().view()),
                            test::host_values(x.grad().view()));
    };
    const auto shared = make_norm<TestType>(kind, comm);
    CHECK(run(shared, shared) ==
          run(make_norm<TestType>(kind, comm), make_norm<TestType>(kind, comm)));
  }
}

TEMPLATE_TEST_CASE("BatchNorm running statistics: sharded equals one rank",
                   "[normalization][batchnorm]", float, double) {
  const double tolerance = std::is_same<TestType, float>::value ? 1e-5 : 1e-12;
  const Communicator world;
  const Communicator self(MPI_COMM_SELF);
  for (const auto& extents : all_extents)
    for (const Decomposition& d : decompositions_of(extents)) {
      INFO(extents.size() << "-D, decomposition " << d.describe());
      const auto make = factory<TestType>(Kind::batch_train);
      const auto reference = test::run_module<TestType>(make, self, test::unsharded(d), batch,
                                                        channels, test::weighted_sum<TestType>);
      const auto sharded =
          test::run_module<TestType>(make, world, d, batch, channels, test::weighted_sum<TestType>);
      const auto& r = dynamic_cast<const BatchNorm<TestType>&>(*reference.module);
      const auto& s = dynamic_cast<const BatchNorm<TestType>&>(*sharded.module);
      CHECK(s.batches_tracked() == 1);
      CHECK(r.batches_tracked() == 1);
      CHECK(test::relative_error(s.running_mean(), r.running_mean()) <= tolerance);
      CHECK(test::relative_error(s.running_var(), r.running_var()) <= tolerance);
      // Buffers, not parameters.
      const auto params = s.named_parameters();
      REQUIRE(params.size() == 2);
      CHECK(params[0].first == "weight");
      CHECK(params[1].first == "bias");
    }
}

TEMPLATE_TEST_CASE("a fused activation gives the bits of the two layers apart",
                   "[normalization][fused]", float, double) {
  // fuse_activation stores no normalized field: backward recomputes it from the input. The
  // output and every gradient are those of the normalization followed by the activation op
  // (on the host GELU on float runs through the same vector rows), on every decomposition.
  const Communicator world;
  for (Kind kind : all_kinds)
    for (Activation activation : fused_activations)
      for (const auto& extents : all_extents) {
        INFO(kind_name(kind) << ", activation " << int(activation) << ", " << extents.size()
                             << "-D");
        for (const Decomposition& d : decompositions_of(extents)) {
          const auto make = [&](bool fused) {
            return test::run_module<TestType>(
                [&](const Communicator& c) {
                  return std::make_shared<NormActivation<TestType>>(kind, activation, fused, c);
                },
                world, d, batch, channels, test::weighted_sum<TestType>);
          };
          const test::Run<TestType> apart = make(false), fused = make(true);
          CHECK(same_bits(fused.output.value(), apart.output.value()));
          CHECK(same_bits(fused.input.grad(), apart.input.grad()));
          const auto pa = apart.module->named_parameters(), pf = fused.module->named_parameters();
          REQUIRE(pa.size() == pf.size());
          for (std::size_t i = 0; i < pa.size(); ++i) {
            INFO(pa[i].first);
            CHECK(same_bits(pf[i].second.data_grad(), pa[i].second.data_grad()));
          }
        }
      }
}

TEMPLATE_TEST_CASE(
    "a normalization feeding a conv carries the conv's ghost cells, which it fills in place",
    "[normalization][padding]", float, double) {
  // conv -> norm (fused GELU) -> conv, with the norm's output allocated with the second conv's
  // ghost cells (set_output_ghosts, as the U-Net does where nothing keeps it to the backward),
  // against the same without: the output and every gradient bit for bit. The norm's input
  // gradient, which cannot take that output gradient's buffer (another layout), is written
  // over the first conv's output (nothing else holds it). Zeros and reflect padding, 2-D
  // and 3-D, every decomposition of the rank count (several axes split: ghost cells), shards
  // one cell thick included (where the output keeps no ghost cells: normalize()).
  const Communicator world;
  int ghosted = 0;
  for (const PaddingMode mode : {PaddingMode::zeros, PaddingMode::reflect})
    for (const std::vector<Index>& extents :
         {std::vector<Index>{12, 10}, std::vector<Index>{8, 6, 10}}) {
      INFO(extents.size() << "-D, padding " << int(mode));
      for (const Decomposition& d : test::test_decompositions(
               extents, world.size(), std::vector<bool>(extents.size(), false),
               mode == PaddingMode::reflect ? 2 : 1)) {  // (reflect reads 2 owned cells)
        struct Result {
          ShardTensor<TestType> y, gx;
          std::vector<ReplicatedView<TestType>> grads;
          GhostWidths norm_output_ghosts;
        };
        const auto run = [&](bool carry_ghosts) {
          ConvOptions c;
          c.in_channels = 3;
          c.out_channels = int(channels);
          c.kernel.assign(extents.size(), 3);
          c.padding.assign(extents.size(), 1);
          c.padding_mode = mode;
          c.seed = 5;
          const auto first = std::make_shared<Conv<TestType>>(world, c, "first");
          c.in_channels = int(channels);
          c.seed = 6;
          const auto second = std::make_shared<Conv<TestType>>(world, c, "second");
          GroupNorm<TestType> norm(world, 2, int(channels), 1e-5, true, "norm");
          norm.fuse_activation(Activation::gelu);
          if (carry_ghosts)
            norm.set_output_ghosts([second](const ShardTensor<TestType>& like) {
              return second->padded_input_ghosts(like);
            });
          const auto x = Variable<TestType>::field(
              test::random_shard<TestType>(d, world.rank(), batch, 3, 7), true, "x");
          Variable<TestType> h = norm.forward(first->forward(x));
          const GhostWidths ghosts = h.value().ghosts();
          CHECK(h.node()->scratch_ghosts == !ghosts.none());
          const Variable<TestType> y = second->forward(h);
          h = Variable<TestType>();
          backward(test::weighted_sum<TestType>(world, y));
          std::vector<ReplicatedView<TestType>> grads;
          for (const auto* m : {static_cast<const Module<TestType>*>(first.get()),
                                static_cast<const Module<TestType>*>(&norm),
                                static_cast<const Module<TestType>*>(second.get())})
            for (const auto& p : m->named_parameters()) grads.push_back(p.second.data_grad());
          return Result{y.value(), x.grad(), grads, ghosts};
        };
        const Result plain = run(false), carried = run(true);
        CHECK(plain.norm_output_ghosts.none());
        if (!carried.norm_output_ghosts.none()) ++ghosted;
        CHECK(same_bits(carried.y, plain.y));
        CHECK(same_bits(carried.gx, plain.gx));
        REQUIRE(carried.grads.size() == plain.grads.size());
        for (std::size_t i = 0; i < plain.grads.size(); ++i) {
          INFO("parameter " << i << ", " << d.describe());
          CHECK(same_bits(carried.grads[i], plain.grads[i]));
        }
      }
    }
  CHECK(ghosted > 0);  // reflect padding copies even on one rank
}

TEMPLATE_TEST_CASE("a fused activation: sharded equals one rank", "[normalization][fused]",
                   float, double) {
  for (Kind kind : {Kind::group, Kind::layer, Kind::batch_train, Kind::batch_eval})
    for (const auto& extents : all_extents) {
      INFO(kind_name(kind) << ", " << extents.size() << "-D");
      for (const Decomposition& d : decompositions_of(extents))
        test::check_equivalence<TestType>(
            [kind](const Communicator& c) {
              return std::make_shared<NormActivation<TestType>>(kind, Activation::gelu, true, c);
            },
            d, batch, channels);
    }
}

TEST_CASE("a fused activation matches finite differences and leaves a caller's gradient alone",
          "[normalization][fused][gradient]") {
  const auto decompositions = decompositions_of({9, 7});
  for (Kind kind : {Kind::group, Kind::batch_train})
    test::check_gradients_by_finite_differences(
        [kind](const Communicator& c) {
          return std::make_shared<NormActivation<double>>(kind, Activation::gelu, true, c);
        },
        decompositions.back(), batch, channels);
  // A gradient the caller holds is read, not overwritten (the in-place path is for gradients
  // only the node holds).
  const Communicator world;
  const Decomposition& d = decompositions.back();
  NormActivation<float> layer(Kind::group, Activation::gelu, true, world);
  const auto input =
      Variable<float>::field(test::random_shard<float>(d, world.rank(), batch, channels, 11), true);
  const Variable<float> output = layer.forward(input);
  const ShardTensor<float> gradient = test::random_shard<float>(d, world.rank(), batch, channels, 5);
  ShardTensor<float> before(d, world.rank(), batch, channels);
  Kokkos::deep_copy(before.view(), gradient.view());
  backward(output, gradient);
  CHECK(same_bits(gradient, before));
  CHECK_FALSE(same_bits(input.grad(), ShardTensor<float>(d, world.rank(), batch, channels)));

  // An output the caller holds keeps its gradient (the loss's), though nobody else shares the
  // buffer: the in-place paths are for outputs no caller can read again.
  const Variable<float> held = layer.forward(input);
  backward(test::weighted_sum<float>(world, held));
  const Variable<float> leaf = Variable<float>::field(held.value(), true);
  backward(test::weighted_sum<float>(world, leaf));
  CHECK(same_bits(held.grad(), leaf.grad()));
}

TEST_CASE("normalization layers match finite differences", "[normalization][gradient]") {
  for (Kind kind : all_kinds)
    for (const auto& extents : all_extents) {
      INFO(kind_name(kind) << ", " << extents.size() << "-D");
      const auto decompositions = decompositions_of(extents);
      REQUIRE(!decompositions.empty());
      test::check_gradients_by_finite_differences(factory<double>(kind), decompositions.back(),
                                                  batch, channels);
    }
}

TEST_CASE("normalization layers match a direct reference", "[normalization][reference]") {
  const Communicator comm;
  const double eps = 1e-5;
  // A field far from zero mean: the two-pass statistics keep full accuracy there.
  for (const double offset : {3.0, 1e6}) {
    INFO("offset " << offset);
    const auto decompositions = decompositions_of({7, 5});
    const Decomposition& d = decompositions.back();
    const auto input = Variable<double>::field(offset_field(d, comm.rank(), offset, 0.5));
    const HostField x = host_field(all_gather(comm, input.value()));
    std::vector<double> mean, var;

    // GroupNorm(2, 4) without affine: mean 0, variance var / (var + eps) per (n, group).
    GroupNorm<double> group(comm, 2, channels, eps, false);
    HostField y = host_field(all_gather(comm, group(input).value()));
    HostField expected = reference_normalize(
        x, batch * 2, [](Index n, Index c) { return n * 2 + c / 2; }, eps, mean, var);
    for (Index n = 0; n < batch; ++n)
      for (Index g = 0; g < 2; ++g) {
        double m = 0, v = 0, count = 0;
        for (Index c = 2 * g; c < 2 * g + 2; ++c)
          for (Index i = 0; i < y.cells; ++i) {
            m += y.at(n, c, i);
            count += 1;
          }
        m /= count;
        for (Index c = 2 * g; c < 2 * g + 2; ++c)
          for (Index i = 0; i < y.cells; ++i) v += (y.at(n, c, i) - m) * (y.at(n, c, i) - m);
        v /= count;
        INFO("sample " << n << ", group " << g);
        const double var_x = var[n * 2 + g];
        // The centred values carry the rounding of the mean in double: half an ulp of it.
        CHECK(std::abs(m) <= 1e-13 + 2.3e-16 * offset / std::sqrt(var_x));
        CHECK(v == Approx(var_x / (var_x + eps)).epsilon(1e-10));
        CHECK(std::abs(v - 1) <= 1.01 * eps / var_x);
      }
    double diff = 0;
    for (std::size_t i = 0; i < y.values.size(); ++i)
      diff = std::max(diff, std::abs(y.values[i] - expected.values[i]));
    CHECK(diff <= 1e-8);

    // LayerNorm: one statistic per sample; weight 2 and bias 1 on channel 3.
    LayerNorm<double> layer(comm, channels, eps, true);
    set_values(layer.weight().data(), 2.0, 0.0, 0);
    set_values(layer.bias().data(), 1.0, 0.0, 0);
    y = host_field(all_gather(comm, layer(input).value()));
    expected = reference_normalize(
        x, batch, [](Index n, Index) { return n; }, eps, mean, var);
    diff = 0;
    for (std::size_t i = 0; i < y.values.size(); ++i)
      diff = std::max(diff, std::abs(y.values[i] - (2 * expected.values[i] + 1)));
    CHECK(diff <= 2e-8);

    // BatchNorm in training: one statistic per channel over the batch; running estimates.
    BatchNorm<double> bn(comm, channels, 0.25, eps);
    y = host_field(all_gather(comm, bn(input).value()));
    expected = reference_normalize(
        x, channels, [](Index, Index c) { return c; }, eps, mean, var);
    diff = 0;
    for (std::size_t i = 0; i < y.values.size(); ++i)
      diff = std::max(diff, std::abs(y.values[i] - expected.values[i]));
    CHECK(diff <= 1e-8);
    auto running_mean = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bn.running_mean());
    auto running_var = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bn.running_var());
    const double count = double(batch) * d.global_cells();
    for (Index c = 0; c < channels; ++c) {
      INFO("channel " << c);
      CHECK(running_mean(c) == Approx(0.25 * mean[c]).epsilon(1e-12));
      CHECK(running_var(c) == Approx(0.75 + 0.25 * var[c] * count / (count - 1)).epsilon(1e-9));
    }
    // Evaluation: the running estimates normalize.
    bn.eval();
    y = host_field(all_gather(comm, bn(input).value()));
    diff = 0;
    for (Index n = 0; n < batch; ++n)
      for (Index c = 0; c < channels; ++c)
        for (Index i = 0; i < y.cells; ++i) {
          const double want = (x.values[(n * channels + c) * x.cells + i] - running_mean(c)) /
                              std::sqrt(running_var(c) + eps);
          diff = std::max(diff, std::abs(y.at(n, c, i) - want));
        }
    CHECK(diff <= 1e-8);
  }
}

TEST_CASE("normalization layers read only the owned cells of fields with ghosts",
          "[normalization][ghosts]") {
  const Communicator comm;
  const Decomposition d = decompositions_of({9, 7}).back();
  const ShardTensor<double> plain = test::random_shard<double>(d, comm.rank(), batch, channels, 5);
  ShardTensor<double> ghosted(d, comm.rank(), batch, channels, GhostWidths::uniform(1, 2));
  test::fill(ghosted, [&](Index n, Index c, const SpatialIndex& l, const SpatialIndex& g) {
    return test::is_ghost(ghosted, l)
               ? 1e3
               : hashed_uniform(5, test::global_linear_index(d, channels, n, c, g));
  });
  // Ghosted fields feed no loss directly: a 1x1 convolution (which reads only the owned cells
  // too) makes the ghost-free field the loss needs.
  ConvOptions pointwise;
  pointwise.in_channels = pointwise.out_channels = channels;
  pointwise.kernel = {1, 1};
  for (Kind kind : {Kind::group, Kind::batch_train}) {
    INFO(kind_name(kind));
    const auto a = Variable<double>::field(plain, true), b = Variable<double>::field(ghosted, true);
    const auto ya = make_norm<double>(kind, comm)->forward(a);
    const auto yb = make_norm<double>(kind, comm)->forward(b);
    CHECK(yb.value().ghosts() == ghosted.ghosts());
    CHECK(test::relative_error(all_gather(comm, yb.value()), all_gather(comm, ya.value())) <=
          1e-14);
    Conv<double> conv(comm, pointwise);
    backward(test::weighted_sum(comm, conv(ya)));
    backward(test::weighted_sum(comm, conv(yb)));
    CHECK(test::relative_error(all_gather(comm, b.grad()), all_gather(comm, a.grad())) <= 1e-14);
  }
}

TEST_CASE("normalization layers reject bad configurations and inputs", "[normalization][errors]") {
  const Communicator comm;
  CHECK_THROWS_AS(GroupNorm<float>(comm, 3, 4), Error);
  CHECK_THROWS_WITH(GroupNorm<float>(comm, 3, 4, 1e-5, true, "gn"),
                    Contains("GroupNorm 'gn': num_groups 3 must divide channels 4"));
  CHECK_THROWS_WITH(GroupNorm<double>(comm, 0, 4),
                    Contains("GroupNorm 'group_norm': num_groups 0"));
  CHECK_THROWS_WITH(GroupNorm<double>(comm, 2, 4, -1.0), Contains("eps -1 must be"));
  CHECK_THROWS_WITH(LayerNorm<float>(comm, 0), Contains("LayerNorm 'layer_norm': channels 0"));
  CHECK_THROWS_WITH(BatchNorm<float>(comm, 4, 1.5, 1e-5, true, "bn"),
                    Contains("BatchNorm 'bn': momentum 1.5 must lie in [0, 1]"));

  const Decomposition d = Decomposition::automatic({12, 10}, comm.size());
  const auto three = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 2, 3), false, "x");
  GroupNorm<float> gn(comm, 2, 4, 1e-5, true, "gn");
  LayerNorm<float> ln(comm, 4, 1e-5, true, "ln");
  BatchNorm<float> bn(comm, 4, 0.1, 1e-5, true, "bn");
  CHECK_THROWS_WITH(gn(three),
                    Contains("GroupNorm 'gn': input has 3 channels, the layer expects 4"));
  CHECK_THROWS_WITH(ln(three),
                    Contains("LayerNorm 'ln': input has 3 channels, the layer expects 4"));
  CHECK_THROWS_WITH(bn(three),
                    Contains("BatchNorm 'bn': input has 3 channels, the layer expects 4"));
  const auto scalar = sum(comm, three);
  CHECK_THROWS_WITH(gn(scalar), Contains("GroupNorm 'gn': input 'sum' is not a sharded field"));

  // BatchNorm training needs more than one value per channel (PyTorch's rule too).
  const Communicator self(MPI_COMM_SELF);
  const Decomposition one_cell = Decomposition::from_split_points({{0, 1}}, {false});
  BatchNorm<double> single(self, 2, 0.1, 1e-5, true, "bn1");
  const auto lone = Variable<double>::field(ShardTensor<double>(one_cell, 0, 1, 2));
  CHECK_THROWS_WITH(single(lone),
                    Contains("BatchNorm 'bn1': training needs more than one value per channel"));
  single.eval();
  CHECK_NOTHROW(single(lone));
  CHECK(single.batches_tracked() == 0);
}
