#pragma once
// SolverArrays: how a solver's own arrays hold its patch (memory order, ghost cells per side,
// interleaved components), and the per-rank indexing that description resolves to, checked
// against the patches of every rank so that a wrong description fails instead of reading past
// an array.

#include <optional>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/core/ghost_widths.hpp"

namespace shardtensor {

/// Memory order of the solver's arrays: C (last index fastest) or Fortran (first fastest).
enum class ArrayOrder { c, fortran };

/// Every array handed to a session holds this rank's patch plus ghost cells, in `order`, the
/// same layout for inputs, targets and outputs. Axes are the patch's (SolverPatch).
///
/// Ghost cells, three ways:
///  - `ghost_width` on every side that faces another patch (a periodic wrap included), and
///    `boundary_ghost_width` past the field's edge on non-periodic axes: AMReX and most
///    hand-written codes keep ghost cells there too (boundary conditions fill them), PETSc's
///    DMDA has none. It must be said (>= 0) whenever ghost_width > 0 and an axis is not
///    periodic: a wrong guess would read past the solver's arrays.
///  - `ghost_lower` / `ghost_upper`: this rank's exact widths per axis (both or neither),
///    which may differ between ranks (a DMDA's corner rank: 0 below, 1 above). They replace
///    the two widths above.
/// A ghost layer on a side that faces a patch must lie within that patch (at most its extent
/// along the axis), as every solver's halo exchange needs.
///
/// `components`: values per cell in every array, the component fastest (PETSc's dof, any
/// array of structures: u[y][x][c] in C, u(c, x, y) in Fortran). Each channel is then passed
/// as a pointer to its component in the cell (u + c), so one array may serve several
/// channels, or several arrays one each.
struct SolverArrays {
  ArrayOrder order = ArrayOrder::c;
  Index ghost_width = 0;
  Index boundary_ghost_width = -1;  ///< -1: not said (an error where it matters)
  std::vector<Index> ghost_lower, ghost_upper;
  Index components = 1;
};

/// Where the values of one array lie: strides (in values) along each axis and the index of
/// the first owned cell, for this rank's layout.
struct ArrayIndexing {
  Index stride[max_spatial_dims] = {0, 0, 0};
  Index first = 0;  ///< index of owned cell (0, 0, 0)
  Index span = 0;   ///< values from the array's first to its last, plus one (all cells)

  Index at(Index i, Index j, Index k) const {
    return first + i * stride[0] + j * stride[1] + k * stride[2];
  }
};

/// A SolverArrays description resolved for one rank of a decomposition.
struct ResolvedArrays {
  SolverArrays description;
  int ndims = 0;
  GhostWidths ghosts;              ///< this rank's widths (axes past ndims are 0)
  bool ghosts_same_everywhere = false;  ///< every rank has `ghosts` (a field may wrap them)
  ArrayIndexing indexing;

  /// "C-order arrays, ghost cells lower (1,0) upper (1,1), 2 components per cell"
  std::string describe() const;
};

/// Checks `arrays` against the patches of `decomposition` (the session's communicator,
/// ranks numbered as the decomposition's) and resolves this rank's layout. Widths out of
/// range, a ghost layer beyond the neighbour's patch, an unsaid boundary width or
/// descriptions that differ in kind between ranks throw Error on every rank, naming the rank,
/// the axis and the values. Collective.
ResolvedArrays resolve_solver_arrays(const Communicator& comm, const Decomposition& decomposition,
                                     const SolverArrays& arrays);

/// What is wrong with `pointers`, a list of `what` arrays laid out as `layout` ("" if
/// nothing): two arrays whose cells overlap in memory other than as components of one cell
/// (the same array passed twice is allowed for inputs, `writes` false). Local.
std::string overlapping_arrays(const std::vector<const void*>& pointers, std::size_t value_bytes,
                               const ResolvedArrays& layout, const char* what, bool writes);

}  // namespace shardtensor
