// bench_attention: ring attention (8 heads x 64 head dim, C = 512, batch 1, float) over a
// 1-D token sequence sharded over all ranks: forward, and forward + backward, against
// OpenBLAS sgemm measured in the same run.
//
//   mpirun -n 1 ./bench_attention --tokens 16384     mpirun -n 2 ./bench_attention --tokens 16384
//   options: --tokens T (global sequence length, 4096) --heads H (8) --head-dim D (64)
//            --causal on|off (off) --iters K (2) --warmup K (1)
//            --tf32 on|off (off; on: float products on TF32 tensor cores where the GPU has
//            them, the check then within 1e-2)
//            --bf16 on|off (off; on: bf16 operands, autocast's numerics, the K/V blocks on
//            the bfloat16 wire; the check then within 6e-2)
//            --budget-mib M (per-rank memory budget for the "fits" estimate, 16384)
//            --check-tokens T (size of the correctness check, 700; 0 skips it)
//
// FLOPs (non-causal; C = H x D, all T x T scores): forward 4 T^2 C (S = Q K^T and O = P V,
// 2 T^2 C each); backward 10 T^2 C (S recomputed, dP = dO V^T, dV = P^T dO, dQ = dS K,
// dK = dS^T Q); forward + backward 14 T^2 C. Causal: the same per visible (query, key) pair,
// T (T + 1) / 2 pairs instead of T^2. The softmax's exponentials and the packing are not
// counted. Time: slowest rank, best of `iters`. GFLOP/s per core = FLOPs / time / ranks (one
// core per rank). CPU time (max over ranks) is printed too: less inflated than wall time
// when other jobs share the cores. Ceiling: KokkosBlas::gemm (OpenBLAS sgemm) of 1024^3 on
// every rank at once; in bf16 where the products run on AMX tiles, the tiles' multiply-add
// peak too (independent full tile products on every rank at once).
// Ring bytes: what each rank hands the transport per step (K/V blocks and the dK/dV
// accumulators, PendingExchange's CommKind::collective count), max over ranks.
// Waiting: the time ranks spend blocked on the ring's transfers (the next K/V block, the
// backward's travelling dK/dV accumulators; PendingExchange::wait counts it as collective
// communication in the comm timers, with the loss's one sum), max over ranks, in the best
// step, and its fraction of that step: what the overlap of transfers under compute leaves.
// Memory: the peak resident set per rank (max over ranks), and that peak less the resident
// set before the inputs were made. Tracked (memory_tracker.hpp): the highest total of live
// Kokkos allocations during a measured step less what was live before the inputs were made
// (so q, k, v, the output and all gradients count), max over ranks and steps; per local
// token = that / (tokens of the largest rank). Unsharded: the same step on one rank alone
// (MPI_COMM_SELF) at min(T, 2048) tokens. Memory is O(local tokens x C) plus a fixed score
// tile, so the largest sequence within `budget` per rank is estimated linearly: ranks x
// budget / (KiB per local token), and budget / (unsharded KiB per token) without sharding.
// Check: afterwards, ring attention on `check-tokens` tokens (2 heads x 16) must match a
// dense double-precision attention of the gathered sequence (output and q/k/v gradients,
// relative error <= 1e-4), else exit 1. Last line: one JSON object.

#include <mpi.h>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/gather_scatter.hpp"
#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/layers.hpp"
#include "shardtensor/layers/ring_attention.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

/// A (batch 1, channels, tokens) sequence over all ranks with random values.
Variable<float> random_tokens(const Communicator& comm, Index tokens, Index channels,
                              std::uint64_t seed, bool requires_grad) {
  const Decomposition d({tokens}, {comm.size()});
  ShardTensor<float> t(d, comm.rank(), 1, channels);
  const auto view = t.view();
  const Index offset = d.offset(comm.rank(), 0), local = d.extent(comm.rank(), 0);
  Kokkos::parallel_for(
      "init", channels * local, KOKKOS_LAMBDA(const Index i) {
        const Index c = i / local, x = i % local;
        view(0, c, x, 0, 0) = float(hashed_uniform(seed, c * tokens + offset + x) - 0.5);
      });
  return Variable<float>::field(t, requires_grad, "tokens");
}

/// Dense attention in double on gathered (1, C, T) arrays: output and q/k/v gradients for
/// the output gradient dout, all (C, T) row-major.
struct Dense {
  std::vector<double> out, dq, dk, dv;
};

template <class V>
Dense dense_attention(const V& q, const V& k, const V& v, const V& dout, int heads, bool causal) {
  const Index C = q.extent(1), T = q.extent(2), D = C / heads;
  const double scale = 1 / std::sqrt(double(D));
  Dense r;
  r.out.assign(C * T, 0);
  r.dq = r.dk = r.dv = r.out;
  std::vector<double> p(T), dp(T);
  for (Index h = 0; h < heads; ++h)
    for (Index i = 0; i < T; ++i) {
      const Index keys = causal ? i + 1 : T;
      double mx = -INFINITY, sum = 0, rowsum = 0;
      for (Index j = 0; j < keys; ++j) {
        double s = 0;
        for (Index d = h * D; d < (h + 1) * D; ++d)
          s += double(q(0, d, i, 0, 0)) * k(0, d, j, 0, 0);
        mx = std::max(mx, p[j] = s * scale);
      }
      for (Index j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (Index j = 0; j < keys; ++j) {
        p[j] /= sum;
        double s = 0;
        for (Index d = h * D; d < (h + 1) * D; ++d) {
          r.out[d * T + i] += p[j] * v(0, d, j, 0, 0);
          s += double(dout(0, d, i, 0, 0)) * v(0, d, j, 0, 0);
        }
        rowsum += p[j] * (dp[j] = s);
      }
      for (Index j = 0; j < keys; ++j) {
        const double ds = p[j] * (dp[j] - rowsum);
        for (Index d = h * D; d < (h + 1) * D; ++d) {
          r.dv[d * T + j] += p[j] * dout(0, d, i, 0, 0);
          r.dq[d * T + i] += scale * ds * k(0, d, j, 0, 0);
          r.dk[d * T + j] += scale * ds * q(0, d, i, 0, 0);
        }
      }
    }
  return r;
}

/// Tracked memory (MiB) of one forward + backward step of ring attention on `comm`: the
/// highest total of live Kokkos allocations less what was live before the inputs were made.
double tracked_step_mib(const Communicator& comm, Index tokens, int heads, Index C, bool causal) {
  const std::uint64_t before = memory_snapshot().total.current;
  const auto q = random_tokens(comm, tokens, C, 1, true);
  const auto k = random_tokens(comm, tokens, C, 2, true);
  const auto v = random_tokens(comm, tokens, C, 3, true);
  reset_memory_peak();
  {
    MemoryCategoryScope graph_memory(MemoryCategory::activations);
    backward(sum(comm, ring_attention(comm, q, k, v, heads, causal)));
  }
  return to_mib(memory_snapshot().total.peak - before);
}

/// Largest relative error (max |a - b| / max |b|) of ring attention's output and q/k/v
/// gradients on `tokens` tokens against dense_attention of the gathered sequence.
double error_against_dense(const Communicator& comm, Index tokens, bool causal, bool tf32,
                           bool bf16) {
  const int heads = 2;
  const Index C = 32;
  const auto q = random_tokens(comm, tokens, C, 11, true);
  const auto k = random_tokens(comm, tokens, C, 12, true);
  const auto v = random_tokens(comm, tokens, C, 13, true);
  const auto weights = random_tokens(comm, tokens, C, 14, false);
  const Variable<float> out = ring_attention(comm, q, k, v, heads, causal, tf32, bf16);
  backward(sum(comm, multiply(out, weights)));
  auto host = [&](const ShardTensor<float>& f) {
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all_gather(comm, f));
  };
  const Dense ref = dense_attention(host(q.value()), host(k.value()), host(v.value()),
                                    host(weights.value()), heads, causal);
  double worst = 0;
  const std::pair<ShardTensor<float>, const std::vector<double>*> pairs[] = {
      {out.value(), &ref.out}, {q.grad(), &ref.dq}, {k.grad(), &ref.dk}, {v.grad(), &ref.dv}};
  for (const auto& [field, expected] : pairs) {
    const auto got = host(field);
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < expected->size(); ++i) {
      diff = std::max(diff, std::abs(double(got.data()[i]) - (*expected)[i]));
      scale = std::max(scale, std::abs((*expected)[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  keep_freed_memory();  // steady-state steps reuse the heap instead of faulting pages in again
  one_blas_thread_per_rank();  // as the CLI does
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm;
    try {
      const Index tokens = std::stol(option(argc, argv, "--tokens", "4096"));
      const int heads = std::stoi(option(argc, argv, "--heads", "8"));
      const Index head_dim = std::stol(option(argc, argv, "--head-dim", "64"));
      const std::string causal_option = option(argc, argv, "--causal", "off");
      const std::string tf32_option = option(argc, argv, "--tf32", "off");
      const std::string bf16_option = option(argc, argv, "--bf16", "off");
      const int iters = std::stoi(option(argc, argv, "--iters", "2"));
      const int warmup = std::stoi(option(argc, argv, "--warmup", "1"));
      const double budget_mib = std::stod(option(argc, argv, "--budget-mib", "16384"));
      const Index check_tokens = std::stol(option(argc, argv, "--check-tokens", "700"));
      const bool causal = causal_option == "on", tf32 = tf32_option == "on",
                 bf16 = bf16_option == "on";
      SHARDTENSOR_REQUIRE(
          tokens >= comm.size() && heads >= 1 && head_dim >= 1 && iters >= 1 && warmup >= 0 &&
              budget_mib > 0 && (causal_option == "on" || causal_option == "off") &&
              (tf32_option == "on" || tf32_option == "off") &&
              (bf16_option == "on" || bf16_option == "off") &&
              (check_tokens == 0 || check_tokens >= comm.size()),
          "bench_attention",
          "bad options: tokens " << tokens << ", heads " << heads << ", head dim " << head_dim
                                 << ", causal " << causal_option << ", tf32 " << tf32_option
                                 << ", bf16 " << bf16_option << ", iters " << iters
                                 << ", check tokens " << check_tokens);
      const Index C = heads * head_dim;
      const double memory_before = max_over_ranks(peak_resident_mib());
      enable_memory_tracking();
      const std::uint64_t tracked_before = memory_snapshot().total.current;
      const auto q = random_tokens(comm, tokens, C, 1, true);
      const auto k = random_tokens(comm, tokens, C, 2, true);
      const auto v = random_tokens(comm, tokens, C, 3, true);
      double forward_best = 1e30, step_best = 1e30, forward_cpu_best = 1e30, step_cpu_best = 1e30;
      double step_wait = 0;  // the best step's time blocked on transfers, max over ranks
      double ring_mib = 0;   // sent per step, max over ranks
      enable_comm_timers();
      std::uint64_t tracked_peak = 0;  // of the measured steps, this rank
      for (int step = 0; step < warmup + iters; ++step) {
        for (const auto* x : {&q, &k, &v}) x->zero_grad();
        MPI_Barrier(MPI_COMM_WORLD);
        reset_memory_peak();
        reset_comm_timers();
        MemoryCategoryScope graph_memory(MemoryCategory::activations);
        const double t0 = MPI_Wtime(), c0 = cpu_seconds();
        const Variable<float> out = ring_attention(comm, q, k, v, heads, causal, tf32, bf16);
        Kokkos::fence();
        const double t1 = MPI_Wtime(), c1 = cpu_seconds();
        backward(sum(comm, out));
        Kokkos::fence();
        const double t2 = MPI_Wtime(), c2 = cpu_seconds();
        const double times[4] = {max_over_ranks(t1 - t0), max_over_ranks(t2 - t0),
                                 max_over_ranks(c1 - c0), max_over_ranks(c2 - c0)};
        const double waited = max_over_ranks(comm_seconds(CommKind::collective));
        ring_mib = max_over_ranks(to_mib(comm_bytes_sent(CommKind::collective)));
        if (step >= warmup) {
          if (times[1] < step_best) step_wait = waited;
          tracked_peak = std::max(tracked_peak, memory_snapshot().total.peak);
          forward_best = std::min(forward_best, times[0]);
          step_best = std::min(step_best, times[1]);
          forward_cpu_best = std::min(forward_cpu_best, times[2]);
          step_cpu_best = std::min(step_cpu_best, times[3]);
        }
      }
      const double peak = max_over_ranks(peak_resident_mib());
      // Memory per token from the tracked step peaks, sharded (this run, the rank with most
      // tokens) and unsharded (the same step on one rank alone, at up to 2048 tokens).
      const double step_mib = max_over_ranks(to_mib(tracked_peak - tracked_before));
      const double kib_per_token =
          step_mib * 1024 / double((tokens + comm.size() - 1) / comm.size());
      const Index calibration_tokens = std::min<Index>(tokens, 2048);
      const double unsharded_kib_per_token =
          max_over_ranks(
              tracked_step_mib(Communicator(MPI_COMM_SELF), calibration_tokens, heads, C, causal)) *
          1024 / double(calibration_tokens);
      const double fit_tokens = std::floor(budget_mib * 1024 / kib_per_token) * comm.size();
      const double fit_unsharded = std::floor(budget_mib * 1024 / unsharded_kib_per_token);

      const double pairs = causal ? 0.5 * double(tokens) * (tokens + 1) : double(tokens) * tokens;
      const double forward_flops = 4 * pairs * C, step_flops = 14 * pairs * C;
      const double forward_gflops = forward_flops / forward_best / 1e9 / cores_of(comm.size());
      const double step_gflops = step_flops / step_best / 1e9 / cores_of(comm.size());
      const double sgemm = sgemm_gflops(1024, 1024, 1024, 5);
      const double tile_peak = bf16 && kernels::bf16_matrix_tiles() ? bf16_tile_peak_gflops() : 0.0;
      const double check_error =
          check_tokens > 0 ? error_against_dense(comm, check_tokens, causal, tf32, bf16) : 0;
      // TF32 rounds the products' inputs to 10 mantissa bits: errors near 1e-3 of the largest.
      // bf16 rounds the operands and the output to 8: the gradients' dP - rowsum(dO O) cancels,
      // so they come within a few 1e-2 (3.6e-2 at 700 tokens on 2 ranks), as with any bf16 O.
      const double check_tolerance = bf16 ? 6e-2 : tf32 ? 1e-2 : 1e-4;
      if (!(check_error <= check_tolerance)) status = 1;
      const char* coretype = openblas_coretype();
      if (comm.rank() == 0) {
        std::printf(
            "bench_attention: ring attention, %ld tokens, %d heads x %ld (C = %ld), batch 1, "
            "%s%s%s, %d rank(s)\n",
            long(tokens), heads, long(head_dim), long(C), bf16 ? "bf16" : "float",
            causal ? ", causal" : "", tf32 ? ", TF32 allowed" : "", comm.size());
        std::printf("  vector path (softmax rows) %s\n", vector_path().c_str());
        std::printf(
            "  forward                    %10.1f ms   %7.1f GFLOP/s per core (%.1f GFLOP)\n",
            forward_best * 1e3, forward_gflops, forward_flops / 1e9);
        std::printf(
            "  forward + backward         %10.1f ms   %7.1f GFLOP/s per core (%.1f GFLOP)\n",
            step_best * 1e3, step_gflops, step_flops / 1e9);
        std::printf(
            "  waiting for transfers      %10.1f ms of the step (%.1f %%, max over ranks)\n",
            step_wait * 1e3, 100 * step_wait / step_best);
        std::printf("  ring transfers sent        %10.2f MiB per step and rank (max)\n", ring_mib);
        std::printf(
            "  CPU time (max over ranks)  %10.1f ms forward, %.1f ms forward + backward "
            "(%.1f GFLOP/s per CPU-second)\n",
            forward_cpu_best * 1e3, step_cpu_best * 1e3,
            step_flops / step_cpu_best / 1e9 / comm.size());
        std::printf(
            "  sgemm 1024^3 per core      %10.1f GFLOP/s  -> ratio %.2f forward, %.2f "
            "forward + backward (OPENBLAS_CORETYPE=%s)\n",
            sgemm, forward_gflops / sgemm, step_gflops / sgemm, coretype);
        if (tile_peak > 0)
          std::printf(
              "  AMX bf16 tile peak per core %9.1f GFLOP/s  -> ratio %.2f forward, %.2f "
              "forward + backward\n",
              tile_peak, forward_gflops / tile_peak, step_gflops / tile_peak);
        std::printf(
            "  peak resident memory/rank  %10.1f MiB (%.1f MiB before the inputs, step %.1f MiB)\n",
            peak, memory_before, peak - memory_before);
        std::printf(
            "  step peak, tracked/rank    %10.1f MiB (%.1f KiB per local token; unsharded %.1f "
            "KiB per token)\n",
            step_mib, kib_per_token, unsharded_kib_per_token);
        std::printf("  fits in %.0f MiB per rank   %10.0f tokens on %d rank(s), %.0f unsharded\n",
                    budget_mib, fit_tokens, comm.size(), fit_unsharded);
        std::printf("  check against dense (%ld tokens) %.2g relative error (%s)\n",
                    long(check_tokens), check_error, status == 0 ? "ok" : "FAILED");
        std::printf(
            "{\"bench\":\"attention\",\"ranks\":%d,\"tokens\":%ld,\"heads\":%d,\"head_dim\":%ld,"
            "\"causal\":%s,\"tf32\":%s,\"bf16\":%s,\"ring_mib\":%.6g,"
            "\"ms_forward\":%.6g,\"ms_forward_backward\":%.6g,"
            "\"ms_wait\":%.6g,\"wait_fraction\":%.4g,"
            "\"cpu_ms_forward\":%.6g,\"cpu_ms_forward_backward\":%.6g,"
            "\"gflops_per_core_forward\":%.4g,\"gflops_per_core\":%.4g,"
            "\"sgemm_gflops_per_core\":%.4g,\"ratio_to_sgemm_forward\":%.4g,"
            "\"ratio_to_sgemm\":%.4g,\"amx_tile_peak_gflops_per_core\":%.4g,"
            "\"peak_mib\":%.1f,\"resident_step_mib\":%.1f,"
            "\"tracked_step_mib\":%.1f,\"kib_per_local_token\":%.4g,"
            "\"unsharded_kib_per_token\":%.4g,\"budget_mib\":%.0f,"
            "\"tokens_fit_in_budget\":%.0f,\"tokens_fit_unsharded\":%.0f,"
            "\"check_error\":%.3g,\"correct\":%s,\"openblas_coretype\":\"%s\","
            "\"vector_isa\":\"%s\",\"vector_lanes\":%d}\n",
            comm.size(), long(tokens), heads, long(head_dim), causal ? "true" : "false",
            tf32 ? "true" : "false", bf16 ? "true" : "false", ring_mib, forward_best * 1e3,
            step_best * 1e3, step_wait * 1e3, step_wait / step_best, forward_cpu_best * 1e3,
            step_cpu_best * 1e3, forward_gflops, step_gflops, sgemm, forward_gflops / sgemm,
            step_gflops / sgemm, tile_peak, peak, peak - memory_before, step_mib, kib_per_token,
            unsharded_kib_per_token, budget_mib, fit_tokens, fit_unsharded, check_error,
            status == 0 ? "true" : "false", coretype, kernels::vector_isa().c_str(),
            kernels::vector_lanes());
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
      status = 2;
    }
  }
  MPI_Finalize();
  return status;
}
