#pragma once
// CellIndex: the (batch, channel, x, y, z) position of a flat C-order index, for kernels that
// run one work item per cell of a field.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

struct CellIndex {
  Index n, c, x, y, z;
};

/// Position of `flat` in a (batch, channels, nx, ny, nz) array in C order.
KOKKOS_INLINE_FUNCTION CellIndex unflatten(Index flat, Index channels, Index nx, Index ny,
                                           Index nz) {
  CellIndex i;
  i.z = flat % nz;
  flat /= nz;
  i.y = flat % ny;
  flat /= ny;
  i.x = flat % nx;
  flat /= nx;
  i.c = flat % channels;
  i.n = flat / channels;
  return i;
}

/// Calls cell(n, c, x, y, z) for every cell of a (batch, channels, extents...) index space:
/// in parallel over lines along the innermost axis longer than one cell (z in 3-D, y in
/// 2-D, x in 1-D), in order along each line. One index decomposition per line instead of
/// per cell (a 2-D field's z lines are single cells: per-cell decompositions, four integer
/// divisions each, would cost more than most kernels' work).
template <class CellOp>
void for_each_cell_by_lines(const char* label, Index batch, Index channels,
                            const Index (&extents)[3], const CellOp& cell) {
  const int axis = extents[2] > 1 ? 2 : extents[1] > 1 ? 1 : 0;
  const Index length = extents[axis];
  Index line_extents[3] = {extents[0], extents[1], extents[2]};
  line_extents[axis] = 1;
  const Index lines = batch * channels * line_extents[0] * line_extents[1] * line_extents[2];
  Kokkos::parallel_for(
      label, lines, KOKKOS_LAMBDA(const Index line) {
        const CellIndex start =
            unflatten(line, channels, line_extents[0], line_extents[1], line_extents[2]);
        Index at[3] = {start.x, start.y, start.z};
        for (Index i = 0; i < length; ++i) {
          at[axis] = i;
          cell(start.n, start.c, at[0], at[1], at[2]);
        }
      });
}

}  // namespace shardtensor
