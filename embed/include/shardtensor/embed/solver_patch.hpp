#pragma once
// SolverPatch: a simulation code's own description of its domain decomposition (the global
// field, this rank's offset and extent), and the Decomposition the patches of all ranks form.

#include <mpi.h>

#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/decomposition.hpp"

namespace shardtensor {

/// This rank's patch of the solver's global field. Axes are listed in the order the solver
/// indexes its arrays (u[x][y][z] in C, u(x, y, z) in Fortran): axis 0 first.
struct SolverPatch {
  std::vector<Index> global_extent;  ///< cells of the whole field per axis (1 to 3 axes)
  std::vector<Index> offset;         ///< first cell this rank owns, per axis
  std::vector<Index> extent;         ///< cells this rank owns, per axis
  std::vector<bool> periodic;        ///< per axis; empty: no periodic axis

  /// The patch of this rank in an MPI Cartesian communicator (MPI_Cart_create) that splits
  /// `global_extent` evenly, the first (extent % dims) ranks along an axis one cell larger;
  /// the periodic flags are the communicator's.
  static SolverPatch cartesian(MPI_Comm cartesian_comm, std::vector<Index> global_extent);
};

/// The solver's patches as a Decomposition, and where this rank sits in it.
struct SolverGrid {
  Decomposition decomposition;
  int grid_rank = 0;  ///< this rank's number in `decomposition` (row-major over the grid)
};

/// Gathers every rank's patch over `comm` and checks that together they tile the global
/// field as a process grid: the same global extent and periodic flags everywhere, each patch
/// inside the field and non-empty, no two patches overlapping, no cell left out, patches
/// lined up in rows (a tensor-product split). Any violation throws Error on every rank,
/// naming the ranks and cells concerned. Collective over `comm`.
SolverGrid solver_grid(const Communicator& comm, const SolverPatch& patch);

}  // namespace shardtensor
