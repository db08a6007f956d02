#include "shardtensor/embed/solver_patch.hpp"

#include <algorithm>
#include <sstream>

#include "shardtensor/comm/environment.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

constexpr const char* where = "SolverPatch";

/// A patch in the form every rank can check: offsets and extents on three axes.
struct GatheredPatch {
  int rank = 0;
  Box box;
};

std::string describe_box(const Box& box, int ndims) {
  std::ostringstream out;
  for (int d = 0; d < ndims; ++d)
    out << (d ? " x " : "") << "[" << box.lower[d] << ", " << box.upper(d) << ")";
  return out.str();
}

std::string local_problem(const SolverPatch& p) {
  std::ostringstream out;
  const std::size_t n = p.global_extent.size();
  if (n < 1 || n > std::size_t(max_spatial_dims)) {
    out << "the global field has " << n << " axes; 1 to 3 are supported";
  } else if (p.offset.size() != n || p.extent.size() != n) {
    out << "offset has " << p.offset.size() << " and extent " << p.extent.size()
        << " entries for a " << n << "-axis field";
  } else if (!p.periodic.empty() && p.periodic.size() != n) {
    out << "periodic has " << p.periodic.size() << " entries for a " << n << "-axis field";
  } else {
    for (std::size_t d = 0; d < n && out.tellp() == 0; ++d) {
      if (p.global_extent[d] < 1)
        out << "global extent " << p.global_extent[d] << " along axis " << d;
      else if (p.extent[d] < 1)
        out << "the patch has extent " << p.extent[d] << " along axis " << d
            << " (every rank must own cells)";
      else if (p.offset[d] < 0 || p.offset[d] + p.extent[d] > p.global_extent[d])
        out << "the patch [" << p.offset[d] << ", " << p.offset[d] + p.extent[d] << ") along axis "
            << d << " lies outside the field [0, " << p.global_extent[d] << ")";
    }
  }
  return out.str();
}

}  // namespace

SolverPatch SolverPatch::cartesian(MPI_Comm cartesian_comm, std::vector<Index> global_extent) {
  const std::optional<CartesianLayout> layout = cartesian_layout(cartesian_comm);
  SHARDTENSOR_REQUIRE(
      layout, "SolverPatch::cartesian",
      "the communicator has no Cartesian topology (create it with MPI_Cart_create)");
  const int ndims = int(layout->dims.size());
  SHARDTENSOR_REQUIRE(ndims == int(global_extent.size()), "SolverPatch::cartesian",
                      "the Cartesian communicator has " << ndims << " dims, the field "
                                                        << global_extent.size() << " axes");
  const std::vector<int>&dims = layout->dims, &periods = layout->periods, &coords = layout->coords;
  SolverPatch patch;
  patch.global_extent = global_extent;
  for (int d = 0; d < ndims; ++d) {
    SHARDTENSOR_REQUIRE(
        global_extent[d] >= dims[d], "SolverPatch::cartesian",
        "axis " << d << " has " << global_extent[d] << " cells for " << dims[d] << " ranks");
    const std::vector<Index> points = balanced_split_points(global_extent[d], dims[d]);
    patch.offset.push_back(points[coords[d]]);
    patch.extent.push_back(points[coords[d] + 1] - points[coords[d]]);
    patch.periodic.push_back(periods[d] != 0);
  }
  return patch;
}

SolverGrid solver_grid(const Communicator& comm, const SolverPatch& patch) {
  const std::string problem = local_problem(patch);
  comm.agree(problem.empty()
                 ? ""
                 : std::string(where) + ": rank " + std::to_string(comm.rank()) + ": " + problem);
  const int ndims = int(patch.global_extent.size());
  std::vector<long long> shape(patch.global_extent.begin(), patch.global_extent.end());
  for (int d = 0; d < ndims; ++d) shape.push_back(!patch.periodic.empty() && patch.periodic[d]);
  comm.require_same(shape, where, "the global extent and periodic flags");

  // Every rank gathers every patch, so the checks below fail on all ranks alike.
  std::vector<long long> mine(2 * max_spatial_dims, 0), all;
  for (int d = 0; d < max_spatial_dims; ++d) {
    mine[d] = d < ndims ? patch.offset[d] : 0;
    mine[max_spatial_dims + d] = d < ndims ? patch.extent[d] : 1;
  }
  all = comm.allgather(mine);
  std::vector<GatheredPatch> patches(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    patches[r].rank = r;
    for (int d = 0; d < max_spatial_dims; ++d) {
      patches[r].box.lower[d] = all[2 * max_spatial_dims * r + d];
      patches[r].box.extent[d] = all[2 * max_spatial_dims * r + max_spatial_dims + d];
    }
  }

  // Split points per axis: the patches' offsets. The patches form a process grid when each
  // spans exactly one interval on every axis and each block of the grid has one patch.
  std::vector<std::vector<Index>> points(ndims);
  std::vector<int> grid(ndims);
  Index blocks = 1;
  for (int d = 0; d < ndims; ++d) {
    for (const GatheredPatch& p : patches) points[d].push_back(p.box.lower[d]);
    points[d].push_back(patch.global_extent[d]);
    std::sort(points[d].begin(), points[d].end());
    points[d].erase(std::unique(points[d].begin(), points[d].end()), points[d].end());
    grid[d] = int(points[d].size()) - 1;
    blocks *= grid[d];
  }
  std::vector<int> holder(blocks <= Index(comm.size()) ? blocks : 0, -1);  // block -> rank
  std::vector<int> grid_rank_of(comm.size(), -1);
  const GatheredPatch* misaligned = nullptr;
  int misaligned_axis = 0;
  bool tiles = blocks == Index(comm.size());
  for (int d = 0; d < ndims; ++d) tiles = tiles && points[d].front() == 0;
  for (const GatheredPatch& p : patches) {
    Index block = 0;
    for (int d = 0; d < ndims && tiles; ++d) {
      const Index i =
          std::lower_bound(points[d].begin(), points[d].end(), p.box.lower[d]) - points[d].begin();
      if (points[d][i + 1] != p.box.upper(d)) {
        tiles = false;
        misaligned = &p;
        misaligned_axis = d;
      }
      block = block * grid[d] + i;
    }
    if (!tiles) break;
    if (holder[block] >= 0)
      tiles = false;
    else
      holder[block] = p.rank, grid_rank_of[p.rank] = int(block);
  }
  if (!tiles) {
    // Say why, naming ranks and cells. Only on failure: the pairwise scan costs O(P^2).
    for (const GatheredPatch& p : patches)
      for (const GatheredPatch& q : patches)
        if (q.rank > p.rank && !intersect(p.box, q.box).empty())
          SHARDTENSOR_FAIL(where, "the patches of ranks "
                                      << p.rank << " and " << q.rank
                                      << " overlap: " << describe_box(p.box, ndims) << " and "
                                      << describe_box(q.box, ndims));
    for (int d = 0; d < ndims; ++d)
      SHARDTENSOR_REQUIRE(points[d].front() == 0, where,
                          "no rank holds cells [0, " << points[d].front() << ") along axis " << d
                                                     << ": the patches do not cover the field");
    if (misaligned)
      SHARDTENSOR_FAIL(where, "rank " << misaligned->rank << "'s patch "
                                      << describe_box(misaligned->box, ndims) << " ends at "
                                      << misaligned->box.upper(misaligned_axis) << " along axis "
                                      << misaligned_axis
                                      << ", where no other patch starts: cells are missing "
                                         "there, or the patches do not form a process grid "
                                         "(every row of patches split at the same points)");
    SHARDTENSOR_FAIL(where, "the patches split the field into "
                                << blocks << " blocks for " << comm.size()
                                << " ranks: cells are missing or the patches do not form a "
                                   "process grid");
  }
  std::vector<bool> periodic(ndims, false);
  for (int d = 0; d < ndims && !patch.periodic.empty(); ++d) periodic[d] = patch.periodic[d];
  return SolverGrid{Decomposition::from_split_points(points, periodic), grid_rank_of[comm.rank()]};
}

}  // namespace shardtensor
