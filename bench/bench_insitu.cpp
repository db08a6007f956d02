// bench_insitu: what the embedding API costs on top of the model. Session::infer on a
// solver's arrays (a 64^3 field, one ghost layer, float model) against the bare model forward
// on the same memory, and the extra cost when the session must copy the input (double
// arrays, Fortran order, interleaved components).
//
//   mpirun -n 1 ./bench_insitu        mpirun -n 2 ./bench_insitu      (same global field)
//   options: --size N (global cube edge, 64) --iters K (best of K, 10) --warmup K (2)
//            --config FILE (a run config; default: the U-Net of examples/03_insitu_heat)
//
// The solver's arrays: one channel, C order (or Fortran for the last variant), one ghost
// cell per side, on an MPI Cartesian grid (MPI_Dims_create, periodic), described to the
// session with SolverPatch::cartesian. Variants, all on the same field values:
//
//   bare      the model built with models::build_model from the same config (same seed,
//             hence the same parameters; checked below), in eval mode, run on a ShardTensor
//             that wraps the solver's float C-order array without a copy
//             (ShardTensor::wrap, ghost width 1), then the copy of the prediction's owned
//             cells into the solver's output array (the copy a solver needs in any case: the
//             model returns its own tensor). "forward" is the model alone.
//   session   Session::infer on float C-order arrays: the input is read in place.
//   double    Session::infer on double C-order arrays: converted to float (a copy).
//   fortran   Session::infer on float Fortran-order arrays: transposed (a copy).
//   field copy  the ceiling for a copy: one Kokkos pass reading the owned cells of the
//             double array and writing a float field (what the double variant stages).
//   2 components  Session::infer on a float C-order array of 2 values per cell (PETSc's
//             dof 2), the model's channel in component 0: staged (a copy); the session also
//             refuses a NaN in the input, a pass over the owned cells in every variant.
//
// On a GPU (the host cannot read device memory) the bare model wraps a device copy of the
// float array made before the timing, as a GPU solver's field would be, and its prediction
// comes back through a device buffer; the field copy first moves the double array to the
// device; every session call copies its input (in_place false).
//
// overhead_fraction = session / bare - 1; copy_overhead_fraction = double / bare - 1;
// fortran_overhead_fraction = fortran / bare - 1. Time: a barrier before each call, the
// slowest rank's time of the call, best of `iters` rounds; all variants are timed in every
// round, in rotating order. The same is done with CPU time (CLOCK_PROCESS_CPUTIME_ID; the
// *_cpu fields), which other jobs on shared cores inflate far less than wall time. Every variant's
// prediction is checked against the bare one (bitwise for the in-place path, 1e-6 relative
// otherwise): a mismatch exits with 1. Last line: one JSON object.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/embed.hpp"
#include "shardtensor/models/builder.hpp"
#include "shardtensor/models/summary.hpp"
#include "shardtensor/train/run_config.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

/// The U-Net of examples/03_insitu_heat/insitu_heat.yaml (the model that example couples).
const char* default_config = R"(
data: {normalize: false}
model: {type: unet, depth: 1, base_channels: 8, norm: none, activation: gelu, down: avgpool,
        up: linear, padding: periodic, input_skip: true, seed: 3}
optimizer: {type: adam, lr: 3.0e-3}
training: {precision: float}
)";

/// A solver's array with one ghost layer per side, C or Fortran order, `components` values
/// per cell (PETSc's dof); the model's channel is component 0.
template <class S>
struct SolverArray {
  Index extent[3], allocated[3];
  bool fortran;
  Index components;
  std::vector<S> values;
  SolverArray(const SolverPatch& patch, bool fortran_order, Index components_per_cell = 1)
      : fortran(fortran_order), components(components_per_cell) {
    std::size_t n = std::size_t(components);
    for (int d = 0; d < 3; ++d) {
      extent[d] = patch.extent[d];
      n *= std::size_t(allocated[d] = extent[d] + 2);
    }
    values.assign(n, S(-7));  // ghost cells (and other components) hold values never seen
  }
  /// Index of owned cell (i, j, k), 0-based without ghosts (its component 0).
  std::size_t at(Index i, Index j, Index k) const {
    ++i, ++j, ++k;
    return std::size_t(components) *
           (fortran ? std::size_t((k * allocated[1] + j) * allocated[0] + i)
                    : std::size_t((i * allocated[1] + j) * allocated[2] + k));
  }
  template <class F>
  void for_owned(F f) const {
    for (Index i = 0; i < extent[0]; ++i)
      for (Index j = 0; j < extent[1]; ++j)
        for (Index k = 0; k < extent[2]; ++k) f(i, j, k);
  }
};

/// Largest |a - b| / max |b| over owned cells, all ranks.
template <class A, class B>
double relative_difference(const SolverArray<A>& a, const SolverArray<B>& b) {
  double diff = 0, scale = 0;
  a.for_owned([&](Index i, Index j, Index k) {
    const double x = double(a.values[a.at(i, j, k)]), y = double(b.values[b.at(i, j, k)]);
    diff = std::max(diff, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  });
  return max_over_ranks(diff) / max_over_ranks(scale);
}

template <class S>
using HostValues = Kokkos::View<S*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// A solver array's values where the model's kernels read them: the array itself where the
/// host reads default memory, else a device copy (a GPU solver keeps its fields on the
/// device; the session, given host arrays, copies them over).
template <class S>
Kokkos::View<S*, DefaultMemorySpace> in_default_memory(std::vector<S>& values) {
  if (host_reads_default_memory)
    return Kokkos::View<S*, DefaultMemorySpace>(values.data(), values.size());
  Kokkos::View<S*, DefaultMemorySpace> copy("solver array", values.size());
  Kokkos::deep_copy(copy, HostValues<S>(values.data(), values.size()));
  return copy;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  keep_freed_memory();
  one_blas_thread_per_rank();  // as the CLI does
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    try {
      const Index size = std::stol(option(argc, argv, "--size", "64"));
      const int iters = std::stoi(option(argc, argv, "--iters", "10"));
      const int warmup = std::stoi(option(argc, argv, "--warmup", "2"));
      const std::string config_path = option(argc, argv, "--config", "");
      SHARDTENSOR_REQUIRE(
          size >= 4 && iters >= 1 && warmup >= 0, "bench_insitu",
          "bad options: size " << size << ", iters " << iters << ", warmup " << warmup);

      // The solver's side: a periodic Cartesian grid and its arrays.
      int dims[3] = {0, 0, 0}, periods[3] = {1, 1, 1};
      MPI_Dims_create(world_size, 3, dims);
      MPI_Comm cart = MPI_COMM_NULL;
      MPI_Cart_create(MPI_COMM_WORLD, 3, dims, periods, 0, &cart);
      const SolverPatch patch = SolverPatch::cartesian(cart, {size, size, size});
      SolverArray<float> input(patch, false), fortran_input(patch, true);
      SolverArray<double> double_input(patch, false);
      SolverArray<float> bare_out(patch, false), session_out(patch, false),
          fortran_out(patch, true);
      SolverArray<double> double_out(patch, false);
      SolverArray<float> interleaved_input(patch, false, 2), interleaved_out(patch, false, 2);
      input.for_owned([&](Index i, Index j, Index k) {
        const Index x = patch.offset[0] + i, y = patch.offset[1] + j, z = patch.offset[2] + k;
        const float v = float(
            std::sin(0.3 * x + 0.1) * std::cos(0.2 * y) + 0.5 * std::sin(0.15 * z + 0.05 * x) +
            0.1 * (hashed_uniform(5, std::uint64_t((x * size + y) * size + z)) - 0.5));
        input.values[input.at(i, j, k)] = v;
        fortran_input.values[fortran_input.at(i, j, k)] = v;
        double_input.values[double_input.at(i, j, k)] = double(v);
        interleaved_input.values[interleaved_input.at(i, j, k)] = v;
      });

      SessionOptions options;
      if (config_path.empty())
        options.config_text = default_config;
      else
        options.config = config_path;
      options.arrays = SolverArrays{ArrayOrder::c, 1};
      Session session(cart, patch, options);
      options.arrays = SolverArrays{ArrayOrder::fortran, 1};
      Session fortran_session(cart, patch, options);
      options.arrays = SolverArrays{ArrayOrder::c, 1};
      options.arrays.components = 2;  // PETSc's dof 2: the model reads component 0
      Session interleaved_session(cart, patch, options);
      SHARDTENSOR_REQUIRE(session.precision() == "float", "bench_insitu",
                          "the config's model computes in " << session.precision()
                                                            << "; this benchmark needs float");

      // The bare model: same config, same communicator layout as the session's.
      const RunConfig config =
          config_path.empty()
              ? RunConfig::parse(default_config, "default config", {}, RunConfig::DataUse::arrays)
              : RunConfig::load(config_path, {}, RunConfig::DataUse::arrays);
      const Communicator solver_comm(cart);
      const SolverGrid grid = solver_grid(solver_comm, patch);
      MPI_Comm ordered = MPI_COMM_NULL;
      MPI_Comm_split(cart, 0, grid.grid_rank, &ordered);
      const Communicator comm(ordered);
      MPI_Comm_free(&ordered);
      const auto model = models::build_model<float>(config.model, comm, {3, 1, 1});
      model->allow_tf32(config.training.tf32);  // as the session's
      model->eval();
      const auto model_input = in_default_memory(input.values);
      const auto model_output = in_default_memory(bare_out.values);
      const ShardTensor<float> wrapped = ShardTensor<float>::wrap(
          model_input.data(), grid.decomposition, comm.rank(), 1, 1, GhostWidths::uniform(1, 3));

      double forward_time = 0;  // of the last bare call
      const auto bare = [&] {
        const double t0 = MPI_Wtime();
        const NoGradGuard no_grad;  // as the session's infer call runs it
        const Variable<float> y = model->forward(Variable<float>::field(wrapped));
        Kokkos::fence();
        forward_time = MPI_Wtime() - t0;
        const auto in = y.value().interior();
        float* out = model_output.data();
        const Index a0 = bare_out.allocated[1] * bare_out.allocated[2], a1 = bare_out.allocated[2];
        Kokkos::parallel_for(
            "bare output copy",
            Kokkos::MDRangePolicy<RightRank<3>>({0, 0, 0},
                                                {in.extent(2), in.extent(3), in.extent(4)}),
            KOKKOS_LAMBDA(const Index i, const Index j, const Index k) {
              out[(i + 1) * a0 + (j + 1) * a1 + k + 1] = in(0, 0, i, j, k);
            });
        if (!host_reads_default_memory)
          Kokkos::deep_copy(HostValues<float>(bare_out.values.data(), bare_out.values.size()),
                            model_output);
        Kokkos::fence();
      };
      bool in_place = true, double_copied = false, fortran_copied = false,
           interleaved_copied = false;
      std::string double_reason, fortran_reason, interleaved_reason;
      const auto in_session = [&] {
        session.infer({input.values.data()}, {session_out.values.data()});
        in_place = !session.last_call().input_copied;
      };
      const auto double_session = [&] {
        session.infer({double_input.values.data()}, {double_out.values.data()});
        double_copied = session.last_call().input_copied;
        double_reason = session.last_call().copy_reason;
      };
      const auto fortran = [&] {
        fortran_session.infer({fortran_input.values.data()}, {fortran_out.values.data()});
        fortran_copied = fortran_session.last_call().input_copied;
        fortran_reason = fortran_session.last_call().copy_reason;
      };
      const auto interleaved = [&] {
        interleaved_session.infer({interleaved_input.values.data()},
                                  {interleaved_out.values.data()});
        interleaved_copied = interleaved_session.last_call().input_copied;
        interleaved_reason = interleaved_session.last_call().copy_reason;
      };
      // The copy ceiling: read the double array's owned cells, write a float field.
      Kokkos::View<float***, Kokkos::LayoutRight> staged("staged", patch.extent[0], patch.extent[1],
                                                         patch.extent[2]);
      const auto double_source = in_default_memory(double_input.values);
      const auto field_copy = [&] {
        if (!host_reads_default_memory)  // the array crosses to the device, as in the session
          Kokkos::deep_copy(double_source, HostValues<double>(double_input.values.data(),
                                                              double_input.values.size()));
        const double* source = double_source.data();
        const Index a0 = double_input.allocated[1] * double_input.allocated[2],
                    a1 = double_input.allocated[2];
        const auto target = staged;
        Kokkos::parallel_for(
            "field copy",
            Kokkos::MDRangePolicy<RightRank<3>>(
                {0, 0, 0}, {target.extent(0), target.extent(1), target.extent(2)}),
            KOKKOS_LAMBDA(const Index i, const Index j, const Index k) {
              target(i, j, k) = float(source[(i + 1) * a0 + (j + 1) * a1 + k + 1]);
            });
        Kokkos::fence();
      };

      const std::vector<std::function<void()>> variants{bare,    in_session, double_session,
                                                        fortran, field_copy, interleaved};
      std::vector<double> best(variants.size(), 1e30), cpu_best(variants.size(), 1e30);
      double forward_best = 1e30;
      for (int round = 0; round < warmup + iters; ++round)
        for (std::size_t v = 0; v < variants.size(); ++v) {
          const std::size_t which = (v + round) % variants.size();
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime(), c0 = cpu_seconds();
          variants[which]();
          const double elapsed = max_over_ranks(MPI_Wtime() - t0);
          const double cpu = max_over_ranks(cpu_seconds() - c0);
          if (round < warmup) continue;
          best[which] = std::min(best[which], elapsed);
          cpu_best[which] = std::min(cpu_best[which], cpu);
          if (which == 0) forward_best = std::min(forward_best, max_over_ranks(forward_time));
        }

      // Every variant predicts what the bare model predicts.
      const double session_difference = relative_difference(session_out, bare_out);
      const double double_difference = relative_difference(double_out, bare_out);
      const double fortran_difference = relative_difference(fortran_out, bare_out);
      const double interleaved_difference = relative_difference(interleaved_out, bare_out);
      // On a GPU the session copies every input to the device (in_place false), into a
      // buffer laid out unlike the wrapped array: equal to 1e-6 there, not bitwise.
      const bool correct = session_difference <= (host_reads_default_memory ? 0.0 : 1e-6) &&
                           double_difference <= 1e-6 && fortran_difference <= 1e-6 &&
                           interleaved_difference <= 1e-6 && in_place == host_reads_default_memory &&
                           double_copied && fortran_copied && interleaved_copied;
      if (!correct) status = 1;

      const double bare_s = best[0], session_s = best[1], double_s = best[2], fortran_s = best[3],
                   copy_s = best[4], interleaved_s = best[5];
      const double overhead = session_s / bare_s - 1, copy_overhead = double_s / bare_s - 1,
                   fortran_overhead = fortran_s / bare_s - 1;
      const double cpu_overhead = cpu_best[1] / cpu_best[0] - 1,
                   cpu_copy_overhead = cpu_best[2] / cpu_best[0] - 1,
                   cpu_fortran_overhead = cpu_best[3] / cpu_best[0] - 1;
      if (world_rank == 0) {
        const long n = long(size);
        std::printf(
            "bench_insitu: Session::infer vs the bare model, %ldx%ldx%ld cells (%s), "
            "%d rank(s), best of %d\n",
            n, n, n, grid.decomposition.describe().c_str(), world_size, iters);
        std::printf("  model: %s\n", session.describe().c_str());
        std::printf("  %-42s %9s %9s %9s %9s\n", "variant", "wall ms", "overhead", "CPU ms",
                    "overhead");
        std::printf("  %-42s %9.3f\n", "bare forward (wrapped float array)", forward_best * 1e3);
        const char* names[] = {"bare forward + output copy", "session, float C order",
                               "session, double C order", "session, float Fortran order",
                               "field copy (double -> float, owned cells)",
                               "session, float C order, 2 components"};
        const bool copied[] = {false, !in_place, double_copied, fortran_copied, false,
                               interleaved_copied};
        for (int v = 0; v < 6; ++v) {
          std::printf("  %-42s %9.3f", names[v], best[v] * 1e3);
          if ((v >= 1 && v <= 3) || v == 5)
            std::printf(" %8.2f%% %9.3f %8.2f%%  input %s\n", 100 * (best[v] / bare_s - 1),
                        cpu_best[v] * 1e3, 100 * (cpu_best[v] / cpu_best[0] - 1),
                        copied[v] ? "copied" : "read in place");
          else
            std::printf(" %9s %9.3f\n", "", cpu_best[v] * 1e3);
        }
        std::printf(
            "  session - bare: %.3f ms wall, %.3f ms CPU (in place); %.3f ms wall, %.3f ms "
            "CPU (double)\n",
            (session_s - bare_s) * 1e3, (cpu_best[1] - cpu_best[0]) * 1e3,
            (double_s - bare_s) * 1e3, (cpu_best[2] - cpu_best[0]) * 1e3);
        std::printf("  copy reasons: double: %s; Fortran: %s; 2 components: %s\n",
                    double_reason.c_str(), fortran_reason.c_str(), interleaved_reason.c_str());
        std::printf(
            "  check: |session - bare| %.3g, |double - bare| %.3g, |Fortran - bare| %.3g, "
            "|2 components - bare| %.3g (relative) %s\n",
            session_difference, double_difference, fortran_difference, interleaved_difference,
            correct ? "ok" : "MISMATCH");
        std::printf(
            "{\"bench\":\"insitu\",\"ranks\":%d,\"grid\":\"%s\",\"size\":%ld,\"parameters\":%lld,"
            "\"forward_s\":%.6g,\"bare_s\":%.6g,\"session_s\":%.6g,\"overhead_fraction\":%.4g,"
            "\"input_copied\":%s,\"copy_session_s\":%.6g,\"copy_overhead_fraction\":%.4g,"
            "\"fortran_session_s\":%.6g,\"fortran_overhead_fraction\":%.4g,"
            "\"interleaved_session_s\":%.6g,\"interleaved_overhead_fraction\":%.4g,"
            "\"field_copy_s\":%.6g,\"bare_cpu_s\":%.6g,\"session_cpu_s\":%.6g,"
            "\"overhead_fraction_cpu\":%.4g,\"copy_overhead_fraction_cpu\":%.4g,"
            "\"fortran_overhead_fraction_cpu\":%.4g,\"correct\":%s}\n",
            world_size, grid.decomposition.describe().c_str(), n,
            static_cast<long long>(models::count_parameters(*model)), forward_best, bare_s,
            session_s, overhead, in_place ? "false" : "true", double_s, copy_overhead, fortran_s,
            fortran_overhead, interleaved_s, interleaved_s / bare_s - 1, copy_s, cpu_best[0], cpu_best[1], cpu_overhead, cpu_copy_overhead,
            cpu_fortran_overhead, correct ? "true" : "false");
      }
      MPI_Comm_free(&cart);
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", world_rank, e.what());
      status = 2;
    }
  }
  MPI_Finalize();
  return status;
}
