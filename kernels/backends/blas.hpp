#pragma once
// KokkosBlas::gemm on an execution space instance (cuBLAS on its stream in CUDA builds).
// Kokkos Kernels 3.x (Debian's 3.4.1) has no instance argument: there the default instance,
// the only one a Serial build has.

#include <KokkosKernels_config.h>
#include <KokkosBlas3_gemm.hpp>

#include "shardtensor/core/execution.hpp"

namespace shardtensor::kernels {

template <class A, class B, class C>
void gemm(const ExecutionSpace& space, const char* trans_a, const char* trans_b,
          typename A::const_value_type alpha, const A& a, const B& b,
          typename C::const_value_type beta, const C& c) {
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40000
  KokkosBlas::gemm(space, trans_a, trans_b, alpha, a, b, beta, c);
#else
  (void)space;
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
#endif
}

}  // namespace shardtensor::kernels
