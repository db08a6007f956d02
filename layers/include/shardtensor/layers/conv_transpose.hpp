#pragma once
// ConvTranspose<T>: N-D transposed convolution (1-3 spatial dims) of a sharded field, with any
// kernel size, stride, dilation, padding, output padding and group count, equal to the
// unsharded transposed convolution (PyTorch's ConvTranspose1d/2d/3d, zero padding).

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/halo_padding.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

struct ConvTransposeOptions {
  int in_channels = 1;
  int out_channels = 1;
  std::vector<int> kernel;          ///< one size per spatial dim (its length sets the dims)
  std::vector<int> stride;          ///< default 1
  std::vector<int> dilation;        ///< default 1
  std::vector<int> padding;         ///< cells removed from both ends of the output, default 0
  std::vector<int> output_padding;  ///< cells added at the upper end, default 0; each must be
                                    ///< smaller than the stride or the dilation (as in PyTorch)
  int groups = 1;
  bool bias = true;
  /// Initialisation seed (same on every rank); 0 derives it from the layer name.
  std::uint64_t seed = 0;
  /// bf16 operands, float sums, bf16 output (as ConvOptions::bf16; Module::compute_in_bf16).
  bool bf16 = false;
};

/// Transposed convolution layer: the adjoint of a Conv's data path. Weights (in,
/// out / groups, kx[, ky[, kz]]) and bias (out) are replicated, in PyTorch's layout; their
/// gradients are summed over the ranks that share the field. Along each dim the output has
/// (n - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1 cells.
///
/// Output o receives input i through tap t when o = i * stride - padding + t * dilation.
/// Decomposition: a rank owning input cells [a, b) owns output cells [a * stride,
/// b * stride) (the last rank: up to the output extent), so every output is a gather over
/// the rank's inputs plus a few ghost cells from its neighbours (halo exchange; cells past
/// the global boundary contribute nothing). Throws if a rank would own no output.
///
/// Backward: the input gradient is a gather over the owned outputs into the ghosted buffer,
/// whose ghost cells are then sent back and added to their owners (reverse halo exchange).
template <class T>
class ConvTranspose : public Module<T> {
 public:
  ConvTranspose(const Communicator& comm, ConvTransposeOptions options,
                const std::string& name = "conv_transpose");

  Variable<T> forward(const Variable<T>& input) override;
  /// forward(input) with the output written into channels [first, first + out_channels) of
  /// `into`'s owned cells (laid out by output_decomposition, with any ghost cells and
  /// channels: a concatenation's output, impl::ChannelConcat::add_written_part) instead of a
  /// field of its own. Returns the output's node: it holds no value, only its layout (that of
  /// forward's output), for its gradient.
  std::shared_ptr<impl::Node<T>> forward_into(const Variable<T>& input, const ShardTensor<T>& into,
                                              Index first);
  void compute_in_bf16(bool on) override;

  const ConvTransposeOptions& options() const { return options_; }
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

  /// Global output extent along `dim` for `input` cells (may be < 1 for bad input).
  Index output_extent(int dim, Index input) const;
  /// How the outputs of an input decomposition are split: input split points times the
  /// stride, the last one the output extent. Throws if a rank would own no output.
  Decomposition output_decomposition(const Decomposition& input) const;
  /// Ghost cells of the input that the owned outputs of every rank read (the largest need
  /// over the ranks, so the widths are the same everywhere).
  GhostWidths input_ghosts(const Decomposition& input) const;

 private:
  std::shared_ptr<HaloPadding<T>> halo_for(const GhostWidths& ghosts);
  /// The output of `input` written into channels [first, first + out_channels) of `into`'s
  /// owned cells, and its node with the backward (forward and forward_into).
  std::shared_ptr<impl::Node<T>> write_output(const Variable<T>& input, const ShardTensor<T>& into,
                                              Index first);

  Communicator comm_;
  ConvTransposeOptions options_;
  int ndims_ = 0;
  std::array<int, max_spatial_dims> kernel_{1, 1, 1}, stride_{1, 1, 1}, dilation_{1, 1, 1};
  std::array<int, max_spatial_dims> padding_{0, 0, 0}, output_padding_{0, 0, 0};
  std::string name_, where_;
  Variable<T> weight_, bias_;
  /// One halo plan set per ghost widths (they depend on the input decomposition).
  std::map<std::vector<int>, std::shared_ptr<HaloPadding<T>>>
      halos_;  // shared with backward closures
};

extern template class ConvTranspose<float>;
extern template class ConvTranspose<double>;

}  // namespace shardtensor
