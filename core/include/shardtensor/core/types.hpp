#pragma once
// Basic index types shared by every module.

#include <array>
#include <cstdint>

namespace shardtensor {

/// Signed index type for global and local cell indices and counts.
using Index = std::int64_t;

/// Fields have 1, 2 or 3 spatial dimensions. Internally every field is stored with three
/// spatial axes; the axes past Decomposition::ndims() have extent 1 and no ghost cells.
inline constexpr int max_spatial_dims = 3;

/// One value per spatial dimension.
using SpatialIndex = std::array<Index, max_spatial_dims>;

}  // namespace shardtensor
