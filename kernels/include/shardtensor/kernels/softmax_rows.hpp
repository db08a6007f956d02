#pragma once
// The row kernels of a softmax over host memory (ring attention's score tiles): the host
// backend's (kernels/backends/host/softmax_rows.cpp), vectorised with AVX-512 for float where
// the CPU has it.

#include "shardtensor/core/types.hpp"

namespace shardtensor::kernels {

/// max of x[0, n).
template <class T>
T row_max(const T* x, Index n);

/// x[j] = exp(x[j] - shift) for j < n; returns their sum. The exponential is the costly
/// part of the softmax: a vectorised one where the CPU has AVX-512 (float).
template <class T>
T exp_row(T* x, Index n, T shift);

}  // namespace shardtensor::kernels
