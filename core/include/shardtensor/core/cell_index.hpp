#pragma once
// CellIndex: the (batch, channel, x, y, z) position of a flat C-order index, for kernels that
// run one work item per cell of a field.

#include <Kokkos_Core.hpp>
#include <cstdint>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

struct CellIndex {
  Index n, c, x, y, z;
};

namespace impl {
/// flat % extent, and flat /= extent. An extent of 1 (a 2-D field's z, a line's across
/// extents) divides by nothing, and a quotient that fits 32 bits is taken in 32 bits: a
/// 64-bit division costs several times a 32-bit one on x86 and is emulated on GPUs, and the
/// divisions were most of a short line's work (the main job's padded copies).
KOKKOS_INLINE_FUNCTION Index take_remainder(Index& flat, Index extent) {
  if (extent == 1) return 0;
  Index remainder;
  if (flat <= Index(0xffffffff) && extent <= Index(0xffffffff)) {
    const auto f = static_cast<std::uint32_t>(flat), e = static_cast<std::uint32_t>(extent);
    remainder = Index(f % e);
    flat = Index(f / e);
  } else {
    remainder = flat % extent;
    flat /= extent;
  }
  return remainder;
}
}  // namespace impl

/// Position of `flat` in a (batch, channels, nx, ny, nz) array in C order.
KOKKOS_INLINE_FUNCTION CellIndex unflatten(Index flat, Index channels, Index nx, Index ny,
                                           Index nz) {
  CellIndex i;
  i.z = impl::take_remainder(flat, nz);
  i.y = impl::take_remainder(flat, ny);
  i.x = impl::take_remainder(flat, nx);
  i.c = impl::take_remainder(flat, channels);
  i.n = flat;
  return i;
}

/// The lines of a (batch, channels, extents...) index space along its innermost axis longer
/// than one cell (z in 3-D, y in 2-D, x in 1-D): kernels run one work item per line and walk
/// the line in order. One index decomposition per line instead of per cell (a 2-D field's z
/// lines are single cells: per-cell decompositions, four integer divisions each, would cost
/// more than most kernels' work).
struct Lines {
  int axis = 2;                 // the axis the lines run along
  Index length = 1;             // cells per line
  Index count = 0;              // lines
  Index channels = 1;           // of the index space
  Index across[3] = {1, 1, 1};  // the extents with the line axis taken out (1)

  Lines(Index batch, Index channels_, const Index (&extents)[3]) : channels(channels_) {
    axis = extents[2] > 1 ? 2 : extents[1] > 1 ? 1 : 0;
    length = extents[axis];
    for (int a = 0; a < 3; ++a) across[a] = a == axis ? 1 : extents[a];
    count = batch * channels * across[0] * across[1] * across[2];
  }
  /// The first cell of line `line`.
  KOKKOS_INLINE_FUNCTION CellIndex start(Index line) const {
    return unflatten(line, channels, across[0], across[1], across[2]);
  }
  /// Moves `at`, the first cell of a line, to the first cell of the next line: no division.
  KOKKOS_INLINE_FUNCTION void advance(CellIndex& at) const {
    if (++at.z < across[2]) return;
    at.z = 0;
    if (++at.y < across[1]) return;
    at.y = 0;
    if (++at.x < across[0]) return;
    at.x = 0;
    if (++at.c < channels) return;
    at.c = 0;
    ++at.n;
  }
  /// Lines per work item for kernels whose lines are short: on the host, enough lines for
  /// about `cells` cells (a work item's index decomposition and loop set-up cost as much as
  /// a short line's work); on a GPU one line, every line its own thread.
  Index lines_per_item(Index cells = 512) const {
    if constexpr (!kernels_run_on_host) return 1;
    return length >= cells ? 1 : cells / length;
  }
};

/// Calls line(start) with the first cell of every line of `lines`, in parallel on `space`:
/// several short lines to a host work item (Lines::lines_per_item), in order within it. For
/// kernels that set up per line what each cell reuses (row pointers, strides).
template <class LineOp>
void for_each_line(const ExecutionSpace& space, const char* label, const Lines& lines,
                   const LineOp& line) {
  const Index per_item = lines.lines_per_item(), count = lines.count;
  Kokkos::parallel_for(
      label, kernel_range(space, (count + per_item - 1) / per_item),
      KOKKOS_LAMBDA(const Index item) {
        const Index end = (item + 1) * per_item, last = end < count ? end : count;
        CellIndex at = lines.start(item * per_item);
        for (Index l = item * per_item; l < last; ++l, lines.advance(at)) line(at);
      });
}

/// Calls cell(n, c, x, y, z) for every cell of a (batch, channels, extents...) index space, in
/// parallel on `space`: on a host over its Lines, in order along each line; on a GPU one cell
/// per work item, neighbouring items on neighbouring cells of a line (a line per thread put
/// neighbouring threads a line apart: every load its own memory transaction).
template <class CellOp>
void for_each_cell_by_lines(const ExecutionSpace& space, const char* label, Index batch,
                            Index channels, const Index (&extents)[3], const CellOp& cell) {
  if constexpr (!kernels_run_on_host) {
    const Index nx = extents[0], ny = extents[1], nz = extents[2];
    Kokkos::parallel_for(
        label, kernel_range(space, batch * channels * nx * ny * nz),
        KOKKOS_LAMBDA(const Index flat) {
          const CellIndex at = unflatten(flat, channels, nx, ny, nz);
          cell(at.n, at.c, at.x, at.y, at.z);
        });
    return;
  }
  const Lines lines(batch, channels, extents);
  const Index length = lines.length;  // locals: loop bounds the compiler can keep in registers
  const int axis = lines.axis;
  Kokkos::parallel_for(
      label, kernel_range(space, lines.count), KOKKOS_LAMBDA(const Index line) {
        const CellIndex start = lines.start(line);
        // One loop per line axis, the coordinates as values: an array written at a run-time
        // index and read back as a wider load stalled every cell on store forwarding.
        if (axis == 2) {
          for (Index i = 0; i < length; ++i) cell(start.n, start.c, start.x, start.y, i);
        } else if (axis == 1) {
          for (Index i = 0; i < length; ++i) cell(start.n, start.c, start.x, i, start.z);
        } else {
          for (Index i = 0; i < length; ++i) cell(start.n, start.c, i, start.y, start.z);
        }
      });
}

}  // namespace shardtensor
