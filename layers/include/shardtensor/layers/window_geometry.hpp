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
/// stride, dilation and the padding before and after the field (unused axes: kernel 1,
/// stride 1).
struct WindowGeometry {
  int ndims = 0;
  std::array<int, max_spatial_dims> kernel{1, 1, 1}, stride{1, 1, 1}, dilation{1, 1, 1};
  std::array<int, max_spatial_dims> padding_lower{0, 0, 0}, padding_upper{0, 0, 0};
  /// PyTorch's ceil_mode (pooling): a last window that only partly covers the padded field
  /// still makes an output, unless it starts past the field and its lower padding.
  bool ceil_mode = false;

  /// Global output extent along `dim` for `input` cells (0 where no window fits).
  Index output_extent(int dim, Index input) const {
    const Index span = input + padding_lower[dim] + padding_upper[dim] -
                       dilation[dim] * (kernel[dim] - 1) - 1;
    if (span < 0) return 0;
    if (!ceil_mode) return span / stride[dim] + 1;
    Index outputs = (span + stride[dim] - 1) / stride[dim] + 1;
    if ((outputs - 1) * stride[dim] >= input + padding_lower[dim]) --outputs;
    return outputs;
  }

  /// Padding past the field's end that the last window may read: the upper padding, and with
  /// ceil_mode up to stride - 1 cells of the last partial window.
  int reach_past_end(int dim) const {
    return padding_upper[dim] + (ceil_mode ? stride[dim] - 1 : 0);
  }

  /// Ghost cells the padded input needs: the lower padding below; above, whatever the windows
  /// of the outputs anchored in this shard reach past its last cell (and past the field's end).
  GhostWidths input_ghosts() const {
    GhostWidths g;
    for (int d = 0; d < ndims; ++d) {
      g.lower[d] = padding_lower[d];
      g.upper[d] =
          std::max({0, dilation[d] * (kernel[d] - 1) - padding_lower[d], reach_past_end(d)});
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
