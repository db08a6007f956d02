#pragma once
// Conv<T>: N-D convolution (1-3 spatial dims) of a sharded field, with any kernel size,
// stride, dilation, padding mode and group count, equal to the unsharded convolution.

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/halo_padding.hpp"
#include "shardtensor/layers/module.hpp"

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
  const WindowGeometry& geometry() const { return geometry_; }
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

 private:
  Communicator comm_;
  ConvOptions options_;
  WindowGeometry geometry_;
  std::string name_;
  Variable<T> weight_, bias_;
  std::unique_ptr<HaloPadding<T>> halo_;
};

extern template class Conv<float>;
extern template class Conv<double>;

}  // namespace shardtensor
