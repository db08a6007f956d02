#pragma once
// Work split over the host backend's threads (OpenMP; one thread on Serial) in a fixed way:
// the same items go to the same thread on every run, so what a thread sums adds up in the
// same order every time. Used where one work item is a whole host loop (a band of conv
// rows, an attention slice with its GEMMs) rather than one cell of a Kokkos kernel.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/execution.hpp"

namespace shardtensor::kernels::host {

/// Threads of the host execution space (1 on Serial).
inline int host_threads() {
  return static_cast<int>(Kokkos::DefaultHostExecutionSpace().concurrency());
}

/// Runs work(t, first, last) on each of `threads` host threads for its contiguous share
/// [first, last) of `items` (a static split). The work may not dispatch Kokkos kernels: a
/// kernel dispatched inside another waits forever on Kokkos 4.6's OpenMP backend.
template <class Work>
void split_over_threads(int threads, Index items, const Work& work) {
  const auto share = [&](int t) { work(t, items * t / threads, items * (t + 1) / threads); };
  if (threads == 1) return share(0);
  Kokkos::parallel_for(
      "host::split_over_threads",
      Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Schedule<Kokkos::Static>>(
          0, threads),
      [&](const int t) { share(t); });
}

}  // namespace shardtensor::kernels::host
