#include <Kokkos_Core.hpp>
#include <algorithm>

#include "host/host_threads.hpp"
#include "host/vector_kernels.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/kernels/gelu.hpp"

namespace shardtensor::kernels {

namespace {

/// Runs work(first, last) on contiguous shares of [0, n), one per host thread, each share a
/// whole number of 16-value blocks but the last (elementwise: any split gives the same bits).
template <class Work>
void split_over_host_threads(std::size_t n, const Work& work) {
  const Index blocks = Index(n + 15) / 16;
  const int threads = blocks < 2 * host::host_threads() ? 1 : host::host_threads();
  host::split_over_threads(threads, blocks, [&](int, Index first, Index last) {
    work(std::min(n, std::size_t(first) * 16), std::min(n, std::size_t(last) * 16));
  });
}

bool vector_kernels_run_here() {
  return kernels_run_on_host && vector_kernels_on();
}

}  // namespace

bool gelu_kernel(const float* x, float* y, std::size_t n) {
  if (!vector_kernels_run_here()) return false;
  split_over_host_threads(n, [&](std::size_t first, std::size_t last) {
    host::gelu_rows(x + first, y + first, last - first);
  });
  return true;
}

bool gelu_backward_kernel(const float* x, const float* gy, float* gx, std::size_t n) {
  if (!vector_kernels_run_here()) return false;
  split_over_host_threads(n, [&](std::size_t first, std::size_t last) {
    host::gelu_backward_rows(x + first, gy + first, gx + first, last - first);
  });
  return true;
}

}  // namespace shardtensor::kernels
