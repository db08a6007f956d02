#pragma once
// Conv<T>: N-D convolution (1-3 spatial dims) of a sharded field, with any kernel size,
// stride, dilation, padding mode and group count, equal to the unsharded convolution.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/layers/padding.hpp"

namespace shardtensor {

struct ConvOptions {
  int in_channels = 1;
  int out_channels = 1;
  std::vector<int> kernel;    ///< one size per spatial dim (its length sets the dims)
  std::vector<int> stride;    ///< default 1
  std::vector<int> dilation;  ///< default 1
  std::vector<int> padding;   ///< cells added on both sides per dim, default 0
  PaddingMode padding_mode = PaddingMode::zeros;
  int groups = 1;
  bool bias = true;
  std::uint64_t seed = 1;  ///< initialisation (same on every rank)
};

/// Geometry of a convolution along the spatial axes (unused axes: kernel 1, stride 1).
struct ConvGeometry {
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

  /// Output o belongs to the rank owning input cell o * stride (its window's anchor), so a
  /// stride-1 "same" convolution keeps the input's decomposition. Throws if a rank would own
  /// no output.
  Decomposition output_decomposition(const Decomposition& input, const std::string& where) const;
};

/// Convolution layer. Weights (out, in / groups, kx[, ky[, kz]]) and bias (out) are replicated;
/// their gradients are summed over the ranks that share the field.
///
/// Forward on each rank: copy the shard into a buffer with the ghost cells the windows need,
/// exchange halos (periodic padding wraps), fill zeros / replicate / reflect padding at open
/// global boundaries, and convolve the outputs this rank owns. Backward runs the adjoints in
/// reverse: input gradient into the padded buffer, padding adjoint, reverse halo exchange.
template <class T>
class Conv : public Module<T> {
 public:
  Conv(const Communicator& comm, ConvOptions options, const std::string& name = "conv");

  Variable<T> forward(const Variable<T>& input) override;

  const ConvOptions& options() const { return options_; }
  const ConvGeometry& geometry() const { return geometry_; }
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

 private:
  HaloExchange<T>& plan_for(const ShardTensor<T>& padded);

  Communicator comm_;
  ConvOptions options_;
  ConvGeometry geometry_;
  std::string name_;
  Variable<T> weight_, bias_;
  std::map<std::vector<long long>, std::unique_ptr<HaloExchange<T>>> plans_;
};

extern template class Conv<float>;
extern template class Conv<double>;

}  // namespace shardtensor
