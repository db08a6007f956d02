// ConvTranspose: sharded == single rank (outputs, input and parameter gradients) for 1-D/2-D/3-D
// kernels with strides (kernel != stride too), dilations, padding, output padding and groups,
// on several process grids and uneven splits; finite-difference gradients in double; the
// adjoint of Conv with the same weights; known values; bad input.

#include <catch2/catch.hpp>

#include "equivalence.hpp"
#include "shardtensor/core/kernel_counter.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

struct ConvTransposeCase {
  const char* name;
  std::vector<Index> extents;
  ConvTransposeOptions options;
};

ConvTransposeOptions opts(int in, int out, std::vector<int> k, std::vector<int> s,
                          std::vector<int> dil, std::vector<int> pad, std::vector<int> out_pad,
                          int groups, bool bias) {
  ConvTransposeOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.kernel = k;
  o.stride = s;
  o.dilation = dil;
  o.padding = pad;
  o.output_padding = out_pad;
  o.groups = groups;
  o.bias = bias;
  return o;
}

std::vector<ConvTransposeCase> conv_transpose_cases() {
  return {
      {"1-D k4 s2 p1", {24}, opts(2, 3, {4}, {2}, {}, {1}, {}, 1, true)},
      {"1-D k3 s3 output_padding 2", {20}, opts(3, 2, {3}, {3}, {}, {}, {2}, 1, true)},
      {"1-D k3 s2 dilation 2 p1 output_padding 1",
       {22},
       opts(2, 2, {3}, {2}, {2}, {1}, {1}, 1, true)},
      {"1-D k7 s2 p1 (two lower ghosts)", {26}, opts(2, 2, {7}, {2}, {}, {1}, {}, 1, true)},
      {"1-D k2 s4 p1 (stride > kernel)", {18}, opts(2, 2, {2}, {4}, {}, {1}, {3}, 1, true)},
      {"2-D k2 s2 (U-Net up-conv)", {16, 10}, opts(4, 2, {2, 2}, {2, 2}, {}, {}, {}, 1, true)},
      {"2-D k3 s2 p1 output_padding 1 groups 2",
       {16, 9},
       opts(4, 6, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 2, true)},
      {"2-D k5 s1 p2", {16, 12}, opts(2, 3, {5, 5}, {1, 1}, {}, {2, 2}, {}, 1, true)},
      {"2-D k3x2 s1x3 dilation 2x1 p2x0 output_padding 1x2",
       {12, 8},
       opts(2, 2, {3, 2}, {1, 3}, {2, 1}, {2, 0}, {1, 2}, 1, true)},
      {"3-D k3 s2 p1", {16, 8, 8}, opts(2, 2, {3, 3, 3}, {2, 2, 2}, {}, {1, 1, 1}, {}, 1, true)},
      {"3-D k2 s2 no bias", {16, 6, 8}, opts(2, 3, {2, 2, 2}, {2, 2, 2}, {}, {}, {}, 1, false)},
      // One rank's taps (G, the output's size) are made in three chunks of input rows, the
      // last partial; split over more ranks, in fewer (kernels/src/conv_transpose_gemm.cpp).
      {"3-D k2 s2, taps in chunks", {23, 15, 16}, opts(4, 4, {2, 2, 2}, {2, 2, 2}, {}, {}, {}, 1,
                                                     true)},
  };
}

template <class T>
test::ModuleFactory<T> conv_transpose_factory(const ConvTransposeOptions& options) {
  return [options](const Communicator& comm) {
    return std::make_shared<ConvTranspose<T>>(comm, options, "convt");
  };
}

/// Fewest cells a shard needs along an axis: its neighbours' ghost regions must fit in it.
Index min_cells(const ConvTransposeOptions& o) {
  Index need = 2;
  for (std::size_t d = 0; d < o.kernel.size(); ++d) {
    const int dilation = o.dilation.empty() ? 1 : o.dilation[d];
    const int padding = o.padding.empty() ? 0 : o.padding[d];
    const int stride = o.stride.empty() ? 1 : o.stride[d];
    const int reach = dilation * (o.kernel[d] - 1) - padding;
    need = std::max<Index>(need, std::max(reach, 0) / stride);
    need = std::max<Index>(need, (padding + stride - 1) / stride);
  }
  return need;
}

std::vector<Decomposition> decompositions_of(const ConvTransposeCase& c) {
  return test::test_decompositions(c.extents, test::world_size(),
                                   std::vector<bool>(c.extents.size(), false),
                                   min_cells(c.options));
}

template <class T>
auto host_copy(const T& view) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
}

/// <a, b> over two whole fields of the same shape.
double dot(const FieldView<double>& a, const FieldView<double>& b) {
  const auto ha = host_copy(a);
  const auto hb = host_copy(b);
  REQUIRE(ha.span() == hb.span());
  double sum = 0;
  for (std::size_t i = 0; i < ha.span(); ++i) sum += ha.data()[i] * hb.data()[i];
  return sum;
}

}  // namespace

TEMPLATE_TEST_CASE("ConvTranspose sharded equals ConvTranspose on one rank",
                   "[conv_transpose][equivalence]", float, double) {
  for (const ConvTransposeCase& c : conv_transpose_cases()) {
    INFO(c.name);
    const auto decompositions = decompositions_of(c);
    CHECK(!decompositions.empty());
    for (const Decomposition& d : decompositions)
      test::check_equivalence<TestType>(conv_transpose_factory<TestType>(c.options), d, 2,
                                        c.options.in_channels);
  }
}

TEST_CASE("ConvTranspose gradients match finite differences", "[conv_transpose][gradient]") {
  for (const ConvTransposeCase& c : conv_transpose_cases()) {
    INFO(c.name);
    const auto decompositions = decompositions_of(c);
    if (decompositions.empty()) continue;
    test::check_gradients_by_finite_differences(conv_transpose_factory<double>(c.options),
                                                decompositions.back(), 1, c.options.in_channels);
  }
}

TEST_CASE("ConvTranspose is the adjoint of Conv with the same weights", "[conv_transpose]") {
  // <Conv(x), y> == <x, ConvT(y)> with the Conv weight (out, in / groups, k...) used as the
  // ConvT weight (in = Conv's out, out / groups = Conv's in / groups, k...); no biases.
  struct AdjointCase {
    const char* name;
    std::vector<Index> extents;  // of x, the Conv input
    int in, out, groups;
    std::vector<int> k, s, d, p;
  };
  const std::vector<AdjointCase> cases{
      {"1-D k4 s3 p1", {13}, 2, 3, 1, {4}, {3}, {1}, {1}},
      {"1-D k3 s2 dilation 2", {15}, 1, 2, 1, {3}, {2}, {2}, {0}},
      {"2-D k3x2 s2x3 dilation 2x1 p1x0 groups 2",
       {11, 10},
       4,
       6,
       2,
       {3, 2},
       {2, 3},
       {2, 1},
       {1, 0}},
      {"3-D k3 s2 p1", {7, 6, 5}, 2, 2, 1, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}},
      // The transposed convolution's GEMMs, their taps in four chunks of input rows.
      {"3-D k2 s2, taps in chunks", {32, 32, 32}, 4, 4, 1, {2, 2, 2}, {2, 2, 2}, {1, 1, 1},
       {0, 0, 0}},
  };
  const Communicator self(MPI_COMM_SELF);
  for (const AdjointCase& c : cases) {
    INFO(c.name);
    const int ndims = static_cast<int>(c.extents.size());
    ConvOptions co;
    co.in_channels = c.in;
    co.out_channels = c.out;
    co.kernel = c.k;
    co.stride = c.s;
    co.dilation = c.d;
    co.padding = c.p;
    co.groups = c.groups;
    co.bias = false;
    Conv<double> conv(self, co, "conv");
    ConvTransposeOptions to;
    to.in_channels = c.out;
    to.out_channels = c.in;
    to.kernel = c.k;
    to.stride = c.s;
    to.dilation = c.d;
    to.padding = c.p;
    to.groups = c.groups;
    to.bias = false;
    to.seed = 7;  // different initial weights: the copy below must make them equal
    const Decomposition dx(c.extents, std::vector<int>(ndims, 1));
    const Decomposition dy = conv.geometry().output_decomposition(dx, "test");
    for (int k = 0; k < ndims; ++k) {  // the output padding that brings ConvT back to x's size
      const int reach = c.d[k] * (c.k[k] - 1) + 1;
      to.output_padding.push_back(static_cast<int>((c.extents[k] + 2 * c.p[k] - reach) % c.s[k]));
    }
    ConvTranspose<double> convt(self, to, "convt");
    REQUIRE(convt.weight().shape() == conv.weight().shape());
    Kokkos::deep_copy(convt.weight().data(), conv.weight().data());
    REQUIRE(convt.output_decomposition(dy) == dx);

    const auto x = Variable<double>::field(test::random_shard<double>(dx, 0, 2, c.in, 5));
    const auto y = Variable<double>::field(test::random_shard<double>(dy, 0, 2, c.out, 6));
    const double lhs = dot(conv.forward(x).value().view(), y.value().view());
    const double rhs = dot(x.value().view(), convt.forward(y).value().view());
    CHECK(std::abs(lhs - rhs) <= 1e-12 * std::max(1.0, std::abs(lhs)));
  }
}

TEST_CASE("ConvTranspose values on a small known field", "[conv_transpose]") {
  // x = (1, 2), w = (1, 10, 100), stride 2: the full output is 1, 10, 100 + 2, 20, 200;
  // padding 1 cuts one cell off each end, output_padding 1 gives one back at the top.
  const Communicator self(MPI_COMM_SELF);
  const Decomposition d({2}, {1});
  ShardTensor<double> x(d, 0, 1, 1);
  test::fill(
      x, [](Index, Index, const SpatialIndex&, const SpatialIndex& g) { return double(g[0] + 1); });
  auto run = [&](int padding, int output_padding) {
    ConvTranspose<double> convt(
        self, opts(1, 1, {3}, {2}, {}, {padding}, {output_padding}, 1, false), "known");
    auto w = host_copy(convt.weight().data());
    w(0) = 1;
    w(1) = 10;
    w(2) = 100;
    Kokkos::deep_copy(convt.weight().data(), w);
    const auto y = host_copy(convt.forward(Variable<double>::field(x)).value().view());
    std::vector<double> values;
    for (std::size_t i = 0; i < y.extent(2); ++i) values.push_back(y(0, 0, i, 0, 0));
    return values;
  };
  CHECK(run(0, 0) == std::vector<double>{1, 10, 102, 20, 200});
  CHECK(run(1, 0) == std::vector<double>{10, 102, 20});
  CHECK(run(1, 1) == std::vector<double>{10, 102, 20, 200});
}

TEST_CASE("ConvTranspose rejects bad input naming layer, dim and values",
          "[conv_transpose][errors]") {
  const Communicator comm;
  const int p = comm.size();
  const ConvTransposeOptions o = opts(2, 2, {3, 3}, {2, 2}, {}, {1, 1}, {}, 1, true);
  ConvTranspose<float> convt(comm, o, "c1");
  {  // channel mismatch
    const Decomposition d = Decomposition::automatic({16, 16}, p);
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 3));
    CHECK_THROWS_WITH(convt.forward(x),
                      Contains("ConvTranspose2d 'c1': input has 3 channels, the layer expects 2"));
  }
  {  // spatial dims mismatch
    const Decomposition d = Decomposition::automatic({8, 8, 8}, p);
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    CHECK_THROWS_WITH(convt.forward(x),
                      Contains("ConvTranspose2d 'c1': input field has 3 spatial dims, the "
                               "kernel 2"));
  }
  {  // padding that leaves no output at all
    ConvTranspose<float> cut(comm, opts(2, 2, {1, 1}, {}, {}, {2, 0}, {}, 1, true), "cut");
    const Decomposition d({2, Index(8 * p)}, {1, p});
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    CHECK_THROWS_WITH(cut.forward(x),
                      Contains("ConvTranspose2d 'cut': input extent 2 along dim 0 gives output "
                               "extent -2"));
  }
  if (p > 1) {  // stride and padding that leave the last rank with no output
    ConvTranspose<float> strided(comm, opts(2, 2, {1, 1}, {4, 1}, {}, {1, 0}, {}, 1, true), "s4");
    std::vector<Index> points{0};
    for (int r = 0; r < p; ++r) points.push_back(points.back() + (r == 0 ? 5 : 1));
    const Decomposition d = Decomposition::from_split_points({points, {0, 8}});
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    const std::string message = test::error_message_of([&] { strided.forward(x); });
    CHECK(test::ranks_with_error(message) == p);
    CHECK_THAT(message, Contains("ConvTranspose2d 's4': stride 4 and padding 1 leave the ranks "
                                 "at grid position " +
                                 std::to_string(p - 1) + " along dim 0"));
  }
  {  // a ghost region wider than the shard that fills it: 3 lower ghosts, middle ranks own 2
    // cells (with 2 ranks each neighbour holds all the cells read: no error)
    ConvTranspose<float> wide(comm, opts(2, 2, {7, 1}, {1, 1}, {}, {3, 0}, {}, 1, true), "w7");
    std::vector<Index> points{0};
    for (int r = 0; r < p; ++r) points.push_back(points.back() + (r == 0 || r == p - 1 ? 6 : 2));
    const Decomposition d = Decomposition::from_split_points({points, {0, 8}});
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    const std::string message = test::error_message_of([&] { wide.forward(x); });
    if (p > 2) {
      CHECK(test::ranks_with_error(message) == p);
      CHECK_THAT(message, Contains("ConvTranspose2d 'w7': HaloExchange: halo width 3 exceeds "
                                   "local extent 2"));
    } else {
      CHECK(test::ranks_with_error(message) == 0);
    }
  }
  ConvTransposeOptions bad_groups = o;
  bad_groups.groups = 3;
  CHECK_THROWS_WITH(ConvTranspose<float>(comm, bad_groups, "g"),
                    Contains("ConvTranspose2d 'g': groups 3 must divide in_channels 2"));
  ConvTransposeOptions bad_output_padding = o;
  bad_output_padding.output_padding = {1, 2};
  CHECK_THROWS_WITH(ConvTranspose<float>(comm, bad_output_padding, "op"),
                    Contains("ConvTranspose2d 'op': output_padding 2 along dim 1 must be smaller "
                             "than the stride 2 or the dilation 1"));
  ConvTransposeOptions bad_stride = o;
  bad_stride.stride = {1};
  CHECK_THROWS_WITH(ConvTranspose<float>(comm, bad_stride, "s"),
                    Contains("ConvTranspose2d 's': stride has 1 values for 2 spatial dims"));
}

TEST_CASE("ConvTranspose written into a concatenation's channels equals the copied concatenation",
          "[conv_transpose][concat]") {
  // concat_channels_written (ConvTranspose::forward_into, the U-Net's upsampling) against
  // concat_channels of the skip and forward's output: the same output, with and without ghost
  // cells, and the same gradients of the input, the skip and the parameters, bit for bit,
  // in float and bf16, on every case's kernel (GEMM and direct) and on all ranks.
  const Communicator world;
  for (const ConvTransposeCase& c : conv_transpose_cases()) {
    if (c.options.groups != 1 || c.extents.size() < 2) continue;  // (1-D: too few cells a rank)
    for (const bool bf16 : {false, true}) {
      for (const int ghost : {0, 1}) {
        INFO(c.name << (bf16 ? ", bf16" : "") << ", ghost width " << ghost);
        ConvTransposeOptions o = c.options;
        o.bf16 = bf16;
        const int ndims = static_cast<int>(c.extents.size());
        const Decomposition dx = Decomposition::automatic(c.extents, world.size());
        struct Result {
          std::vector<double> y, gx, gs, gw, gb;
        };
        const auto run = [&](bool written) {
          ConvTranspose<float> convt(world, o, "convt");
          const Decomposition dy = convt.output_decomposition(dx);
          const auto x = Variable<float>::field(
              test::random_shard<float>(dx, world.rank(), 2, o.in_channels, 5), true, "x");
          auto skip = Variable<float>::field(test::random_shard<float>(dy, world.rank(), 2, 3, 6),
                                             true, "skip");
          const Variable<float> skip_leaf = skip;
          GhostWidths ghosts;
          for (int d = 0; d < ndims; ++d) ghosts.lower[d] = ghosts.upper[d] = ghost;
          const Variable<float> y = written ? concat_channels_written<float>(
                                                  std::move(skip), o.out_channels,
                                                  [&](const ShardTensor<float>& into, Index first) {
                                                    return convt.forward_into(x, into, first);
                                                  },
                                                  ghosts)
                                            : concat_channels<float>(
                                                  world, std::move(skip), o.out_channels,
                                                  [&] { return convt.forward(x); }, ghosts);
          const ShardTensor<float> g =
              test::random_shard<float>(dy, world.rank(), 2, 3 + o.out_channels, 7);
          ShardTensor<float> grad(dy, world.rank(), 2, 3 + o.out_channels, y.value().ghosts());
          copy_box_between(g.view(), g.interior_box(), grad.view(), grad.interior_box());
          Result r;
          r.y = test::host_values(y.value().view());
          backward(y, grad);
          r.gx = test::host_values(x.grad().view());
          r.gs = test::host_values(skip_leaf.grad().view());
          r.gw = test::host_values(convt.weight().data_grad());
          if (o.bias) r.gb = test::host_values(convt.bias().data_grad());
          return r;
        };
        const Result copied = run(false), written = run(true);
        CHECK(written.y == copied.y);
        CHECK(written.gx == copied.gx);
        CHECK(written.gs == copied.gs);
        CHECK(written.gw == copied.gw);
        CHECK(written.gb == copied.gb);
      }
    }
  }
}

TEST_CASE("ConvTranspose on its GEMM path allocates no chunk buffer once warm",
          "[conv_transpose][launches]") {
  // The kernel = stride case tiles its output as GEMMs in chunks of input rows (three on one
  // rank here). Its chunks of the taps and of the input rows come from the convolutions'
  // process-wide scratch (shared_conv_scratch), and a shell with no exchanged ghost cell is
  // no View, so a warm call allocates only its output in forward and, in backward, the input
  // gradient it adds to the input's (the first call made the scratch, the second the
  // parameters' partial sums beside gradients that were not zeroed). On a GPU every
  // allocation is a cudaMalloc and a cudaFree that waits for the device.
  const Communicator world;
  const ConvTransposeOptions o = opts(4, 4, {2, 2, 2}, {2, 2, 2}, {}, {}, {}, 1, true);
  const Decomposition dx = Decomposition::automatic({23, 15, 16}, world.size());
  ConvTranspose<float> convt(world, o, "convt");
  const Decomposition dy = convt.output_decomposition(dx);
  const auto x = Variable<float>::field(
      test::random_shard<float>(dx, world.rank(), 1, o.in_channels, 5), true, "x");
  const ShardTensor<float> grad = test::random_shard<float>(dy, world.rank(), 1, o.out_channels, 6);
  std::vector<double> first_grad;
  for (int call = 0; call < 3; ++call) {
    KernelCounter counter;
    const Variable<float> y = convt.forward(x);
    const std::int64_t forward_allocations = counter.counts().allocations;
    counter.reset();
    backward(y, grad);
    const std::int64_t backward_allocations = counter.counts().allocations;
    if (call == 0) first_grad = test::host_values(x.grad().view());
    if (call < 2) continue;  // warm from the third call
    INFO("warm call: " << forward_allocations << " allocations in forward, " << backward_allocations
                       << " in backward");
    CHECK(forward_allocations == 1);
    CHECK(backward_allocations == 1);
    // Each call's input gradient is added to the ones before: three times the first, up to
    // the rounding of the two additions.
    const std::vector<double> thrice = test::host_values(x.grad().view());
    REQUIRE(thrice.size() == first_grad.size());
    for (std::size_t i = 0; i < thrice.size(); ++i)
      CHECK(thrice[i] == Approx(3 * first_grad[i]).epsilon(1e-6).margin(1e-6));
  }
}
