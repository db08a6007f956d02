// Catch2 main for MPI tests: MPI_Init, then Kokkos, then the tests. The process fails if
// any rank's tests fail, so mpirun (and ctest) report the failure whichever rank saw it.

#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <catch2/catch.hpp>
#include <cstdio>

#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/host_blas.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  shardtensor::keep_freed_memory();
  shardtensor::one_blas_thread_per_rank();  // as the CLI does (test_host_blas checks it)
  int failed = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)  // the log says which backend ran the kernels
      std::printf("backend: %s, concurrency %d per rank\n", Kokkos::DefaultExecutionSpace::name(),
                  static_cast<int>(Kokkos::DefaultExecutionSpace().concurrency()));
    Catch::Session session;
    // Only rank 0 prints passing summaries; every rank prints its own failures.
    if (session.applyCommandLine(argc, argv) != 0) {
      failed = 1;
    } else {
      failed = session.run() != 0 ? 1 : 0;
    }
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && failed) std::fprintf(stderr, "tests failed on at least one rank\n");
  }
  MPI_Finalize();
  return failed;
}
