#pragma once
// TokenLayerNorm<T>: the LayerNorm of transformers, over the channels of each cell (token).

#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

/// For every sample and cell, the mean and (biased) variance over the `channels` values of
/// that cell; y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c] (PyTorch's
/// nn.LayerNorm(channels) applied to each token). weight (ones) and bias (zeros), shape
/// (channels).
///
/// A replicated (N, C) tensor (a pooled vector) is normalized row by row, every rank alike.
///
/// Sharding: the statistics are per cell, so forward and the input gradient need no
/// communication. The weight and bias gradients are each rank's sums over its own cells,
/// added over the ranks by the autodiff (Node::grad_partial). Only owned cells are read
/// and written (inputs may carry ghost cells). Statistics are accumulated in double.
template <class T>
class TokenLayerNorm : public Module<T> {
 public:
  TokenLayerNorm(const Communicator& comm, int channels, double eps = 1e-5,
                 const std::string& name = "token_layer_norm");

  Variable<T> forward(const Variable<T>& input) override;
  /// forward of a replicated (N, C) tensor (public: a CUDA lambda's enclosing function must be).
  Variable<T> forward_rows(const Variable<T>& input);
  bool reads_owned_cells_only() const override { return true; }

  int channels() const { return channels_; }
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

 private:
  Communicator comm_;
  int channels_;
  double eps_;
  std::string name_;
  Variable<T> weight_, bias_;
};

extern template class TokenLayerNorm<float>;
extern template class TokenLayerNorm<double>;

}  // namespace shardtensor
