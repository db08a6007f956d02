// The CUDA backend of batched_gemm (batched_gemm.hpp): cuBLAS's strided-batched GEMM on the
// stream of the execution space instance, so a call runs after the kernels that wrote its
// operands, without a fence. cuBLAS is column-major: a row-major C = op(A) op(B) is the
// column-major C^T = op(B)^T op(A)^T, the same memory, so the call swaps the operands.
// Float runs cublasGemmStridedBatchedEx with FP32 compute (no tensor cores), with TF32 where
// the caller allows it, or with bf16 inputs (CUBLAS_COMPUTE_32F_FAST_16BF: the float operands
// rounded to bf16 on the way in, float sums) for a bf16 op; double runs
// cublasDgemmStridedBatched.

#include <cublas_v2.h>

#include <climits>

#include "batched_gemm.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor::kernels {

namespace {

void check(cublasStatus_t status, const char* call) {
  SHARDTENSOR_REQUIRE(status == CUBLAS_STATUS_SUCCESS, "cuBLAS",
                      call << " failed: " << cublasGetStatusString(status));
}

/// The process's handle, on the stream of `space`. Created at the first call, destroyed when
/// Kokkos finalizes (while the CUDA context is still there).
cublasHandle_t handle_on(const ExecutionSpace& space) {
  static const cublasHandle_t handle = [] {
    cublasHandle_t created = nullptr;
    check(cublasCreate(&created), "cublasCreate");
    Kokkos::push_finalize_hook([created] { cublasDestroy(created); });
    return created;
  }();
  check(cublasSetStream(handle, space.cuda_stream()), "cublasSetStream");
  return handle;
}

int as_int(Index value, const char* what) {
  SHARDTENSOR_REQUIRE(value >= 0 && value <= INT_MAX, "batched_gemm",
                      what << " " << value << " exceeds cuBLAS's int range");
  return static_cast<int>(value);
}

}  // namespace

template <class T>
void batched_gemm(const ExecutionSpace& space, bool trans_a, bool trans_b, Index m, Index n,
                  Index k, T alpha, const T* a, Index stride_a, const T* b, Index stride_b, T beta,
                  T* c, Index stride_c, Index batch, bool tf32, bool bf16) {
  if (m == 0 || n == 0 || batch == 0) return;
  const cublasHandle_t handle = handle_on(space);
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int rows = as_int(m, "rows"), cols = as_int(n, "columns"), inner = as_int(k, "inner");
  const int lda = trans_a ? rows : inner, ldb = trans_b ? inner : cols,
            count = as_int(batch, "batch");
  if constexpr (std::is_same_v<T, float>) {
    check(cublasGemmStridedBatchedEx(handle, op_b, op_a, cols, rows, inner, &alpha, b, CUDA_R_32F,
                                     ldb, stride_b, a, CUDA_R_32F, lda, stride_a, &beta, c,
                                     CUDA_R_32F, cols, stride_c, count,
                                     bf16   ? CUBLAS_COMPUTE_32F_FAST_16BF
                                     : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  } else {
    check(cublasDgemmStridedBatched(handle, op_b, op_a, cols, rows, inner, &alpha, b, ldb, stride_b,
                                    a, lda, stride_a, &beta, c, cols, stride_c, count),
          "cublasDgemmStridedBatched");
  }
}

template void batched_gemm(const ExecutionSpace&, bool, bool, Index, Index, Index, float,
                           const float*, Index, const float*, Index, float, float*, Index, Index,
                           bool, bool);
template void batched_gemm(const ExecutionSpace&, bool, bool, Index, Index, Index, double,
                           const double*, Index, const double*, Index, double, double*, Index,
                           Index, bool, bool);

}  // namespace shardtensor::kernels
