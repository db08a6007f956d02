#pragma once
// The pooling kernels (layers/pooling.hpp) on the execution space of their Views: max and average
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
  // The global cells average pooling divides by, [counted_lower, counted_upper): the field,
  // or the field and its padding (count_include_pad).
  Index counted_lower[3], counted_upper[3];

  KOKKOS_INLINE_FUNCTION Index padded_flat(Index x, Index y, Index z) const {
    return (x * padded[1] + y) * padded[2] + z;
  }
  /// Cells of output o's window that average pooling divides by.
  KOKKOS_INLINE_FUNCTION Index divisor(Index ox, Index oy, Index oz) const {
    const Index o[3] = {ox, oy, oz};
    Index count = 1;
    for (int a = 0; a < 3; ++a) {
      const Index start = first_global[a] + o[a] * s[a];
      const Index lo = start < counted_lower[a] ? counted_lower[a] : start;
      const Index hi = start + k[a] > counted_upper[a] ? counted_upper[a] : start + k[a];
      count *= hi - lo;
    }
    return count;
  }
  /// Every local output's divisor where it is the same for all (no window of this rank
  /// reaches past the counted cells), else 0.
  Index constant_divisor() const {
    for (int a = 0; a < 3; ++a)
      if (first_global[a] < counted_lower[a] ||
          first_global[a] + (out[a] - 1) * s[a] + k[a] > counted_upper[a])
        return 0;
    return k[0] * k[1] * k[2];
  }
};

inline bool operator==(const PoolShape& a, const PoolShape& b) {
  bool same = a.channels == b.channels;
  for (int d = 0; d < 3; ++d)
    same = same && a.k[d] == b.k[d] && a.s[d] == b.s[d] && a.d[d] == b.d[d] &&
           a.base[d] == b.base[d] && a.out[d] == b.out[d] && a.padded[d] == b.padded[d] &&
           a.first_global[d] == b.first_global[d] && a.counted_lower[d] == b.counted_lower[d] &&
           a.counted_upper[d] == b.counted_upper[d];
  return same;
}

/// One shape and kind of pooling, with the table its backward reads where windows are
/// disjoint (max: each tap's offset from its window's first cell; average: per axis and
/// padded index, the output whose window holds it), made once: a layer keeps its plan from
/// call to call, so a step makes no table (on a GPU a cudaMalloc, a kernel and a cudaFree per
/// call). Copies share the table. Charged to workspaces.
class PoolPlan {
 public:
  PoolPlan(const ExecutionSpace& space, const PoolShape& g, PoolKind kind);

  const PoolShape& shape() const { return shape_; }
  PoolKind kind() const { return kind_; }
  /// Every padded cell lies in at most one window.
  bool disjoint() const { return disjoint_; }
  /// The backward's table (empty where windows overlap).
  const Kokkos::View<Index*, DefaultMemorySpace>& table() const { return table_; }

 private:
  PoolShape shape_;
  PoolKind kind_;
  bool disjoint_ = true;
  Kokkos::View<Index*, DefaultMemorySpace> table_;
};

/// y = pooling of the padded input xp over the plan's windows; argmax (max pooling), unless
/// empty (no backward to come), records where each maximum was (the first one, as in PyTorch).
template <class T>
void pool_forward(const ExecutionSpace& space, const PoolPlan& plan, const FieldView<T>& xp,
                  const FieldView<T>& y, const PoolArgmax& argmax);

/// Gradient of the padded input gxp (zero on entry) from the output gradient gy.
template <class T>
void pool_backward(const ExecutionSpace& space, const PoolPlan& plan, const FieldView<T>& gy,
                   const PoolArgmax& argmax, const FieldView<T>& gxp);

}  // namespace kernels
}  // namespace shardtensor
