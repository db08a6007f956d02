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

}  // namespace shardtensor
