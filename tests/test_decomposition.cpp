// Decomposition: splits, process grids, rank <-> coordinates, neighbours, owners, errors.

#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace shardtensor;

TEST_CASE("balanced split gives the first remainder parts one more cell", "[decomposition]") {
  CHECK(balanced_split_points(10, 3) == std::vector<Index>{0, 4, 7, 10});
  CHECK(balanced_split_points(9, 3) == std::vector<Index>{0, 3, 6, 9});
  CHECK(balanced_split_points(5, 5) == std::vector<Index>{0, 1, 2, 3, 4, 5});

  Decomposition d({10, 7}, {3, 2});
  CHECK(d.ndims() == 2);
  CHECK(d.nranks() == 6);
  CHECK(d.global_cells() == 70);
  // Rank order is row-major over the grid: rank = x * 2 + y.
  CHECK(d.coords_of(3) == std::array<int, 3>{1, 1, 0});
  CHECK(d.box(3) == Box{{4, 4, 0}, {3, 3, 1}});
  CHECK(d.box(0) == Box{{0, 0, 0}, {4, 4, 1}});
  CHECK(d.box(5) == Box{{7, 4, 0}, {3, 3, 1}});
  CHECK(d.extent(5, 2) == 1);
  CHECK(d.offset(5, 2) == 0);
}

TEST_CASE("the boxes of all ranks tile the field exactly once", "[decomposition]") {
  for (int nranks : {1, 2, 3, 4, 5, 6, 8, 12}) {
    for (int ndims = 1; ndims <= 3; ++ndims) {
      const std::vector<Index> extents = std::vector<Index>{13, 12, 17};
      std::vector<Index> global(extents.begin(), extents.begin() + ndims);
      for (const std::vector<int>& grid : test::process_grids(nranks, ndims)) {
        bool fits = true;
        for (int k = 0; k < ndims; ++k) fits = fits && grid[k] <= global[k];
        if (!fits) continue;
        Decomposition d(global, grid);
        std::vector<int> covered(static_cast<std::size_t>(d.global_cells()), 0);
        Index total = 0;
        for (int r = 0; r < d.nranks(); ++r) {
          CHECK(d.rank_of(d.coords_of(r)) == r);
          const Box b = d.box(r);
          total += b.size();
          for (Index x = b.lower[0]; x < b.upper(0); ++x)
            for (Index y = b.lower[1]; y < b.upper(1); ++y)
              for (Index z = b.lower[2]; z < b.upper(2); ++z) {
                const SpatialIndex e = d.global_extents();
                covered[static_cast<std::size_t>((x * e[1] + y) * e[2] + z)] += 1;
                CHECK(d.owner({x, y, z}) == r);
              }
        }
        CHECK(total == d.global_cells());
        CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
      }
    }
  }
}

TEST_CASE("explicit split points give uneven shards", "[decomposition]") {
  Decomposition d = Decomposition::from_split_points({{0, 1, 10}, {0, 5, 6, 8}});
  CHECK(d.process_grid() == std::vector<int>{2, 3});
  CHECK(d.box(0) == Box{{0, 0, 0}, {1, 5, 1}});
  CHECK(d.box(4) == Box{{1, 5, 0}, {9, 1, 1}});
  CHECK(d.owner({9, 7, 0}) == 5);
}

TEST_CASE("automatic process grids minimise the cut surface", "[decomposition]") {
  CHECK(choose_process_grid({64, 64, 64}, 8) == std::vector<int>{2, 2, 2});
  CHECK(choose_process_grid({128, 64, 64}, 2) == std::vector<int>{2, 1, 1});
  CHECK(choose_process_grid({64, 64, 64}, 2) == std::vector<int>{2, 1, 1});  // tie: slow axis
  CHECK(choose_process_grid({4, 1000}, 4) == std::vector<int>{1, 4});
  CHECK(choose_process_grid({3, 3}, 9) == std::vector<int>{3, 3});
  CHECK(choose_process_grid({100}, 7) == std::vector<int>{7});
  // Pinned axes, as with MPI_Dims_create: 0 leaves an axis free.
  CHECK(choose_process_grid({64, 64, 64}, 8, {0, 0, 1}) == std::vector<int>{4, 2, 1});
  CHECK(choose_process_grid({64, 64, 64}, 8, {1, 0, 0}) == std::vector<int>{1, 4, 2});
  CHECK_THROWS_WITH(choose_process_grid({64, 64}, 8, {3, 0}),
                    Catch::Matchers::Contains("with grid 3x0 (0 = free)"));
  Decomposition d = Decomposition::automatic({32, 32}, 4, {true, false});
  CHECK(d.process_grid() == std::vector<int>{2, 2});
  CHECK(d.periodic(0));
  CHECK_FALSE(d.periodic(1));
  CHECK_FALSE(d.periodic(2));
  CHECK(d.describe() ==
        "32x32 cells on a 2x2 process grid (split x at 0,16,32, y at 0,16,32), periodic x");
  CHECK(Decomposition({22, 20}, {1, 1}).describe() == "22x20 cells on a 1x1 process grid");
}

TEST_CASE("neighbours include edges and corners and wrap on periodic axes", "[decomposition]") {
  Decomposition open({9, 9, 9}, {3, 3, 3});
  const int centre = open.rank_of({1, 1, 1});
  int found = 0;
  for (int dx = -1; dx <= 1; ++dx)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dz = -1; dz <= 1; ++dz) {
        const int n = open.neighbor(centre, {dx, dy, dz});
        CHECK(n == open.rank_of({1 + dx, 1 + dy, 1 + dz}));
        ++found;
      }
  CHECK(found == 27);
  CHECK(open.neighbor(open.rank_of({0, 0, 0}), {-1, 0, 0}) == no_neighbor);
  CHECK(open.neighbor(open.rank_of({2, 2, 2}), {1, 1, 1}) == no_neighbor);
  CHECK(open.neighbor(open.rank_of({2, 2, 2}), {-1, -1, -1}) == centre);

  Decomposition periodic({9, 9, 9}, {3, 3, 3}, {true, false, true});
  CHECK(periodic.neighbor(periodic.rank_of({0, 1, 0}), {-1, 0, -1}) == periodic.rank_of({2, 1, 2}));
  CHECK(periodic.neighbor(periodic.rank_of({0, 2, 0}), {-1, 1, -1}) == no_neighbor);
  // A periodic axis with one process is its own neighbour.
  Decomposition single({8}, {1}, {true});
  CHECK(single.neighbor(0, {1, 0, 0}) == 0);
  CHECK(single.neighbor(0, {0, 1, 0}) == no_neighbor);
}

TEST_CASE("invalid decompositions name the offending values", "[decomposition][errors]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(Decomposition({4, 4}, {5, 1}), Contains("more ranks than cells") &&
                                                       Contains("5 ranks along dim 0") &&
                                                       Contains("extent 4"));
  CHECK_THROWS_WITH(choose_process_grid({2, 2}, 5), Contains("cannot split a 2x2 field over 5"));
  CHECK_THROWS_WITH(Decomposition({4, 4, 4, 4}, {1, 1, 1, 1}),
                    Contains("1 to 3 spatial dims, got 4"));
  CHECK_THROWS_WITH(Decomposition({4, 4}, {2}), Contains("process grid 2 has 1 dims"));
  CHECK_THROWS_WITH(Decomposition({0, 4}, {1, 1}), Contains("global extent 0 in dim 0"));
  CHECK_THROWS_WITH(Decomposition({4, 4}, {1, 1}, {true}), Contains("periodic flags for 1 dims"));
  CHECK_THROWS_WITH(Decomposition::from_split_points({{0, 3, 3, 8}}),
                    Contains("increase strictly, got 0,3,3,8"));
  CHECK_THROWS_WITH(Decomposition::from_split_points({{1, 8}}), Contains("must start at 0"));
  Decomposition d({4, 4}, {2, 2});
  CHECK_THROWS_AS(d.box(4), Error);
  CHECK_THROWS_WITH(d.owner({4, 0, 0}), Contains("cell index 4 outside the field extent 4"));
}
