#pragma once
// WindowGeometry: where the windows of a convolution or pooling op fall on a sharded field,
// which ghost cells they read, and how the outputs are split over the ranks.

#include <algorithm>
#include <array>
#include <string>

#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/core/ghost_widths.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/kernels/window_index.hpp"

namespace shardtensor {

/// Geometry of a windowed op (convolution, pooling) along the spatial axes: window size,
/// stride, dilation and symmetric padding (unused axes: kernel 1, stride 1).
struct WindowGeometry {
  int ndims = 0;
  std::array<int, max_spatial_dims> kernel{1, 1, 1}, stride{1, 1, 1}, dilation{1, 1, 1};
  std::array<int, max_spatial_dims> padding{0, 0, 0};

  /// Global output extent along `dim` for `input` cells.
  Index output_extent(int dim, Index input) const {
    return (input + 2 * padding[dim] - dilation[dim] * (kernel[dim] - 1) - 1) / stride[dim] + 1;
  }

  /// Ghost cells the padded input needs: `padding` below; above, whatever the windows of the
  /// outputs anchored in this shard reach past its last cell (and the padding at the end).
  GhostWidths input_ghosts() const {
    GhostWidths g;
    for (int d = 0; d < ndims; ++d) {
      g.lower[d] = padding[d];
      g.upper[d] = std::max({0, dilation[d] * (kernel[d] - 1) - padding[d], padding[d]});
    }
    return g;
  }

  /// Whether every rank's windows read only its own cells of `input`: no padding, and each
  /// shard's last output window ends inside it (2x2 pooling on even splits). Then no ghost
  /// cell is read and the input is the padded buffer; the same answer on every rank.
  bool reads_owned_cells_only(const Decomposition& input) const;

  /// Output o belongs to the rank owning input cell o * stride (its window's anchor), so a
  /// stride-1 "same" convolution keeps the input's decomposition. Throws if a rank would own
  /// no output.
  Decomposition output_decomposition(const Decomposition& input, const std::string& where) const;
};

/// Padded-buffer index, per axis, of the window start of the first output this rank owns:
/// output o reads padded cells window_base + (o - first owned o) * stride + tap * dilation.
template <class T>
std::array<Index, max_spatial_dims> window_base(const WindowGeometry& g,
                                                const ShardTensor<T>& input,
                                                const ShardTensor<T>& output) {
  std::array<Index, max_spatial_dims> base{0, 0, 0};
  for (int d = 0; d < max_spatial_dims; ++d)
    base[d] = output.global_box().lower[d] * g.stride[d] - input.global_box().lower[d];
  return base;
}

}  // namespace shardtensor
