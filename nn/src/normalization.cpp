#include "shardtensor/nn/normalization.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/kernels/normalization.hpp"
#include "shardtensor/nn/pointwise.hpp"

namespace shardtensor {

namespace {

using HostDoubles = std::vector<double>;
using DeviceDoubles = kernels::BlockDoubles;

/// Which statistic each (sample n, channel c) block, numbered n * channels + c, belongs to.
struct StatLayout {
  Index batch = 0, channels = 0;
  bool per_channel = false;  // BatchNorm: one statistic per channel, over the batch
  Index groups = 1;          // GroupNorm: `groups` statistics per sample

  Index blocks() const { return batch * channels; }
  Index stats() const { return per_channel ? channels : batch * groups; }
  Index blocks_per_stat() const { return per_channel ? batch : channels / groups; }
  Index stat_of_block(Index block) const {
    const Index n = block / channels, c = block % channels;
    return per_channel ? c : n * groups + c / (channels / groups);
  }
};

/// Sums `values` over the ranks of `comm` in place (one call).
void sum_over_ranks(const Communicator& comm, HostDoubles& values) {
  Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view(
      values.data(), values.size());
  allreduce(comm, view);
}

DeviceDoubles to_device(const HostDoubles& values, const char* label) {
  DeviceDoubles out(std::string(label), values.size());
  auto host = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = values[i];
  Kokkos::deep_copy(out, host);
  return out;
}

/// Host copy of a replicated tensor in double; `fallback` per entry when undefined.
template <class T>
HostDoubles host_values(const Variable<T>& v, Index size, double fallback) {
  if (!v.defined()) return HostDoubles(size, fallback);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v.data());
  HostDoubles out(size);
  for (Index i = 0; i < size; ++i) out[i] = static_cast<double>(host(i));
  return out;
}

template <class T>
HostDoubles host_values(const ReplicatedView<T>& v) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return HostDoubles(host.data(), host.data() + host.extent(0));
}

/// grad[c] += sum over samples n of per_block[n * channels + c].
template <class T>
void add_channel_sums(const ReplicatedView<T>& grad, const HostDoubles& per_block,
                      const StatLayout& layout) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad);
  for (Index c = 0; c < layout.channels; ++c) {
    double s = 0;
    for (Index n = 0; n < layout.batch; ++n) s += per_block[n * layout.channels + c];
    host(c) += static_cast<T>(s);
  }
  Kokkos::deep_copy(grad, host);
}

/// Normalization statistics per statistic index (see StatLayout).
struct Statistics {
  HostDoubles mean, var;  // var biased
  double count = 0;       // global values per statistic
};

/// Global mean and biased variance per statistic in two passes, each one allreduce of every
/// block's local sums: the sum of x gives a first mean m; then the sums of d = x - m and d^2
/// give the corrected mean m + sum(d) / count and the variance (sum(d^2) - sum(d)^2 / count) /
/// count (the corrected two-pass algorithm: accurate when the mean dwarfs the spread).
template <class T>
Statistics batch_statistics(const Communicator& comm, const ShardTensor<T>& x,
                            const StatLayout& layout) {
  Statistics s;
  s.count = double(layout.blocks_per_stat()) * double(x.decomposition().global_cells());
  const Index blocks = layout.blocks(), stats = layout.stats();
  const kernels::OwnedCells<const T> xi = x.interior();
  HostDoubles sums = kernels::block_sums(ExecutionSpace(), xi);
  sum_over_ranks(comm, sums);
  HostDoubles first_mean(stats, 0.0);
  for (Index b = 0; b < blocks; ++b) first_mean[layout.stat_of_block(b)] += sums[b];
  for (double& m : first_mean) m /= s.count;
  HostDoubles block_mean(blocks);
  for (Index b = 0; b < blocks; ++b) block_mean[b] = first_mean[layout.stat_of_block(b)];
  const DeviceDoubles mean = to_device(block_mean, "normalization_block_mean");
  HostDoubles deviations = kernels::block_deviation_sums(ExecutionSpace(), xi, mean);
  sum_over_ranks(comm, deviations);
  HostDoubles d_sum(stats, 0.0), d2_sum(stats, 0.0);
  for (Index b = 0; b < blocks; ++b) {
    d_sum[layout.stat_of_block(b)] += deviations[b];
    d2_sum[layout.stat_of_block(b)] += deviations[blocks + b];
  }
  s.mean.resize(stats);
  s.var.resize(stats);
  for (Index k = 0; k < stats; ++k) {
    s.mean[k] = first_mean[k] + d_sum[k] / s.count;
    s.var[k] = std::max(0.0, (d2_sum[k] - d_sum[k] * d_sum[k] / s.count) / s.count);
  }
  return s;
}

/// The output of a normalization, with an activation applied when one is fused.
template <class T>
using FusedActivation = std::optional<kernels::ActivationFunction<T>>;

/// y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c] with the given statistics (then
/// y = f(y) with a fused activation f), and its backward: through the statistics when they are
/// the batch's (`batch_stats`), else (fixed statistics, BatchNorm in evaluation) a per-channel
/// scale. Without `value_needed` (forward_graph_only) the output is an empty field of its layout.
template <class T>
Variable<T> normalize(const Communicator& comm, const Variable<T>& input, const StatLayout& layout,
                      const Statistics& stats, bool batch_stats, double eps,
                      const std::string& name, const Variable<T>& weight, const Variable<T>& bias,
                      SavedPacking input_packing, const FusedActivation<T>& activation,
                      bool value_needed) {
  const ShardTensor<T>& x = input.value();
  const Index blocks = layout.blocks(), channels = layout.channels;
  const HostDoubles w = host_values(weight, channels, 1.0);
  const HostDoubles beta = host_values(bias, channels, 0.0);
  HostDoubles block_mean(blocks), block_rstd(blocks);
  for (Index b = 0; b < blocks; ++b) {
    const Index s = layout.stat_of_block(b);
    block_mean[b] = stats.mean[s];
    block_rstd[b] = 1.0 / std::sqrt(stats.var[s] + eps);
  }
  const DeviceDoubles mean = to_device(block_mean, "normalization_mean");
  const DeviceDoubles rstd = to_device(block_rstd, "normalization_rstd");
  const DeviceDoubles scale = to_device(w, "normalization_weight");
  const DeviceDoubles shift = to_device(beta, "normalization_bias");

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node()};
  if (weight.defined()) inputs.push_back(weight.node());
  if (bias.defined()) inputs.push_back(bias.node());
  auto node = make_result_node<T>(name, inputs);
  if (value_needed) {
    // Every owned cell is written below: only ghost cells (if any) need their zeros.
    ShardTensor<T> y =
        x.ghosts() == GhostWidths{}
            ? ShardTensor<T>::uninitialized(x.decomposition(), x.rank(), x.batch(), x.channels(),
                                            x.ghosts(), name + ".output")
            : ShardTensor<T>(x.decomposition(), x.rank(), x.batch(), x.channels(), x.ghosts(),
                             name + ".output");
    kernels::normalize_forward(ExecutionSpace(), kernels::OwnedCells<const T>(x.interior()), mean,
                               rstd, scale, shift, kernels::OwnedCells<T>(y.interior()));
    if (activation) impl::apply_activation(*activation, y, y);
    node->field = y;
  } else {
    node->released = typename impl::Node<T>::Layout{x.decomposition(), x.rank(), x.batch(),
                                                    x.channels(), x.ghosts()};
  }
  if (node->requires_grad) {
    auto x_node = input.node();
    auto w_node = weight.defined() ? weight.node() : nullptr;
    auto b_node = bias.defined() ? bias.node() : nullptr;
    const double count = stats.count;
    // The input, for backward (in 16 bits where all its values are bfloat16 values: a bf16
    // layer's output). Not after a graph-only forward, the last op of a recomputed unit: its
    // backward runs next, so the 16 bits would only sit beside the float input until then
    // (the peak of the bf16 U-Net's recomputed up block, 4 MiB of 57.5 at 64^3).
    SavedField<T> saved_input(input, value_needed ? input_packing : SavedPacking::none,
                              name + ".saved_input");
    node->backward = [=](impl::Node<T>& self) mutable {
      // The output's gradient is this node's alone: no other node shares the buffer, and no
      // caller holds the output (whose gradient it could read).
      const bool in_place = self.grad_field().view().use_count() == 1 && self.handle.expired();
      const ShardTensor<T> x_again = saved_input.value();
      saved_input = {};
      const kernels::OwnedCells<const T> x_cells = x_again.interior();
      // dy: the output's gradient, or (with the activation) the gradient at the normalized
      // values, in place of the output's where that is this node's alone, else in a field of
      // its own. Either way a buffer the input's gradient may be written over (below).
      ShardTensor<T> dy = self.grad_field();
      bool dy_is_own = in_place;
      if (activation) {
        if (!in_place)
          dy = ShardTensor<T>::uninitialized(x_again.decomposition(), x_again.rank(),
                                             x_again.batch(), x_again.channels(), x_again.ghosts(),
                                             name + ".normalized_grad");
        kernels::normalize_activation_gradient(
            ExecutionSpace(), kernels::OwnedCells<const T>(self.grad_field().interior()), x_cells,
            mean, rstd, scale, shift, *activation, kernels::OwnedCells<T>(dy.interior()));
        dy_is_own = true;
      }
      if (in_place) self.field_grad = ShardTensor<T>();  // dy holds it now
      const kernels::OwnedCells<const T> gy = dy.interior();
      // This rank's sums of dy and dy * xhat per block.
      const HostDoubles sums =
          kernels::normalize_gradient_sums(ExecutionSpace(), gy, x_cells, mean, rstd);
      const HostDoubles dy_sums(sums.begin(), sums.begin() + blocks);
      const HostDoubles dyx_sums(sums.begin() + blocks, sums.end());
      if (w_node && w_node->requires_grad)
        add_channel_sums(w_node->grad_partial(comm), dyx_sums, layout);
      if (b_node && b_node->requires_grad)
        add_channel_sums(b_node->grad_partial(comm), dy_sums, layout);
      if (!x_node->requires_grad) return;

      // dx = c1 * dy - c2 - c3 * xhat per block.
      HostDoubles c1(blocks), c2(blocks, 0.0), c3(blocks, 0.0);
      for (Index b = 0; b < blocks; ++b) c1[b] = block_rstd[b] * w[b % channels];
      if (batch_stats) {
        // Global sums of g = dy * weight and g * xhat per statistic: one allreduce.
        HostDoubles global(2 * blocks);
        for (Index b = 0; b < blocks; ++b) {
          global[b] = dy_sums[b];
          global[blocks + b] = dyx_sums[b];
        }
        sum_over_ranks(comm, global);
        HostDoubles g_sum(layout.stats(), 0.0), gx_sum(layout.stats(), 0.0);
        for (Index b = 0; b < blocks; ++b) {
          const Index s = layout.stat_of_block(b);
          g_sum[s] += w[b % channels] * global[b];
          gx_sum[s] += w[b % channels] * global[blocks + b];
        }
        for (Index b = 0; b < blocks; ++b) {
          const Index s = layout.stat_of_block(b);
          c2[b] = block_rstd[b] * g_sum[s] / count;
          c3[b] = block_rstd[b] * gx_sum[s] / count;
        }
      }
      const DeviceDoubles a1 = to_device(c1, "normalization_c1");
      const DeviceDoubles a2 = to_device(c2, "normalization_c2");
      const DeviceDoubles a3 = to_device(c3, "normalization_c3");
      // Written, not added to; over dy itself where the input's gradient can take that buffer
      // (each cell reads its dy before its dx is written): one field fewer at the peak of a
      // U-Net block's backward.
      const bool first =
          (dy_is_own && x_node->adopt_grad_field(dy)) || x_node->take_unfilled_grad_field();
      kernels::normalize_backward(ExecutionSpace(), gy, x_cells, mean, rstd, a1, a2, a3,
                                  kernels::OwnedCells<T>(x_node->grad_field().interior()), first);
    };
  }
  return Variable<T>(node);
}

/// weight (ones) and bias (zeros), shape (channels).
template <class T>
Variable<T> constant_parameter(Variable<T> p, double value) {
  Kokkos::deep_copy(p.data(), static_cast<T>(value));
  return p;
}

template <class T>
void check_input(const Variable<T>& input, int channels, const std::string& where) {
  SHARDTENSOR_REQUIRE(input.defined() && input.is_field(), where,
                      "input '" << (input.defined() ? input.name() : std::string("undefined"))
                                << "' is not a sharded field");
  SHARDTENSOR_REQUIRE(
      input.value().channels() == channels, where,
      "input has " << input.value().channels() << " channels, the layer expects " << channels);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

template <class T>
GroupNorm<T>::GroupNorm(const Communicator& comm, int num_groups, int channels, double eps,
                        bool affine, const std::string& name)
    : GroupNorm("GroupNorm", comm, num_groups, channels, eps, affine, name) {}

template <class T>
GroupNorm<T>::GroupNorm(const char* kind, const Communicator& comm, int num_groups, int channels,
                        double eps, bool affine, const std::string& name)
    : comm_(comm),
      num_groups_(num_groups),
      channels_(channels),
      eps_(eps),
      affine_(affine),
      where_(std::string(kind) + " '" + name + "'"),
      name_(name) {
  SHARDTENSOR_REQUIRE(channels >= 1, where_, "channels " << channels << " must be positive");
  SHARDTENSOR_REQUIRE(num_groups >= 1 && channels % num_groups == 0, where_,
                      "num_groups " << num_groups << " must divide channels " << channels);
  SHARDTENSOR_REQUIRE(eps >= 0 && std::isfinite(eps), where_,
                      "eps " << eps << " must be finite and non-negative");
  if (affine) {
    weight_ = constant_parameter(this->register_parameter("weight", {channels}, 0.0, 0), 1.0);
    bias_ = constant_parameter(this->register_parameter("bias", {channels}, 0.0, 0), 0.0);
  }
}

template <class T>
Variable<T> GroupNorm<T>::normalized(const Variable<T>& input, bool value_needed) {
  check_input(input, channels_, where_);
  StatLayout layout;
  layout.batch = input.value().batch();
  layout.channels = channels_;
  layout.groups = num_groups_;
  const Statistics stats = batch_statistics(comm_, input.value(), layout);
  return normalize(comm_, input, layout, stats, true, eps_, name_, weight_, bias_, input_packing(),
                   activation_, value_needed);
}

template <class T>
LayerNorm<T>::LayerNorm(const Communicator& comm, int channels, double eps, bool affine,
                        const std::string& name)
    : GroupNorm<T>("LayerNorm", comm, 1, channels, eps, affine, name) {}

// ---------------------------------------------------------------------------------------------

template <class T>
BatchNorm<T>::BatchNorm(const Communicator& comm, int channels, double momentum, double eps,
                        bool affine, const std::string& name)
    : comm_(comm),
      channels_(channels),
      momentum_(momentum),
      eps_(eps),
      affine_(affine),
      where_("BatchNorm '" + name + "'"),
      name_(name) {
  SHARDTENSOR_REQUIRE(channels >= 1, where_, "channels " << channels << " must be positive");
  SHARDTENSOR_REQUIRE(momentum >= 0 && momentum <= 1, where_,
                      "momentum " << momentum << " must lie in [0, 1]");
  SHARDTENSOR_REQUIRE(eps >= 0 && std::isfinite(eps), where_,
                      "eps " << eps << " must be finite and non-negative");
  if (affine) {
    weight_ = constant_parameter(this->register_parameter("weight", {channels}, 0.0, 0), 1.0);
    bias_ = constant_parameter(this->register_parameter("bias", {channels}, 0.0, 0), 0.0);
  }
  running_mean_ = ReplicatedView<T>(name + ".running_mean", channels);
  running_var_ = ReplicatedView<T>(name + ".running_var", channels);
  Kokkos::deep_copy(running_var_, T(1));
  this->register_buffer("running_mean", running_mean_);
  this->register_buffer("running_var", running_var_);
}

template <class T>
Variable<T> BatchNorm<T>::normalized(const Variable<T>& input, bool value_needed) {
  check_input(input, channels_, where_);
  const ShardTensor<T>& x = input.value();
  StatLayout layout;
  layout.batch = x.batch();
  layout.channels = channels_;
  layout.per_channel = true;
  if (!this->is_training()) {
    Statistics running;
    running.mean = host_values(running_mean_);
    running.var = host_values(running_var_);
    running.count = double(x.batch()) * double(x.decomposition().global_cells());
    return normalize(comm_, input, layout, running, false, eps_, name_, weight_, bias_,
                     input_packing(), activation_, value_needed);
  }
  const Index global_cells = x.decomposition().global_cells();
  SHARDTENSOR_REQUIRE(x.batch() * global_cells > 1, where_,
                      "training needs more than one value per channel, got batch "
                          << x.batch() << " of " << global_cells << " cell(s)");
  const Statistics stats = batch_statistics(comm_, x, layout);
  // A recomputed forward (nn/recompute.hpp) normalizes alike but updates nothing: the step's
  // first forward did.
  if (impl::recomputing_flag())
    return normalize(comm_, input, layout, stats, true, eps_, name_, weight_, bias_,
                     input_packing(), activation_, value_needed);
  // Running estimates: PyTorch's update, with the unbiased variance.
  auto mean_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), running_mean_);
  auto var_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), running_var_);
  const double unbias = stats.count / (stats.count - 1);
  for (Index c = 0; c < channels_; ++c) {
    mean_host(c) =
        static_cast<T>((1 - momentum_) * double(mean_host(c)) + momentum_ * stats.mean[c]);
    var_host(c) =
        static_cast<T>((1 - momentum_) * double(var_host(c)) + momentum_ * stats.var[c] * unbias);
  }
  Kokkos::deep_copy(running_mean_, mean_host);
  Kokkos::deep_copy(running_var_, var_host);
  ++batches_tracked_;
  return normalize(comm_, input, layout, stats, true, eps_, name_, weight_, bias_, input_packing(),
                   activation_, value_needed);
}

template class GroupNorm<float>;
template class GroupNorm<double>;
template class LayerNorm<float>;
template class LayerNorm<double>;
template class BatchNorm<float>;
template class BatchNorm<double>;

}  // namespace shardtensor
