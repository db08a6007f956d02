#pragma once
// An index wrapped around a periodic extent, for the host kernels that read a source's cells
// past its ends (conv_vector.cpp's ring copies, conv_winograd.cpp's transforms).

#include "shardtensor/core/types.hpp"

namespace shardtensor::kernels::host {

/// i modulo extent, in [0, extent). Windows and padding reach at most an extent past either
/// end, so one addition or subtraction does (the divisions were most of a small field's ring
/// copies and a tenth of its transforms); an index farther out takes the division.
inline Index wrapped(Index i, Index extent) {
  if (i < 0) i += extent;
  if (i >= extent) i -= extent;
  return i >= 0 && i < extent ? i : ((i % extent) + extent) % extent;
}

}  // namespace shardtensor::kernels::host
