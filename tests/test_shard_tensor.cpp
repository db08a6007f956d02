// ShardTensor: shapes with ghost cells, interior subview, index maps, wrapping memory.

#include <catch2/catch.hpp>

#include "shardtensor/core/view_address.hpp"
#include "test_support.hpp"

using namespace shardtensor;

TEMPLATE_TEST_CASE("a shard has the owned extents plus ghosts on each side", "[shard_tensor]",
                   float, double) {
  const Decomposition d({10, 7, 5}, {3, 2, 1});
  GhostWidths g;
  g.lower = {1, 2, 0};
  g.upper = {3, 0, 1};
  for (int r = 0; r < d.nranks(); ++r) {
    ShardTensor<TestType> t(d, r, 2, 4, g);
    CHECK(t.owns_memory());
    CHECK(t.batch() == 2);
    CHECK(t.channels() == 4);
    CHECK(t.global_box() == d.box(r));
    for (int k = 0; k < 3; ++k) {
      CHECK(t.local_extent(k) == d.extent(r, k));
      CHECK(t.allocated_extent(k) == d.extent(r, k) + g.lower[k] + g.upper[k]);
    }
    auto interior = t.interior();
    CHECK(interior.extent(2) == std::size_t(d.extent(r, 0)));
    CHECK(interior.extent(3) == std::size_t(d.extent(r, 1)));
    CHECK(interior.extent(4) == std::size_t(d.extent(r, 2)));
    // interior(0, 0, 0, 0, 0) is the first owned cell: allocation index g.lower.
    CHECK(address_of(interior, 1, 2, 0, 0, 0) ==
          address_of(t.view(), 1, 2, g.lower[0], g.lower[1], g.lower[2]));
    // Index maps invert each other and place the first owned cell at the offset.
    for (int k = 0; k < 3; ++k) {
      CHECK(t.to_global(k, g.lower[k]) == d.offset(r, k));
      for (Index i = 0; i < t.allocated_extent(k); ++i)
        CHECK(t.to_local(k, t.to_global(k, i)) == i);
    }
    CHECK(t.owns(t.to_global(SpatialIndex{g.lower[0], g.lower[1], g.lower[2]})));
    CHECK_FALSE(t.owns(t.to_global(SpatialIndex{0, g.lower[1], g.lower[2]})));
    CHECK(t.to_local(t.global_box()) == t.interior_box());
  }
}

TEST_CASE("a 1-D field has unit trailing axes", "[shard_tensor]") {
  const Decomposition d({9}, {2});
  ShardTensor<double> t(d, 1, 1, 3, GhostWidths::uniform(2, 1));
  CHECK(t.ndims() == 1);
  CHECK(t.allocated_extent(0) == 4 + 4);
  CHECK(t.allocated_extent(1) == 1);
  CHECK(t.allocated_extent(2) == 1);
  CHECK(t.global_box() == Box{{5, 0, 0}, {4, 1, 1}});
}

TEST_CASE("wrapping a caller's array shares its memory", "[shard_tensor]") {
  const Decomposition d({6, 4}, {2, 1});
  const GhostWidths g = GhostWidths::uniform(1, 2);
  const Index nx = 3 + 2, ny = 4 + 2;
  // The caller's array, in the default memory space (a GPU's on a CUDA build).
  Kokkos::View<double*, DefaultMemorySpace> array("caller's array", 2 * nx * ny);
  Kokkos::deep_copy(array, 0.5);
  auto t = ShardTensor<double>::wrap(array.data(), d, 0, 1, 2, g);
  CHECK_FALSE(t.owns_memory());
  CHECK(t.view().data() == array.data());
  Kokkos::deep_copy(Kokkos::subview(t.view(), 0, 1, 2, 3, 0), 42.0);
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), array);
  CHECK(host((1 * nx + 2) * ny + 3) == 42.0);  // C order: ((c * nx + x) * ny + y)
  auto copy = t;                               // copies share memory, like Views
  CHECK(copy.view().data() == array.data());
}

TEST_CASE("bad shard parameters are rejected with their values", "[shard_tensor][errors]") {
  using Catch::Matchers::Contains;
  const Decomposition d({6, 4}, {2, 1});
  CHECK_THROWS_WITH(ShardTensor<float>(d, 2, 1, 1),
                    Contains("rank 2 outside a decomposition of 2"));
  CHECK_THROWS_WITH(ShardTensor<float>(d, 0, 0, 1), Contains("batch 0 and channels 1"));
  GhostWidths negative;
  negative.lower[1] = -1;
  CHECK_THROWS_WITH(ShardTensor<float>(d, 0, 1, 1, negative), Contains("negative ghost width"));
  CHECK_THROWS_WITH(ShardTensor<float>(d, 0, 1, 1, GhostWidths::uniform(1, 3)),
                    Contains("ghost width in dim 2 of a 2-D field"));
  CHECK_THROWS_WITH(ShardTensor<float>::wrap(nullptr, d, 0, 1, 1), Contains("null data pointer"));
}
