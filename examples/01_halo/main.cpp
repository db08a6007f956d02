// Example 01: a 2-D heat equation on a domain-decomposed field.
//
// Each rank owns one patch of a 96 x 64 field (periodic in x, cold walls in y), exchanges
// one layer of ghost cells per step with HaloExchange -- overlapping the exchange with the
// interior update -- and takes explicit diffusion steps. At the end the field is gathered
// on rank 0 and compared with the same computation on one rank.
//
//   mpirun -n 2 ./example_01_halo [--nx 96] [--ny 64] [--steps 200]

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "shardtensor/comm.hpp"
#include "shardtensor/core.hpp"

using namespace shardtensor;

namespace {

constexpr double diffusion_number = 0.2;  // alpha * dt / dx^2, stable below 0.25

/// next = field + r * (5-point Laplacian of field) on the cells of `box` (local indices).
void diffuse(const ShardTensor<double>& field, const ShardTensor<double>& next, const Box& box) {
  if (box.empty()) return;
  auto u = field.view();
  auto v = next.view();
  Kokkos::parallel_for(
      "diffuse",
      Kokkos::MDRangePolicy<Kokkos::Rank<2>>({box.lower[0], box.lower[1]},
                                             {box.upper(0), box.upper(1)}),
      KOKKOS_LAMBDA(const Index x, const Index y) {
        const double laplacian = u(0, 0, x - 1, y, 0) + u(0, 0, x + 1, y, 0) +
                                 u(0, 0, x, y - 1, 0) + u(0, 0, x, y + 1, 0) -
                                 4.0 * u(0, 0, x, y, 0);
        v(0, 0, x, y, 0) = u(0, 0, x, y, 0) + diffusion_number * laplacian;
      });
}

/// The owned cells split into the part that needs no ghost cells and the rim that does.
struct InteriorSplit {
  Box inner;
  std::vector<Box> rim;
};

InteriorSplit split_interior(const Box& owned) {
  InteriorSplit s;
  s.inner = owned;
  for (int k = 0; k < 2; ++k) {
    s.inner.lower[k] += 1;
    s.inner.extent[k] = std::max<Index>(0, s.inner.extent[k] - 2);
  }
  // x-low and x-high rows (full y), then y-low and y-high columns (inner x).
  Box x_low = owned, x_high = owned, y_low = owned, y_high = owned;
  x_low.extent[0] = 1;
  x_high.lower[0] = owned.upper(0) - 1;
  x_high.extent[0] = owned.extent[0] > 1 ? 1 : 0;
  for (Box* b : {&y_low, &y_high}) {
    b->lower[0] = owned.lower[0] + 1;
    b->extent[0] = std::max<Index>(0, owned.extent[0] - 2);
    b->extent[1] = 1;
  }
  y_high.lower[1] = owned.upper(1) - 1;
  if (owned.extent[1] < 2) y_high.extent[1] = 0;
  s.rim = {x_low, x_high, y_low, y_high};
  return s;
}

/// Initial temperature: a few smooth bumps, a function of the global cell only.
double initial_temperature(Index x, Index y, Index nx, Index ny) {
  const double pi = 3.14159265358979323846;
  const double fx = double(x) / double(nx), fy = (double(y) + 0.5) / double(ny);
  return std::sin(2 * pi * fx) * std::sin(pi * fy) +
         0.5 * std::exp(-40.0 * ((fx - 0.3) * (fx - 0.3) + (fy - 0.6) * (fy - 0.6)));
}

/// Runs `steps` diffusion steps on the decomposition and returns the whole field on rank 0.
FieldView<double> simulate(const Communicator& comm, const Decomposition& d, int steps,
                           bool report) {
  const GhostWidths ghosts = GhostWidths::uniform(1, 2);
  ShardTensor<double> field(d, comm.rank(), 1, 1, ghosts, "temperature");
  ShardTensor<double> next(d, comm.rank(), 1, 1, ghosts, "temperature_next");
  auto host = Kokkos::create_mirror_view(field.view());
  const Box owned = field.interior_box();
  for (Index x = owned.lower[0]; x < owned.upper(0); ++x)
    for (Index y = owned.lower[1]; y < owned.upper(1); ++y)
      host(0, 0, x, y, 0) = initial_temperature(field.to_global(0, x), field.to_global(1, y),
                                                d.global_extent(0), d.global_extent(1));
  Kokkos::deep_copy(field.view(), host);

  HaloExchange<double> halo(comm, field);
  if (report) {
    for (int r = 0; r < comm.size(); ++r) {
      if (r == comm.rank()) {
        const Box b = field.global_box();
        std::printf(
            "  rank %d owns x [%lld, %lld) y [%lld, %lld): %zu halo messages, %zu bytes out per "
            "step\n",
            r, (long long)b.lower[0], (long long)b.upper(0), (long long)b.lower[1],
            (long long)b.upper(1), halo.messages().size(), halo.bytes_sent());
        std::fflush(stdout);
      }
      comm.barrier();
    }
  }
  const InteriorSplit split = split_interior(owned);
  for (int step = 0; step < steps; ++step) {
    halo.start(field);                  // ghosts travel while...
    diffuse(field, next, split.inner);  // ...the cells that do not need them update
    halo.finish(field);
    for (const Box& b : split.rim) diffuse(field, next, b);
    Kokkos::fence();
    std::swap(field, next);
  }
  return gather_to_root(comm, field, 0);
}

int option(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::stoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm;
    try {
      const Index nx = option(argc, argv, "--nx", 96), ny = option(argc, argv, "--ny", 64);
      const int steps = option(argc, argv, "--steps", 200);
      const Decomposition sharded = Decomposition::automatic({nx, ny}, comm.size(), {true, false});
      if (comm.rank() == 0)
        std::printf("Heat equation, %d steps, %s on %d rank(s)\n", steps,
                    sharded.describe().c_str(), comm.size());
      const double t0 = MPI_Wtime();
      const FieldView<double> result = simulate(comm, sharded, steps, true);
      const double elapsed = MPI_Wtime() - t0;

      if (comm.rank() == 0) {
        // The same computation on one rank, for comparison.
        const Communicator self(MPI_COMM_SELF);
        const FieldView<double> reference =
            simulate(self, Decomposition({nx, ny}, {1, 1}, {true, false}), steps, false);
        auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result);
        auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reference);
        double max_difference = 0, max_value = 0, total = 0;
        for (Index x = 0; x < nx; ++x)
          for (Index y = 0; y < ny; ++y) {
            max_difference =
                std::max(max_difference, std::abs(a(0, 0, x, y, 0) - b(0, 0, x, y, 0)));
            max_value = std::max(max_value, std::abs(a(0, 0, x, y, 0)));
            total += a(0, 0, x, y, 0);
          }
        std::printf("Sharded run: %.3f s; max |T| = %.6f, sum T = %.6f\n", elapsed, max_value,
                    total);
        std::printf("Max |sharded - single rank| = %.3g %s\n", max_difference,
                    max_difference == 0.0 ? "(bit-identical)" : "(MISMATCH)");
        if (max_difference != 0.0) status = 1;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: error: %s\n", comm.rank(), e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return status;
}
