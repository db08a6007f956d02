// The host backend of batched_gemm (batched_gemm.hpp): one KokkosBlas::gemm (the host BLAS) per
// matrix of the batch. The host runs the per-slice attention tiles; this serves the batched
// tiles' tests on the host.

#include "batched_gemm.hpp"

#include "blas.hpp"

namespace shardtensor::kernels {

namespace {

template <class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, DefaultMemorySpace,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T>
Matrix<T> matrix(T* data, Index rows, Index cols) {
  return Matrix<T>(data, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
}

}  // namespace

template <class T>
void batched_gemm(const ExecutionSpace& space, bool trans_a, bool trans_b, Index m, Index n,
                  Index k, T alpha, const T* a, Index stride_a, const T* b, Index stride_b, T beta,
                  T* c, Index stride_c, Index batch, bool /*tf32*/, bool /*bf16*/) {
  // No tensor cores here: float products of the operands as they are.
  for (Index i = 0; i < batch; ++i) {
    const auto a_i = trans_a ? matrix(a + i * stride_a, k, m) : matrix(a + i * stride_a, m, k);
    const auto b_i = trans_b ? matrix(b + i * stride_b, n, k) : matrix(b + i * stride_b, k, n);
    gemm(space, trans_a ? "T" : "N", trans_b ? "T" : "N", alpha, a_i, b_i, beta,
         matrix(c + i * stride_c, m, n));
  }
}

template void batched_gemm(const ExecutionSpace&, bool, bool, Index, Index, Index, float,
                           const float*, Index, const float*, Index, float, float*, Index, Index,
                           bool, bool);
template void batched_gemm(const ExecutionSpace&, bool, bool, Index, Index, Index, double,
                           const double*, Index, const double*, Index, double, double*, Index,
                           Index, bool, bool);

}  // namespace shardtensor::kernels
