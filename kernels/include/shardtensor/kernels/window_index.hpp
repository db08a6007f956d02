#pragma once
// Index arithmetic of sliding windows (convolution, pooling) inside kernels.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// Output index along one axis whose window tap `tap` lands on padded index i; -1 if none.
KOKKOS_INLINE_FUNCTION Index window_output_of(Index i, Index base, Index tap, Index stride,
                                              Index dilation, Index outputs) {
  const Index t = i - base - tap * dilation;
  if (t < 0 || t % stride != 0) return -1;
  const Index o = t / stride;
  return o < outputs ? o : -1;
}

}  // namespace shardtensor
