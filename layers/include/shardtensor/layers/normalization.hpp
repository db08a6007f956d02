#pragma once
// Normalization layers of sharded fields: GroupNorm, LayerNorm and BatchNorm, with their
// statistics over the GLOBAL field, so a sharded run normalizes exactly like the whole field
// on one rank, whatever the (possibly uneven) decomposition.
//
// Statistics are accumulated in double: per (sample, channel) block each rank sums its own
// cells, then one allreduce over the domain Communicator sums every block at once, and the
// blocks are combined into the statistics on the host (same order on every rank). The mean
// and the variance take two such passes (the corrected two-pass algorithm: sum of x gives a
// first mean m, then the sums of d = x - m and d^2 give mean = m + sum(d) / count and
// var = (sum(d^2) - sum(d)^2 / count) / count). The one-pass E[x^2] - E[x]^2 loses digits on
// fields whose mean is large against their spread (pressure, temperature); this form does
// not. Variances are biased (divide by the count), as in PyTorch.
//
// Backward is the exact gradient through the mean and the variance. With g = dy * weight,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))       (means over the statistic's cells),
// which needs the global sums of dy and dy * xhat per block: one more allreduce in backward,
// issued in the same order on every rank. Weight and bias gradients are this rank's partial
// sums (over its own cells), summed over the ranks by the autodiff (Node::grad_partial).
//
// Fields may carry ghost cells: only the owned cells are read and written.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/kernels/activation.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/layers/saved_field.hpp"

namespace shardtensor {

/// The ghost cells to allocate a normalization's output with, given its input (without ghost
/// cells): those of the conv it feeds (Conv::padded_input_ghosts), which fills them in place,
/// or none. A normalization's set_output_ghosts.
template <class T>
using OutputGhosts = std::function<GhostWidths(const ShardTensor<T>&)>;

/// Group normalization (Wu & He): for each sample n and group of channels/num_groups
/// consecutive channels, the mean and (biased) variance over the group's channels and every
/// cell of the global field; y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c].
/// weight (ones) and bias (zeros), shape (channels), exist when `affine`.
template <class T>
class GroupNorm : public Module<T> {
 public:
  GroupNorm(const Communicator& comm, int num_groups, int channels, double eps = 1e-5,
            bool affine = true, const std::string& name = "group_norm");

  Variable<T> forward(const Variable<T>& input) override { return normalized(input, true); }
  /// The statistics and the node for backward, not the output (backward reads the input).
  Variable<T> forward_graph_only(const Variable<T>& input) override {
    return normalized(input, false);
  }
  /// In a bf16 model the statistics and the output stay float (autocast's normalization);
  /// the input kept for backward is packed into 16 bits where it is a bf16 layer's output.
  void compute_in_bf16(bool on) override { bf16_inputs_ = on; }
  /// Applies `kind` to the output in the same op (normalization then activation, as in a
  /// U-Net block): the normalized field is never stored, backward recomputes it from the
  /// input, so the pair keeps one field less. The same numbers as the two layers apart.
  void fuse_activation(Activation kind, double slope = 0.01) {
    activation_ = kernels::ActivationFunction<T>{kind, static_cast<T>(slope)};
  }
  /// Where the output feeds a conv that can pad it in place, set by a model that knows (the
  /// U-Net's blocks): an input without ghost cells makes an output with `ghosts(input)`, zero,
  /// marked for that conv to fill (Node::scratch_ghosts). Same numbers.
  void set_output_ghosts(OutputGhosts<T> ghosts) { output_ghosts_ = std::move(ghosts); }

  int num_groups() const { return num_groups_; }
  int channels() const { return channels_; }
  double eps() const { return eps_; }
  bool affine() const { return affine_; }
  /// Undefined Variables when the layer is not affine.
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

 protected:
  /// `kind` names the layer in error messages ("GroupNorm", "LayerNorm").
  GroupNorm(const char* kind, const Communicator& comm, int num_groups, int channels, double eps,
            bool affine, const std::string& name);

 private:
  Communicator comm_;
  int num_groups_, channels_;
  double eps_;
  bool affine_;
  std::string where_;  // "GroupNorm 'name'"
  std::string name_;
  Variable<T> weight_, bias_;
  bool bf16_inputs_ = false;
  std::optional<kernels::ActivationFunction<T>> activation_;
  OutputGhosts<T> output_ghosts_;
  Kokkos::View<double*, DefaultMemorySpace> doubles_;  // statistics scratch, reused when free
  SavedPacking input_packing() const {
    return bf16_inputs_ ? SavedPacking::if_exact : SavedPacking::none;
  }
  /// forward (`value_needed`) or forward_graph_only.
  Variable<T> normalized(const Variable<T>& input, bool value_needed);
};

/// Layer normalization over (channels, all cells of the global field) per sample: the
/// statistics of GroupNorm(1, channels). Unlike PyTorch's LayerNorm(normalized_shape =
/// (C, spatial...)), whose elementwise affine has one weight per (channel, cell) and so
/// depends on the global grid, the affine weight and bias here are per channel, shape
/// (channels), exactly as GroupNorm(1, channels) (a grid-independent layer, like the
/// "LayerNorm" of most neural operators on fields).
template <class T>
class LayerNorm : public GroupNorm<T> {
 public:
  LayerNorm(const Communicator& comm, int channels, double eps = 1e-5, bool affine = true,
            const std::string& name = "layer_norm");
};

/// Batch normalization of a field per channel.
///
/// Training (Module::is_training()): the mean and biased variance per channel over the batch
/// and every cell of the global field normalize the input, and the running estimates are
/// updated: running = (1 - momentum) * running + momentum * batch statistic, with the unbiased
/// variance (count / (count - 1)) for running_var, as PyTorch does. Evaluation: the running
/// estimates normalize (then the layer is a per-channel affine map and backward needs no
/// communication). The batch statistics are over this domain group's samples only (like
/// PyTorch's BatchNorm, not SyncBatchNorm, under data parallelism).
///
/// running_mean (zeros) and running_var (ones) are replicated buffers, not parameters: they
/// are updated identically on every rank of the domain group and are not in
/// named_parameters(). weight (ones) and bias (zeros), shape (channels), when `affine`.
template <class T>
class BatchNorm : public Module<T> {
 public:
  BatchNorm(const Communicator& comm, int channels, double momentum = 0.1, double eps = 1e-5,
            bool affine = true, const std::string& name = "batch_norm");

  Variable<T> forward(const Variable<T>& input) override { return normalized(input, true); }
  /// As GroupNorm's.
  Variable<T> forward_graph_only(const Variable<T>& input) override {
    return normalized(input, false);
  }
  /// As GroupNorm's: float statistics and output, the saved input in 16 bits where exact.
  void compute_in_bf16(bool on) override { bf16_inputs_ = on; }
  /// As GroupNorm's: the activation in the same op, the normalized field not stored.
  void fuse_activation(Activation kind, double slope = 0.01) {
    activation_ = kernels::ActivationFunction<T>{kind, static_cast<T>(slope)};
  }
  /// As GroupNorm's: the output allocated with the ghost cells of the conv it feeds.
  void set_output_ghosts(OutputGhosts<T> ghosts) { output_ghosts_ = std::move(ghosts); }

  int channels() const { return channels_; }
  double momentum() const { return momentum_; }
  double eps() const { return eps_; }
  bool affine() const { return affine_; }
  Variable<T> weight() const { return weight_; }
  Variable<T> bias() const { return bias_; }

  /// The running estimates (shared storage: writing into them sets them, e.g. to load a
  /// checkpoint; keep them the same on every rank).
  const ReplicatedView<T>& running_mean() const { return running_mean_; }
  const ReplicatedView<T>& running_var() const { return running_var_; }
  /// Training forwards that updated the running estimates.
  Index batches_tracked() const { return batches_tracked_; }

 private:
  Communicator comm_;
  int channels_;
  double momentum_, eps_;
  bool affine_;
  std::string where_;  // "BatchNorm 'name'"
  std::string name_;
  Variable<T> weight_, bias_;
  ReplicatedView<T> running_mean_, running_var_;
  Index batches_tracked_ = 0;
  bool bf16_inputs_ = false;
  std::optional<kernels::ActivationFunction<T>> activation_;
  OutputGhosts<T> output_ghosts_;
  Kokkos::View<double*, DefaultMemorySpace> doubles_;  // statistics scratch, reused when free
  SavedPacking input_packing() const {
    return bf16_inputs_ ? SavedPacking::if_exact : SavedPacking::none;
  }
  /// forward (`value_needed`) or forward_graph_only.
  Variable<T> normalized(const Variable<T>& input, bool value_needed);
};

extern template class GroupNorm<float>;
extern template class GroupNorm<double>;
extern template class LayerNorm<float>;
extern template class LayerNorm<double>;
extern template class BatchNorm<float>;
extern template class BatchNorm<double>;

}  // namespace shardtensor
