#pragma once
// Boundary padding of a ghosted shard: the ghost cells past an open (non-periodic) global
// boundary get zeros or copies of the field's own edge cells, and the adjoint of that fill.

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// How values past the global boundary are made, as in PyTorch's padding modes.
/// periodic = PyTorch's "circular": the halo exchange wraps around.
enum class PaddingMode { zeros, periodic, replicate, reflect };

inline const char* to_string(PaddingMode mode) {
  switch (mode) {
    case PaddingMode::periodic:
      return "periodic";
    case PaddingMode::replicate:
      return "replicate";
    case PaddingMode::reflect:
      return "reflect";
    default:
      return "zeros";
  }
}

namespace impl {

/// Source global index of padding cell `g` along an axis of `n` cells; -1 for zeros.
KOKKOS_INLINE_FUNCTION Index padding_source(PaddingMode mode, Index g, Index n) {
  if (mode == PaddingMode::replicate) return g < 0 ? 0 : n - 1;
  if (mode == PaddingMode::reflect) return g < 0 ? -g : 2 * (n - 1) - g;
  return -1;
}

/// The padding cells of `t` along `dim` on one side: `width` cells next to the owned ones,
/// over the whole allocation in the other axes (so corners get the separable fill).

template <class T>
Box padding_band(const ShardTensor<T>& t, int dim, bool upper, int width) {
  Box b;
  for (int k = 0; k < max_spatial_dims; ++k) {
    b.lower[k] = 0;
    b.extent[k] = t.allocated_extent(k);
  }
  b.lower[dim] =
      upper ? t.ghosts().lower[dim] + t.local_extent(dim) : t.ghosts().lower[dim] - width;
  b.extent[dim] = width;
  return b;
}

/// Applies `op(n, c, local cell, local source cell)` to each padding cell of the band, with
/// the band's axis walked sequentially inside one work item (adjoint adds stay race-free). A
/// work item is a line of the band along its innermost other axis (contiguous cells where that
/// is z): one index decomposition per line, not per cell (per-cell work items spent most of
/// their time on it and on the multidimensional range).
template <class T, class Op>
void for_each_padding_line(const ShardTensor<T>& t, int dim, bool upper, int width,
                           PaddingMode mode, Op op) {
  const Box band = padding_band(t, dim, upper, width);
  if (band.empty()) return;
  Index extents[3] = {band.extent[0], band.extent[1], band.extent[2]};
  extents[dim] = 1;
  const Lines lines(t.batch(), t.channels(), extents);  // along the innermost other axis
  const int axis = lines.axis;
  const Index length = lines.length;
  const Index global_n = t.decomposition().global_extent(dim);
  const Index to_global = t.global_box().lower[dim] - t.ghosts().lower[dim];
  const Index band_lower = band.lower[dim];
  Kokkos::parallel_for(
      "padding_lines", kernel_range(ExecutionSpace(), lines.count),
      KOKKOS_LAMBDA(const Index line) {
        const CellIndex start = lines.start(line);
        const Index first[3] = {start.x, start.y, start.z};
        for (Index p = 0; p < width; ++p) {
          const Index at_dim = band_lower + p;
          const Index g = padding_source(mode, at_dim + to_global, global_n);
          const Index source_at_dim = g < 0 ? -1 : g - to_global;
          for (Index i = 0; i < length; ++i) {
            // Built whole per cell: writing one entry of an array at a run-time index and
            // reading it back as a wider load stalled every cell on store forwarding.
            Index cell[3], source[3];
            for (int a = 0; a < 3; ++a) {
              const Index at = a == dim ? at_dim : a == axis ? i : first[a];
              cell[a] = at;
              source[a] = a == dim ? source_at_dim : at;
            }
            op(start.n, start.c, cell, source);
          }
        }
      });
}

/// The cell operations of fill_boundary_padding and its adjoint: functors, not lambdas (the
/// nvcc pattern core/box_copy.hpp describes: a header template's lambda handed to another
/// template).
template <class View>
struct CopyPaddingSource {  // cell = source cell (constant past the global edge)
  View v;
  int dim;
  typename View::non_const_value_type constant;
  KOKKOS_INLINE_FUNCTION void operator()(Index n, Index c, const Index* cell,
                                         const Index* source) const {
    v(n, c, cell[0], cell[1], cell[2]) =
        source[dim] < 0 ? constant : v(n, c, source[0], source[1], source[2]);
  }
};
template <class View>
struct ReturnPaddingGradient {  // source cell += cell; cell = 0
  View v;
  int dim;
  KOKKOS_INLINE_FUNCTION void operator()(Index n, Index c, const Index* cell,
                                         const Index* source) const {
    auto& g = v(n, c, cell[0], cell[1], cell[2]);
    if (source[dim] >= 0) v(n, c, source[0], source[1], source[2]) += g;
    g = 0;
  }
};

}  // namespace impl

/// Which padding widths (lower, upper per axis) a shard at an open global boundary fills.
struct BoundaryPadding {
  PaddingMode mode = PaddingMode::zeros;
  std::array<int, max_spatial_dims> lower{0, 0, 0}, upper{0, 0, 0};
  double constant = 0;  ///< value of zeros-mode padding (-inf for max pooling)
};

/// Fills the padding cells of a shard at an open global boundary, axis by axis (x, then y,
/// then z, each over the whole allocation of the others), after the halo exchange.
/// Axes of a periodic decomposition are left alone: the exchange wraps them.
template <class T>
void fill_boundary_padding(const ShardTensor<T>& t, const BoundaryPadding& padding) {
  const auto v = t.view();
  const PaddingMode mode = padding.mode;
  const T constant = static_cast<T>(padding.constant);
  for (int dim = 0; dim < t.ndims(); ++dim) {
    if (t.decomposition().periodic(dim)) continue;
    for (bool upper : {false, true}) {
      const bool at_boundary =
          upper ? t.global_box().upper(dim) == t.decomposition().global_extent(dim)
                : t.global_box().lower[dim] == 0;
      const int width = upper ? padding.upper[dim] : padding.lower[dim];
      if (!at_boundary || width == 0) continue;
      impl::for_each_padding_line(
          t, dim, upper, width, mode,
          impl::CopyPaddingSource<typename ShardTensor<T>::view_type>{v, dim, constant});
    }
  }
}

/// Adjoint of fill_boundary_padding: each padding cell's gradient is added to its source
/// cell (replicate, reflect) and cleared; axes in reverse order.
template <class T>
void unfill_boundary_padding(const ShardTensor<T>& grad, const BoundaryPadding& padding) {
  const auto v = grad.view();
  const PaddingMode mode = padding.mode;
  for (int dim = grad.ndims() - 1; dim >= 0; --dim) {
    if (grad.decomposition().periodic(dim)) continue;
    for (bool upper : {true, false}) {
      const bool at_boundary =
          upper ? grad.global_box().upper(dim) == grad.decomposition().global_extent(dim)
                : grad.global_box().lower[dim] == 0;
      const int width = upper ? padding.upper[dim] : padding.lower[dim];
      if (!at_boundary || width == 0) continue;
      impl::for_each_padding_line(
          grad, dim, upper, width, mode,
          impl::ReturnPaddingGradient<typename ShardTensor<T>::view_type>{v, dim});
    }
  }
}

/// Throws unless every shard at an open boundary owns the cells its padding copies.
inline void check_padding_sources(const Decomposition& d, const BoundaryPadding& padding,
                                  const std::string& where) {
  if (padding.mode != PaddingMode::replicate && padding.mode != PaddingMode::reflect) return;
  for (int dim = 0; dim < d.ndims(); ++dim) {
    if (d.periodic(dim)) continue;
    const int width = std::max(padding.lower[dim], padding.upper[dim]);
    const Index first = d.split_points(dim)[1] - d.split_points(dim)[0];
    const Index last = d.split_points(dim).back() - d.split_points(dim)[d.process_grid(dim) - 1];
    const Index needed = padding.mode == PaddingMode::reflect ? width + 1 : 1;
    SHARDTENSOR_REQUIRE(needed <= std::min(first, last), where,
                        to_string(padding.mode)
                            << " padding " << width << " along dim " << dim << " needs " << needed
                            << " owned cells on the boundary ranks, which own "
                            << std::min(first, last));
  }
}

}  // namespace shardtensor
