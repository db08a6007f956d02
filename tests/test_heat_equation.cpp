// The heat-equation data generator: sharded solves equal the single-rank solve bit for bit,
// heat is conserved, and a single Fourier mode decays by the scheme's exact discrete factor.

#include <catch2/catch.hpp>
#include <cmath>

#include "shardtensor/comm.hpp"
#include "shardtensor/data/heat_equation.hpp"
#include "test_support.hpp"

using namespace shardtensor;

namespace {

double total(const FieldView<double>& field, int channel) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), field);
  double sum = 0;
  for (std::size_t x = 0; x < host.extent(2); ++x)
    for (std::size_t y = 0; y < host.extent(3); ++y)
      for (std::size_t z = 0; z < host.extent(4); ++z) sum += host(0, channel, x, y, z);
  return sum;
}

}  // namespace

TEST_CASE("heat samples are the same on any number of ranks", "[heat]") {
  const Communicator comm;
  for (int dims : {2, 3}) {
    HeatOptions options;
    options.dims = dims;
    options.size = dims == 2 ? 20 : 10;
    options.steps = 7;
    options.seed = 42;
    for (const auto& grid : test::process_grids(comm.size(), dims)) {
      const Decomposition sharded(std::vector<Index>(dims, options.size), grid,
                                  std::vector<bool>(dims, true));
      const HeatSample sample = solve_heat_sample(comm, sharded, options, 3);
      const auto input = gather_to_root(comm, sample.input, 0);
      const auto target = gather_to_root(comm, sample.target, 0);
      if (comm.rank() == 0) {
        const Communicator self(MPI_COMM_SELF);
        const HeatSample reference = solve_heat_sample(self, options.decomposition(1), options, 3);
        auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), input);
        auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reference.input.view());
        auto c = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target);
        auto e = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reference.target.view());
        REQUIRE(a.span() == b.span());
        REQUIRE(c.span() == e.span());
        bool same = true;
        for (std::size_t i = 0; i < a.span(); ++i) same = same && a.data()[i] == b.data()[i];
        for (std::size_t i = 0; i < c.span(); ++i) same = same && c.data()[i] == e.data()[i];
        CHECK(same);
        // The field changed, kappa is within its bounds, heat is conserved.
        CHECK(std::abs(total(target, 0) - total(input, 0)) <= 1e-10 * a.span());
        double change = 0, kmin = 1e300, kmax = 0;
        for (std::size_t x = 0; x < a.extent(2); ++x)
          for (std::size_t y = 0; y < a.extent(3); ++y)
            for (std::size_t z = 0; z < a.extent(4); ++z) {
              change = std::max(change, std::abs(c(0, 0, x, y, z) - a(0, 0, x, y, z)));
              kmin = std::min(kmin, a(0, 1, x, y, z));
              kmax = std::max(kmax, a(0, 1, x, y, z));
            }
        CHECK(change > 1e-3);
        CHECK(kmin >= options.diffusivity * (1 - options.contrast));
        CHECK(kmax <= options.diffusivity * (1 + options.contrast));
        CHECK(kmax - kmin > 0.1);
      }
    }
  }
}

TEST_CASE("a single mode decays by the discrete amplification factor", "[heat]") {
  const Communicator comm;
  HeatOptions options;
  options.dims = 2;
  options.size = 16;
  options.steps = 25;
  options.modes = 1;
  options.contrast = 0;  // constant kappa: the mode is an eigenvector of the scheme
  const Decomposition d = options.decomposition(comm.size());
  const HeatSample sample = solve_heat_sample(comm, d, options, 0);
  const auto input = gather_to_root(comm, sample.input, 0);
  const auto target = gather_to_root(comm, sample.target, 0);
  if (comm.rank() == 0) {
    auto u0 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), input);
    auto u1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), target);
    // Recover the wavevector from the field: the ratio u1/u0 is the same in every cell.
    double ratio = 0, spread = 0;
    Index count = 0;
    for (Index x = 0; x < 16; ++x)
      for (Index y = 0; y < 16; ++y)
        if (std::abs(u0(0, 0, x, y, 0)) > 0.05) {
          const double r = u1(0, 0, x, y, 0) / u0(0, 0, x, y, 0);
          if (count++ == 0) ratio = r;
          spread = std::max(spread, std::abs(r - ratio));
        }
    REQUIRE(count > 10);
    CHECK(spread < 1e-12);
    // The ratio must be one of the scheme's eigenvalues g(k)^steps for some integer k.
    const double h = 1.0 / 16, r = options.time_step() / (h * h) * options.diffusivity;
    double best = 1e300;
    for (int kx = -3; kx <= 3; ++kx)
      for (int ky = -3; ky <= 3; ++ky) {
        const double g =
            1 - 2 * r * (2 - std::cos(2 * M_PI * kx * h) - std::cos(2 * M_PI * ky * h));
        best = std::min(best, std::abs(std::pow(g, options.steps) - ratio));
      }
    CHECK(best < 1e-12);
    CHECK(ratio < 0.99);
  }
}

TEST_CASE("bad heat options name the option and value", "[heat]") {
  HeatOptions options;
  options.dims = 4;
  CHECK_THROWS_WITH(options.validate(), Catch::Contains("dims 4"));
  options.dims = 2;
  options.contrast = 1.5;
  CHECK_THROWS_WITH(options.validate(), Catch::Contains("contrast 1.5"));
}
