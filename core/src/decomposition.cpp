#include "shardtensor/core/decomposition.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

std::string join(const std::vector<Index>& values, const char* separator = "x") {
  std::ostringstream os;
  for (std::size_t i = 0; i < values.size(); ++i) os << (i ? separator : "") << values[i];
  return os.str();
}

std::string join(const std::vector<int>& values, const char* separator = "x") {
  return join(std::vector<Index>(values.begin(), values.end()), separator);
}

void check_ndims(std::size_t ndims, const char* where) {
  SHARDTENSOR_REQUIRE(ndims >= 1 && ndims <= max_spatial_dims, where,
                      "a field has 1 to " << max_spatial_dims << " spatial dims, got " << ndims);
}

std::vector<bool> normalized_periodic(std::vector<bool> periodic, std::size_t ndims,
                                      const char* where) {
  if (periodic.empty()) periodic.assign(ndims, false);
  SHARDTENSOR_REQUIRE(
      periodic.size() == ndims, where,
      "periodic flags for " << periodic.size() << " dims given for a " << ndims << "-D field");
  return periodic;
}

}  // namespace

std::vector<Index> balanced_split_points(Index extent, int parts) {
  std::vector<Index> points(parts + 1);
  const Index base = extent / parts;
  const Index remainder = extent % parts;
  for (int i = 0; i <= parts; ++i) points[i] = i * base + std::min<Index>(i, remainder);
  return points;
}

std::vector<int> choose_process_grid(const std::vector<Index>& global_extent, int nranks,
                                     const std::vector<int>& fixed_grid) {
  constexpr const char* where = "choose_process_grid";
  check_ndims(global_extent.size(), where);
  SHARDTENSOR_REQUIRE(nranks >= 1, where, "rank count must be positive, got " << nranks);
  const int ndims = static_cast<int>(global_extent.size());
  std::vector<int> fixed = fixed_grid;
  if (fixed.empty()) fixed.assign(ndims, 0);
  SHARDTENSOR_REQUIRE(static_cast<int>(fixed.size()) == ndims, where,
                      "fixed grid " << join(fixed) << " has " << fixed.size() << " dims, the field "
                                    << join(global_extent) << " has " << ndims);

  std::vector<int> best;
  double best_cut = std::numeric_limits<double>::infinity();
  std::vector<int> grid(ndims, 1);
  // Depth-first over the factorizations of nranks into ndims factors.
  std::function<void(int, int)> visit = [&](int dim, int remaining) {
    if (dim == ndims - 1) {
      if (remaining > global_extent[dim] || (fixed[dim] > 0 && remaining != fixed[dim])) return;
      grid[dim] = remaining;
      double cut = 0.0;  // total area of the cut planes, in cells
      for (int d = 0; d < ndims; ++d) {
        double face = 1.0;
        for (int e = 0; e < ndims; ++e)
          if (e != d) face *= static_cast<double>(global_extent[e]);
        cut += (grid[d] - 1) * face;
      }
      // Enumeration puts larger factors on earlier axes first: strict '<' keeps them on ties.
      if (cut < best_cut) {
        best_cut = cut;
        best = grid;
      }
      return;
    }
    for (int p = remaining; p >= 1; --p) {
      if (remaining % p != 0 || p > global_extent[dim] || (fixed[dim] > 0 && p != fixed[dim]))
        continue;
      grid[dim] = p;
      visit(dim + 1, remaining / p);
    }
  };
  visit(0, nranks);
  SHARDTENSOR_REQUIRE(!best.empty(), where,
                      "cannot split a "
                          << join(global_extent) << " field over " << nranks << " ranks"
                          << (fixed_grid.empty() ? std::string()
                                                 : " with grid " + join(fixed) + " (0 = free)")
                          << ": more ranks than cells along the dims, or the "
                             "fixed counts do not divide the rank count");
  return best;
}

Decomposition::Decomposition(std::vector<Index> global_extent, std::vector<int> process_grid,
                             std::vector<bool> periodic) {
  constexpr const char* where = "Decomposition";
  check_ndims(global_extent.size(), where);
  SHARDTENSOR_REQUIRE(process_grid.size() == global_extent.size(), where,
                      "process grid " << join(process_grid) << " has " << process_grid.size()
                                      << " dims but the field " << join(global_extent) << " has "
                                      << global_extent.size());
  std::vector<std::vector<Index>> points;
  for (std::size_t d = 0; d < global_extent.size(); ++d) {
    SHARDTENSOR_REQUIRE(
        global_extent[d] >= 1, where,
        "global extent " << global_extent[d] << " in dim " << d << " must be positive");
    SHARDTENSOR_REQUIRE(process_grid[d] >= 1, where,
                        "process grid " << join(process_grid) << " has " << process_grid[d]
                                        << " ranks in dim " << d);
    SHARDTENSOR_REQUIRE(process_grid[d] <= global_extent[d], where,
                        "more ranks than cells: " << process_grid[d] << " ranks along dim " << d
                                                  << " of extent " << global_extent[d] << " (field "
                                                  << join(global_extent) << ")");
    points.push_back(balanced_split_points(global_extent[d], process_grid[d]));
  }
  *this = Decomposition(from_points_tag{}, std::move(points), std::move(periodic));
}

Decomposition Decomposition::from_split_points(std::vector<std::vector<Index>> split_points,
                                               std::vector<bool> periodic) {
  return Decomposition(from_points_tag{}, std::move(split_points), std::move(periodic));
}

Decomposition Decomposition::automatic(std::vector<Index> global_extent, int nranks,
                                       std::vector<bool> periodic, std::vector<int> fixed_grid) {
  std::vector<int> grid = choose_process_grid(global_extent, nranks, fixed_grid);
  return Decomposition(std::move(global_extent), std::move(grid), std::move(periodic));
}

Decomposition::Decomposition(from_points_tag, std::vector<std::vector<Index>> split_points,
                             std::vector<bool> periodic) {
  constexpr const char* where = "Decomposition";
  check_ndims(split_points.size(), where);
  ndims_ = static_cast<int>(split_points.size());
  periodic_ = normalized_periodic(std::move(periodic), split_points.size(), where);
  nranks_ = 1;
  for (int d = 0; d < ndims_; ++d) {
    const std::vector<Index>& p = split_points[d];
    SHARDTENSOR_REQUIRE(p.size() >= 2, where,
                        "split points of dim " << d << " need at least {0, extent}, got "
                                               << p.size() << " value(s)");
    SHARDTENSOR_REQUIRE(p.front() == 0, where,
                        "split points of dim " << d << " must start at 0, got " << join(p, ","));
    for (std::size_t i = 1; i < p.size(); ++i) {
      SHARDTENSOR_REQUIRE(p[i] > p[i - 1], where,
                          "split points of dim " << d << " must increase strictly, got "
                                                 << join(p, ",") << " (a rank would own no cells)");
    }
    process_grid_.push_back(static_cast<int>(p.size() - 1));
    nranks_ *= process_grid_.back();
  }
  split_points_ = std::move(split_points);
}

const std::vector<Index>& Decomposition::split_points(int dim) const {
  SHARDTENSOR_REQUIRE(dim >= 0 && dim < ndims_, "Decomposition::split_points",
                      "dim " << dim << " of a " << ndims_ << "-D decomposition");
  return split_points_[dim];
}

SpatialIndex Decomposition::global_extents() const {
  SpatialIndex out{1, 1, 1};
  for (int d = 0; d < ndims_; ++d) out[d] = global_extent(d);
  return out;
}

Index Decomposition::global_cells() const {
  const SpatialIndex e = global_extents();
  return e[0] * e[1] * e[2];
}

void Decomposition::check_rank(int rank, const char* where) const {
  SHARDTENSOR_REQUIRE(rank >= 0 && rank < nranks_, where,
                      "rank " << rank << " is outside a decomposition of " << nranks_ << " ranks");
}

std::array<int, max_spatial_dims> Decomposition::coords_of(int rank) const {
  check_rank(rank, "Decomposition::coords_of");
  std::array<int, max_spatial_dims> coords{0, 0, 0};
  for (int d = ndims_ - 1; d >= 0; --d) {
    coords[d] = rank % process_grid_[d];
    rank /= process_grid_[d];
  }
  return coords;
}

int Decomposition::rank_of(const std::array<int, max_spatial_dims>& coords) const {
  int rank = 0;
  for (int d = 0; d < ndims_; ++d) {
    SHARDTENSOR_REQUIRE(coords[d] >= 0 && coords[d] < process_grid_[d], "Decomposition::rank_of",
                        "coordinate " << coords[d] << " outside the process grid "
                                      << join(process_grid_) << " (dim " << d << ")");
    rank = rank * process_grid_[d] + coords[d];
  }
  return rank;
}

Index Decomposition::offset(int rank, int dim) const {
  if (dim >= ndims_) return 0;
  return split_points_[dim][coords_of(rank)[dim]];
}

Index Decomposition::extent(int rank, int dim) const {
  if (dim >= ndims_) return 1;
  const int c = coords_of(rank)[dim];
  return split_points_[dim][c + 1] - split_points_[dim][c];
}

Box Decomposition::box(int rank) const {
  Box b;
  for (int d = 0; d < max_spatial_dims; ++d) {
    b.lower[d] = offset(rank, d);
    b.extent[d] = extent(rank, d);
  }
  return b;
}

int Decomposition::neighbor(int rank, const Direction& direction) const {
  std::array<int, max_spatial_dims> coords = coords_of(rank);
  for (int d = 0; d < max_spatial_dims; ++d) {
    if (direction[d] == 0) continue;
    if (d >= ndims_) return no_neighbor;
    int c = coords[d] + direction[d];
    if (c < 0 || c >= process_grid_[d]) {
      if (!periodic_[d]) return no_neighbor;
      c = (c % process_grid_[d] + process_grid_[d]) % process_grid_[d];
    }
    coords[d] = c;
  }
  return rank_of(coords);
}

int Decomposition::owner(const SpatialIndex& global_cell) const {
  std::array<int, max_spatial_dims> coords{0, 0, 0};
  for (int d = 0; d < ndims_; ++d) {
    const std::vector<Index>& p = split_points_[d];
    SHARDTENSOR_REQUIRE(global_cell[d] >= 0 && global_cell[d] < p.back(), "Decomposition::owner",
                        "cell index " << global_cell[d] << " outside the field extent " << p.back()
                                      << " (dim " << d << ")");
    coords[d] =
        static_cast<int>(std::upper_bound(p.begin(), p.end(), global_cell[d]) - p.begin() - 1);
  }
  return rank_of(coords);
}

std::string Decomposition::describe() const {
  std::vector<Index> extents;
  for (int d = 0; d < ndims_; ++d) extents.push_back(global_extent(d));
  std::ostringstream os;
  os << join(extents) << " cells on a " << join(process_grid_) << " process grid";
  static const char axis_names[] = {'x', 'y', 'z'};
  // The split points of the split axes: two layouts of one global size differ only there.
  std::string splits;
  for (int d = 0; d < ndims_; ++d)
    if (process_grid_[d] > 1)
      splits += std::string(splits.empty() ? "" : ", ") + axis_names[d] + " at " +
                join(split_points_[d], ",");
  if (!splits.empty()) os << " (split " << splits << ")";
  std::string periodic_axes;
  for (int d = 0; d < ndims_; ++d)
    if (periodic_[d]) periodic_axes += axis_names[d];
  if (!periodic_axes.empty()) os << ", periodic " << periodic_axes;
  return os.str();
}

bool operator==(const Decomposition& a, const Decomposition& b) {
  return a.split_points_ == b.split_points_ && a.periodic_ == b.periodic_;
}

}  // namespace shardtensor
