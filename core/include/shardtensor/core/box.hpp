#pragma once
// Box: an axis-aligned block of cells in the (global or local) spatial index space.

#include <algorithm>
#include <ostream>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// The cells lower[d] <= i < lower[d] + extent[d] in each of the three spatial axes.
struct Box {
  SpatialIndex lower{0, 0, 0};
  SpatialIndex extent{0, 0, 0};

  Index size() const { return extent[0] * extent[1] * extent[2]; }
  bool empty() const { return size() == 0; }
  Index upper(int dim) const { return lower[dim] + extent[dim]; }

  bool contains(const SpatialIndex& cell) const {
    for (int d = 0; d < max_spatial_dims; ++d) {
      if (cell[d] < lower[d] || cell[d] >= upper(d)) return false;
    }
    return true;
  }

  /// The same cells, with every lower corner moved by `delta`.
  Box shifted(const SpatialIndex& delta) const {
    Box moved = *this;
    for (int d = 0; d < max_spatial_dims; ++d) moved.lower[d] += delta[d];
    return moved;
  }

  friend bool operator==(const Box& a, const Box& b) {
    return a.lower == b.lower && a.extent == b.extent;
  }
  friend bool operator!=(const Box& a, const Box& b) { return !(a == b); }
};

/// Cells in both boxes (extent 0 in some axis when they do not overlap).
inline Box intersect(const Box& a, const Box& b) {
  Box out;
  for (int d = 0; d < max_spatial_dims; ++d) {
    const Index lo = std::max(a.lower[d], b.lower[d]);
    const Index hi = std::min(a.upper(d), b.upper(d));
    out.lower[d] = lo;
    out.extent[d] = std::max<Index>(0, hi - lo);
  }
  return out;
}

inline std::ostream& operator<<(std::ostream& os, const Box& box) {
  os << "[" << box.lower[0] << ":" << box.upper(0) << ", " << box.lower[1] << ":" << box.upper(1)
     << ", " << box.lower[2] << ":" << box.upper(2) << ")";
  return os;
}

}  // namespace shardtensor
