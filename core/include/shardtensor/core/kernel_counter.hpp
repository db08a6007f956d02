#pragma once
// KernelCounter: how many Kokkos kernels this process launched (parallel_for, _reduce, _scan),
// how many fences it made, how many deep copies and how many View allocations, while a counter
// lives. On a GPU each launch costs microseconds, each fence or device-host copy stalls the
// stream, and each allocation is a cudaMalloc with a fence (Kokkos copies the allocation's
// header to the device) and later a cudaFree (which waits for the device), so a training
// step's counts are its latency budget; launches, deep copies and allocations are the same on
// Serial, OpenMP and CUDA (the same code launches the same kernels), so they can be measured
// and kept low on a CPU. Fences differ by backend (Kokkos 3.4's Serial reports none; the host
// backends fence around zero-filled allocations where CUDA does not).
//
//   KernelCounter counter;  ...one step...  const KernelCounts c = counter.counts();
//
// Through Kokkos Tools callbacks (the same API in Kokkos 3.4 and 4.x), chained to a tool that
// was loaded before (the kernel timer keeps timing). Fences that Kokkos makes for a loaded
// tool (labels "Kokkos::Tools::...") are not counted: without a tool they do not happen.
// Work outside Kokkos kernels (the host vector kernels, BLAS, cuDNN, MPI) is not seen.

#include <cstdint>

namespace shardtensor {

struct KernelCounts {
  std::int64_t launches = 0;     ///< parallel_for, parallel_reduce and parallel_scan calls
  std::int64_t fences = 0;       ///< Kokkos::fence and execution-space fences
  std::int64_t deep_copies = 0;  ///< Kokkos::deep_copy between or within memory spaces
  std::int64_t allocations = 0;  ///< managed View allocations, in every memory space
};

/// Counts from construction (or reset()) on; one counter at a time per process (a second
/// throws shardtensor::Error). Kokkos must be initialized.
class KernelCounter {
 public:
  KernelCounter();
  ~KernelCounter();
  KernelCounter(const KernelCounter&) = delete;
  KernelCounter& operator=(const KernelCounter&) = delete;

  KernelCounts counts() const;
  void reset();
};

}  // namespace shardtensor
