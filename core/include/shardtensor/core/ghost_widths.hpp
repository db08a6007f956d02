#pragma once
// GhostWidths: how many ghost cells a shard carries on each side of each spatial axis.

#include <array>
#include <ostream>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// lower[d] ghost cells before the first owned cell along axis d, upper[d] after the last.
/// Widths may differ per axis and per side (asymmetric stencils); they are the same on
/// every rank, including ranks at an open boundary (where the layer fills them: padding).
struct GhostWidths {
  std::array<int, max_spatial_dims> lower{0, 0, 0};
  std::array<int, max_spatial_dims> upper{0, 0, 0};

  /// `width` cells on both sides of the first `ndims` axes.
  static GhostWidths uniform(int width, int ndims) {
    GhostWidths g;
    for (int d = 0; d < ndims && d < max_spatial_dims; ++d) g.lower[d] = g.upper[d] = width;
    return g;
  }

  bool none() const {
    for (int d = 0; d < max_spatial_dims; ++d)
      if (lower[d] != 0 || upper[d] != 0) return false;
    return true;
  }

  friend bool operator==(const GhostWidths& a, const GhostWidths& b) {
    return a.lower == b.lower && a.upper == b.upper;
  }
  friend bool operator!=(const GhostWidths& a, const GhostWidths& b) { return !(a == b); }
};

inline std::ostream& operator<<(std::ostream& os, const GhostWidths& g) {
  os << "lower (" << g.lower[0] << "," << g.lower[1] << "," << g.lower[2] << ") upper ("
     << g.upper[0] << "," << g.upper[1] << "," << g.upper[2] << ")";
  return os;
}

}  // namespace shardtensor
