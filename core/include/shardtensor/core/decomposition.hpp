#pragma once
// Decomposition: how a global 1-3-D field is split over a process grid.

#include <array>
#include <string>
#include <vector>

#include "shardtensor/core/box.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// Offsets of a direction vector: each component is -1, 0 or +1.
using Direction = std::array<int, max_spatial_dims>;

/// Value returned by Decomposition::neighbor() past an open (non-periodic) boundary.
inline constexpr int no_neighbor = -1;

/// The global spatial extents of a field, a process grid over them, the split points
/// along each axis and which axes are periodic.
///
/// Ranks are numbered row-major over the process grid (the last axis varies fastest),
/// the order MPI_Cart_create uses without reordering. Everything here is computed
/// locally: any rank can ask for any other rank's offsets, extents and neighbours.
/// Every rank builds the same Decomposition, so checks made here fail on all ranks alike.
class Decomposition {
 public:
  /// Balanced split: along axis d, each of the process_grid[d] parts gets
  /// global_extent[d] / process_grid[d] cells, the first (global_extent[d] % process_grid[d])
  /// parts one more. `periodic` may be empty (no periodic axis).
  Decomposition(std::vector<Index> global_extent, std::vector<int> process_grid,
                std::vector<bool> periodic = {});

  /// Explicit split: split_points[d] = {0, s_1, ..., global_extent[d]}, strictly increasing;
  /// part i along axis d covers [s_i, s_{i+1}).
  static Decomposition from_split_points(std::vector<std::vector<Index>> split_points,
                                         std::vector<bool> periodic = {});

  /// Balanced split over a process grid chosen for `nranks` (see choose_process_grid);
  /// positive entries of `fixed_grid` pin the process count of that axis, 0 leaves it free.
  static Decomposition automatic(std::vector<Index> global_extent, int nranks,
                                 std::vector<bool> periodic = {}, std::vector<int> fixed_grid = {});

  int ndims() const { return ndims_; }
  int nranks() const { return nranks_; }
  /// Cells of the whole field along `dim` (1 past ndims()).
  Index global_extent(int dim) const { return dim < ndims_ ? split_points_[dim].back() : 1; }
  SpatialIndex global_extents() const;
  Index global_cells() const;
  int process_grid(int dim) const { return dim < ndims_ ? process_grid_[dim] : 1; }
  const std::vector<int>& process_grid() const { return process_grid_; }
  bool periodic(int dim) const { return dim < ndims_ && periodic_[dim]; }
  /// {0, s_1, ..., global_extent(dim)}; dim must be below ndims().
  const std::vector<Index>& split_points(int dim) const;

  /// Position of `rank` in the process grid (axes past ndims() are 0).
  std::array<int, max_spatial_dims> coords_of(int rank) const;
  /// Rank at `coords`; every coordinate must lie inside the grid.
  int rank_of(const std::array<int, max_spatial_dims>& coords) const;

  /// First global cell of `rank` along `dim`.
  Index offset(int rank, int dim) const;
  /// Number of cells `rank` owns along `dim` (1 for axes past ndims()).
  Index extent(int rank, int dim) const;
  /// The global cells `rank` owns.
  Box box(int rank) const;

  /// Rank at coords_of(rank) + direction, wrapping periodic axes; no_neighbor past an open
  /// boundary. May return `rank` itself on a periodic axis with one process.
  int neighbor(int rank, const Direction& direction) const;

  /// Rank owning the global cell (which must lie inside the field).
  int owner(const SpatialIndex& global_cell) const;

  /// "128x64x64 cells on a 2x1x1 grid, periodic x" style summary.
  std::string describe() const;

  friend bool operator==(const Decomposition& a, const Decomposition& b);
  friend bool operator!=(const Decomposition& a, const Decomposition& b) { return !(a == b); }

 private:
  struct from_points_tag {};
  Decomposition(from_points_tag, std::vector<std::vector<Index>> split_points,
                std::vector<bool> periodic);
  void check_rank(int rank, const char* where) const;

  int ndims_ = 0;
  int nranks_ = 0;
  std::vector<int> process_grid_;
  std::vector<bool> periodic_;
  std::vector<std::vector<Index>> split_points_;
};

/// Factors `nranks` into one process count per axis (at most the extent along each axis)
/// so that the total area of the cuts, and so the halo traffic, is smallest; ties go to
/// splitting earlier (slower-varying) axes, whose faces are contiguous in memory.
/// Positive entries of `fixed_grid` (like MPI_Dims_create's nonzero dims) are kept as given.
/// Throws if no factorization fits (e.g. more ranks than cells).
std::vector<int> choose_process_grid(const std::vector<Index>& global_extent, int nranks,
                                     const std::vector<int>& fixed_grid = {});

/// Split points of a balanced split of `extent` cells into `parts`.
std::vector<Index> balanced_split_points(Index extent, int parts);

}  // namespace shardtensor
