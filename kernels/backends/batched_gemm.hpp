#pragma once
// batched_gemm: many products of one shape at once, C_b = alpha op(A_b) op(B_b) + beta C_b for
// b < batch, on row-major matrices that are each contiguous (a row's stride is its width), the
// b-th at a fixed distance from the first. The batched attention tiles (flash_attention.hpp)
// run every head of a block in one call. One implementation per backend:
// host/batched_gemm_host.cpp (a loop of KokkosBlas::gemm, the host BLAS) in host builds,
// cuda/batched_gemm_cublas.cpp (cuBLAS's strided-batched GEMM on the instance's stream) in
// CUDA builds.

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// Row-major operands: op(A) is m x k, op(B) k x n, C m x n. A is stored m x k, or k x m with
/// `trans_a`; B k x n, or n x k with `trans_b`. `stride_*`: values from one matrix of the batch
/// to the next. `tf32`: float products may run on TF32 tensor cores where the backend has
/// them (inputs rounded to 10 mantissa bits, float sums). `bf16`: a bf16 op's products, on bf16
/// tensor cores where the backend has them (inputs rounded to bf16, exactly where they hold
/// bf16 values; float sums), as the host's AMX tiles take them. Both ignored elsewhere and for
/// double.
template <class T>
void batched_gemm(const ExecutionSpace& space, bool trans_a, bool trans_b, Index m, Index n,
                  Index k, T alpha, const T* a, Index stride_a, const T* b, Index stride_b, T beta,
                  T* c, Index stride_c, Index batch, bool tf32, bool bf16);

}  // namespace shardtensor::kernels
