#pragma once
// crop_pad: grow the global field with zeros or cut cells off it, per side of each axis.
// Local: every rank keeps its own cells (shifted); the first and last ranks along an axis
// also get the added zeros or lose the cropped cells.

#include <array>

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

/// The output of crop_pad: the input's split points moved by lower[d] and clamped to the new
/// extent N + lower[d] + upper[d]. Positive amounts add zero cells, negative ones crop.
/// Throws if a rank would be left with no cells.
inline Decomposition crop_pad_decomposition(const Decomposition& input,
                                            const std::array<Index, max_spatial_dims>& lower,
                                            const std::array<Index, max_spatial_dims>& upper) {
  std::vector<std::vector<Index>> points;
  std::vector<bool> periodic;
  for (int d = 0; d < input.ndims(); ++d) {
    const Index extent = input.global_extent(d) + lower[d] + upper[d];
    SHARDTENSOR_REQUIRE(extent >= 1, "crop_pad",
                        "cropping " << -lower[d] << " + " << -upper[d] << " cells of dim " << d
                                    << " leaves nothing of " << input.global_extent(d));
    std::vector<Index> p{0};
    const std::vector<Index>& in = input.split_points(d);
    for (std::size_t i = 1; i + 1 < in.size(); ++i)
      p.push_back(std::min(extent, std::max<Index>(0, in[i] + lower[d])));
    p.push_back(extent);
    for (std::size_t i = 0; i + 1 < p.size(); ++i)
      SHARDTENSOR_REQUIRE(p[i] < p[i + 1], "crop_pad",
                          "cropping dim " << d << " by (" << -lower[d] << ", " << -upper[d]
                                          << ") leaves the ranks at grid position " << i
                                          << " (cells [" << in[i] << ", " << in[i + 1]
                                          << ")) with no cells");
    points.push_back(p);
    periodic.push_back(input.periodic(d));
  }
  return Decomposition::from_split_points(points, periodic);
}

namespace impl {
/// Output cell o (global) holds input cell o - lower, owned here when inside the field: maps
/// a flat index of the output's local view to the input's local cell, if it has one.
struct CropPadMap {
  Index shift[3], in_extent[3], channels, out_extent[3];

  template <class T>
  CropPadMap(const ShardTensor<T>& x, const ShardTensor<T>& y,
             const std::array<Index, max_spatial_dims>& lower)
      : channels(x.channels()) {
    for (int d = 0; d < max_spatial_dims; ++d) {
      shift[d] = y.global_box().lower[d] - lower[d] - x.global_box().lower[d];  // local y -> x
      in_extent[d] = x.local_extent(d);
      out_extent[d] = static_cast<Index>(y.view().extent(2 + d));
    }
  }

  KOKKOS_INLINE_FUNCTION bool source(Index flat, CellIndex& o, Index& i, Index& j, Index& k) const {
    o = unflatten(flat, channels, out_extent[0], out_extent[1], out_extent[2]);
    i = o.x + shift[0];
    j = o.y + shift[1];
    k = o.z + shift[2];
    return i >= 0 && i < in_extent[0] && j >= 0 && j < in_extent[1] && k >= 0 && k < in_extent[2];
  }
};
}  // namespace impl

/// Pads (positive amounts, zeros) or crops (negative amounts) the global field.
template <class T>
Variable<T> crop_pad(const Variable<T>& input, const std::array<Index, max_spatial_dims>& lower,
                     const std::array<Index, max_spatial_dims>& upper) {
  impl::require_field(input, "crop_pad");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(x.ghosts().none(), "crop_pad",
                      "'" << input.name() << "' carries ghost cells");
  for (int d = x.ndims(); d < max_spatial_dims; ++d)
    SHARDTENSOR_REQUIRE(lower[d] == 0 && upper[d] == 0, "crop_pad",
                        "amounts for dim " << d << " of a " << x.ndims() << "-D field");
  ShardTensor<T> y(crop_pad_decomposition(x.decomposition(), lower, upper), x.rank(), x.batch(),
                   x.channels(), {}, "crop_pad");
  const impl::CropPadMap map(x, y, lower);
  const auto xv = x.view(), yv = y.view();
  Kokkos::parallel_for(
      "crop_pad", static_cast<Index>(yv.span()), KOKKOS_LAMBDA(const Index flat) {
        CellIndex o;
        Index i, j, k;
        if (map.source(flat, o, i, j, k)) yv(o.n, o.c, o.x, o.y, o.z) = xv(o.n, o.c, i, j, k);
      });
  auto node = make_result_node<T>("crop_pad", {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, map](impl::Node<T>& self) {
      const auto gy = self.grad_field().view(), gx = in->grad_field().view();
      Kokkos::parallel_for(
          "crop_pad_backward", static_cast<Index>(gy.span()), KOKKOS_LAMBDA(const Index flat) {
            CellIndex o;
            Index i, j, k;
            if (map.source(flat, o, i, j, k)) gx(o.n, o.c, i, j, k) += gy(o.n, o.c, o.x, o.y, o.z);
          });
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
