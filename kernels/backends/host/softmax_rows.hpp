#pragma once
// The softmax rows of flash_attention's score tiles (kernels/flash_attention.hpp) on host
// memory, with the vector exponentials of vector_kernels.hpp for float, split over the host
// threads by rows (a row is one thread's: the same bits on any thread count), or all on the
// calling thread (`inline_rows`: flash_attention gives each host thread whole slices). Each
// returns false, touching nothing, where it cannot run (no vector path on: SHARDTENSOR_SIMD=off,
// a CPU without FMA vectors, a build without Highway; or Kokkos kernels not on the host); then
// the caller runs its portable kernel.

#include "shardtensor/kernels/flash_attention.hpp"

namespace shardtensor::kernels::host {

/// The online-softmax update of the rows of score tile s (local query rows i0 + i, keys
/// j0 + j): see online_softmax_rows in kernels/src/flash_attention.cpp.
bool online_softmax_rows(const Tile<float>& s, const Visibility& visible, Index i0, Index j0,
                         float* max, float* sum, float* out, Index head_dim, bool inline_rows);

/// P = exp(S - lse) of the visible keys, 0 for the others, for the rows of tile p.
bool softmax_probabilities(const Tile<float>& p, const Visibility& visible, Index i0, Index j0,
                           const float* lse, bool inline_rows);

}  // namespace shardtensor::kernels::host
