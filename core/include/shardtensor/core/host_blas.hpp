#pragma once
// The host BLAS behind Kokkos Kernels, asked at run time: Debian's alternatives choose the
// library behind libblas.so.3 (OpenBLAS, BLIS, the reference), so nothing here links to one.
//
// one_blas_thread_per_rank(): a process-wide setting for the application to make once, like
// keep_freed_memory() (the CLI, benchmarks, tests and examples do). Why: the ranks fill the
// cores, and in an OpenMP build the library splits its GEMMs over the rank's threads itself.
// OpenBLAS would start its own threads in every rank besides (one per core it may run on, or
// OMP_NUM_THREADS of them), which compete with the ranks and the OpenMP threads: ring attention
// over 4096 tokens took 4977 ms instead of 513 in an OpenMP build run with OMP_NUM_THREADS=2.

#include <string>

namespace shardtensor {

/// "OpenBLAS <its configuration>, kernels <its core>", or a line saying the BLAS is not
/// OpenBLAS.
std::string host_blas_description();

/// The threads a host BLAS call may use; 0 where the BLAS does not say (not OpenBLAS).
int host_blas_threads();

/// Makes each host BLAS call run on its caller's thread, unless the user chose the BLAS's
/// threads (OPENBLAS_NUM_THREADS or GOTO_NUM_THREADS set and not empty). Returns true where it
/// set them; false where the user's choice stands or the BLAS offers no control (BLIS and the
/// reference BLAS run single-threaded unless told otherwise).
bool one_blas_thread_per_rank();

}  // namespace shardtensor
