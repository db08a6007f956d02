// Models: the U-Net and config-built sequential models sharded equal one rank (outputs, input
// gradients, every parameter gradient), finite differences, inference without a graph
// (NoGradGuard), parameter names and counts, and the config errors the builder reports.

#include <catch2/catch.hpp>

#include "equivalence.hpp"
#include "model_options.hpp"
#include "shardtensor/models.hpp"

using namespace shardtensor;
using namespace shardtensor::models;
using Catch::Matchers::Contains;

namespace {

/// Decompositions for a U-Net of `depth` levels: every shard keeps `min_cells` cells at
/// full resolution (at least 2^depth, so none is empty at the coarsest level). Uneven splits
/// have odd split points, which exercises the redistribution before the skip concat.
std::vector<Decomposition> unet_decompositions(const std::vector<Index>& extents, int depth,
                                               Index min_cells = 0, std::size_t most = 4) {
  std::vector<Decomposition> ds = test::test_decompositions(
      extents, test::world_size(), std::vector<bool>(extents.size(), false),
      std::max(min_cells, Index(1) << depth));
  if (ds.size() > most) ds.erase(ds.begin() + long(most), ds.end());
  return ds;
}

template <class T>
test::ModuleFactory<T> unet_factory(const UNetOptions& options) {
  return [options](const Communicator& comm) { return std::make_shared<UNet<T>>(comm, options); };
}


template <class T>
std::shared_ptr<Module<T>> from_yaml(const std::string& text, const Communicator& comm,
                                     const ModelShape& shape) {
  return build_model<T>(YAML::Load(text), comm, shape);
}

std::string build_error(const std::string& text, const ModelShape& shape = {2, 1, 1}) {
  const Communicator self(MPI_COMM_SELF);
  return test::error_message_of([&] { from_yaml<float>(text, self, shape); });
}

}  // namespace

TEMPLATE_TEST_CASE("UNet 2-D sharded equals one rank, every norm, down and up mode",
                   "[models][unet][equivalence]", float, double) {
  struct Case {
    int depth;
    NormKind norm;
    Activation activation;
    DownMode down;
    UpMode up;
    PaddingMode padding;
  };
  const std::vector<Case> cases{
      {2, NormKind::group, Activation::relu, DownMode::maxpool, UpMode::transpose,
       PaddingMode::periodic},
      {1, NormKind::batch, Activation::gelu, DownMode::avgpool, UpMode::nearest,
       PaddingMode::zeros},
      {2, NormKind::layer, Activation::silu, DownMode::conv, UpMode::linear,
       PaddingMode::replicate},
      {1, NormKind::none, Activation::leaky_relu, DownMode::maxpool, UpMode::linear,
       PaddingMode::reflect},
  };
  for (const Case& c : cases) {
    UNetOptions o = test::small_unet(2, c.depth);
    o.norm = c.norm;
    o.activation = c.activation;
    o.down = c.down;
    o.up = c.up;
    o.padding = c.padding;
    INFO("norm " << to_string(c.norm) << ", down " << to_string(c.down) << ", up "
                 << to_string(c.up) << ", padding " << to_string(c.padding));
    // Reflect padding reads 2 cells of the boundary shards at the coarsest level.
    const Index min_cells = c.padding == PaddingMode::reflect ? Index(2) << c.depth : 0;
    for (const Decomposition& d : unet_decompositions({16, 16}, c.depth, min_cells))
      test::check_equivalence<TestType>(unet_factory<TestType>(o), d, 1, 2);
  }
}

TEMPLATE_TEST_CASE("UNet 3-D and 1-D sharded equal one rank", "[models][unet][equivalence]", float,
                   double) {
  UNetOptions o = test::small_unet(3, 1);
  o.up = UpMode::linear;
  o.activation = Activation::tanh;
  for (const Decomposition& d : unet_decompositions({8, 8, 8}, 1, 0, 3))
    test::check_equivalence<TestType>(unet_factory<TestType>(o), d, 1, 2);
  UNetOptions line = test::small_unet(1, 3);
  // Not batch norm with periodic padding: there the bias of the downsampling conv shifts
  // whole channels, which the batch norm after the next conv removes, so its gradient is
  // 0 up to rounding and cannot be compared relatively.
  line.norm = NormKind::layer;
  line.down = DownMode::conv;
  line.padding = PaddingMode::periodic;
  // Double only: in float the layer-norm weight gradients of this small 1-D field are sums
  // of few, cancelling terms whose rounding (~1e-5 relative, depending on summation order)
  // sits at the float tolerance; double checks the same code paths to 1e-12.
  if (std::is_same<TestType, double>::value)
    for (const Decomposition& d : unet_decompositions({64}, 3, 0, 3))
      test::check_equivalence<TestType>(unet_factory<TestType>(line), d, 2, 2);
  // The input skip (a 1x1 convolution of the input added to the output).
  UNetOptions skip = test::small_unet(2, 1);
  skip.norm = NormKind::none;
  skip.input_skip = true;
  for (const Decomposition& d : unet_decompositions({16, 16}, 1, 0, 2))
    test::check_equivalence<TestType>(unet_factory<TestType>(skip), d, 1, 2);
}

TEMPLATE_TEST_CASE("UNet on odd split points equals one rank", "[models][unet][equivalence]", float,
                   double) {
  // Split points 4i + 1: pooled to 2i + 1 and upsampled to 4i + 2, one cell off the skip's
  // split, so every level joins its skip after a redistribution.
  const int p = test::world_size();
  std::vector<Index> points{0};
  for (int i = 1; i < p; ++i) points.push_back(4 * i + 1);
  points.push_back(4 * p + 4);
  const Decomposition d = Decomposition::from_split_points({points, {0, 6}});
  for (UpMode up : {UpMode::transpose, UpMode::nearest}) {
    UNetOptions o = test::small_unet(2, 1);
    o.up = up;
    o.down = DownMode::conv;
    test::check_equivalence<TestType>(unet_factory<TestType>(o), d, 1, 2);
  }
}

TEMPLATE_TEST_CASE("a UNet gives the same numbers on every run (no race-dependent sums)",
                   "[models][unet][determinism]", float, double) {
  // On a threaded backend a scatter-add race or a thread-order reduction would change the
  // last bits from run to run: the output and every gradient must be bit-identical.
  const Communicator world;
  const Decomposition d = Decomposition::automatic({Index(24), Index(20)}, world.size());
  for (int dims : {2, 3}) {
    UNetOptions o = test::small_unet(dims, 1);
    o.base_channels = 8;
    const Decomposition field =
        dims == 2 ? d : Decomposition::automatic({Index(12), Index(8), Index(20)}, world.size());
    const auto first = test::run_module<TestType>(unet_factory<TestType>(o), world, field, 2, 2,
                                                  test::weighted_sum<TestType>);
    for (int repeat = 0; repeat < 3; ++repeat) {
      const auto again = test::run_module<TestType>(unet_factory<TestType>(o), world, field, 2, 2,
                                                    test::weighted_sum<TestType>);
      INFO(dims << "-D, repeat " << repeat);
      test::check_bit_identical(again, first);
    }
  }
}

TEMPLATE_TEST_CASE("a UNet with recomputed blocks gives the same numbers bit for bit",
                   "[models][unet][recompute]", float, double) {
  // Outputs, input and parameter gradients, and BatchNorm's running statistics (updated by the
  // first forward only), on the rank count's sharding and on every norm; a float model in bf16
  // too (what the graph packs into 16 bits differs between the two: SavedField).
  const Communicator world;
  for (const bool bf16 : {false, true})
    for (int dims : {2, 3})
      for (NormKind norm : {NormKind::group, NormKind::batch, NormKind::none}) {
        if (bf16 && !std::is_same<TestType, float>::value) continue;
        // Level 0's first unit makes the upsampling again: a transposed conv, or (2-D, no
        // norm) nearest upsampling and a conv.
        const UpMode up = dims == 2 && norm == NormKind::none ? UpMode::nearest : UpMode::transpose;
        INFO(dims << "-D, norm " << to_string(norm) << ", up " << to_string(up)
                  << (bf16 ? ", bf16" : ""));
        UNetOptions o = test::small_unet(dims, 2);
        o.norm = norm;
        o.up = up;
        o.input_skip = dims == 2;  // the input then has two readers
        const Decomposition field =
            dims == 2 ? Decomposition::automatic({Index(16), Index(24)}, world.size())
                      : Decomposition::automatic({Index(12), Index(8), Index(16)}, world.size());
        UNetOptions recomputed = o;
        recomputed.recompute = true;
        const auto factory = [bf16](const UNetOptions& options) -> test::ModuleFactory<TestType> {
          return [options, bf16](const Communicator& comm) {
            auto unet = std::make_shared<UNet<TestType>>(comm, options);
            if (bf16) unet->compute_in_bf16(true);
            return unet;
          };
        };
        const auto plain = test::run_module<TestType>(factory(o), world, field, 2, 2,
                                                      test::weighted_sum<TestType>);
        const auto again = test::run_module<TestType>(factory(recomputed), world, field, 2, 2,
                                                      test::weighted_sum<TestType>);
        test::check_bit_identical(again, plain);
        const auto b = again.module->named_buffers(), c = plain.module->named_buffers();
        REQUIRE(b.size() == c.size());
        for (std::size_t i = 0; i < b.size(); ++i) {
          INFO("buffer " << b[i].first);
          CHECK(test::host_values(b[i].second) == test::host_values(c[i].second));
        }
      }
}

TEST_CASE("Sequential's recomputed ranges give the same numbers and refuse overlaps",
          "[models][recompute]") {
  const Communicator world;
  const auto make = [&](bool units) {
    auto s = std::make_shared<Sequential<double>>();
    for (int i = 0; i < 2; ++i) {
      ConvOptions c;
      c.in_channels = 2;
      c.out_channels = 2;
      c.kernel = {3, 3};
      c.padding = {1, 1};
      c.seed = 5 + i;
      s->add("conv" + std::to_string(i), std::make_shared<Conv<double>>(world, c, "c"));
      s->add("norm" + std::to_string(i),
             std::make_shared<GroupNorm<double>>(world, 1, 2, 1e-5, true, "n"));
      s->add("act" + std::to_string(i),
             std::make_shared<ActivationLayer<double>>(Activation::gelu));
    }
    if (units) {
      s->recompute_range(1, 3);
      s->recompute_range(4, 6);
    }
    return s;
  };
  const Decomposition field = Decomposition::automatic({Index(12), Index(10)}, world.size());
  const auto run = [&](bool units) {
    return test::run_module<double>([&](const Communicator&) { return make(units); }, world,
                                    field, 2, 2, test::weighted_sum<double>);
  };
  const auto plain = run(false), units = run(true);
  test::check_bit_identical(units, plain);  // the parameter names do not change either
  const auto s = make(false);
  s->recompute_range(1, 3);
  CHECK_THROWS_WITH(s->recompute_range(2, 4), Catch::Contains("range [2, 4) overlaps [1, 3)"));
  CHECK_THROWS_WITH(s->recompute_range(5, 7), Catch::Contains("range [5, 7) of 6 layers"));
}

TEMPLATE_TEST_CASE("a UNet under NoGradGuard gives the same output and records no graph",
                   "[models][unet][no_grad]", float, double) {
  const Communicator world;
  UNetOptions o = test::small_unet(2, 2);
  o.down = DownMode::maxpool;  // its argmax is only for backward
  o.up = UpMode::transpose;
  const Decomposition d = Decomposition::automatic({Index(16), Index(24)}, world.size());
  const auto model = unet_factory<TestType>(o)(world);
  model->eval();
  const auto input =
      Variable<TestType>::field(test::random_shard<TestType>(d, world.rank(), 2, 2, 5), true);
  const Variable<TestType> recorded = model->forward(input);
  REQUIRE(recorded.requires_grad());
  REQUIRE(grad_enabled());
  Variable<TestType> y;
  {
    const NoGradGuard outer;
    {
      const NoGradGuard inner;
      CHECK(!grad_enabled());
    }
    CHECK(!grad_enabled());  // an inner guard gives back the outer's mode
    y = model->forward(input);
  }
  CHECK(grad_enabled());
  // Same numbers; the result needs no gradient although the input and every parameter do, and
  // its node keeps neither inputs nor a backward closure (nothing saved for backward).
  CHECK(test::relative_error(y.value().view(), recorded.value().view()) == 0);
  CHECK(!y.requires_grad());
  CHECK(y.node()->inputs.empty());
  CHECK(!y.node()->backward);
  // backward from a loss made without the graph changes no gradient.
  backward(test::weighted_sum<TestType>(world, y));
  for (const auto& [name, parameter] : model->named_parameters()) {
    INFO("parameter " << name);
    CHECK(parameter.node()->data_grad.extent(0) == 0);
  }
  // With the guard gone, the graph is recorded again and backward reaches the input.
  backward(test::weighted_sum<TestType>(world, model->forward(input)));
  CHECK(input.node()->field_grad.view().span() > 0);
}

TEST_CASE("a tiny UNet matches finite differences", "[models][unet][gradient]") {
  UNetOptions o;
  o.dims = 2;
  o.in_channels = 2;
  o.out_channels = 2;
  o.depth = 1;
  o.base_channels = 2;
  o.norm = NormKind::group;
  o.norm_groups = 1;
  o.activation = Activation::silu;  // smooth: no kinks for the differences to straddle
  o.down = DownMode::conv;
  o.up = UpMode::linear;
  o.blocks = 1;
  const auto ds = unet_decompositions({8, 8}, 1);
  REQUIRE(!ds.empty());
  test::check_gradients_by_finite_differences(unet_factory<double>(o), ds.back(), 1, 2);
}

TEST_CASE("UNet parameter names and counts", "[models][unet]") {
  const Communicator self(MPI_COMM_SELF);
  UNetOptions o;
  o.dims = 2;
  o.depth = 1;
  o.base_channels = 2;
  o.norm = NormKind::none;
  o.blocks = 1;
  UNet<float> unet(self, o);
  std::vector<std::string> names;
  for (const auto& named : unet.named_parameters()) names.push_back(named.first);
  const std::vector<std::string> expected{
      "down0.conv0.weight", "down0.conv0.bias", "bottom.conv0.weight", "bottom.conv0.bias",
      "upsample0.weight",   "upsample0.bias",   "up0.conv0.weight",    "up0.conv0.bias",
      "head.weight",        "head.bias"};
  CHECK(names == expected);
  // 2*1*9+2, 4*2*9+4, 4*2*2*2+2, 2*4*9+2, 2*1+1
  CHECK(count_parameters(unet) == 20 + 76 + 34 + 74 + 3);
  CHECK_THAT(describe(unet),
             Contains("upsample0.weight (4, 2, 2, 2) 32") && Contains("total 207 parameters"));

  o.norm = NormKind::group;
  o.norm_groups = 2;
  o.blocks = 2;
  o.down = DownMode::conv;
  o.up = UpMode::nearest;
  UNet<double> normed(self, o);
  names.clear();
  for (const auto& named : normed.named_parameters()) names.push_back(named.first);
  const std::vector<std::string> expected_normed{
      "down0.conv0.weight",  "down0.norm0.weight",  "down0.norm0.bias",      "down0.conv1.weight",
      "down0.norm1.weight",  "down0.norm1.bias",    "downsample0.weight",    "downsample0.bias",
      "bottom.conv0.weight", "bottom.norm0.weight", "bottom.norm0.bias",     "bottom.conv1.weight",
      "bottom.norm1.weight", "bottom.norm1.bias",   "upsample0.conv.weight", "upsample0.conv.bias",
      "up0.conv0.weight",    "up0.norm0.weight",    "up0.norm0.bias",        "up0.conv1.weight",
      "up0.norm1.weight",    "up0.norm1.bias",      "head.weight",           "head.bias"};
  CHECK(names == expected_normed);
}

TEST_CASE("UNet rejects fields it cannot halve and shards that vanish", "[models][unet][errors]") {
  const Communicator comm;
  UNet<float> unet(comm, test::small_unet(2, 2));
  const Decomposition odd = Decomposition::automatic({16, 18}, comm.size());
  const auto x = Variable<float>::field(ShardTensor<float>(odd, comm.rank(), 1, 2), false, "x");
  const std::string message = test::error_message_of([&] { unet.forward(x); });
  CHECK_THAT(message, Contains("UNet 'unet': field extent 18 along dim 1 is not divisible by "
                               "2^depth = 4 (depth 2)"));
  CHECK(test::ranks_with_error(message) == comm.size());
  if (comm.size() >= 3) {  // shard [3, 4) pools to [2, 2): nothing at level 1
    std::vector<Index> points{0, 3};
    for (int r = 2; r < comm.size(); ++r) points.push_back(2 + r);
    points.push_back(16);
    const Decomposition thin = Decomposition::from_split_points({points, {0, 16}});
    const auto y = Variable<float>::field(ShardTensor<float>(thin, comm.rank(), 1, 2), false, "y");
    const std::string vanish = test::error_message_of([&] { unet.forward(y); });
    CHECK_THAT(vanish, Contains("at level 1 (extent 8 along dim 0) the ranks at grid position 1 "
                                "own no cells (full-resolution cells [3, 4)); with depth 2"));
    CHECK(test::ranks_with_error(vanish) == comm.size());
  }
  const Communicator self(MPI_COMM_SELF);
  UNetOptions bad = test::small_unet(2, 1);
  bad.norm_groups = 3;
  CHECK_THROWS_WITH(UNet<float>(self, bad),
                    Contains("norm_groups 3 does not divide base_channels 4"));
}

TEMPLATE_TEST_CASE("a config-built UNet and sequential model with a residual equal one rank",
                   "[models][builder][equivalence]", float, double) {
  const std::string unet = R"(
type: unet
depth: 1
base_channels: 4
norm: group
norm_groups: 2
activation: gelu
down: avgpool
up: linear
padding: periodic
blocks: 1
seed: 5
)";
  for (const Decomposition& d : unet_decompositions({16, 8}, 1, 0, 2))
    test::check_equivalence<TestType>(
        [&](const Communicator& comm) {
          return from_yaml<TestType>(unet, comm, {2, 2, 1});
        },
        d, 1, 2);

  const std::string sequential = R"(
type: sequential
seed: 3
layers:
  - {type: conv, out_channels: 6, kernel: 3, padding: same, padding_mode: periodic}
  - {type: group_norm, groups: 2}
  - {type: activation, function: gelu}
  - type: residual
    layers:
      - {type: conv, out_channels: 8, kernel: [3, 1], padding: [1, 0], padding_mode: reflect,
         bias: false}
      - {type: batch_norm}
      - {type: activation, function: leaky_relu, slope: 0.1}
  - {type: pool, kind: average, kernel: 2}
  - {type: upsample, scale: 2, mode: linear}
  - {type: dropout, p: 0.2}
  - {type: layer_norm}
  - {type: conv_transpose, out_channels: 4, kernel: 3, padding: 1}
  - {type: activation, function: sigmoid}
  - {type: conv, kernel: 1}
)";
  for (const Decomposition& d : unet_decompositions({12, 10}, 1, 2, 3))
    test::check_equivalence<TestType>(
        [&](const Communicator& comm) {
          return from_yaml<TestType>(sequential, comm, {2, 3, 2});
        },
        d, 2, 3);
}

TEMPLATE_TEST_CASE("sequential models that change resolution return the input's split",
                   "[models][builder][equivalence][sequential]", float, double) {
  // 22 cells: the split points of 2, 3 and 4 parts (0,11,22; 0,8,15,22; 0,6,12,17,22) are not
  // multiples of 2, so every layer list below moves them (0,8,15,22 comes back as 0,8,16,22)
  // before the sequence restores the input's.
  const std::vector<std::string> layer_lists{
      "[{type: pool, kind: max, kernel: 2}, {type: upsample, scale: 2, mode: nearest},"
      " {type: conv, kernel: 1}]",
      "[{type: conv, out_channels: 3, kernel: 3, stride: 2, padding: 1},"
      " {type: upsample, scale: 2, mode: linear}, {type: conv, kernel: 1}]",
      "[{type: conv, out_channels: 3, kernel: 2, stride: 2},"
      " {type: conv_transpose, kernel: 2, stride: 2}]",
      "[{type: pool, kind: average, kernel: 2}, {type: upsample, scale: 2, mode: linear},"
      " {type: conv, kernel: 3, padding: same, padding_mode: periodic}]",
  };
  const Communicator world;
  for (const std::string& layers : layer_lists) {
    INFO(layers);
    const std::string yaml = "type: sequential\nseed: 4\nlayers: " + layers + "\n";
    const auto make = [&](const Communicator& comm) {
      return from_yaml<TestType>(yaml, comm, {2, 2, 1});
    };
    const Decomposition d = Decomposition::from_split_points(
        {balanced_split_points(22, world.size()), {0, 6}}, {true, true});
    const ShardTensor<TestType> x =
        test::random_shard<TestType>(d, world.rank(), 2, 2, /*seed=*/11);
    const Variable<TestType> y = make(world)->forward(Variable<TestType>::field(x));
    CHECK(y.value().decomposition() == d);
    test::check_equivalence<TestType>(make, d, 2, 2);
  }
}

TEST_CASE("sequential configs: names, channel rule, projection", "[models][builder]") {
  const Communicator self(MPI_COMM_SELF);
  const auto model = from_yaml<float>(R"(
type: sequential
layers:
  - {type: conv, out_channels: 4, kernel: 3, padding: same}
  - type: residual
    layers:
      - {type: conv, out_channels: 6, kernel: 3, padding: same}
      - {type: activation, function: relu}
  - {type: conv, out_channels: out, kernel: 1, bias: false}
)",
                                      self, {2, 1, 3});
  std::vector<std::string> names;
  for (const auto& named : model->named_parameters()) names.push_back(named.first);
  const std::vector<std::string> expected{
      "0.weight",          "0.bias",  "1.layers.0.weight", "1.layers.0.bias", "1.projection.weight",
      "1.projection.bias", "2.weight"};
  CHECK(names == expected);
  CHECK(count_parameters(*model) == (4 * 9 + 4) + (6 * 4 * 9 + 6) + (6 * 4 + 6) + 3 * 6);
  // The last conv defaults to the model's out_channels; others keep their input's.
  const auto defaults = from_yaml<float>(R"(
type: sequential
layers:
  - {type: conv, kernel: 3, padding: 1}
  - {type: conv, kernel: 1}
)",
                                         self, {1, 2, 5});
  const auto params = defaults->named_parameters();
  CHECK(params[0].second.shape() == std::vector<Index>{2, 2, 3});
  CHECK(params[2].second.shape() == std::vector<Index>{5, 2, 1});
}

TEST_CASE("config errors name the key, the line and the accepted values",
          "[models][builder][errors]") {
  CHECK_THAT(build_error("type: unet\ndepth: 2\nbase_chanels: 8\n"),
             Contains("build_model: model (line 3): unknown key 'base_chanels' (did you mean "
                      "'base_channels'?); accepted keys: "
                      "type, depth, base_channels,"));
  CHECK_THAT(build_error("type: unet\nactivation: rlu\n"),
             Contains("model.activation (line 2): unknown value 'rlu'; accepted: relu, "
                      "leaky_relu, gelu, silu, tanh, sigmoid"));
  CHECK_THAT(build_error("type: unet\ndepth: two\n"),
             Contains("model.depth (line 2): expects an integer, got 'two'"));
  CHECK_THAT(build_error("type: unet\ndepth: -1\n"),
             Contains("model.depth (line 2): must be at least 0, got -1"));
  CHECK_THAT(
      build_error("type: unet\nnorm_groups: 3\n"),
      Contains("model.norm_groups (line 2): norm_groups 3 does not divide base_channels 32"));
  CHECK_THAT(build_error("type: resnet\n"),
             Contains("model.type (line 1): unknown value 'resnet'; accepted: unet, "
                      "sequential"));
  CHECK_THAT(build_error("depth: 2\n"),
             Contains("model.type (line 1): missing required key; accepted: unet, "
                      "sequential"));
  const std::string layers = R"(type: sequential
layers:
  - {type: conv, out_channels: 4, kernel: 3}
  - {type: activation, function: relu}
  - {type: conv, kernel: [3, x]}
)";
  CHECK_THAT(build_error(layers),
             Contains("model.layers[2].kernel[1] (line 5): expects an integer, got 'x'"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: conv, kernal: 3}\n"),
             Contains("model.layers[0] (line 3): unknown key 'kernal' (did you mean 'kernel'?); "
                      "accepted keys: type, "
                      "out_channels, kernel,"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: conv, out_channels: 2}\n"),
             Contains("model.layers[0].kernel (line 3): missing required key"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: conv, kernel: [3, 3, 3]}\n"),
             Contains("model.layers[0].kernel (line 3): expects 2 sizes (one per spatial dim), "
                      "got 3"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: activation, function: swish}\n"),
             Contains("model.layers[0].function (line 3): unknown value 'swish'; accepted: "
                      "relu, leaky_relu, gelu, silu, tanh, sigmoid"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: activation}\n"),
             Contains("model.layers[0].function (line 3): missing required key; accepted: "
                      "relu,"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: dense}\n"),
             Contains("model.layers[0].type (line 3): unknown value 'dense'; accepted: "
                      "conv, conv_transpose, pool, upsample, group_norm, layer_norm, batch_norm, "
                      "activation, dropout, residual"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: conv, kernel: 1, bias: maybe}\n"),
             Contains("model.layers[0].bias (line 3): expects true or false, got 'maybe'"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: conv, kernel: 2, padding: same}\n"),
             Contains("model.layers[0].padding (line 3): 'same' padding needs an odd kernel"));
  // A layer's own check, with the config entry it came from.
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - {type: conv, kernel: 1, out_channels: 4}\n"
                         "  - {type: group_norm, groups: 3}\n  - {type: conv, kernel: 1}\n"),
             Contains("model.layers[1] (line 4): GroupNorm 'model.layers[1]'"));
  CHECK_THAT(build_error("type: sequential\nlayers:\n  - type: residual\n    layers:\n"
                         "      - {type: pool, kind: min, kernel: 2}\n"),
             Contains("model.layers[0].layers[0].kind (line 5): unknown value 'min'; accepted: "
                      "max, average"));
  CHECK_THAT(
      build_error("type: sequential\nlayers:\n  - {type: activation, function: relu}\n", {2, 1, 2}),
      Contains("model.layers (line 3): the layers end with 1 channels, but the model's "
               "out_channels is 2"));
  CHECK_THAT(build_error("type: sequential\nlayers: []\n"),
             Contains("model.layers (line 2): expects a non-empty list of layer maps"));
}

TEMPLATE_TEST_CASE("two models in one process share its caches without interfering",
                   "[models][process]", float, double) {
  // The process-wide state (docs/architecture.md, "Process-wide state"): the convolution
  // scratch, the halo plans shared per communicator, the cuDNN plans, the comm timers and the
  // memory tracker. Three models of different shapes and options (TF32 and halo overlap set
  // per model; neighbourhood attention through the shared halo plans), their steps
  // interleaved (A's forward, then B's and C's, then the backwards in another order), give
  // each model's numbers alone, bit for bit.
  const Communicator world;
  const Decomposition field = Decomposition::automatic({Index(16), Index(24)}, world.size());
  UNetOptions a = test::small_unet(2, 2);
  UNetOptions b = test::small_unet(2, 1);
  b.base_channels = 6;
  b.seed = 11;
  const auto make_a = unet_factory<TestType>(a);
  const test::ModuleFactory<TestType> make_b = [b](const Communicator& comm) {
    auto model = std::make_shared<UNet<TestType>>(comm, b);
    model->allow_tf32(true);
    model->set_library_workspace_share(0);  // a GPU's convolutions without workspace
    model->overlap_halo(false);
    return model;
  };
  const test::ModuleFactory<TestType> make_c = [](const Communicator& comm) {
    return from_yaml<TestType>(
        "{type: vit, patch: 2, embed_dim: 12, depth: 1, heads: 2, attention: neighborhood, "
        "window: 3, seed: 5}",
        comm, {2, 2, 3});
  };
  std::vector<test::Run<TestType>> alone;
  for (const auto& make : {make_a, make_b, make_c})
    alone.push_back(
        test::run_module<TestType>(make, world, field, 2, 2, test::weighted_sum<TestType>));

  std::vector<test::Run<TestType>> together(3);
  std::vector<Variable<TestType>> losses(3);
  const auto forward = [&](int m, const test::ModuleFactory<TestType>& make) {
    together[m].module = make(world);
    together[m].input = Variable<TestType>::field(
        test::random_shard<TestType>(field, world.rank(), 2, 2, 11), true, "input");
    together[m].output = together[m].module->forward(together[m].input);
    losses[m] = test::weighted_sum<TestType>(world, together[m].output);
  };
  forward(0, make_a);
  forward(1, make_b);
  forward(2, make_c);
  for (int m : {2, 0, 1}) backward(losses[m]);

  for (int m = 0; m < 3; ++m) {
    INFO("model "
         << "ABC"[m]);
    together[m].loss = losses[m].item();
    test::check_bit_identical(together[m], alone[m]);
  }
}
