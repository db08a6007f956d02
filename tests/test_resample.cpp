// Upsampling, channel concatenation and dropout: sharded == single rank, finite
// differences, known values; and a small U-Net-shaped block that chains them with conv and
// pooling across resolutions.

#include <algorithm>
#include <catch2/catch.hpp>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

template <class T>
test::ModuleFactory<T> upsample_factory(
    std::vector<int> scale, UpsampleMode mode,
    LinearCoordinates coordinates = LinearCoordinates::half_pixel) {
  return [scale, mode, coordinates](const Communicator& comm) {
    return std::make_shared<Upsample<T>>(comm, scale, mode, "up", coordinates);
  };
}

/// Nearest, and linear in each of its coordinate modes.
const std::vector<std::pair<UpsampleMode, LinearCoordinates>> upsample_modes{
    {UpsampleMode::nearest, LinearCoordinates::half_pixel},
    {UpsampleMode::linear, LinearCoordinates::half_pixel},
    {UpsampleMode::linear, LinearCoordinates::align_corners},
    {UpsampleMode::linear, LinearCoordinates::asymmetric}};

/// conv -> maxpool 2 -> conv -> linear upsample 2 -> concat with the first conv -> conv,
/// with dropout in the middle.
template <class T>
class TinyUNet : public Module<T> {
 public:
  TinyUNet(const Communicator& comm, int ndims) : comm_(comm) {
    auto conv = [&](int in, int out, std::uint64_t seed) {
      ConvOptions o;
      o.in_channels = in;
      o.out_channels = out;
      o.kernel.assign(ndims, 3);
      o.padding.assign(ndims, 1);
      o.seed = seed;
      return std::make_shared<Conv<T>>(comm, o, "conv" + std::to_string(seed));
    };
    PoolOptions p;
    p.window.assign(ndims, 2);
    down_ = conv(2, 3, 1);
    middle_ = conv(3, 3, 2);
    out_ = conv(6, 2, 3);
    pool_ = std::make_shared<Pool<T>>(comm, p, "pool");
    up_ =
        std::make_shared<Upsample<T>>(comm, std::vector<int>(ndims, 2), UpsampleMode::linear, "up");
    dropout_ = std::make_shared<Dropout<T>>(0.25);
    this->register_module("down", down_);
    this->register_module("middle", middle_);
    this->register_module("out", out_);
    this->register_module("pool", pool_);
    this->register_module("up", up_);
    this->register_module("dropout", dropout_);
  }
  Variable<T> forward(const Variable<T>& x) override {
    const Variable<T> skip = activate(down_->forward(x), Activation::silu);
    const Variable<T> coarse = dropout_->forward(middle_->forward(pool_->forward(skip)));
    return out_->forward(concat_channels<T>({skip, up_->forward(coarse)}));
  }

 private:
  Communicator comm_;
  std::shared_ptr<Conv<T>> down_, middle_, out_;
  std::shared_ptr<Pool<T>> pool_;
  std::shared_ptr<Upsample<T>> up_;
  std::shared_ptr<Dropout<T>> dropout_;
};

/// Extents per dims whose halves split evenly enough for pooling by 2 on every grid.
std::vector<Index> unet_extents(int ndims) {
  return std::vector<std::vector<Index>>{{48}, {24, 16}, {16, 12, 8}}[ndims - 1];
}

}  // namespace

TEMPLATE_TEST_CASE("Upsample sharded equals Upsample on one rank", "[upsample][equivalence]", float,
                   double) {
  const std::vector<std::vector<Index>> extents{{20}, {14, 11}, {8, 7, 6}};
  for (const auto& [mode, coordinates] : upsample_modes)
    for (int ndims = 1; ndims <= 3; ++ndims)
      for (int s : {2, 3}) {
        std::vector<int> scale(ndims, s);
        scale[0] = 2;  // mixed factors
        INFO("mode " << int(mode) << ", coordinates " << int(coordinates) << ", " << ndims
                     << "-D, scale " << s);
        for (const Decomposition& d : test::test_decompositions(
                 extents[ndims - 1], test::world_size(), std::vector<bool>(ndims, false), 1))
          test::check_equivalence<TestType>(upsample_factory<TestType>(scale, mode, coordinates),
                                            d, 2, 2);
      }
}

TEMPLATE_TEST_CASE("an Upsample layer keeps its tables per shape: a new shape remakes them",
                   "[upsample][plan]", float, double) {
  for (UpsampleMode mode : {UpsampleMode::nearest, UpsampleMode::linear}) {
    INFO("mode " << int(mode));
    test::check_module_reused_across_shapes<TestType>(
        upsample_factory<TestType>({2, 3}, mode), test::reuse_shapes({14, 11}, {9, 12}, 1, 2), 2);
  }
}

TEMPLATE_TEST_CASE("a U-Net block (conv, pool, upsample, concat, dropout) sharded equals one rank",
                   "[unet][equivalence]", float, double) {
  for (int ndims = 1; ndims <= 3; ++ndims) {
    // Even splits so that every shard pools to whole cells.
    const std::vector<Index> extents = unet_extents(ndims);
    for (const Decomposition& d : test::test_decompositions(extents, test::world_size(),
                                                            std::vector<bool>(ndims, false), 2)) {
      bool even = true;
      for (int k = 0; k < d.ndims(); ++k)
        for (Index p : d.split_points(k)) even = even && p % 2 == 0;
      if (!even) continue;
      test::check_equivalence<TestType>(
          [ndims](const Communicator& comm) {
            return std::make_shared<TinyUNet<TestType>>(comm, ndims);
          },
          d, 2, 2);
    }
  }
}

TEST_CASE("upsampling and the U-Net block match finite differences", "[upsample][unet][gradient]") {
  for (const auto& [mode, coordinates] : upsample_modes) {
    const auto ds = test::test_decompositions({10, 9}, test::world_size(), {false, false}, 1);
    if (!ds.empty())
      test::check_gradients_by_finite_differences(
          upsample_factory<double>({2, 3}, mode, coordinates), ds.back(), 1, 2);
  }
  for (const Decomposition& d :
       test::test_decompositions(unet_extents(2), test::world_size(), {false, false}, 2)) {
    bool even = true;
    for (int k = 0; k < 2; ++k)
      for (Index p : d.split_points(k)) even = even && p % 2 == 0;
    if (!even) continue;
    test::check_gradients_by_finite_differences(
        [](const Communicator& comm) { return std::make_shared<TinyUNet<double>>(comm, 2); }, d, 1,
        2);
    break;
  }
}

TEST_CASE("linear upsampling matches PyTorch's align_corners=False values", "[upsample]") {
  const Communicator self(MPI_COMM_SELF);
  ShardTensor<double> x(Decomposition({3}, {1}), 0, 1, 1);
  test::fill(x,
             [](Index, Index, const SpatialIndex&, const SpatialIndex& g) { return double(g[0]); });
  Upsample<double> up(self, {2}, UpsampleMode::linear);
  const auto y = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), up.forward(Variable<double>::field(x)).value().view());
  const double expected[6] = {0,    0.25, 0.75,
                              1.25, 1.75, 2};  // torch.nn.Upsample(scale_factor=2, mode='linear')
  for (int i = 0; i < 6; ++i) CHECK(y(0, 0, i, 0, 0) == Approx(expected[i]).margin(1e-15));
  Upsample<double> nearest(self, {3}, UpsampleMode::nearest);
  const auto z = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), nearest.forward(Variable<double>::field(x)).value().view());
  for (int i = 0; i < 9; ++i) CHECK(z(0, 0, i, 0, 0) == double(i / 3));
}

TEST_CASE("linear upsampling matches align_corners=True's and ONNX's asymmetric values",
          "[upsample]") {
  const Communicator self(MPI_COMM_SELF);
  ShardTensor<double> x(Decomposition({3}, {1}), 0, 1, 1);
  test::fill(x, [](Index, Index, const SpatialIndex&, const SpatialIndex& g) {
    return double(g[0] * g[0]);  // 0, 1, 4
  });
  auto upsampled = [&](LinearCoordinates coordinates) {
    Upsample<double> up(self, {2}, UpsampleMode::linear, "up", coordinates);
    const auto y = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), up.forward(Variable<double>::field(x)).value().view());
    std::vector<double> v;
    for (int i = 0; i < 6; ++i) v.push_back(y(0, 0, i, 0, 0));
    return v;
  };
  // F.interpolate(x, scale_factor=2, mode='linear', align_corners=True): sources 0, 0.4, ..., 2.
  const std::vector<double> corners = upsampled(LinearCoordinates::align_corners);
  const double expected_corners[6] = {0, 0.4, 0.8, 1.6, 2.8, 4};
  // ONNX Resize, asymmetric: sources o / 2, the last clamped to the field's end.
  const std::vector<double> asymmetric = upsampled(LinearCoordinates::asymmetric);
  const double expected_asymmetric[6] = {0, 0.5, 1, 2.5, 4, 4};
  for (int i = 0; i < 6; ++i) {
    CHECK(corners[i] == Approx(expected_corners[i]).margin(1e-15));
    CHECK(asymmetric[i] == Approx(expected_asymmetric[i]).margin(1e-15));
  }
}

TEST_CASE("nearest upsampling's gradient sums each input's outputs, in order", "[upsample]") {
  // Against a loop over the outputs: the kernels sum a line's cells side by side in chunks of
  // 32, so the z extent crosses a chunk; float, so a change of summation order would show.
  const Communicator self(MPI_COMM_SELF);
  const std::vector<int> scale{2, 3, 2};
  const Decomposition d({3, 2, 37}, {1, 1, 1});
  const ShardTensor<float> x = test::random_shard<float>(d, 0, 2, 3, 5);
  Upsample<float> up(self, scale, UpsampleMode::nearest);
  const Variable<float> input = Variable<float>::field(x, true);
  const Variable<float> y = up.forward(input);
  const ShardTensor<float> gy =
      test::random_shard<float>(y.value().decomposition(), 0, 2, 3, 6);
  backward(y, gy);
  const auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gy.view());
  const auto gx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                      input.node()->grad_field().view());
  Kokkos::View<float*****, Kokkos::HostSpace> expected("expected", 2, 3, 3, 2, 37);
  for (Index n = 0; n < 2; ++n)
    for (Index c = 0; c < 3; ++c)
      for (Index ox = 0; ox < 6; ++ox)
        for (Index oy = 0; oy < 6; ++oy)
          for (Index oz = 0; oz < 74; ++oz)
            expected(n, c, ox / 2, oy / 3, oz / 2) += g(n, c, ox, oy, oz);
  for (Index n = 0; n < 2; ++n)
    for (Index c = 0; c < 3; ++c)
      for (Index ix = 0; ix < 3; ++ix)
        for (Index iy = 0; iy < 2; ++iy)
          for (Index iz = 0; iz < 37; ++iz) REQUIRE(gx(n, c, ix, iy, iz) == expected(n, c, ix, iy, iz));
}

TEST_CASE("linear 2-D upsampling's gradient sums each input's outputs, x-major, in order",
          "[upsample]") {
  // The kernel against a loop over the outputs with the plan's weights (linear_source): a
  // y line's inner cells run side by side in chunks of 32 (scale 2 along y), the cells at its
  // ends one by one; 37 owned cells cross a chunk. Float, so a change of summation order or
  // of operations would show. Ghost cells on both sides of both axes, as the layer's buffer.
  const kernels::UpsampleShape g{3,          {2, 2, 1},  {0, 0, 0}, {0, 0, 0},
                                 {6, 74, 1}, {5, 39, 1}, {1, 1, 0}};
  const kernels::UpsamplePlan<float> plan(ExecutionSpace(), g, UpsampleMode::linear);
  FieldView<float> gy("gy", 2, 3, 6, 74, 1), gx("gx", 2, 3, 5, 39, 1);
  const auto gy_host = Kokkos::create_mirror_view(gy);
  const auto gx_host = Kokkos::create_mirror(gx);  // a copy: the kernel adds to gx
  for (std::size_t i = 0; i < gy.span(); ++i)
    gy_host.data()[i] = float(hashed_uniform(7, i)) - 0.5f;
  for (std::size_t i = 0; i < gx.span(); ++i)
    gx_host.data()[i] = float(hashed_uniform(8, i)) - 0.5f;
  Kokkos::deep_copy(gy, gy_host);
  Kokkos::deep_copy(gx, gx_host);
  kernels::upsample_backward(ExecutionSpace(), plan, gy, gx);
  const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gx);
  // Output o's weight on input buffer index i along axis a.
  const auto weight = [&](int a, Index o, Index i) {
    Index lower = 0, upper = 0;
    float w = 0;
    g.linear_source(a, o, lower, upper, w);
    return i == lower ? w : i == upper ? 1 - w : 0.0f;
  };
  for (Index n = 0; n < 2; ++n)
    for (Index c = 0; c < 3; ++c)
      for (Index ix = 0; ix < 5; ++ix)
        for (Index iy = 0; iy < 39; ++iy) {
          float sum = 0;
          for (Index ox = 0; ox < 6; ++ox) {
            const float weight_x = 1.0f * weight(0, ox, ix);
            if (weight_x == 0) continue;
            for (Index oy = 0; oy < 74; ++oy) {
              const float weight_y = weight(1, oy, iy);
              if (weight_y != 0) sum += weight_x * weight_y * gy_host(n, c, ox, oy, 0);
            }
          }
          INFO("sample " << n << ", channel " << c << ", cell " << ix << ", " << iy);
          REQUIRE(result(n, c, ix, iy, 0) == gx_host(n, c, ix, iy, 0) + sum);
        }
}

TEST_CASE("clamped linear upsampling reads the input itself: a padded copy's values, bit for bit",
          "[upsample]") {
  // The plan that reads a whole field and clamps its sources (one rank) against the plan that
  // reads a replicate-padded copy (what the halo padding makes): the same outputs, bit for
  // bit; input gradients within rounding of the padded plan's with its ghosts' gradients
  // folded onto the end cells they copy. 2-D lines cross the separable path's chunk of 64.
  struct Case {
    std::array<Index, 3> in;
    std::array<Index, 3> scale;
    int ndims;
  };
  for (const Case& k : {Case{{37, 1, 1}, {2, 1, 1}, 1}, Case{{5, 37, 1}, {2, 2, 1}, 2},
                        Case{{4, 9, 1}, {3, 2, 1}, 2}, Case{{6, 5, 1}, {2, 3, 1}, 2},
                        Case{{3, 1, 1}, {2, 2, 1}, 2},
                        Case{{4, 3, 5}, {2, 3, 2}, 3}}) {
    INFO(k.ndims << "-D, " << k.in[0] << "x" << k.in[1] << "x" << k.in[2]);
    kernels::UpsampleShape clamped{};
    clamped.channels = 2;
    clamped.clamped = true;
    kernels::UpsampleShape padded = clamped;
    padded.clamped = false;
    for (int d = 0; d < 3; ++d) {
      clamped.global_in[d] = padded.global_in[d] = k.in[d];
      clamped.scale[d] = padded.scale[d] = k.scale[d];
      clamped.out[d] = padded.out[d] = k.in[d] * k.scale[d];
      clamped.in[d] = k.in[d];
      padded.ghost[d] = d < k.ndims ? 1 : 0;
      padded.in[d] = k.in[d] + 2 * padded.ghost[d];
    }
    const auto field = [](const char* label, const kernels::UpsampleShape& g, const Index* e) {
      return FieldView<float>(std::string(label), 3, g.channels, e[0], e[1], e[2]);
    };
    const FieldView<float> x = field("x", clamped, clamped.in), xp = field("xp", padded, padded.in);
    const FieldView<float> y = field("y", clamped, clamped.out),
                           yp = field("yp", padded, padded.out);
    const FieldView<float> gy = field("gy", clamped, clamped.out);
    const FieldView<float> gx = field("gx", clamped, clamped.in),
                           gp = field("gp", padded, padded.in);
    const auto xh = Kokkos::create_mirror_view(x), xph = Kokkos::create_mirror_view(xp);
    const auto gyh = Kokkos::create_mirror_view(gy);
    for (std::size_t i = 0; i < xh.span(); ++i) xh.data()[i] = float(hashed_uniform(31, i)) - 0.5f;
    for (std::size_t i = 0; i < gyh.span(); ++i)
      gyh.data()[i] = float(hashed_uniform(32, i)) - 0.5f;
    // The padded copy's cell (i, j, l) holds the input's cell its indices clamp to.
    const auto source = [&](int d, Index i) {
      return std::clamp<Index>(i - padded.ghost[d], 0, k.in[d] - 1);
    };
    for (Index n = 0; n < 3; ++n)
      for (Index c = 0; c < 2; ++c)
        for (Index i = 0; i < padded.in[0]; ++i)
          for (Index j = 0; j < padded.in[1]; ++j)
            for (Index l = 0; l < padded.in[2]; ++l)
              xph(n, c, i, j, l) = xh(n, c, source(0, i), source(1, j), source(2, l));
    Kokkos::deep_copy(x, xh);
    Kokkos::deep_copy(xp, xph);
    Kokkos::deep_copy(gy, gyh);
    const kernels::UpsamplePlan<float> reads_input(ExecutionSpace(), clamped, UpsampleMode::linear);
    const kernels::UpsamplePlan<float> reads_copy(ExecutionSpace(), padded, UpsampleMode::linear);
    kernels::upsample_forward(ExecutionSpace(), reads_input, x, y);
    kernels::upsample_forward(ExecutionSpace(), reads_copy, xp, yp);
    kernels::upsample_backward(ExecutionSpace(), reads_input, gy, gx);
    kernels::upsample_backward(ExecutionSpace(), reads_copy, gy, gp);
    CHECK(test::host_values(y) == test::host_values(yp));
    if (k.ndims == 2) {
      // And the 2-D form's own sums, bit for bit: x's weight outside, y's inside.
      const auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
      bool same = true;
      for (Index n = 0; n < 3; ++n)
        for (Index c = 0; c < 2; ++c)
          for (Index ox = 0; ox < clamped.out[0]; ++ox)
            for (Index oy = 0; oy < clamped.out[1]; ++oy) {
              Index lx = 0, hx = 0, ly = 0, hy = 0;
              float w = 0, v = 0;
              clamped.linear_source(0, ox, lx, hx, w);
              clamped.linear_source(1, oy, ly, hy, v);
              const float expected =
                  w * (v * xh(n, c, lx, ly, 0) + (1 - v) * xh(n, c, lx, hy, 0)) +
                  (1 - w) * (v * xh(n, c, hx, ly, 0) + (1 - v) * xh(n, c, hx, hy, 0));
              same = same && yh(n, c, ox, oy, 0) == expected;
            }
      CHECK(same);
    }
    const auto gxh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gx);
    const auto gph = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gp);
    Kokkos::View<double*****, Kokkos::HostSpace> folded("folded", 3, 2, k.in[0], k.in[1], k.in[2]);
    for (Index n = 0; n < 3; ++n)
      for (Index c = 0; c < 2; ++c)
        for (Index i = 0; i < padded.in[0]; ++i)
          for (Index j = 0; j < padded.in[1]; ++j)
            for (Index l = 0; l < padded.in[2]; ++l)
              folded(n, c, source(0, i), source(1, j), source(2, l)) += gph(n, c, i, j, l);
    double worst = 0;
    for (std::size_t i = 0; i < folded.span(); ++i)
      worst = std::max(worst, std::abs(gxh.data()[i] - folded.data()[i]));
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("dropout keeps about 1 - p of the values, scaled, and is the identity in eval",
          "[dropout]") {
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({64, 64}, comm.size());
  const ShardTensor<double> ones = test::random_shard<double>(d, comm.rank(), 1, 4, 3);
  Kokkos::deep_copy(ones.view(), 1.0);
  Dropout<double> dropout(0.3);
  const Variable<double> y = dropout.forward(Variable<double>::field(ones));
  const double kept = sum(comm, y).item() * 0.7 / (4.0 * 64 * 64);
  CHECK(kept == Approx(0.7).margin(0.02));
  const Variable<double> y2 = dropout.forward(Variable<double>::field(ones));
  CHECK(sum(comm, multiply(y, y2)).item() !=
        Approx(sum(comm, multiply(y, y)).item()));  // a new mask per call
  dropout.eval();
  CHECK(dropout.forward(Variable<double>::field(ones)).value().view().data() == ones.view().data());
  CHECK_THROWS_WITH(Dropout<double>(1.0), Contains("probability 1 outside [0, 1)"));
}

TEMPLATE_TEST_CASE("a concat handed its first input lets it go before making the second",
                   "[concat]", float, double) {
  // concat_channels(std::move(first), channels, make_second): the values and gradients of
  // concat_channels({first, second}), with first's value gone (its last Variable handed over)
  // before make_second runs (a recomputed U-Net unit's skip).
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({12, 10, 6}, comm.size());
  const auto make = [&](Index channels, std::uint64_t seed, const char* name) {
    return Variable<TestType>::field(test::random_shard<TestType>(d, comm.rank(), 2, channels, seed),
                                     true, name);
  };
  const Variable<TestType> a = make(2, 1, "a"), b = make(3, 2, "b");
  const Variable<TestType> joined = concat_channels<TestType>({a, b});
  backward(test::weighted_sum<TestType>(comm, joined));

  Variable<TestType> first = make(2, 1, "first");
  const Variable<TestType> second = make(3, 2, "second");
  const std::shared_ptr<impl::Node<TestType>> first_node = first.node();
  bool first_gone = false;
  const Variable<TestType> consumed = concat_channels<TestType>(std::move(first), 3, [&] {
    first_gone = first_node->field.view().span() == 0;
    return second;
  });
  CHECK(!first.defined());
  CHECK(first_gone);
  backward(test::weighted_sum<TestType>(comm, consumed));
  CHECK(test::host_values(consumed.value().view()) == test::host_values(joined.value().view()));
  CHECK(test::host_values(first_node->grad_field().view()) == test::host_values(a.grad().view()));
  CHECK(test::host_values(second.grad().view()) == test::host_values(b.grad().view()));

  Variable<TestType> again = make(2, 1, "again");
  CHECK_THROWS_WITH(concat_channels<TestType>(std::move(again), 2, [&] { return second; }),
                    Contains("concat_channels: 'second' brings 3 channels to 2 of 4"));
  const Decomposition other = Decomposition::automatic({12, 10, 8}, comm.size());
  const auto elsewhere = Variable<TestType>::field(
      test::random_shard<TestType>(other, comm.rank(), 2, 3, 3), false, "elsewhere");
  Variable<TestType> once_more = make(2, 1, "once_more");
  CHECK_THROWS_WITH(concat_channels<TestType>(std::move(once_more), 3, [&] { return elsewhere; }),
                    Contains("concat_channels: 'elsewhere'") &&
                        Contains("does not match the first input"));
}

TEMPLATE_TEST_CASE("a concat redistributes a part laid out elsewhere straight into its channels",
                   "[concat][redistribute]", float, double) {
  // concat_channels(comm, std::move(first), channels, make_second), make_second() returning a
  // field whose x split points are a cell off the first's (a U-Net's upsampling on uneven
  // splits): the values and gradients of concat_channels({first, redistribute_field(second)}),
  // bit for bit, whether the part's gradient is the first to reach it (written straight from
  // the output's gradient channels) or is added to one (a second backward into the same leaf).
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({12, 10, 6}, comm.size());
  const Decomposition moved = test::x_splits_moved(d);
  const auto leaf = [&](const Decomposition& on, Index channels, std::uint64_t seed,
                        const char* name) {
    return Variable<TestType>::field(
        test::random_shard<TestType>(on, comm.rank(), 2, channels, seed), true, name);
  };
  const Variable<TestType> a = leaf(d, 2, 1, "a"), b = leaf(moved, 3, 2, "b");
  const Variable<TestType> f = leaf(d, 2, 1, "f"), s = leaf(moved, 3, 2, "s");
  const auto w = Variable<TestType>::field(
      test::random_shard<TestType>(moved, comm.rank(), 2, 3, 4), false, "w");
  for (const char* pass : {"first gradient", "added gradient"}) {
    INFO(pass);
    const Variable<TestType> joined =
        concat_channels<TestType>({a, redistribute_field(comm, multiply(b, w), d)});
    backward(test::weighted_sum<TestType>(comm, joined));
    Variable<TestType> first = f;
    const Variable<TestType> fused =
        concat_channels<TestType>(comm, std::move(first), 3, [&] { return multiply(s, w); });
    CHECK(fused.value().decomposition() == d);
    backward(test::weighted_sum<TestType>(comm, fused));
    CHECK(test::host_values(fused.value().view()) == test::host_values(joined.value().view()));
    CHECK(test::host_values(f.grad().view()) == test::host_values(a.grad().view()));
    CHECK(test::host_values(s.grad().view()) == test::host_values(b.grad().view()));
  }
  const Decomposition other = Decomposition::automatic({12, 10, 8}, comm.size());
  const auto elsewhere = Variable<TestType>::field(
      test::random_shard<TestType>(other, comm.rank(), 2, 3, 3), false, "elsewhere");
  Variable<TestType> again = f;
  CHECK_THROWS_WITH(
      concat_channels<TestType>(comm, std::move(again), 3, [&] { return elsewhere; }),
      Contains("concat_channels: target decomposition") && Contains("covers another field"));
}

TEST_CASE("concat and upsample reject mismatched input", "[concat][upsample][errors]") {
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({12, 10}, comm.size());
  const Decomposition other = Decomposition::automatic({12, 12}, comm.size());
  const auto a = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2), false, "a");
  const auto b = Variable<float>::field(ShardTensor<float>(other, comm.rank(), 1, 2), false, "b");
  CHECK_THROWS_WITH(concat_channels<float>({a, b}),
                    Contains("concat_channels: 'b'") && Contains("does not match 'a'"));
  CHECK_THROWS_WITH(Upsample<float>(comm, {2, 0}, UpsampleMode::nearest),
                    Contains("scale factor 0 along dim 1"));
  Upsample<float> up3(comm, {2, 2, 2}, UpsampleMode::linear, "u");
  CHECK_THROWS_WITH(up3.forward(a), Contains("Upsample3d 'u': input field has 2 spatial dims"));
}
