// Max and average pooling: sharded == single rank for any window, stride, padding and
// dilation on 1-D/2-D/3-D fields; finite-difference gradients; bad input.

#include <catch2/catch.hpp>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

struct PoolCase {
  const char* name;
  std::vector<Index> extents;
  PoolOptions options;
};

PoolOptions pool(PoolKind kind, std::vector<int> window, std::vector<int> stride,
                 std::vector<int> padding, std::vector<int> dilation = {},
                 PaddingMode mode = PaddingMode::zeros, bool include_pad = true) {
  PoolOptions o;
  o.kind = kind;
  o.window = window;
  o.stride = stride;
  o.padding = padding;
  o.dilation = dilation;
  o.padding_mode = mode;
  o.count_include_pad = include_pad;
  return o;
}

/// `pool` with the padding after the field (empty: as before) and ceil_mode.
PoolOptions asymmetric_pool(PoolKind kind, std::vector<int> window, std::vector<int> stride,
                            std::vector<int> padding, std::vector<int> padding_after,
                            bool ceil_mode, bool include_pad = true) {
  PoolOptions o = pool(kind, window, stride, padding, {}, PaddingMode::zeros, include_pad);
  o.padding_after = padding_after;
  o.ceil_mode = ceil_mode;
  return o;
}

std::vector<PoolCase> pool_cases() {
  return {
      {"1-D max 2", {40}, pool(PoolKind::max, {2}, {}, {})},
      {"1-D avg 3 stride 2 pad 1", {41}, pool(PoolKind::average, {3}, {2}, {1})},
      {"1-D max 3 stride 1 dilation 2 pad 1", {40}, pool(PoolKind::max, {3}, {1}, {1}, {2})},
      {"2-D max 2x2", {24, 20}, pool(PoolKind::max, {2, 2}, {}, {})},
      {"2-D avg 3x3 stride 1 pad 1 exclude pad",
       {20, 18},
       pool(PoolKind::average, {3, 3}, {1, 1}, {1, 1}, {}, PaddingMode::zeros, false)},
      {"2-D max 3x2 stride 3x1 periodic pad",
       {27, 16},
       pool(PoolKind::max, {3, 2}, {3, 1}, {1, 1}, {}, PaddingMode::periodic)},
      {"2-D avg 2x2, lines past 16 outputs", {12, 40}, pool(PoolKind::average, {2, 2}, {}, {})},
      {"3-D avg 2", {12, 10, 8}, pool(PoolKind::average, {2, 2, 2}, {}, {})},
      {"3-D max 3 stride 2 pad 1",
       {13, 11, 9},
       pool(PoolKind::max, {3, 3, 3}, {2, 2, 2}, {1, 1, 1})},
      // ceil_mode (GoogLeNet's, SqueezeNet's max pooling) and asymmetric pads (ONNX files).
      {"1-D max 3 stride 2 ceil_mode", {40}, asymmetric_pool(PoolKind::max, {3}, {2}, {}, {}, true)},
      {"2-D avg 3x3 stride 2 pad 1 ceil_mode",
       {20, 17},
       asymmetric_pool(PoolKind::average, {3, 3}, {2, 2}, {1, 1}, {}, true)},
      {"2-D avg 3x2 stride 2 pads (1, 0) and (0, 1) ceil_mode exclude pad",
       {21, 18},
       asymmetric_pool(PoolKind::average, {3, 2}, {2, 2}, {1, 0}, {0, 1}, true, false)},
      {"3-D max 2 padded 1 after",
       {9, 8, 7},
       asymmetric_pool(PoolKind::max, {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, false)},
  };
}

template <class T>
test::ModuleFactory<T> pool_factory(const PoolOptions& options) {
  return [options](const Communicator& comm) {
    return std::make_shared<Pool<T>>(comm, options, "pool");
  };
}

Index min_cells(const PoolOptions& o) {
  Index need = 2;
  for (std::size_t d = 0; d < o.window.size(); ++d) {
    const int dilation = o.dilation.empty() ? 1 : o.dilation[d];
    const int stride = o.stride.empty() ? o.window[d] : o.stride[d];
    need = std::max<Index>(need, dilation * (o.window[d] - 1) + stride);
  }
  return need;
}

}  // namespace

TEMPLATE_TEST_CASE("Pool sharded equals Pool on one rank", "[pool][equivalence]", float, double) {
  for (const PoolCase& c : pool_cases()) {
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(), false);
    for (const Decomposition& d :
         test::test_decompositions(c.extents, test::world_size(), periodic, min_cells(c.options)))
      test::check_equivalence<TestType>(pool_factory<TestType>(c.options), d, 2, 2);
  }
}

TEMPLATE_TEST_CASE("a Pool layer keeps its backward's table per shape: a new shape remakes it",
                   "[pool][plan]", float, double) {
  // Disjoint windows (a table of tap offsets, or of windows) and overlapping ones (none).
  for (const PoolOptions& o :
       {pool(PoolKind::max, {2, 2}, {}, {}), pool(PoolKind::average, {2, 2}, {}, {}),
        pool(PoolKind::max, {3, 3}, {2, 2}, {1, 1})}) {
    INFO("kind " << int(o.kind) << ", window " << o.window[0]);
    test::check_module_reused_across_shapes<TestType>(
        pool_factory<TestType>(o), test::reuse_shapes({24, 20}, {16, 26}, 2, 2), 2);
  }
}

TEST_CASE("Pool gradients match finite differences", "[pool][gradient]") {
  for (const PoolCase& c : pool_cases()) {
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(), false);
    const auto decompositions =
        test::test_decompositions(c.extents, test::world_size(), periodic, min_cells(c.options));
    if (!decompositions.empty())
      test::check_gradients_by_finite_differences(pool_factory<double>(c.options),
                                                  decompositions.back(), 1, 2);
  }
}

TEST_CASE("Pool values on a small known field", "[pool]") {
  // 1-D field 0..5 on one rank: max over 2 -> 1, 3, 5; average over 3 stride 3 -> 1, 4.
  const Communicator self(MPI_COMM_SELF);
  const Decomposition d({6}, {1});
  ShardTensor<double> x(d, 0, 1, 1);
  test::fill(x,
             [](Index, Index, const SpatialIndex&, const SpatialIndex& g) { return double(g[0]); });
  auto host = [](const ShardTensor<double>& t) {
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.view());
  };
  Pool<double> max_pool(self, pool(PoolKind::max, {2}, {}, {}), "max");
  const auto m = host(max_pool.forward(Variable<double>::field(x)).value());
  CHECK((m(0, 0, 0, 0, 0) == 1 && m(0, 0, 1, 0, 0) == 3 && m(0, 0, 2, 0, 0) == 5));
  Pool<double> avg_pool(self, pool(PoolKind::average, {3}, {}, {}), "avg");
  const auto a = host(avg_pool.forward(Variable<double>::field(x)).value());
  CHECK((a(0, 0, 0, 0, 0) == 1 && a(0, 0, 1, 0, 0) == 4));
}

TEST_CASE("ceil_mode's last window: PyTorch's output count and divisors", "[pool]") {
  // Values from torch.nn.functional on the fields 0..n-1, one rank.
  const Communicator self(MPI_COMM_SELF);
  auto pooled = [&](Index n, const PoolOptions& options) {
    const Decomposition d({n}, {1});
    ShardTensor<double> x(d, 0, 1, 1);
    test::fill(x, [](Index, Index, const SpatialIndex&, const SpatialIndex& g) {
      return double(g[0]);
    });
    Pool<double> layer(self, options, "pool");
    const auto h = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), layer.forward(Variable<double>::field(x)).value().view());
    std::vector<double> v;
    for (Index i = 0; i < Index(h.extent(2)); ++i) v.push_back(h(0, 0, i, 0, 0));
    return v;
  };
  // max_pool1d(k 2, s 2, ceil_mode): the last window is one cell.
  CHECK(pooled(5, asymmetric_pool(PoolKind::max, {2}, {2}, {}, {}, true)) ==
        std::vector<double>{1, 3, 4});
  // avg_pool1d(k 3, s 2, pad 1, ceil_mode): the last window [5, 8) reaches a cell past the
  // padded field [-1, 7), which it does not count: (5 + 0) / 2; the first counts its padding.
  CHECK(pooled(6, asymmetric_pool(PoolKind::average, {3}, {2}, {1}, {}, true)) ==
        std::vector<double>{1.0 / 3, 2, 4, 2.5});
  // count_include_pad=False: only the field's cells.
  CHECK(pooled(6, asymmetric_pool(PoolKind::average, {3}, {2}, {1}, {}, true, false)) ==
        std::vector<double>{0.5, 2, 4, 5});
  // A window that would start past the field and its lower padding makes no output.
  CHECK(pooled(4, asymmetric_pool(PoolKind::max, {2}, {2}, {1}, {}, true)) ==
        std::vector<double>{0, 2, 3});
}

TEST_CASE("2x2 average pooling sums each window's taps in order, bit for bit", "[pool]") {
  // The host's pair path (windows of two contiguous cells along the lines) against a loop over
  // the windows: lines longer than its blocks of 16 outputs and shorter, 1-D to 3-D, and a
  // periodic field (read in place: its flags are not the padding's).
  const Communicator self(MPI_COMM_SELF);
  for (const std::vector<Index>& extents :
       std::vector<std::vector<Index>>{{40}, {6, 38}, {4, 6, 42}, {4, 6, 10}}) {
    const int dims = int(extents.size());
    INFO(dims << "-D, last extent " << extents.back());
    const Decomposition d(extents, std::vector<int>(dims, 1), std::vector<bool>(dims, true));
    const ShardTensor<float> x = test::random_shard<float>(d, 0, 2, 3, 17);
    Pool<float> avg(self, pool(PoolKind::average, std::vector<int>(dims, 2), {}, {}), "avg");
    const ShardTensor<float> y = avg.forward(Variable<float>::field(x)).value();
    const auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.view());
    const auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    const Index k[3] = {dims > 0 ? 2 : 1, dims > 1 ? 2 : 1, dims > 2 ? 2 : 1};
    Index mismatches = 0;
    for (Index n = 0; n < 2; ++n)
      for (Index c = 0; c < 3; ++c)
        for (Index ox = 0; ox < Index(yh.extent(2)); ++ox)
          for (Index oy = 0; oy < Index(yh.extent(3)); ++oy)
            for (Index oz = 0; oz < Index(yh.extent(4)); ++oz) {
              float sum = 0;
              for (Index a = 0; a < k[0]; ++a)
                for (Index b = 0; b < k[1]; ++b)
                  for (Index e = 0; e < k[2]; ++e)
                    sum += xh(n, c, k[0] * ox + a, k[1] * oy + b, k[2] * oz + e);
              mismatches += yh(n, c, ox, oy, oz) != sum / float(k[0] * k[1] * k[2]);
            }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("Pool rejects bad options naming layer and values", "[pool][errors]") {
  const Communicator comm;
  CHECK_THROWS_WITH(Pool<float>(comm, pool(PoolKind::max, {2}, {}, {2}), "p"),
                    Contains("MaxPool1d 'p': padding 2 along dim 0 exceeds half the window 2"));
  CHECK_THROWS_WITH(Pool<float>(comm, pool(PoolKind::average, {2, 2}, {}, {}, {2, 1}), "a"),
                    Contains("AvgPool2d 'a': average pooling has no dilation"));
  CHECK_THROWS_WITH(Pool<float>(comm, pool(PoolKind::max, {2, 2}, {1}, {}), "s"),
                    Contains("stride has 1 values for 2 spatial dims"));
  // The argmax keeps a window's tap in two bytes.
  CHECK_THROWS_WITH(Pool<float>(comm, pool(PoolKind::max, {300, 300}, {}, {}), "w"),
                    Contains("MaxPool2d 'w': a window of 90000 cells is more than max pooling's "
                             "65536"));
  CHECK_NOTHROW(Pool<float>(comm, pool(PoolKind::average, {300, 300}, {}, {}), "w"));
  CHECK_THROWS_WITH(
      Pool<float>(comm, asymmetric_pool(PoolKind::max, {3}, {2}, {1}, {2}, false), "after"),
      Contains("MaxPool1d 'after': padding 2 along dim 0 exceeds half the window 3"));
  PoolOptions wrapped = asymmetric_pool(PoolKind::max, {3}, {2}, {}, {}, true);
  wrapped.padding_mode = PaddingMode::periodic;
  CHECK_THROWS_WITH(Pool<float>(comm, wrapped, "c"),
                    Contains("MaxPool1d 'c': ceil_mode needs zeros padding, not periodic"));
  // A window larger than the padded field: no output, a clear error (not one output).
  const Decomposition tiny({3}, {1});
  const Communicator self(MPI_COMM_SELF);
  Pool<float> wide(self, pool(PoolKind::max, {6}, {4}, {1}), "wide");
  CHECK_THROWS_WITH(wide.forward(Variable<float>::field(ShardTensor<float>(tiny, 0, 1, 1))),
                    Contains("input extent 3 along dim 0 is smaller than the kernel 6"));
}
