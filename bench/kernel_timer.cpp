// A Kokkos Tools library: wall seconds and calls per kernel name (parallel_for, _reduce and
// _scan, View initialisations and deep copies included), printed to stderr by rank 0 when Kokkos
// finalizes, largest first. What it does not see: work outside Kokkos kernels (the conv
// layers' AVX-512 kernels, BLAS, MPI). Load it into any ShardTensor program:
//
//   KOKKOS_PROFILE_LIBRARY=build/bench/libshardtensor_kernel_timer.so \
//       build/bench/bench_scaling --config bench/scaling_unet3d.yaml --size 64
//
// SHARDTENSOR_KERNEL_TIMER_ROWS sets how many rows are printed (30).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Total {
  double seconds = 0;
  long calls = 0;
};

std::map<std::string, Total> totals;
std::map<std::uint64_t, std::pair<std::string, Clock::time_point>> running;
std::uint64_t next_id = 1;

void begin(const char* name, std::uint64_t* id) {
  *id = next_id++;
  running[*id] = {name, Clock::now()};
}

void end(std::uint64_t id) {
  const auto it = running.find(id);
  if (it == running.end()) return;
  Total& total = totals[it->second.first];
  total.seconds += std::chrono::duration<double>(Clock::now() - it->second.second).count();
  ++total.calls;
  running.erase(it);
}

/// This process's MPI rank from the launcher's environment (the library does not link MPI).
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return 0;
}

}  // namespace

extern "C" {

void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}

void kokkosp_finalize_library() {
  if (launcher_rank() != 0) return;
  std::vector<std::pair<std::string, Total>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double all = 0;
  for (const auto& row : rows) all += row.second.seconds;
  const char* limit = std::getenv("SHARDTENSOR_KERNEL_TIMER_ROWS");
  const std::size_t shown = std::min(rows.size(), std::size_t(limit ? std::atoi(limit) : 30));
  std::fprintf(stderr, "kernel_timer: %.3f s in %zu kernel names (rank 0)\n", all, rows.size());
  std::fprintf(stderr, "%10s %8s  %s\n", "seconds", "calls", "kernel");
  for (std::size_t i = 0; i < shown; ++i)
    std::fprintf(stderr, "%10.4f %8ld  %s\n", rows[i].second.seconds, rows[i].second.calls,
                 rows[i].first.c_str());
}

void kokkosp_begin_parallel_for(const char* name, std::uint32_t, std::uint64_t* id) {
  begin(name, id);
}
void kokkosp_end_parallel_for(std::uint64_t id) {
  end(id);
}
void kokkosp_begin_parallel_reduce(const char* name, std::uint32_t, std::uint64_t* id) {
  begin(name, id);
}
void kokkosp_end_parallel_reduce(std::uint64_t id) {
  end(id);
}
void kokkosp_begin_parallel_scan(const char* name, std::uint32_t, std::uint64_t* id) {
  begin(name, id);
}
void kokkosp_end_parallel_scan(std::uint64_t id) {
  end(id);
}

}  // extern "C"
