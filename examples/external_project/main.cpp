// A U-Net forward pass on a sharded random field, built against an installed ShardTensor.
//
// Every rank owns one patch of a 32 x 32 field filled with counter-based random numbers
// (each global cell draws the same value whatever the decomposition). The U-Net runs on
// the sharded field, the output is gathered on rank 0 and compared with the same U-Net
// run on the whole field on rank 0 alone. Exit status 1 on a mismatch.
//
//   mpirun -n 2 ./external_unet

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "shardtensor/comm.hpp"
#include "shardtensor/core.hpp"
#include "shardtensor/models.hpp"

using namespace shardtensor;

namespace {

constexpr Index nx = 32, ny = 32;
constexpr std::uint64_t input_seed = 2024;

models::UNetOptions unet_options() {
  models::UNetOptions o;
  o.dims = 2;
  o.in_channels = 1;
  o.out_channels = 2;
  o.depth = 2;
  o.base_channels = 4;
  o.norm = models::NormKind::group;
  o.norm_groups = 2;
  o.seed = 7;
  return o;
}

/// The U-Net applied to a random field on `d`, gathered on rank 0 of `comm`.
FieldView<float> unet_output(const Communicator& comm, const Decomposition& d) {
  ShardTensor<float> input(d, comm.rank(), 1, 1);
  auto host = Kokkos::create_mirror_view(input.view());
  const Box owned = input.interior_box();
  for (Index x = owned.lower[0]; x < owned.upper(0); ++x)
    for (Index y = owned.lower[1]; y < owned.upper(1); ++y) {
      const Index cell = input.to_global(0, x) * ny + input.to_global(1, y);
      host(0, 0, x, y, 0) = float(hashed_uniform(input_seed, std::uint64_t(cell)));
    }
  Kokkos::deep_copy(input.view(), host);

  models::UNet<float> unet(comm, unet_options());
  const Variable<float> output = unet.forward(Variable<float>::field(input, false, "input"));
  return gather_to_root(comm, output.value(), 0);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm;
    try {
      const Decomposition sharded = Decomposition::automatic({nx, ny}, comm.size());
      const FieldView<float> result = unet_output(comm, sharded);
      if (comm.rank() == 0) {
        const Communicator self(MPI_COMM_SELF);
        const FieldView<float> reference = unet_output(self, Decomposition({nx, ny}, {1, 1}));
        auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result);
        auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reference);
        double max_difference = 0, max_value = 0, sum = 0;
        for (Index c = 0; c < Index(b.extent(1)); ++c)
          for (Index x = 0; x < nx; ++x)
            for (Index y = 0; y < ny; ++y) {
              max_difference = std::max(
                  max_difference, std::abs(double(a(0, c, x, y, 0)) - double(b(0, c, x, y, 0))));
              max_value = std::max(max_value, std::abs(double(b(0, c, x, y, 0))));
              sum += a(0, c, x, y, 0);
            }
        const double relative = max_difference / std::max(max_value, 1e-30);
        const bool ok = a.extent(1) == b.extent(1) && relative <= 1e-5 && std::isfinite(sum);
        std::printf("external project: UNet forward on %s, %d rank(s): sum = %.6f, "
                    "max |sharded - single rank| / max |y| = %.3g %s\n",
                    sharded.describe().c_str(), comm.size(), sum, relative,
                    ok ? "(match)" : "(MISMATCH)");
        if (!ok) status = 1;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: error: %s\n", comm.rank(), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return status;
}
