// bench_fft: forward (r2c) + inverse (c2r) distributed FFT of a sharded 3-D float field
// (default 64^3 cells, 4 channels, batch 1), against single-rank FFTW of the same field
// measured in the same run.
//
//   mpirun -n 1 ./bench_fft        mpirun -n 2 ./bench_fft        (same global field)
//   options: --size N (global cube edge, 64) --channels C (4) --iters K (5) --warmup K (1)
//            --planning estimate|measure (FFTW planner, measure)
//
// FLOPs: the usual FFT convention (FFTW's benchFFT), 5 M log2 M per complex transform of M
// points and half that, 2.5 M log2 M, per real (r2c or c2r) transform; here M = N^3, one r2c
// and one c2r per channel: 5 M log2 M x channels per step. Time: slowest rank, best of `iters`
// steps (forward + inverse); CPU time likewise (max over ranks). GFLOP/s per core = FLOPs / time /
// ranks. Reference: FFTW's 3-D r2c + c2r (fftwf_plan_many_dft_r2c / c2r, the same planner flag) of
// the whole field on rank 0 alone, best of `iters`; ratio = reference time / distributed time (the
// speedup; 1 on one rank means no overhead). Check: the inverse of the forward gives the field back
// (relative error <= 1e-5), else exit 1. Last line: one JSON object.

#include <fftw3.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/comm.hpp"
#include "shardtensor/core.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/spectral.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

/// Best time of FFTW's own 3-D r2c + c2r of `channels` fields of size^3 on this rank alone.
double single_rank_fftw_seconds(int size, int channels, unsigned flags, int warmup, int iters) {
  const int n[3] = {size, size, size};
  const std::size_t cells = std::size_t(size) * size * size;
  const std::size_t modes = std::size_t(size) * size * (size / 2 + 1);
  float* real = fftwf_alloc_real(cells * channels);
  fftwf_complex* spectrum = fftwf_alloc_complex(modes * channels);
  fftwf_plan forward = fftwf_plan_many_dft_r2c(3, n, channels, real, nullptr, 1, int(cells),
                                               spectrum, nullptr, 1, int(modes), flags);
  fftwf_plan inverse = fftwf_plan_many_dft_c2r(3, n, channels, spectrum, nullptr, 1, int(modes),
                                               real, nullptr, 1, int(cells), flags);
  for (std::size_t i = 0; i < cells * channels; ++i) real[i] = float(hashed_uniform(1, i));
  double best = 1e30;
  for (int step = 0; step < warmup + iters; ++step) {
    const double t0 = MPI_Wtime();
    fftwf_execute(forward);
    fftwf_execute(inverse);
    if (step >= warmup) best = std::min(best, MPI_Wtime() - t0);
  }
  fftwf_destroy_plan(forward);
  fftwf_destroy_plan(inverse);
  fftwf_free(real);
  fftwf_free(spectrum);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm;
    try {
      const int size = std::stoi(option(argc, argv, "--size", "64"));
      const int channels = std::stoi(option(argc, argv, "--channels", "4"));
      const int iters = std::stoi(option(argc, argv, "--iters", "5"));
      const int warmup = std::stoi(option(argc, argv, "--warmup", "1"));
      const std::string planning = option(argc, argv, "--planning", "measure");
      const Decomposition d = Decomposition::automatic({size, size, size}, comm.size());
      DistributedFFT<float> fft(
          comm, d, 1, channels,
          planning == "measure" ? FftPlanning::measure : FftPlanning::estimate);
      ShardTensor<float> x(d, comm.rank(), 1, channels);
      const auto xv = x.view();
      Kokkos::parallel_for(
          "init", xv.span(),
          KOKKOS_LAMBDA(const std::size_t i) { xv.data()[i] = float(hashed_uniform(1, i)); });
      double best = 1e30, forward_best = 1e30, cpu_best = 1e30, error = 0;
      for (int step = 0; step < warmup + iters; ++step) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime(), c0 = cpu_seconds();
        const SpectralView<float> spectrum = fft.forward(x);
        Kokkos::fence();
        const double t1 = MPI_Wtime();
        const ShardTensor<float> back = fft.inverse(spectrum);
        Kokkos::fence();
        const double t2 = MPI_Wtime(), c2 = cpu_seconds();
        if (step >= warmup) {
          cpu_best = std::min(cpu_best, max_over_ranks(c2 - c0));
          best = std::min(best, max_over_ranks(t2 - t0));
          forward_best = std::min(forward_best, max_over_ranks(t1 - t0));
        }
        if (step == 0) {  // round trip check
          double diff = 0, scale = 0;
          const auto bv = back.view();
          Kokkos::parallel_reduce(
              "check", xv.span(),
              KOKKOS_LAMBDA(const std::size_t i, double& m) {
                const double e = shardtensor::math::fabs(double(bv.data()[i] - xv.data()[i]));
                if (e > m) m = e;
              },
              Kokkos::Max<double>(diff));
          Kokkos::parallel_reduce(
              "scale", xv.span(),
              KOKKOS_LAMBDA(const std::size_t i, double& m) {
                const double e = shardtensor::math::fabs(double(xv.data()[i]));
                if (e > m) m = e;
              },
              Kokkos::Max<double>(scale));
          error = max_over_ranks(diff) / max_over_ranks(scale);
        }
      }
      if (!(error <= 1e-5)) status = 1;
      MPI_Barrier(MPI_COMM_WORLD);
      double reference = 0;
      if (comm.rank() == 0)
        reference = single_rank_fftw_seconds(
            size, channels, planning == "measure" ? FFTW_MEASURE : FFTW_ESTIMATE, warmup, iters);
      MPI_Barrier(MPI_COMM_WORLD);
      const double m = double(size) * size * size;
      const double flops = 5.0 * m * std::log2(m) * channels;  // r2c + c2r per channel
      const double gflops_per_core = flops / best / 1e9 / comm.size();
      const double reference_gflops = flops / reference / 1e9;
      const double sent_mib = max_over_ranks(double(fft.scalars_sent_per_transform())) *
                              sizeof(float) / (1024.0 * 1024.0);
      if (comm.rank() == 0) {
        std::printf(
            "bench_fft: r2c + c2r of %dx%dx%d cells (%s), %d channel(s), float, "
            "FFTW planning %s, %d rank(s)\n",
            size, size, size, d.describe().c_str(), channels, planning.c_str(), comm.size());
        std::printf("  forward + inverse            %10.3f ms   (forward %.3f ms)\n", best * 1e3,
                    forward_best * 1e3);
        std::printf("  CPU time per step (max rank) %10.3f ms\n", cpu_best * 1e3);
        std::printf(
            "  throughput per core          %10.2f GFLOP/s (5 M log2 M x %d = %.3f GFLOP)\n",
            gflops_per_core, channels, flops / 1e9);
        std::printf("  single-rank FFTW             %10.3f ms   %.2f GFLOP/s -> ratio %.3f\n",
                    reference * 1e3, reference_gflops, reference / best);
        std::printf("  sent per transform per rank  %10.2f MiB (largest rank; x2 per step)\n",
                    sent_mib);
        std::printf("  round trip check             %10.2g relative error (%s)\n", error,
                    status == 0 ? "ok" : "FAILED");
        std::printf(
            "{\"bench\":\"fft\",\"ranks\":%d,\"grid\":\"%s\",\"size\":%d,\"channels\":%d,"
            "\"planning\":\"%s\",\"step_s\":%.6g,\"step_cpu_s\":%.6g,\"forward_s\":%.6g,\"gflops_"
            "per_core\":%.4g,"
            "\"fftw_single_rank_s\":%.6g,\"fftw_single_rank_gflops\":%.4g,"
            "\"ratio_to_single_rank_fftw\":%.4g,\"sent_mib_per_transform\":%.4g,"
            "\"check_error\":%.3g,\"correct\":%s}\n",
            comm.size(), d.describe().c_str(), size, channels, planning.c_str(), best, cpu_best,
            forward_best, gflops_per_core, reference, reference_gflops, reference / best, sent_mib,
            error, status == 0 ? "true" : "false");
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
      status = 2;
    }
  }
  MPI_Finalize();
  return status;
}
