#pragma once
// The host backend's one CPU-feature check and one pragma block. Every AVX-512 source of
// kernels/backends/host includes this header and nothing else decides where AVX-512 code is
// compiled or run:
//
//   SHARDTENSOR_HOST_AVX512      defined where the compiler targets x86-64 on the host (GCC or
//                                Clang; not nvcc/hipcc, whose device backends never call
//                                these kernels). The kernels are compiled for AVX-512 through
//                                function attributes, whatever the build's -march.
//   avx512_available()           whether this CPU runs them (AVX-512F), checked once.
//   avx512_kernels_run_here()    that, and Kokkos kernels run on the host (Serial or OpenMP):
//                                the Views are host memory, the work goes to host threads.
//   SHARDTENSOR_AVX512_BEGIN/END around AVX-512 code: GCC 12's avx512fintrin.h trips
//                                -Wuninitialized on its own _mm512_undefined_* (GCC bug 105593).

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__)
#define SHARDTENSOR_HOST_AVX512 1
#include <immintrin.h>

#include "shardtensor/core/execution.hpp"

#define SHARDTENSOR_AVX512_BEGIN                                                       \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SHARDTENSOR_AVX512_END _Pragma("GCC diagnostic pop")

namespace shardtensor::kernels::host {

/// True where this CPU runs the AVX-512F kernels.
inline bool avx512_available() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

/// True where the AVX-512 kernels run on this CPU and on the default execution space's Views.
inline bool avx512_kernels_run_here() {
  return kernels_run_on_host && avx512_available();
}

}  // namespace shardtensor::kernels::host
#endif
