// bench_neighborhood: neighbourhood attention (layers/neighborhood_attention.hpp) on a 2-D field
// split over all ranks: forward, and forward + backward, against OpenBLAS sgemm measured in
// the same run.
//
//   mpirun -n 1 ./bench_neighborhood --size 64     mpirun -n 2 ./bench_neighborhood --size 64
//   options: --size N (N x N cells, 64) --channels C (64) --heads H (2) --window W (7, every
//            axis) --iters K (5) --warmup K (1)
//
// FLOPs: with P = the (query, key) pairs the windows hold (open boundaries: fewer keys near
// the edges; counted exactly, axis by axis), forward 4 P C (scores and the weighted sum, 2 P C
// each); backward 14 P C (the query pass: score, dO.v and dQ; the key pass: score and dO.v
// again, dK and dV); forward + backward 18 P C. Exponentials and packing are not counted.
// Time: slowest rank, best of `iters`. GFLOP/s per core = FLOPs / time / ranks (one core per
// rank; with OpenMP, per rank). Ceiling: KokkosBlas::gemm (OpenBLAS sgemm) of 1024^3 on every
// rank at once. Check: a second forward + backward must give bit-identical outputs and
// gradients (no race-dependent sums), else exit 1. Last line: one JSON object.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/layers.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

/// A (1, C, N, N) field over `d` with random values.
Variable<float> random_field(const Communicator& comm, const Decomposition& d, Index C,
                             std::uint64_t seed) {
  ShardTensor<float> f(d, comm.rank(), 1, C, {}, "input");
  const auto view = f.view();
  const Box box = f.global_box();
  const Index n = d.global_extent(1), x0 = box.lower[0], y0 = box.lower[1];
  Kokkos::parallel_for(
      "bench_neighborhood::random",
      Kokkos::MDRangePolicy<RightRank<3>>({0, 0, 0}, {C, box.extent[0], box.extent[1]}),
      KOKKOS_LAMBDA(const Index c, const Index x, const Index y) {
        view(0, c, x, y, 0) = float(hashed_uniform(seed, (c * n + x0 + x) * n + y0 + y));
      });
  return Variable<float>::field(f, true, "input");
}

/// Keys the windows of an open axis of `extent` cells hold, summed over its cells.
double keys_along(Index extent, Index window) {
  const Index below = (window - 1) / 2;
  double total = 0;
  for (Index x = 0; x < extent; ++x)
    total += double(std::min(window, below + extent - x) - std::max<Index>(0, below - x));
  return total;
}

/// Copies of the output and the three gradients, for the determinism check.
std::vector<std::vector<float>> results(const Variable<float>& out,
                                        const std::vector<Variable<float>>& inputs) {
  std::vector<std::vector<float>> r;
  const auto copy = [&](const ShardTensor<float>& f) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.view());
    r.emplace_back(host.data(), host.data() + host.span());
  };
  copy(out.value());
  for (const auto& v : inputs) copy(v.node()->field_grad);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  shardtensor::one_blas_thread_per_rank();  // as the CLI does
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm(MPI_COMM_WORLD);
    const Index size = std::atol(option(argc, argv, "--size", "64").c_str());
    const Index C = std::atol(option(argc, argv, "--channels", "64").c_str());
    const int heads = std::atoi(option(argc, argv, "--heads", "2").c_str());
    const Index window = std::atol(option(argc, argv, "--window", "7").c_str());
    const int iters = std::atoi(option(argc, argv, "--iters", "5").c_str());
    const int warmup = std::atoi(option(argc, argv, "--warmup", "1").c_str());
    try {
      const Decomposition d = Decomposition::automatic({size, size}, comm.size());
      const auto q = random_field(comm, d, C, 1), k = random_field(comm, d, C, 2),
                 v = random_field(comm, d, C, 3);
      NeighborhoodAttentionOptions options;
      options.heads = heads;
      options.window = {window};
      double forward_best = 1e30, step_best = 1e30;
      std::vector<std::vector<float>> first;
      bool deterministic = true;
      for (int it = 0; it < warmup + iters; ++it) {
        for (const auto& input : {q, k, v}) input.node()->field_grad = ShardTensor<float>();
        comm.barrier();
        const double t0 = MPI_Wtime();
        const Variable<float> out = neighborhood_attention(comm, q, k, v, options);
        Kokkos::fence();
        const double t1 = MPI_Wtime();
        backward(sum(comm, out));
        Kokkos::fence();
        const double t2 = MPI_Wtime();
        if (it >= warmup) {
          forward_best = std::min(forward_best, max_over_ranks(t1 - t0));
          step_best = std::min(step_best, max_over_ranks(t2 - t0));
        }
        const auto r = results(out, {q, k, v});
        if (first.empty())
          first = r;
        else
          deterministic = deterministic && r == first;
      }
      int all_deterministic = deterministic ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &all_deterministic, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (!all_deterministic) status = 1;

      const double pairs = keys_along(size, window) * keys_along(size, window);
      const double forward_flops = 4 * pairs * C, step_flops = 18 * pairs * C;
      const double forward_gflops = forward_flops / forward_best / 1e9 / comm.size();
      const double step_gflops = step_flops / step_best / 1e9 / comm.size();
      const double sgemm = sgemm_gflops(1024, 1024, 1024, 5);
      if (comm.rank() == 0) {
        std::printf(
            "bench_neighborhood: %ldx%ld field, C = %ld, %d heads, window %ld, batch 1, float, "
            "%d rank(s), %s\n",
            long(size), long(size), long(C), heads, long(window), comm.size(),
            Kokkos::DefaultExecutionSpace::name());
        std::printf("  forward              %9.2f ms  %7.2f GFLOP/s per core\n", forward_best * 1e3,
                    forward_gflops);
        std::printf("  forward + backward   %9.2f ms  %7.2f GFLOP/s per core\n", step_best * 1e3,
                    step_gflops);
        std::printf(
            "  sgemm 1024^3 per core %8.1f GFLOP/s -> ratio %.3g forward, %.3g step "
            "(OPENBLAS_CORETYPE=%s)\n",
            sgemm, forward_gflops / sgemm, step_gflops / sgemm, openblas_coretype());
        std::printf("  repeated runs bit-identical: %s\n", all_deterministic ? "yes" : "NO");
        std::printf(
            "{\"bench\":\"neighborhood\",\"ranks\":%d,\"size\":%ld,\"channels\":%ld,\"heads\":%d,"
            "\"window\":%ld,\"ms_forward\":%.6g,\"ms_forward_backward\":%.6g,"
            "\"gflops_per_core_forward\":%.4g,\"gflops_per_core\":%.4g,"
            "\"sgemm_gflops_per_core\":%.4g,\"ratio_to_sgemm\":%.4g,\"correct\":%s}\n",
            comm.size(), long(size), long(C), heads, long(window), forward_best * 1e3,
            step_best * 1e3, forward_gflops, step_gflops, sgemm, step_gflops / sgemm,
            all_deterministic ? "true" : "false");
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
      status = 2;
    }
  }
  MPI_Finalize();
  return status;
}
