#pragma once
// The pooling kernels (nn/pooling.hpp) on the execution space of their Views: max and average
// pooling over windows of a padded field (the halo padding filled its ghosts), and their
// backward, which gathers into each padded cell from the outputs whose windows cover it (a
// scatter only where windows are disjoint, so no two outputs write one cell).

#include <Kokkos_Core.hpp>
#include <cstdint>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// Max or average pooling.
enum class PoolKind { max, average };

namespace kernels {

/// Per output cell of max pooling: the tap of its window's maximum, (a k[1] + b) k[2] + e for
/// window offset (a, b, e), for backward. Two bytes, not an 8-byte offset: the argmax lives
/// from forward to backward, a quarter of the pooled field's size (Pool limits windows to
/// max_pool_taps).
using PoolArgmax = Kokkos::View<std::uint16_t*****, Kokkos::LayoutRight, DefaultMemorySpace>;
inline constexpr Index max_pool_taps = 65536;

/// Index arithmetic shared by the pooling kernels.
struct PoolShape {
  Index channels;
  Index k[3], s[3], d[3];
  Index base[3];          // padded index of the first local output's window start
  Index out[3];           // local output extents
  Index padded[3];        // padded buffer extents
  Index first_global[3];  // global index of the first local output's window start
  Index global[3];        // global field extents
  bool count_include_pad;

  KOKKOS_INLINE_FUNCTION Index padded_flat(Index x, Index y, Index z) const {
    return (x * padded[1] + y) * padded[2] + z;
  }
  /// Cells of output o's window that average pooling divides by.
  KOKKOS_INLINE_FUNCTION Index divisor(Index ox, Index oy, Index oz) const {
    if (count_include_pad) return k[0] * k[1] * k[2];
    const Index o[3] = {ox, oy, oz};
    Index count = 1;
    for (int a = 0; a < 3; ++a) {
      const Index start = first_global[a] + o[a] * s[a];
      const Index lo = start < 0 ? 0 : start;
      const Index hi = start + k[a] > global[a] ? global[a] : start + k[a];
      count *= hi - lo;
    }
    return count;
  }
  /// Every local output's divisor where it is the same for all (count_include_pad, or no
  /// window of this rank reaches past the global field), else 0.
  Index constant_divisor() const {
    for (int a = 0; a < 3 && !count_include_pad; ++a)
      if (first_global[a] < 0 || first_global[a] + (out[a] - 1) * s[a] + k[a] > global[a]) return 0;
    return k[0] * k[1] * k[2];
  }
};

/// y = pooling of the padded input xp over the windows of g; argmax (max pooling), unless
/// empty (no backward to come), records where each maximum was (the first one, as in PyTorch).
template <class T>
void pool_forward(const ExecutionSpace& space, const PoolShape& g, PoolKind kind,
                  const FieldView<T>& xp, const FieldView<T>& y, const PoolArgmax& argmax);

/// Gradient of the padded input gxp (zero on entry) from the output gradient gy.
template <class T>
void pool_backward(const ExecutionSpace& space, const PoolShape& g, PoolKind kind,
                   const FieldView<T>& gy, const PoolArgmax& argmax, const FieldView<T>& gxp);

}  // namespace kernels
}  // namespace shardtensor
