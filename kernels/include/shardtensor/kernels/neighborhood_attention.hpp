#pragma once
// The kernels of neighbourhood attention (layers/neighborhood_attention.hpp) on the execution space
// of their Views: each query attends to the keys of a window around it, read from a padded
// K/V field whose ghosts the halo exchange filled. Data are channel-last rows (PackedRows:
// row n * cells + cell holds one cell's channels), so a head's D values are contiguous.
//
// Every kernel writes only what its own work item owns: a query's output, log-sum-exp and
// dQ; a key's dK and dV, gathered from the queries whose windows hold it (no scatter, no
// atomics), in a fixed order: the same bits on every run and thread count.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/box.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// Channel-last copies of fields (rows: batch x grid cells, columns: channels).
template <class T>
using PackedRows = Kokkos::View<T**, Kokkos::LayoutRight, DefaultMemorySpace>;

/// The owned query grid, the padded key grid and the window, for the kernels.
struct NeighborhoodGrid {
  Index batch = 0, channels = 0, heads = 0, head_dim = 0;
  Index local[3] = {1, 1, 1};   // owned cells (queries) per axis
  Index padded[3] = {1, 1, 1};  // owned + ghost cells (keys) per axis
  Index window[3] = {1, 1, 1}, dilation[3] = {1, 1, 1};
  /// (axis, owned index x): the window positions o in [first, last) whose keys lie in the
  /// field; key o of query x sits at padded index x + dilation * o.
  Kokkos::View<Index**, Kokkos::LayoutRight, DefaultMemorySpace> first, last;

  KOKKOS_INLINE_FUNCTION Index cells() const { return local[0] * local[1] * local[2]; }
  KOKKOS_INLINE_FUNCTION Index padded_cells() const { return padded[0] * padded[1] * padded[2]; }
};

/// dst(row of cell (x, y, z) + shift in a grid of `grid` cells, dst_c0 + c) = src(n, src_c0 + c,
/// x, y, z) for the cells of `box` (local indices of src) and c < count.
template <class T>
void pack_rows(const ExecutionSpace& space, const FieldView<T>& src, const Box& box, Index src_c0,
               Index count, const PackedRows<T>& dst, const SpatialIndex& grid,
               const SpatialIndex& shift, Index dst_c0);

/// The reverse: dst(n, dst_c0 + c, x, y, z) = (or, with `add`, +=) the packed row of cell
/// (x, y, z) + shift, channel src_c0 + c, for the cells of `box` (local indices of dst).
template <class T>
void unpack_rows(const ExecutionSpace& space, const PackedRows<T>& src, const SpatialIndex& grid,
                 const SpatialIndex& shift, Index src_c0, Index count, const FieldView<T>& dst,
                 const Box& box, Index dst_c0, bool add);

/// For the queries in `queries` (owned indices): out = softmax(Q K^T / sqrt(D)) V per head
/// over the window (online softmax, keys in window order) and lse = the softmax rows'
/// log-sum-exp. q, out: (batch x cells, C); kv: (batch x padded cells, 2C), K then V; lse:
/// (batch x cells, heads).
template <class T>
void neighborhood_forward(const ExecutionSpace& space, const NeighborhoodGrid& g,
                          const Box& queries, const PackedRows<T>& q, const PackedRows<T>& kv,
                          const PackedRows<T>& out, const PackedRows<T>& lse);

/// delta(row, h) = dO . O over head h (= sum over keys of P dO . V).
template <class T>
void neighborhood_delta(const ExecutionSpace& space, const NeighborhoodGrid& g,
                        const PackedRows<T>& dout, const PackedRows<T>& out,
                        const PackedRows<T>& delta);

/// dQ of every owned query: sum over its keys of dS K, with P recomputed from lse.
template <class T>
void neighborhood_backward_queries(const ExecutionSpace& space, const NeighborhoodGrid& g,
                                   const PackedRows<T>& q, const PackedRows<T>& kv,
                                   const PackedRows<T>& dout, const PackedRows<T>& lse,
                                   const PackedRows<T>& delta, const PackedRows<T>& dq);

/// dK and dV (into dkv, like kv) of the padded key cells in `keys`: each gathers P dO and
/// dS Q over the owned queries whose windows hold it.
template <class T>
void neighborhood_backward_keys(const ExecutionSpace& space, const NeighborhoodGrid& g,
                                const Box& keys, const PackedRows<T>& q, const PackedRows<T>& kv,
                                const PackedRows<T>& dout, const PackedRows<T>& lse,
                                const PackedRows<T>& delta, const PackedRows<T>& dkv);

}  // namespace shardtensor::kernels
