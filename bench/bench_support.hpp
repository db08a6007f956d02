#pragma once
// What every benchmark measures with: command-line options, the slowest rank's time, CPU
// time (less inflated than wall time when other jobs share the cores), peak memory, and the
// machine ceilings benchmarks report their ratios to (sgemm, the multiply-add peak, copies),
// measured in the same run.

#include <mpi.h>
#include <sys/resource.h>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"  // DefaultMemorySpace
#include "shardtensor/kernels/vector_isa.hpp"

namespace shardtensor::bench {

/// The value after `name` on the command line, or `fallback`.
inline std::string option(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

inline double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

/// CPU seconds this process has run.
inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/// The process's maximum resident set so far, MiB.
inline double peak_resident_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // Linux reports KiB
}

/// Best sgemm rate (GFLOP/s per rank) of an m x k by k x n product (KokkosBlas::gemm, so
/// OpenBLAS on the host), every rank at once.
inline double sgemm_gflops(int m, int k, int n, int reps) {
  Kokkos::View<float**, Kokkos::LayoutRight> a("a", m, k), b("b", k, n), c("c", m, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    KokkosBlas::gemm("N", "N", 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    best = std::min(best, max_over_ranks(MPI_Wtime() - t0));
  }
  return 2.0 * m * k * double(n) / best / 1e9;
}

/// The best of `reps` rates (GFLOP/s) of run(), which returns the flops it ran, on every rank
/// at once after a barrier (the slowest rank's time).
template <class Run>
double best_gflops(const Run& run, int reps = 5) {
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    const double flops = run();
    best = std::max(best, flops / max_over_ranks(MPI_Wtime() - start) / 1e9);
  }
  return best;
}

/// The multiply-add ceiling, GFLOP/s per core: the vector kernels' path running independent
/// multiply-add chains (kernels::run_multiply_add_chains) on one thread of every rank at once,
/// best of `reps`. 0 where the kernels do not run on the host or the build has no vector kernels.
inline double multiply_add_peak_gflops(int reps = 5) {
  if (!kernels_run_on_host) return 0.0;
  return best_gflops([] { return kernels::run_multiply_add_chains(std::size_t(1) << 22); }, reps);
}

/// The float correlation tile's ceiling, GFLOP/s per core: the vector path's tile on a cached
/// workload (kernels::run_correlate_tiles) on one thread of every rank at once, best of `reps`;
/// 0 where the vector kernels are off or do not run on the host.
inline double correlate_tile_peak_gflops(int reps = 5) {
  if (!kernels_run_on_host) return 0.0;
  return best_gflops([] { return kernels::run_correlate_tiles(std::size_t(1) << 14); }, reps);
}

/// The AMX tiles' bf16 multiply-add ceiling per core (GFLOP/s), the best of 5 timings of
/// independent full tile products on every rank at once; 0 where the CPU has no AMX tiles.
inline double bf16_tile_peak_gflops() {
  if (!kernels_run_on_host || kernels::run_bf16_tile_products(1) == 0.0) return 0.0;
  return best_gflops([] { return kernels::run_bf16_tile_products(std::size_t(1) << 18); });
}

/// Cores a run of `ranks` ranks computes on, what "per core" rates divide by: every rank's
/// host threads where the kernels run on the host (OpenMP: OMP_NUM_THREADS each), one per
/// rank on a GPU (the rate is then per GPU).
inline int cores_of(int ranks) {
  return ranks * (kernels_run_on_host ? Kokkos::DefaultHostExecutionSpace().concurrency() : 1);
}

/// The host vector kernels' path, for the human line: "avx512 (16 floats)", "avx2 (8 floats)",
/// "neon (4 floats)" or "off" (SHARDTENSOR_SIMD chooses another: kernels/vector_isa.hpp), and
/// ", bf16 dot products" where bf16 convolutions run on them, ", AMX tiles" where on those.
inline std::string vector_path() {
  const std::string isa = kernels::vector_isa();
  if (isa == "off") return isa;
  return isa + " (" + std::to_string(kernels::vector_lanes()) + " floats" +
         (kernels::bf16_dot_products() ? ", bf16 dot products" : "") +
         (kernels::bf16_matrix_tiles() ? ", AMX tiles" : "") + ")";
}

/// OPENBLAS_CORETYPE as set (it changes sgemm ~2x: SkylakeX for the AVX-512 kernels), or "".
inline const char* openblas_coretype() {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  return coretype ? coretype : "";
}

/// The copy ceiling: bytes read + written per second by Kokkos::deep_copy between two Views
/// of `bytes`, on rank 0 alone (the others wait), best of 5; returned on every rank.
inline double copy_gbytes_per_s(std::size_t bytes, int rank) {
  double best = 1e30;
  if (rank == 0) {
    Kokkos::View<float*, DefaultMemorySpace> a("copy_src", bytes / sizeof(float)),
        b("copy_dst", bytes / sizeof(float));
    Kokkos::deep_copy(a, 1.0f);
    Kokkos::deep_copy(b, a);
    for (int r = 0; r < 5; ++r) {
      const double start = MPI_Wtime();
      Kokkos::deep_copy(b, a);
      Kokkos::fence();
      best = std::min(best, MPI_Wtime() - start);
    }
  }
  double rate = 2.0 * double(bytes / sizeof(float) * sizeof(float)) / best / 1e9;
  MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return rate;
}

}  // namespace shardtensor::bench
