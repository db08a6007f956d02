// Gather to root, all-gather, scatter from root and redistribute: bit-exact round trips
// over 1-D/2-D/3-D process grids, uneven splits and different ghost widths; a channel range
// redistributed into another field's channels; redistribute_field's gradient.

#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "equivalence.hpp"
#include "shardtensor/layers/loss.hpp"
#include "shardtensor/layers/pointwise.hpp"
#include "shardtensor/layers/redistribute_field.hpp"
#include "test_support.hpp"

using namespace shardtensor;

namespace {

/// Random value of a global cell, the same whatever the decomposition.
template <class T>
T cell_value(const Decomposition& d, Index channels, Index n, Index c, const SpatialIndex& g) {
  return static_cast<T>(hashed_uniform(7, test::global_linear_index(d, channels, n, c, g)));
}

template <class T>
ShardTensor<T> random_field(const Communicator& comm, const Decomposition& d, Index batch,
                            Index channels, const GhostWidths& ghosts) {
  ShardTensor<T> t(d, comm.rank(), batch, channels, ghosts);
  test::fill(t, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex& g) {
    return test::is_ghost(t, local) ? T(-99) : cell_value<T>(d, channels, n, c, g);
  });
  return t;
}

/// Number of cells of a whole-field View that differ from cell_value (bit comparison).
template <class T>
long long wrong_in_global(const FieldView<T>& global, const Decomposition& d) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), global);
  long long wrong = 0;
  for (Index n = 0; n < Index(host.extent(0)); ++n)
    for (Index c = 0; c < Index(host.extent(1)); ++c)
      for (Index x = 0; x < Index(host.extent(2)); ++x)
        for (Index y = 0; y < Index(host.extent(3)); ++y)
          for (Index z = 0; z < Index(host.extent(4)); ++z)
            if (host(n, c, x, y, z) != cell_value<T>(d, host.extent(1), n, c, {x, y, z})) ++wrong;
  return wrong;
}

/// Owned cells of a shard that differ from cell_value, and ghosts that are not zero.
template <class T>
long long wrong_in_shard(const ShardTensor<T>& t) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.view());
  long long wrong = 0;
  for (Index n = 0; n < t.batch(); ++n)
    for (Index c = 0; c < t.channels(); ++c)
      for (Index x = 0; x < t.allocated_extent(0); ++x)
        for (Index y = 0; y < t.allocated_extent(1); ++y)
          for (Index z = 0; z < t.allocated_extent(2); ++z) {
            const SpatialIndex local{x, y, z};
            const T want = test::is_ghost(t, local) ? T(0)
                                                    : cell_value<T>(t.decomposition(), t.channels(),
                                                                    n, c, t.to_global(local));
            if (host(n, c, x, y, z) != want) ++wrong;
          }
  return wrong;
}

std::vector<Decomposition> decompositions_for(int nranks) {
  std::vector<Decomposition> out;
  const std::vector<Index> extents{11, 9, 7};
  for (int ndims = 1; ndims <= 3; ++ndims)
    for (const std::vector<int>& grid : test::process_grids(nranks, ndims)) {
      bool fits = true;
      for (int k = 0; k < ndims; ++k) fits = fits && grid[k] <= extents[k];
      if (fits)
        out.emplace_back(std::vector<Index>(extents.begin(), extents.begin() + ndims), grid);
    }
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("gather, all-gather and scatter round trips are bit-exact", "[gather]", float,
                   double) {
  const Communicator comm;
  for (const Decomposition& d : decompositions_for(comm.size())) {
    INFO(d.describe());
    const GhostWidths ghosts = GhostWidths::uniform(1, d.ndims());
    const ShardTensor<TestType> field = random_field<TestType>(comm, d, 2, 3, ghosts);
    for (int root : {0, comm.size() - 1}) {
      const FieldView<TestType> gathered = gather_to_root(comm, field, root);
      if (comm.rank() == root) {
        CHECK(gathered.extent(0) == 2);
        CHECK(gathered.extent(1) == 3);
        CHECK(wrong_in_global(gathered, d) == 0);
      } else {
        CHECK(gathered.span() == 0);
      }
      const ShardTensor<TestType> back = scatter_from_root(comm, gathered, d, ghosts, root);
      CHECK(back.same_layout(field));
      CHECK(wrong_in_shard(back) == 0);
    }
    const FieldView<TestType> everywhere = all_gather(comm, field);
    CHECK(wrong_in_global(everywhere, d) == 0);
  }
}

TEMPLATE_TEST_CASE("redistribute between any two decompositions is bit-exact", "[redistribute]",
                   float, double) {
  const Communicator comm;
  const std::vector<Decomposition> all = decompositions_for(comm.size());
  for (int ndims = 1; ndims <= 3; ++ndims) {
    std::vector<Decomposition> same_dims;
    for (const Decomposition& d : all)
      if (d.ndims() == ndims) same_dims.push_back(d);
    // Add an uneven explicit split of the same field.
    std::vector<std::vector<Index>> points;
    for (int k = 0; k < ndims; ++k) points.push_back({0, same_dims.front().global_extent(k)});
    points[0] = {0};
    for (int r = 0; r < comm.size(); ++r)
      points[0].push_back(points[0].back() + (r == 0 ? 11 - (comm.size() - 1) : 1));
    same_dims.push_back(Decomposition::from_split_points(points));
    for (const Decomposition& from : same_dims)
      for (const Decomposition& to : same_dims) {
        INFO(from.describe() << " -> " << to.describe());
        const ShardTensor<TestType> source =
            random_field<TestType>(comm, from, 1, 2, GhostWidths::uniform(1, ndims));
        const ShardTensor<TestType> moved =
            redistribute(comm, source, to, GhostWidths::uniform(2, ndims));
        CHECK(moved.decomposition() == to);
        CHECK(wrong_in_shard(moved) == 0);
        const ShardTensor<TestType> back = redistribute(comm, moved, from);
        CHECK(wrong_in_shard(back) == 0);
      }
  }
}

TEMPLATE_TEST_CASE("redistribute_channels writes or adds a channel range into another layout",
                   "[redistribute]", float, double) {
  // Channels [1, 3) of a 3-channel field with ghost cells, written into channels [2, 4) of a
  // 5-channel field of another layout (other ghost widths), then added once more: the other
  // channels and every ghost cell stay as they were, the range holds the values, then twice
  // them (exact), whatever the two decompositions.
  const Communicator comm;
  for (const Decomposition& from : decompositions_for(comm.size()))
    for (const Decomposition& to : decompositions_for(comm.size())) {
      if (from.ndims() != to.ndims()) continue;
      INFO(from.describe() << " -> " << to.describe());
      const int ndims = from.ndims();
      const ShardTensor<TestType> source =
          random_field<TestType>(comm, from, 2, 3, GhostWidths::uniform(1, ndims));
      const ShardTensor<TestType> into =
          random_field<TestType>(comm, to, 2, 5, GhostWidths::uniform(2, ndims));
      const std::vector<double> before = test::host_values(into.view());
      long long wrong = 0;
      for (const UnpackMode mode : {UnpackMode::assign, UnpackMode::add}) {
        redistribute_channels(comm, source, 1, into, 2, 2, mode);
        const std::vector<double> now = test::host_values(into.view());
        std::size_t i = 0;  // host_values: the allocated cells in C order
        for (Index n = 0; n < 2; ++n)
          for (Index c = 0; c < 5; ++c)
            for (Index x = 0; x < into.allocated_extent(0); ++x)
              for (Index y = 0; y < into.allocated_extent(1); ++y)
                for (Index z = 0; z < into.allocated_extent(2); ++z, ++i) {
                  const SpatialIndex local{x, y, z};
                  const bool range = c >= 2 && c < 4 && !test::is_ghost(into, local);
                  const TestType value =
                      range ? cell_value<TestType>(from, 3, n, c - 1, into.to_global(local)) : 0;
                  const double want = !range                       ? before[i]
                                      : mode == UnpackMode::assign ? value
                                                                   : TestType(value + value);
                  if (now[i] != want) ++wrong;
                }
      }
      CHECK(wrong == 0);
    }
  CHECK_THROWS_WITH(
      redistribute_channels(
          comm, random_field<float>(comm, decompositions_for(comm.size())[0], 1, 3, {}), 2,
          random_field<float>(comm, decompositions_for(comm.size())[0], 1, 3, {}), 0, 2,
          UnpackMode::assign),
      Catch::Matchers::Contains("redistribute_channels: channels [2, 4) of a field of 3"));
}

TEMPLATE_TEST_CASE("redistribute_field's gradient is the output's moved back, alone or added",
                   "[redistribute][autograd]", float, double) {
  // loss = sum(m + back) or sum(back + m), back = redistribute_field(u * w, from) and
  // u = redistribute_field(x, to), m = x * v: x's gradient is w moved back plus v, bit for bit.
  // With m first, u's backward runs before m's (the sweep's order): the first gradient to
  // reach x is the redistributed one, made once the exchange is done; with back first, u's
  // backward adds to the gradient m left. A held Variable of u keeps u's gradient readable.
  const Communicator comm;
  const Decomposition from = Decomposition::automatic({11, 9, 7}, comm.size());
  const Decomposition to = test::x_splits_moved(from);
  const ShardTensor<TestType> w = random_field<TestType>(comm, to, 2, 3, {});
  const ShardTensor<TestType> v = random_field<TestType>(comm, from, 2, 3, {});
  const ShardTensor<TestType> w_back = redistribute(comm, w, from);
  std::vector<double> expected = test::host_values(w_back.view());
  const std::vector<double> vs = test::host_values(v.view());
  for (std::size_t i = 0; i < expected.size(); ++i)
    expected[i] =
        static_cast<TestType>(static_cast<TestType>(expected[i]) + static_cast<TestType>(vs[i]));
  for (const bool back_first : {true, false})
    for (const bool hold_u : {false, true}) {
      INFO((back_first ? "back" : "m") << " first, u " << (hold_u ? "held" : "dropped"));
      const auto x =
          Variable<TestType>::field(random_field<TestType>(comm, from, 2, 3, {}), true, "x");
      std::optional<Variable<TestType>> held;
      Variable<TestType> loss;
      {
        const Variable<TestType> u = redistribute_field(comm, x, to);
        if (hold_u) held = u;
        const Variable<TestType> back =
            redistribute_field(comm, multiply(u, Variable<TestType>::field(w)), from);
        const Variable<TestType> m = multiply(x, Variable<TestType>::field(v));
        loss = sum(comm, back_first ? add(back, m) : add(m, back));
      }
      backward(loss);
      CHECK(test::host_values(x.grad().view()) == expected);
      if (hold_u && comm.size() > 1)
        CHECK(test::host_values(held->grad().view()) == test::host_values(w.view()));
    }
}
