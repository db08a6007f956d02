#include "shardtensor/embed/solver_arrays.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

constexpr const char* where = "SolverArrays";

/// Values per cell a session accepts: far above any solver's, far below an overflow.
constexpr Index max_components = Index(1) << 20;

Index largest_extent(const Decomposition& d) {
  Index largest = 0;
  for (int dim = 0; dim < d.ndims(); ++dim) largest = std::max(largest, d.global_extent(dim));
  return largest;
}

const char* side_name(int side) { return side == 0 ? "lower" : "upper"; }

/// The patch facing `rank`'s lower (side 0) or upper (side 1) face along `dim`, or no_neighbor
/// past an open boundary.
int facing_rank(const Decomposition& d, int rank, int dim, int side) {
  Direction direction{0, 0, 0};
  direction[dim] = side == 0 ? -1 : 1;
  return d.neighbor(rank, direction);
}

/// This rank's widths from the description, or the first problem with it.
std::string resolve_widths(const Decomposition& d, int rank, const SolverArrays& a,
                           GhostWidths& ghosts) {
  const int ndims = d.ndims();
  std::ostringstream problem;
  const bool explicit_widths = !a.ghost_lower.empty() || !a.ghost_upper.empty();
  if (a.components < 1 || a.components > max_components) {
    problem << "components " << a.components << " must be 1 to " << max_components;
    return problem.str();
  }
  if (explicit_widths) {
    if (a.ghost_lower.size() != std::size_t(ndims) || a.ghost_upper.size() != std::size_t(ndims)) {
      problem << "ghost_lower has " << a.ghost_lower.size() << " and ghost_upper "
              << a.ghost_upper.size() << " entries for a " << ndims
              << "-axis field (give both, one per axis, or neither)";
      return problem.str();
    }
  } else if (a.ghost_width < 0) {
    problem << "ghost_width " << a.ghost_width << " is negative";
    return problem.str();
  } else if (std::max(a.ghost_width, a.boundary_ghost_width) > largest_extent(d)) {
    problem << (a.ghost_width >= a.boundary_ghost_width ? "ghost_width " : "boundary_ghost_width ")
            << std::max(a.ghost_width, a.boundary_ghost_width)
            << " exceeds the field's largest extent " << largest_extent(d);
    return problem.str();
  } else if (a.boundary_ghost_width < -1) {
    problem << "boundary_ghost_width " << a.boundary_ghost_width
            << " is negative (-1 leaves it unsaid)";
    return problem.str();
  }
  for (int dim = 0; dim < ndims; ++dim)
    for (int side = 0; side < 2; ++side) {
      const int facing = facing_rank(d, rank, dim, side);
      Index width = 0;
      if (explicit_widths) {
        width = side == 0 ? a.ghost_lower[dim] : a.ghost_upper[dim];
        if (width < 0) {
          problem << "ghost_" << side_name(side) << "[" << dim << "] = " << width
                  << " is negative";
          return problem.str();
        }
      } else if (facing != no_neighbor) {
        width = a.ghost_width;
      } else if (a.boundary_ghost_width >= 0) {
        width = a.boundary_ghost_width;
      } else if (a.ghost_width > 0) {
        problem << "ghost_width " << a.ghost_width << " on a field whose axis " << dim
                << " is not periodic: say how many ghost cells the arrays keep past the "
                   "field's edge there with boundary_ghost_width (0 for PETSc's DMDA, "
                << a.ghost_width
                << " where the solver keeps them for its boundary conditions, as AMReX does), "
                   "or give ghost_lower and ghost_upper per axis";
        return problem.str();
      }
      if (facing == no_neighbor) {
        if (width > d.global_extent(dim)) {
          problem << "the " << side_name(side) << " ghost width " << width << " along axis "
                  << dim << " exceeds the field's extent " << d.global_extent(dim);
          return problem.str();
        }
      } else if (width > d.extent(facing, dim)) {
        const Box box = d.box(facing);
        problem << "the " << side_name(side) << " ghost width " << width << " along axis " << dim
                << " exceeds the extent " << d.extent(facing, dim)
                << " of the patch it faces (cells [" << box.lower[dim] << ", "
                << box.upper(dim)
                << ")): a ghost layer must lie within the neighbouring patch";
        return problem.str();
      }
      (side == 0 ? ghosts.lower : ghosts.upper)[dim] = int(width);
    }
  return "";
}

ArrayIndexing indexing_for(const Decomposition& d, int rank, const GhostWidths& ghosts,
                           const SolverArrays& a) {
  Index allocated[max_spatial_dims];
  for (int dim = 0; dim < max_spatial_dims; ++dim)
    allocated[dim] = d.extent(rank, dim) + ghosts.lower[dim] + ghosts.upper[dim];
  ArrayIndexing indexing;
  Index stride = a.components;
  for (int k = 0; k < max_spatial_dims; ++k) {
    const int dim = a.order == ArrayOrder::c ? max_spatial_dims - 1 - k : k;
    indexing.stride[dim] = stride;
    stride *= allocated[dim];
  }
  indexing.span = stride;
  for (int dim = 0; dim < max_spatial_dims; ++dim)
    indexing.first += ghosts.lower[dim] * indexing.stride[dim];
  return indexing;
}

}  // namespace

std::string ResolvedArrays::describe() const {
  std::ostringstream out;
  out << (description.order == ArrayOrder::c ? "C" : "Fortran") << "-order arrays";
  const auto widths = [&](const std::array<int, max_spatial_dims>& w) {
    std::ostringstream s;
    for (int d = 0; d < ndims; ++d) s << (d ? "," : "(") << w[d];
    s << ")";
    return s.str();
  };
  if (ghosts.none())
    out << " without ghost cells";
  else
    out << " with ghost cells lower " << widths(ghosts.lower) << " upper "
        << widths(ghosts.upper) << (ghosts_same_everywhere ? "" : " on this rank");
  if (description.components > 1) out << ", " << description.components << " components per cell";
  return out.str();
}

ResolvedArrays resolve_solver_arrays(const Communicator& comm, const Decomposition& decomposition,
                                     const SolverArrays& arrays) {
  ResolvedArrays resolved;
  resolved.description = arrays;
  resolved.ndims = decomposition.ndims();
  const std::string problem =
      resolve_widths(decomposition, comm.rank(), arrays, resolved.ghosts);
  std::ostringstream message;
  if (!problem.empty()) {
    const Box box = decomposition.box(comm.rank());
    message << where << ": the rank owning cells ";
    for (int d = 0; d < decomposition.ndims(); ++d)
      message << (d ? " x " : "") << "[" << box.lower[d] << ", " << box.upper(d) << ")";
    message << ": " << problem;
  }
  comm.agree(message.str());
  // The kind of description is the solver's, the same everywhere; only exact widths may
  // differ between ranks.
  const bool explicit_widths = !arrays.ghost_lower.empty();
  comm.require_same({static_cast<long long>(arrays.order), arrays.components, explicit_widths,
                     explicit_widths ? 0 : arrays.ghost_width,
                     explicit_widths ? 0 : arrays.boundary_ghost_width},
                    where,
                    "the array description (order, components, per-side widths given, "
                    "ghost_width, boundary_ghost_width)");
  std::vector<long long> mine;
  for (int d = 0; d < max_spatial_dims; ++d) {
    mine.push_back(resolved.ghosts.lower[d]);
    mine.push_back(resolved.ghosts.upper[d]);
  }
  const std::vector<long long> all = comm.allgather(mine);
  resolved.ghosts_same_everywhere = true;
  for (std::size_t i = 0; i < all.size(); ++i)
    resolved.ghosts_same_everywhere =
        resolved.ghosts_same_everywhere && all[i] == mine[i % mine.size()];
  resolved.indexing = indexing_for(decomposition, comm.rank(), resolved.ghosts, arrays);
  return resolved;
}

std::string overlapping_arrays(const std::vector<const void*>& pointers, std::size_t value_bytes,
                               const ResolvedArrays& layout, const char* what, bool writes) {
  struct Entry {
    std::uintptr_t address;
    std::size_t index;
  };
  std::vector<Entry> sorted;
  for (std::size_t i = 0; i < pointers.size(); ++i)
    sorted.push_back({reinterpret_cast<std::uintptr_t>(pointers[i]), i});
  std::sort(sorted.begin(), sorted.end(),
            [](const Entry& a, const Entry& b) { return a.address < b.address; });
  const auto span_bytes = std::uintptr_t(layout.indexing.span) * value_bytes;
  const auto components = std::uintptr_t(layout.description.components);
  for (std::size_t i = 0; i < sorted.size(); ++i)
    for (std::size_t j = i + 1; j < sorted.size(); ++j) {
      const std::uintptr_t apart = sorted[j].address - sorted[i].address;
      if (apart >= span_bytes) break;  // sorted: the later ones lie further away
      const bool same_array_allowed = apart == 0 && !writes;
      const bool components_of_one_cell =
          apart > 0 && apart % value_bytes == 0 && apart / value_bytes < components;
      if (same_array_allowed || components_of_one_cell) continue;
      const std::size_t first = std::min(sorted[i].index, sorted[j].index),
                        second = std::max(sorted[i].index, sorted[j].index);
      std::ostringstream problem;
      problem << what << " arrays " << first << " and " << second << " overlap: they start "
              << apart / value_bytes << " value(s) apart (" << apart
              << " bytes), and each spans " << layout.indexing.span << " values ("
              << layout.describe() << ")";
      if (apart == 0)
        problem << "; one array cannot receive two output channels";
      else if (components == 1)
        problem << "; channels interleaved in one array (u + c) need components set to the "
                   "values per cell";
      return problem.str();
    }
  return "";
}

}  // namespace shardtensor
