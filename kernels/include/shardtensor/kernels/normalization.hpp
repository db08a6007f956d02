#pragma once
// The normalization kernels (nn/normalization.hpp: GroupNorm, LayerNorm, BatchNorm) on the
// execution space of their Views. A block is one (sample n, channel c) pair, numbered
// n * channels + c: its sums over the owned cells are in double, one team per block with a
// fixed reduction tree (the same bits on every run); the normalisation and its backward are
// elementwise. How blocks combine into statistics, across blocks and ranks, is the module's.

#include <Kokkos_Core.hpp>
#include <vector>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/kernels/activation.hpp"

namespace shardtensor::kernels {

/// The owned cells of a field (ShardTensor::interior()).
template <class T>
using OwnedCells = Kokkos::View<T*****, Kokkos::LayoutStride, DefaultMemorySpace>;

/// One double per block (mean, 1 / std, the backward's coefficients) or per channel (weight,
/// bias).
using BlockDoubles = Kokkos::View<double*, DefaultMemorySpace>;

/// Per block, the sum of x over the owned cells.
template <class T>
std::vector<double> block_sums(const ExecutionSpace& space, const OwnedCells<const T>& x);

/// Per block, the sum of d = x - mean(block), then (appended, another `blocks` values) the
/// sum of d^2.
template <class T>
std::vector<double> block_deviation_sums(const ExecutionSpace& space, const OwnedCells<const T>& x,
                                         const BlockDoubles& mean);

/// y = (x - mean(b)) rstd(b) scale(c) + shift(c) for the cells of block b = (n, c).
template <class T>
void normalize_forward(const ExecutionSpace& space, const OwnedCells<const T>& x,
                       const BlockDoubles& mean, const BlockDoubles& rstd,
                       const BlockDoubles& scale, const BlockDoubles& shift,
                       const OwnedCells<T>& y);

/// dn = dy f'(n) with n the normalized value of each cell, n = (x - mean(b)) rstd(b) scale(c) +
/// shift(c) rounded as normalize_forward rounds it: the gradient at the input of an activation
/// fused after the normalization, from the normalization's input alone (the normalized field
/// is never stored). Bit for bit what the activation's own backward gives from a stored n (on
/// the host, GELU on float through the same vector rows). `dn` may be `dy` (in place).
template <class T>
void normalize_activation_gradient(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                                   const OwnedCells<const T>& x, const BlockDoubles& mean,
                                   const BlockDoubles& rstd, const BlockDoubles& scale,
                                   const BlockDoubles& shift, const ActivationFunction<T>& f,
                                   const OwnedCells<T>& dn);

/// Per block, the sum of dy, then (appended) the sum of dy * xhat, xhat = (x - mean) rstd.
template <class T>
std::vector<double> normalize_gradient_sums(const ExecutionSpace& space,
                                            const OwnedCells<const T>& dy,
                                            const OwnedCells<const T>& x, const BlockDoubles& mean,
                                            const BlockDoubles& rstd);

/// dx += c1(b) dy - c2(b) - c3(b) xhat for the cells of block b (dx = ... with `overwrite`).
template <class T>
void normalize_backward(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                        const OwnedCells<const T>& x, const BlockDoubles& mean,
                        const BlockDoubles& rstd, const BlockDoubles& c1, const BlockDoubles& c2,
                        const BlockDoubles& c3, const OwnedCells<T>& dx, bool overwrite = false);

}  // namespace shardtensor::kernels
