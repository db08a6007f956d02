// bench_conv: forward + backward of a sharded Conv3d (default 32 -> 32 channels, kernel 3,
// 64^3 cells, batch 1, float) or Conv2d (--dims 2, e.g. --size 512: 512^2 cells), against
// OpenBLAS sgemm measured in the same run.
//
//   mpirun -n 1 ./bench_conv        mpirun -n 2 ./bench_conv      (same global field)
//   options: --dims 2|3 (3) --size N (global edge, 64) --channels C (32) --batch B (1)
//            --iters K (3) --warmup K (1)
//            --algorithm gemm|direct --workspace-mib M (GEMM scratch bound, 16)
//            --vector-kernels on|off (the host vector kernels where a path is on, on; off:
//            always im2col + KokkosBlas::gemm); SHARDTENSOR_SIMD=avx2|avx512|neon|off picks
//            their instruction set (default: the best this CPU runs; printed as "vector path")
//            --winograd on|off (float 3x3 forward and input gradient on Winograd's tiles where
//            the vector kernels run, F(2x4, 3x3) from 64 columns on, and the weight gradient
//            (F(2x2, 3x3)) where it gains: at least 16 channels and 2048 tiles times x taps; on;
//            the passes that ran on them printed after the algorithm, "winograd" and
//            "winograd_gradient" in the JSON)
//            --library on|off (cuDNN in a CUDA build, on; off: the portable kernels)
//            --tf32 on|off (float convolutions through cuDNN may use TF32 tensor cores, off)
//            --memory-tracking on|off (the tracker's step peak, on)
//            --precision float|bf16 (bf16: the layer computes in bf16, Module::compute_in_bf16:
//            operands rounded, products summed in float; float)
//            --no-allocation-cache (last argument: let glibc unmap freed buffers)
//
// FLOPs: 2 * Cin * Cout * k^dims * output cells per pass, three passes (forward, input
// gradient, weight gradient): the direct algorithm's, also for Winograd's tiles (an effective
// rate, which can pass the multiply-add peak). Time: slowest rank, best (and median) of `iters`
// steps. Per-core GFLOP/s = FLOPs / time / ranks (one core per rank). The ceiling: KokkosBlas::gemm
// on a conv-shaped product (Cout x Cin*k^3 times Cin*k^3 x 4096) on every rank at once, and on the
// host the multiply-add peak (independent multiply-add chains on the vector path) and, for
// float on the vector path, its correlation tile on cached data (the layer's own kernel with
// nothing else in the way), each the best of two timings after every timed step, or every
// iters / 5th (so in the same minutes as the steps). Peak memory: the process's maximum
// resident set (getrusage), per rank, max over ranks; the step's share is that peak less the
// resident set before the input and layer were created. Step peak: the memory tracker's
// (memory_tracker.hpp) highest total of live Kokkos allocations during a measured forward +
// backward step (peak reset before it), input, parameters, workspace and halo buffers
// included, per rank, max over ranks and steps; split by category.
// OPENBLAS_CORETYPE (e.g. SkylakeX for AVX-512 kernels) is printed: it changes sgemm ~2x.
// Check: afterwards, on a 20^3 field (rows of 16 + 4 cells; 2-D: 36^2) with the same channels, the
// output and both gradients must match the direct loops (relative error <= 1e-5; 5e-3 with TF32;
// in bf16 against the direct loops in bf16, 1e-2: the sums' order moves outputs by a bf16 step),
// else exit 1. In bf16, where bf16 convolutions run on AMX tiles, the tiles' multiply-add
// ceiling is measured too (full tile products on every rank at once).
// Last line: one JSON object.

#include <mpi.h>
#include <sys/resource.h>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/layers.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

/// Largest relative error (2-norm over all ranks) of the output, input gradient and weight
/// gradient of Conv with `options` (in bf16 if `bf16`) against the direct loops, on a size^dims
/// field.
double error_against_direct(const Communicator& comm, const ConvOptions& options, Index size,
                            bool bf16) {
  ConvOptions direct = options;
  direct.algorithm = ConvAlgorithm::direct;
  const Decomposition d =
      Decomposition::automatic(std::vector<Index>(options.kernel.size(), size), comm.size());
  ShardTensor<float> x(d, comm.rank(), 1, options.in_channels),
      target(d, comm.rank(), 1, options.out_channels);
  const auto xv = x.view(), targetv = target.view();
  Kokkos::parallel_for(
      "check_init", xv.span(),
      KOKKOS_LAMBDA(const std::size_t i) { xv.data()[i] = float(hashed_uniform(2, i)); });
  Kokkos::parallel_for(  // a non-uniform output gradient
      "check_target", targetv.span(),
      KOKKOS_LAMBDA(const std::size_t i) { targetv.data()[i] = float(hashed_uniform(3, i)); });
  struct Result {
    ShardTensor<float> y, dx;
    ReplicatedView<float> dw;
  };
  const auto run = [&](const ConvOptions& o) {
    Conv<float> conv(comm, o, "check");
    conv.compute_in_bf16(bf16);
    const auto input = Variable<float>::field(x, true, "x");
    const Variable<float> y = conv.forward(input);
    backward(mse_loss(comm, y, Variable<float>::field(target, false, "target")));
    return Result{y.value(), input.grad(), conv.weight().data_grad()};
  };
  const Result fast = run(options), reference = run(direct);
  // Compared on the host (the Views may live on a GPU).
  const auto error = [&](const auto& a_view, const auto& b_view, bool local) {
    const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a_view);
    const auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b_view);
    double sums[2] = {0, 0};
    for (std::size_t i = 0; i < a.span(); ++i) {
      const double d = double(a.data()[i]) - b.data()[i];
      sums[0] += d * d;
      sums[1] += double(b.data()[i]) * b.data()[i];
    }
    if (local) MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return std::sqrt(sums[0] / sums[1]);
  };
  return std::max({error(fast.y.view(), reference.y.view(), true),
                   error(fast.dx.view(), reference.dx.view(), true),
                   error(fast.dw, reference.dw, false)});
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool cache = std::string(argc > 1 ? argv[argc - 1] : "") != "--no-allocation-cache";
  if (cache) keep_freed_memory();
  one_blas_thread_per_rank();  // as the CLI does
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm;
    try {
      const int dims = std::stoi(option(argc, argv, "--dims", "3"));
      const Index size = std::stol(option(argc, argv, "--size", "64"));
      const int channels = std::stoi(option(argc, argv, "--channels", "32"));
      const int batch = std::stoi(option(argc, argv, "--batch", "1"));
      const int iters = std::stoi(option(argc, argv, "--iters", "3"));
      const int warmup = std::stoi(option(argc, argv, "--warmup", "1"));
      const std::string algorithm = option(argc, argv, "--algorithm", "gemm");
      const double workspace_mib = std::stod(option(argc, argv, "--workspace-mib", "16"));
      const std::string vector_kernels = option(argc, argv, "--vector-kernels", "on");
      const std::string winograd = option(argc, argv, "--winograd", "on");
      const std::string memory_tracking = option(argc, argv, "--memory-tracking", "on");
      const std::string library = option(argc, argv, "--library", "on");
      const std::string tf32 = option(argc, argv, "--tf32", "off");
      const std::string precision = option(argc, argv, "--precision", "float");
      SHARDTENSOR_REQUIRE(
          (dims == 2 || dims == 3) && batch >= 1 && size >= 4 && channels >= 1 && iters >= 1 &&
              warmup >= 0 && (algorithm == "gemm" || algorithm == "direct") &&
              (vector_kernels == "on" || vector_kernels == "off") &&
              (winograd == "on" || winograd == "off") &&
              (memory_tracking == "on" || memory_tracking == "off") &&
              (library == "on" || library == "off") && (tf32 == "on" || tf32 == "off") &&
              (precision == "float" || precision == "bf16"),
          "bench_conv",
          "bad options: dims " << dims << ", batch " << batch << ", size " << size << ", channels "
                               << channels << ", iters " << iters << ", algorithm " << algorithm
                               << ", vector kernels " << vector_kernels << ", winograd " << winograd
                               << ", memory tracking " << memory_tracking << ", library " << library
                               << ", tf32 " << tf32 << ", precision " << precision);
      const double memory_before = max_over_ranks(peak_resident_mib());
      if (memory_tracking == "on") enable_memory_tracking();
      const Decomposition d = Decomposition::automatic(std::vector<Index>(dims, size), comm.size());
      ConvOptions o;
      o.in_channels = o.out_channels = channels;
      o.kernel = std::vector<int>(dims, 3);
      o.padding = std::vector<int>(dims, 1);
      o.algorithm = algorithm == "gemm" ? ConvAlgorithm::gemm : ConvAlgorithm::direct;
      o.workspace_bytes = static_cast<std::size_t>(workspace_mib * 1024 * 1024);
      o.vector_kernels = vector_kernels == "on";
      o.winograd = winograd == "on";
      o.library_kernels = library == "on";
      o.tf32 = tf32 == "on";
      Conv<float> conv(comm, o, "bench");
      const bool bf16 = precision == "bf16";
      conv.compute_in_bf16(bf16);
      ShardTensor<float> x(d, comm.rank(), batch, channels);
      const auto xv = x.view();
      Kokkos::parallel_for(
          "init", xv.span(),
          KOKKOS_LAMBDA(const std::size_t i) { xv.data()[i] = float(hashed_uniform(1, i)); });
      const int taps = dims == 3 ? 27 : 9;
      double best = 1e30, forward_best = 1e30, cpu_best = 1e30;
      double sgemm = 0.0, peak_flops = 0.0;  // the ceilings, measured between the steps
      // The float tiles' own ceiling where they run the layer (not bf16's pair or AMX tiles).
      const bool float_tiles =
          !bf16 && kernels::vector_kernels_on() && vector_kernels == "on" && algorithm == "gemm";
      double tile_flops = 0.0;
      std::vector<double> step_times;
      MemorySnapshot step_memory;  // peaks of the measured steps (this rank)
      for (int step = 0; step < warmup + iters; ++step) {
        conv.zero_grad();
        const auto input = Variable<float>::field(x, true, "x");
        MPI_Barrier(MPI_COMM_WORLD);
        reset_memory_peak();
        MemoryCategoryScope graph_memory(MemoryCategory::activations);
        const double t0 = MPI_Wtime(), c0 = cpu_seconds();
        const Variable<float> y = conv.forward(input);
        Kokkos::fence();
        const double t1 = MPI_Wtime();
        backward(sum(comm, y));
        Kokkos::fence();
        const double t2 = MPI_Wtime(), c2 = cpu_seconds();
        if (step >= warmup) {
          const MemorySnapshot m = memory_snapshot();
          step_memory.total.peak = std::max(step_memory.total.peak, m.total.peak);
          for (int c = 0; c < memory_category_count; ++c)
            step_memory.categories[c].peak =
                std::max(step_memory.categories[c].peak, m.categories[c].peak);
          cpu_best = std::min(cpu_best, max_over_ranks(c2 - c0));
          step_times.push_back(max_over_ranks(t2 - t0));
          best = std::min(best, step_times.back());
          forward_best = std::min(forward_best, max_over_ranks(t1 - t0));
          // The ceilings between the steps (after every step, or after every iters / 5th of
          // many short ones), so that the steps and their ceilings sample the same minutes of a
          // machine whose speed drifts (a shared VM's moved by a third within minutes): their
          // ratios compare like with like. Outside the step's memory peak.
          if ((step - warmup) % std::max(1, iters / 5) == 0) {
            sgemm = std::max(sgemm, sgemm_gflops(channels, channels * taps, 4096, 2));
            peak_flops = std::max(peak_flops, multiply_add_peak_gflops(2));  // 0 on a GPU
            if (float_tiles) tile_flops = std::max(tile_flops, correlate_tile_peak_gflops(2));
          }
        }
      }
      const double peak = max_over_ranks(peak_resident_mib());
      const auto step_peak_mib = [&](const MemoryUsage& usage) {
        return max_over_ranks(to_mib(usage.peak));
      };
      const double step_peak = step_peak_mib(step_memory.total);
      const double step_activations = step_peak_mib(step_memory[MemoryCategory::activations]);
      const double step_workspaces = step_peak_mib(step_memory[MemoryCategory::workspaces]);
      const double step_comm_buffers = step_peak_mib(step_memory[MemoryCategory::comm_buffers]);
      const double step_inputs = step_peak_mib(step_memory[MemoryCategory::other]);
      const double cells = batch * std::pow(double(size), dims);
      const double flops_per_pass = 2.0 * channels * channels * taps * cells;
      const double gflops_per_core = 3 * flops_per_pass / best / 1e9 / cores_of(comm.size());
      const double gflops_per_cpu_s = 3 * flops_per_pass / cpu_best / 1e9 / comm.size();
      const double tile_peak = bf16 && kernels::bf16_matrix_tiles() ? bf16_tile_peak_gflops() : 0.0;
      const double check_error =  // rows of 16 + 4 cells (3-D), 32 + 4 (2-D)
          error_against_direct(comm, o, dims == 3 ? 20 : 36, bf16);
      if (!(check_error <= (bf16 ? 1e-2 : tf32 == "on" ? 5e-3 : 1e-5))) status = 1;
      std::sort(step_times.begin(), step_times.end());
      const double median = step_times[step_times.size() / 2];
      const char* coretype = openblas_coretype();
      // The kernels the layer chose (rank 0's; every rank's field has the same shape here).
      const ConvKernelPaths& paths = conv.last_paths();
      const char* winograd_note = !paths.winograd ? ""
                                  : paths.winograd_gradient
                                      ? " (Winograd's tiles, all passes)"
                                      : " (Winograd's tiles, but the weight gradient)";
      if (comm.rank() == 0) {
        std::printf("bench_conv: Conv%dd %d->%d, kernel 3, %s, batch %d, %s, %s%s, %d rank(s)\n",
                    dims, channels, channels, d.describe().c_str(), batch, precision.c_str(),
                    algorithm.c_str(), winograd_note, comm.size());
        std::printf("  vector path                 %s\n", vector_path().c_str());
        std::printf("  forward + backward step     %10.2f ms   (median %.2f ms, forward %.2f ms)\n",
                    best * 1e3, median * 1e3, forward_best * 1e3);
        std::printf("  per CPU-second (step %.2f ms CPU) %6.1f GFLOP/s\n", cpu_best * 1e3,
                    gflops_per_cpu_s);
        std::printf("  throughput per core         %10.1f GFLOP/s (3 passes x %.2f GFLOP)\n",
                    gflops_per_core, flops_per_pass / 1e9);
        std::printf(
            "  sgemm %dx%dx4096 per core  %10.1f GFLOP/s  -> ratio %.2f (OPENBLAS_CORETYPE=%s)\n",
            channels, channels * taps, sgemm, gflops_per_core / sgemm, coretype);
        if (peak_flops > 0)
          std::printf("  multiply-add peak per core %10.1f GFLOP/s  -> ratio %.2f (%s path)\n",
                      peak_flops, gflops_per_core / peak_flops,
                      kernels::vector_kernels_on() ? "this" : "the best");
        if (tile_flops > 0)
          std::printf("  correlate tile, cached data %7.1f GFLOP/s  -> ratio %.2f (its ceiling)\n",
                      tile_flops, gflops_per_core / tile_flops);
        if (tile_peak > 0)
          std::printf("  AMX bf16 tile peak per core %9.1f GFLOP/s  -> ratio %.2f\n", tile_peak,
                      gflops_per_core / tile_peak);
        std::printf(
            "  peak resident memory/rank   %10.1f MiB (%.1f MiB before the layer, step %.1f)\n",
            peak, memory_before, peak - memory_before);
        if (memory_tracking == "on")
          std::printf(
              "  step peak, tracked/rank     %10.1f MiB (activations %.1f, workspaces %.1f, comm "
              "buffers %.1f, input and other %.1f)\n",
              step_peak, step_activations, step_workspaces, step_comm_buffers, step_inputs);
        std::printf("  check against direct loops  %10.2g relative error (%s)\n", check_error,
                    status == 0 ? "ok" : "FAILED");
        for (const std::string& line : kernels::conv_library_report())
          std::printf("  library: %s\n", line.c_str());
        std::printf(
            "{\"bench\":\"conv%dd\",\"ranks\":%d,\"grid\":\"%s\",\"size\":%ld,\"batch\":%d,"
            "\"channels\":%d,"
            "\"algorithm\":\"%s\","
            "\"step_s\":%.6g,\"step_median_s\":%.6g,\"forward_s\":%.6g,\"gflops_per_core\":%.4g,"
            "\"step_cpu_s\":%.6g,"
            "\"gflops_per_cpu_s\":%.4g,\"sgemm_gflops_per_core\":"
            "%.4g,"
            "\"ratio_to_sgemm\":%.4g,\"multiply_add_peak_gflops_per_core\":%.4g,"
            "\"ratio_to_multiply_add_peak\":%.4g,\"correlate_tile_gflops_per_core\":%.4g,"
            "\"ratio_to_correlate_tile\":%.4g,"
            "\"peak_mib_per_rank\":%.1f,\"step_mib_per_rank\":%.1f,"
            "\"step_peak_mib\":%.2f,\"step_activations_peak_mib\":%.2f,"
            "\"step_workspaces_peak_mib\":%.2f,\"step_comm_buffers_peak_mib\":%.2f,"
            "\"memory_tracking\":\"%s\","
            "\"workspace_mib\":%.4g,\"vector_kernels\":\"%s\",\"winograd\":%s,"
            "\"winograd_gradient\":%s,"
            "\"library\":\"%s\","
            "\"tf32\":\"%s\",\"precision\":\"%s\",\"amx_tile_peak_gflops_per_core\":%.4g,"
            "\"check_error\":%.3g,"
            "\"openblas_coretype\":\"%s\",\"vector_isa\":\"%s\",\"vector_lanes\":%d}\n",
            dims, comm.size(), d.describe().c_str(), long(size), batch, channels, algorithm.c_str(),
            best, median, forward_best, gflops_per_core, cpu_best, gflops_per_cpu_s, sgemm,
            gflops_per_core / sgemm, peak_flops,
            peak_flops > 0 ? gflops_per_core / peak_flops : 0.0, tile_flops,
            tile_flops > 0 ? gflops_per_core / tile_flops : 0.0, peak, peak - memory_before,
            step_peak, step_activations, step_workspaces, step_comm_buffers,
            memory_tracking.c_str(), workspace_mib, vector_kernels.c_str(),
            paths.winograd ? "true" : "false", paths.winograd_gradient ? "true" : "false",
            library.c_str(), tf32.c_str(), precision.c_str(), tile_peak, check_error, coretype,
            kernels::vector_isa().c_str(), kernels::vector_lanes());
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
      status = 2;
    }
  }
  MPI_Finalize();
  return status;
}
