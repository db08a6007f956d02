// bench_memory_ops: the memory-bound layers of a U-Net step on a field split over all ranks,
// forward and backward each, in GB/s against the copy ceiling measured in the same run:
// max pooling, nearest upsampling, GroupNorm, GELU, channel concat and the MSE loss.
//
//   mpirun -n 1 ./bench_memory_ops --size 64     mpirun -n 2 ./bench_memory_ops --size 64
//   options: --size N (N^3 cells, 64; a multiple of 2) --channels C (32) --iters K (5)
//            --warmup K (1)
//
// Bytes: each op's values read and written once (the least any kernel moves): pooling reads
// the field and writes an eighth of it; upsampling the reverse; GroupNorm and GELU read x and
// write y forward, read x and dy and write dx backward; concat copies two fields into one and
// back; the loss reads prediction and target (and writes dx backward). Time: slowest rank,
// best of `iters`. GB/s per rank = bytes per rank / time. Ceiling: Kokkos::deep_copy of 256 MiB
// on one rank (bytes read + written), the same run. Check: every run of an op gives the same
// output bit for bit ("correct" in the JSON; exit 1 otherwise). Last line: one JSON object.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/layers.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

/// A (1, C) field over `d` with random values in every owned cell.
ShardTensor<float> random_field(const Communicator& comm, const Decomposition& d, Index C,
                                std::uint64_t seed) {
  ShardTensor<float> f(d, comm.rank(), 1, C, {}, "bench_memory_ops.field");
  const auto v = f.view();
  Kokkos::parallel_for(
      "bench_memory_ops::random", v.span(),
      KOKKOS_LAMBDA(const std::size_t i) { v.data()[i] = float(hashed_uniform(seed, i)); });
  return f;
}

struct Op {
  std::string name;
  double forward_bytes, backward_bytes;  // per rank
  /// The op on fresh inputs that require gradients: its output (a field or the loss).
  std::function<Variable<float>()> forward;
  double forward_s = 1e30, backward_s = 1e30;
  std::vector<float> first;  // the first run's output, for the determinism check
  bool deterministic = true;
};

/// A field's or scalar's values on the host.
std::vector<float> values_of(const Variable<float>& v) {
  if (!v.is_field()) return {float(v.item())};
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v.value().view());
  return std::vector<float>(h.data(), h.data() + h.span());
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  keep_freed_memory();  // as the CLI does: freed activations stay in the heap
  one_blas_thread_per_rank();  // as the CLI does
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator comm(MPI_COMM_WORLD);
    const Index size = std::atol(option(argc, argv, "--size", "64").c_str());
    const Index C = std::atol(option(argc, argv, "--channels", "32").c_str());
    const int iters = std::atoi(option(argc, argv, "--iters", "5").c_str());
    const int warmup = std::atoi(option(argc, argv, "--warmup", "1").c_str());
    if (size < 2 || size % 2 != 0 || C < 2) {
      if (comm.rank() == 0)
        std::fprintf(stderr,
                     "bench_memory_ops: --size must be an even number >= 2 (got %ld) "
                     "and --channels at least 2 (got %ld)\n",
                     long(size), long(C));
      MPI_Finalize();
      return 2;
    }
    const Decomposition fine = Decomposition::automatic({size, size, size}, comm.size());
    const Decomposition coarse =
        Decomposition::automatic({size / 2, size / 2, size / 2}, comm.size());
    const ShardTensor<float> x = random_field(comm, fine, C, 1),
                             x2 = random_field(comm, fine, C, 2),
                             small = random_field(comm, coarse, C, 3);
    const double field = double(x.global_box().size()) * double(C) * sizeof(float);
    const double eighth = double(small.global_box().size()) * double(C) * sizeof(float);

    PoolOptions pool_options;
    pool_options.window = {2, 2, 2};
    auto pool = std::make_shared<Pool<float>>(comm, pool_options, "pool");
    auto upsample = std::make_shared<Upsample<float>>(comm, std::vector<int>{2, 2, 2},
                                                      UpsampleMode::nearest, "upsample");
    auto norm = std::make_shared<GroupNorm<float>>(comm, 4, int(C), 1e-5, true, "norm");
    auto gelu = std::make_shared<ActivationLayer<float>>(Activation::gelu);
    const auto input = [](const ShardTensor<float>& f) {
      return Variable<float>::field(f, true, "input");
    };
    std::vector<Op> ops{
        {"maxpool 2", field + eighth, eighth + field, [&] { return pool->forward(input(x)); }},
        {"upsample nearest 2", eighth + field, field + eighth,
         [&] { return upsample->forward(input(small)); }},
        {"group norm", 2 * field, 3 * field, [&] { return norm->forward(input(x)); }},
        {"gelu", 2 * field, 3 * field, [&] { return gelu->forward(input(x)); }},
        {"concat 2", 4 * field, 4 * field,
         [&] {
           return concat_channels<float>({input(x), input(x2)});
         }},
        {"mse loss", 2 * field, 3 * field,
         [&] { return mse_loss(comm, input(x), Variable<float>::field(x2, false, "target")); }},
    };
    for (Op& op : ops) {
      for (int it = 0; it < warmup + iters; ++it) {
        comm.barrier();
        const double t0 = MPI_Wtime();
        const Variable<float> out = op.forward();
        Kokkos::fence();
        const double t1 = MPI_Wtime();
        const ShardTensor<float> gradient =
            out.is_field()
                ? random_field(comm, out.value().decomposition(), out.value().channels(), 4)
                : ShardTensor<float>();
        Kokkos::fence();
        comm.barrier();
        const double t1b = MPI_Wtime();
        if (out.is_field())
          backward(out, gradient);
        else
          backward(out);
        Kokkos::fence();
        const double t2 = MPI_Wtime();
        const std::vector<float> values = values_of(out);
        if (op.first.empty())
          op.first = values;
        else
          op.deterministic = op.deterministic && values == op.first;
        if (it < warmup) continue;
        op.forward_s = std::min(op.forward_s, max_over_ranks(t1 - t0));
        op.backward_s = std::min(op.backward_s, max_over_ranks(t2 - t1b));
      }
    }
    int deterministic = 1;
    for (const Op& op : ops) deterministic = deterministic && op.deterministic;
    MPI_Allreduce(MPI_IN_PLACE, &deterministic, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!deterministic) status = 1;
    const double ceiling = copy_gbytes_per_s(std::size_t(256) << 20, comm.rank());
    if (comm.rank() == 0) {
      std::printf("bench_memory_ops: %ld^3 cells, C = %ld, batch 1, float, %d rank(s), %s\n",
                  long(size), long(C), comm.size(), Kokkos::DefaultExecutionSpace::name());
      std::printf("  copy ceiling (deep_copy of 256 MiB on one rank, read + write): %.2f GB/s\n",
                  ceiling);
      std::printf("  %-20s %10s %9s %6s %10s %9s %6s\n", "op", "fwd ms", "GB/s", "ratio", "bwd ms",
                  "GB/s", "ratio");
      std::ostringstream json;
      json << "{\"bench\":\"memory_ops\",\"ranks\":" << comm.size() << ",\"size\":" << size
           << ",\"channels\":" << C << ",\"copy_gbytes_per_s\":" << ceiling
           << ",\"correct\":" << (deterministic ? "true" : "false") << ",\"ops\":[";
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const double fwd = op.forward_bytes / op.forward_s / 1e9;
        const double bwd = op.backward_bytes / op.backward_s / 1e9;
        std::printf("  %-20s %10.3f %9.2f %6.2f %10.3f %9.2f %6.2f\n", op.name.c_str(),
                    op.forward_s * 1e3, fwd, fwd / ceiling, op.backward_s * 1e3, bwd,
                    bwd / ceiling);
        json << (i ? "," : "") << "{\"op\":\"" << op.name << "\",\"forward_s\":" << op.forward_s
             << ",\"forward_gbytes_per_s\":" << fwd << ",\"backward_s\":" << op.backward_s
             << ",\"backward_gbytes_per_s\":" << bwd << "}";
      }
      json << "]}";
      std::printf("%s\n", json.str().c_str());
    }
  }
  MPI_Finalize();
  return status;
}
