#pragma once
// The normalization kernels (layers/normalization.hpp: GroupNorm, LayerNorm, BatchNorm) on the
// execution space of their Views. A block is one (sample n, channel c) pair, numbered
// n * channels + c: its sums over the owned cells are in double, one team per block with a
// fixed reduction tree (the same bits on every run); the normalisation and its backward are
// elementwise. Blocks combine into statistics here too, in tiny kernels, so a normalization
// never reads a value on the host (on a GPU that would stall the stream twice per layer); the
// sums over the ranks (one allreduce per pass) are the module's.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/kernels/activation.hpp"

namespace shardtensor::kernels {

/// The owned cells of a field (ShardTensor::interior()).
template <class T>
using OwnedCells = Kokkos::View<T*****, Kokkos::LayoutStride, DefaultMemorySpace>;

/// One double per block (mean, 1 / std, the backward's coefficients) or per channel (weight,
/// bias) or per statistic; the sums of a block are written where the caller says (often
/// subviews of one allocation). Everything here runs asynchronously on `space` (no fence, no
/// host read on a GPU), so a normalization costs its launches and nothing else.
using BlockDoubles = Kokkos::View<double*, DefaultMemorySpace>;

/// Which statistic each block belongs to: GroupNorm `groups` statistics per sample (over its
/// channels / groups blocks), BatchNorm one per channel (over the batch).
struct StatLayout {
  Index batch = 0, channels = 0;
  bool per_channel = false;  // BatchNorm
  Index groups = 1;          // GroupNorm

  KOKKOS_INLINE_FUNCTION Index blocks() const { return batch * channels; }
  KOKKOS_INLINE_FUNCTION Index stats() const { return per_channel ? channels : batch * groups; }
  KOKKOS_INLINE_FUNCTION Index blocks_per_stat() const {
    return per_channel ? batch : channels / groups;
  }
  KOKKOS_INLINE_FUNCTION Index stat_of_block(Index block) const {
    const Index n = block / channels, c = block % channels;
    return per_channel ? c : n * groups + c / (channels / groups);
  }
  /// The i-th block of statistic s, in increasing block order.
  KOKKOS_INLINE_FUNCTION Index block_of_stat(Index s, Index i) const {
    return per_channel ? i * channels + s
                       : (s / groups) * channels + (s % groups) * (channels / groups) + i;
  }
};

/// Per block, the sum of x over the owned cells: sums(b).
template <class T>
void block_sums(const ExecutionSpace& space, const OwnedCells<const T>& x,
                const BlockDoubles& sums);

/// Per block, the sum of d = x - mean(block) into sums(b), and of d^2 into sums(blocks + b).
template <class T>
void block_deviation_sums(const ExecutionSpace& space, const OwnedCells<const T>& x,
                          const BlockDoubles& mean, const BlockDoubles& sums);

/// From every block's global sum: each block's statistic's mean, sum of its blocks' sums (in
/// block order) over `count` values, into block_mean(b).
void statistic_block_means(const ExecutionSpace& space, const StatLayout& layout,
                           const BlockDoubles& sums, double count, const BlockDoubles& block_mean);

/// The corrected two-pass moments: from the global deviation sums about block_mean (as
/// block_deviation_sums lays them out), per statistic s its mean m + sum(d) / count into
/// mean(s) and its biased variance (sum(d^2) - sum(d)^2 / count) / count into var(s).
void statistic_moments(const ExecutionSpace& space, const StatLayout& layout,
                       const BlockDoubles& block_mean, const BlockDoubles& deviations, double count,
                       const BlockDoubles& mean, const BlockDoubles& var);

/// What normalize_forward reads: per block mean(b) = stat_mean(s) and rstd(b) = 1 / sqrt(
/// stat_var(s) + eps) of its statistic s; per channel scale(c) = weight(c) (1 without a
/// weight: an empty View) and shift(c) = bias(c) (0 without).
template <class S, class T>
void block_coefficients(const ExecutionSpace& space, const StatLayout& layout,
                        const Kokkos::View<const S*, DefaultMemorySpace>& stat_mean,
                        const Kokkos::View<const S*, DefaultMemorySpace>& stat_var, double eps,
                        const Kokkos::View<const T*, DefaultMemorySpace>& weight,
                        const Kokkos::View<const T*, DefaultMemorySpace>& bias,
                        const BlockDoubles& mean, const BlockDoubles& rstd,
                        const BlockDoubles& scale, const BlockDoubles& shift);

/// PyTorch's running estimates: running = (1 - momentum) running + momentum * the batch's
/// (the variance times `unbias`), per channel.
template <class T>
void update_running_statistics(const ExecutionSpace& space, const BlockDoubles& stat_mean,
                               const BlockDoubles& stat_var, double momentum, double unbias,
                               const Kokkos::View<T*, DefaultMemorySpace>& running_mean,
                               const Kokkos::View<T*, DefaultMemorySpace>& running_var);

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

/// Per block, the sum of dy into sums(b) and of dy * xhat into sums(blocks + b), xhat = (x -
/// mean) rstd.
template <class T>
void normalize_gradient_sums(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                             const OwnedCells<const T>& x, const BlockDoubles& mean,
                             const BlockDoubles& rstd, const BlockDoubles& sums);

/// grad(c) += the sum over samples n of per_block(n * channels + c), in sample order (the
/// weight's or bias's gradient from the blocks' sums).
template <class T>
void add_channel_sums(const ExecutionSpace& space, const StatLayout& layout,
                      const BlockDoubles& per_block,
                      const Kokkos::View<T*, DefaultMemorySpace>& grad);

/// normalize_backward's coefficients from the global gradient sums (as
/// normalize_gradient_sums lays them out): c1(b) = rstd(b) scale(c); through the batch's
/// statistics (`batch_stats`) c2(b) = rstd(b) sum(scale * dy) / count and c3(b) = rstd(b)
/// sum(scale * dy * xhat) / count over the blocks of b's statistic, else zero.
void backward_coefficients(const ExecutionSpace& space, const StatLayout& layout,
                           const BlockDoubles& rstd, const BlockDoubles& scale,
                           const BlockDoubles& sums, double count, bool batch_stats,
                           const BlockDoubles& c1, const BlockDoubles& c2, const BlockDoubles& c3);

/// dx += c1(b) dy - c2(b) - c3(b) xhat for the cells of block b (dx = ... with `overwrite`).
template <class T>
void normalize_backward(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                        const OwnedCells<const T>& x, const BlockDoubles& mean,
                        const BlockDoubles& rstd, const BlockDoubles& c1, const BlockDoubles& c2,
                        const BlockDoubles& c3, const OwnedCells<T>& dx, bool overwrite = false);

}  // namespace shardtensor::kernels
