#pragma once
// A source row's cells past its ends, for the host kernels that read them (conv_vector.cpp's
// ring copies, conv_winograd.cpp's transforms): zeros, or around a periodic extent the cells
// an extent away.

#include <algorithm>

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

/// to[z] = cell(shift + z) for z < width, of a row of `extent` cells: its own cells in one run
/// (cells(first, count, to) writes `count` from cell `first`), around them zeros, or with
/// `wrap` cell(i) of the cells an extent away.
template <class Out, class Cell, class Cells>
void copy_padded_row(Out* to, Index width, Index shift, Index extent, bool wrap, const Cell& cell,
                     const Cells& cells) {
  const Index z0 = std::clamp<Index>(-shift, 0, width),
              z1 = std::clamp<Index>(extent - shift, z0, width);
  if (wrap) {
    for (Index z = 0; z < z0; ++z) to[z] = cell(wrapped(shift + z, extent));
    for (Index z = z1; z < width; ++z) to[z] = cell(wrapped(shift + z, extent));
  } else {
    std::fill(to, to + z0, Out(0));
    std::fill(to + z1, to + width, Out(0));
  }
  cells(shift + z0, z1 - z0, to + z0);
}

}  // namespace shardtensor::kernels::host
