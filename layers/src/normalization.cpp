#include "shardtensor/layers/normalization.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/normalization.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

namespace {

using kernels::BlockDoubles;
using kernels::StatLayout;

/// The doubles of one normalization (its sums, statistics, coefficients and its backward's) in
/// one device allocation, handed out in pieces; each piece keeps the allocation alive. The
/// layer keeps the allocation and hands it out again once nothing else holds it (no graph of
/// an earlier call, no piece: its use count is 1), so a step allocates none: on a GPU each
/// allocation is a cudaMalloc, a fence and a cudaFree.
class DoublesArena {
 public:
  /// Room for a normalization of `layout`, with its batch statistics or without (fixed ones),
  /// in `kept` where nothing else holds it and it has that size, else in a new allocation
  /// that `kept` keeps.
  DoublesArena(const StatLayout& layout, bool batch_statistics, BlockDoubles& kept) {
    const Index size = (batch_statistics ? 4 * layout.blocks() + 2 * layout.stats() : 0) +
                       2 * layout.blocks() + 2 * layout.channels  // coefficients
                       + 5 * layout.blocks();                     // the backward's sums and c1-c3
    if (kept.use_count() != 1 || Index(kept.extent(0)) != size) {
      const MemoryCategoryScope scope(MemoryCategory::workspaces);  // kept with the layer
      kept = BlockDoubles(Kokkos::view_alloc(Kokkos::WithoutInitializing, "normalization_doubles"),
                          size);
    }
    all_ = kept;
  }
  BlockDoubles take(Index count) {
    SHARDTENSOR_REQUIRE(used_ + count <= Index(all_.extent(0)), "normalization",
                        "internal: " << count << " more doubles than the layer sized");
    const BlockDoubles piece = Kokkos::subview(all_, Kokkos::make_pair(used_, used_ + count));
    used_ += count;
    return piece;
  }

 private:
  BlockDoubles all_;
  Index used_ = 0;
};

/// A statistic's mean and biased variance per statistic index (see StatLayout), on the device.
struct Statistics {
  BlockDoubles mean, var;
  double count = 0;  // global values per statistic
};

/// Global mean and biased variance per statistic in two passes, each one allreduce of every
/// block's local sums: the sum of x gives a first mean m; then the sums of d = x - m and d^2
/// give the corrected mean m + sum(d) / count and the variance (sum(d^2) - sum(d)^2 / count) /
/// count (the corrected two-pass algorithm: accurate when the mean dwarfs the spread). Nothing
/// is read on the host.
template <class T>
Statistics batch_statistics(const Communicator& comm, const ShardTensor<T>& x,
                            const StatLayout& layout, DoublesArena& arena) {
  const ExecutionSpace space;
  const Index blocks = layout.blocks(), stats = layout.stats();
  const BlockDoubles sums = arena.take(blocks), first_mean = arena.take(blocks);
  const BlockDoubles deviations = arena.take(2 * blocks);
  Statistics s{arena.take(stats), arena.take(stats),
               double(layout.blocks_per_stat()) * double(x.decomposition().global_cells())};
  const kernels::OwnedCells<const T> xi = x.interior();
  kernels::block_sums(space, xi, sums);
  allreduce(comm, sums);
  kernels::statistic_block_means(space, layout, sums, s.count, first_mean);
  kernels::block_deviation_sums(space, xi, first_mean, deviations);
  allreduce(comm, deviations);
  kernels::statistic_moments(space, layout, first_mean, deviations, s.count, s.mean, s.var);
  return s;
}

/// What the normalization's kernels read: per block mean and 1 / std, per channel the weight
/// and bias as doubles (1 and 0 without them).
struct Coefficients {
  BlockDoubles mean, rstd, scale, shift;
};

/// The coefficients from per-statistic means and variances (in double, or a BatchNorm's
/// running estimates in T).
template <class S, class T>
Coefficients coefficients(const StatLayout& layout,
                          const Kokkos::View<const S*, DefaultMemorySpace>& mean,
                          const Kokkos::View<const S*, DefaultMemorySpace>& var, double eps,
                          const Variable<T>& weight, const Variable<T>& bias, DoublesArena& arena) {
  using Parameter = Kokkos::View<const T*, DefaultMemorySpace>;
  Coefficients k{arena.take(layout.blocks()), arena.take(layout.blocks()),
                 arena.take(layout.channels), arena.take(layout.channels)};
  kernels::block_coefficients<S, T>(ExecutionSpace(), layout, mean, var, eps,
                                    weight.defined() ? Parameter(weight.data()) : Parameter(),
                                    bias.defined() ? Parameter(bias.data()) : Parameter(), k.mean,
                                    k.rstd, k.scale, k.shift);
  return k;
}

/// The output of a normalization, with an activation applied when one is fused.
template <class T>
using FusedActivation = std::optional<kernels::ActivationFunction<T>>;

/// y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c] with the given coefficients (then
/// y = f(y) with a fused activation f), and its backward: through the statistics when they are
/// the batch's (`batch_stats`, `count` values each), else (fixed statistics, BatchNorm in
/// evaluation) a per-channel scale. Without `value_needed` (forward_graph_only) the output is
/// an empty field of its layout. The output has the input's ghost cells, or those
/// `output_ghosts` gives an input without any (for the conv it feeds to fill).
template <class T>
Variable<T> normalize(const Communicator& comm, const Variable<T>& input, const StatLayout& layout,
                      const Coefficients& k, double count, bool batch_stats,
                      const std::string& name, const Variable<T>& weight, const Variable<T>& bias,
                      SavedPacking input_packing, const FusedActivation<T>& activation,
                      const OutputGhosts<T>& output_ghosts, bool value_needed,
                      DoublesArena& arena) {
  const ShardTensor<T>& x = input.value();
  GhostWidths ghosts = x.ghosts().none() && output_ghosts ? output_ghosts(x) : x.ghosts();
  // Not on a shard one cell thick along z with z ghosts: the gradient's rows would run along
  // y with a stride, summed in another order than the input's (kernels' CellLines), and the
  // bits would differ from the run without.
  if (!(ghosts == x.ghosts()) && x.local_extent(2) == 1 && ghosts.lower[2] + ghosts.upper[2] > 0)
    ghosts = x.ghosts();
  const Index blocks = layout.blocks();
  const BlockDoubles mean = k.mean, rstd = k.rstd, scale = k.scale, shift = k.shift;
  const BlockDoubles gradient_doubles = arena.take(5 * blocks);  // for the backward

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node()};
  if (weight.defined()) inputs.push_back(weight.node());
  if (bias.defined()) inputs.push_back(bias.node());
  auto node = make_result_node<T>(name, inputs);
  node->scratch_ghosts = !(ghosts == x.ghosts());
  if (value_needed) {
    // Every owned cell is written below: only ghost cells (if any) need their zeros.
    ShardTensor<T> y = ghosts == GhostWidths{}
                           ? ShardTensor<T>::uninitialized(x.decomposition(), x.rank(), x.batch(),
                                                           x.channels(), ghosts, name + ".output")
                           : ShardTensor<T>(x.decomposition(), x.rank(), x.batch(), x.channels(),
                                            ghosts, name + ".output");
    kernels::normalize_forward(ExecutionSpace(), kernels::OwnedCells<const T>(x.interior()), mean,
                               rstd, scale, shift, kernels::OwnedCells<T>(y.interior()));
    if (activation) impl::apply_activation(*activation, y, y);
    node->field = y;
  } else {
    node->released = typename impl::Node<T>::Layout{x.decomposition(), x.rank(), x.batch(),
                                                    x.channels(), ghosts};
  }
  if (node->requires_grad) {
    auto x_node = input.node();
    auto w_node = weight.defined() ? weight.node() : nullptr;
    auto b_node = bias.defined() ? bias.node() : nullptr;
    // The input, for backward (in 16 bits where all its values are bfloat16 values: a bf16
    // layer's output). Not after a graph-only forward, the last op of a recomputed unit: its
    // backward runs next, so the 16 bits would only sit beside the float input until then
    // (the peak of the bf16 U-Net's recomputed up block, 4 MiB of 57.5 at 64^3).
    SavedField<T> saved_input(input, value_needed ? input_packing : SavedPacking::none,
                              name + ".saved_input");
    node->backward = [=](impl::Node<T>& self) mutable {
      // The output's gradient is this node's alone (the input's gradient may take it).
      const bool in_place = self.owns_grad_field();
      const ShardTensor<T> x_again = saved_input.value();
      saved_input = {};
      // Nothing holds the input's value but this closure and perhaps the input's node (no op
      // saved it, no Variable of it is left).
      const bool node_holds_x = x_node->field.view().data() == x_again.view().data();
      const bool x_held_here_only =
          x_again.view().use_count() == (node_holds_x ? 2 : 1) && x_node->handle.expired();
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
      // This rank's sums of dy and dy * xhat per block: the weight's and bias's gradients (each
      // rank's part), then, summed over the ranks, the input gradient's coefficients.
      const ExecutionSpace space;
      const auto piece = [&](Index first, Index count) -> BlockDoubles {
        return Kokkos::subview(gradient_doubles, Kokkos::make_pair(first, first + count));
      };
      const BlockDoubles sums = piece(0, 2 * blocks);
      const BlockDoubles a1 = piece(2 * blocks, blocks), a2 = piece(3 * blocks, blocks),
                         a3 = piece(4 * blocks, blocks);
      kernels::normalize_gradient_sums(space, gy, x_cells, mean, rstd, sums);
      if (w_node && w_node->requires_grad)
        kernels::add_channel_sums(space, layout, piece(blocks, blocks), w_node->grad_partial(comm));
      if (b_node && b_node->requires_grad)
        kernels::add_channel_sums(space, layout, piece(0, blocks), b_node->grad_partial(comm));
      if (!x_node->requires_grad) return;
      // dx = c1 * dy - c2 - c3 * xhat per block, c2 and c3 from the global sums of g = dy *
      // weight and g * xhat per statistic.
      if (batch_stats) allreduce(comm, sums);
      kernels::backward_coefficients(space, layout, rstd, scale, sums, count, batch_stats, a1, a2,
                                     a3);
      // Written, not added to; over dy itself where the input's gradient can take that buffer
      // (each cell reads its dy before its dx is written): one field fewer at the peak of a
      // U-Net block's backward. Where it cannot (dy has the ghost cells of the conv the
      // output fed), over the input itself if nothing else holds it (each cell reads its x
      // before its dx is written).
      bool first = dy_is_own && x_node->adopt_grad_field(dy);
      if (!first && dy_is_own && x_held_here_only && x_node->field_grad.view().span() == 0) {
        x_node->release_value();  // its copy, if it has one: nothing can read it any more
        first = x_node->adopt_grad_field(x_again);
      }
      first = first || x_node->take_unfilled_grad_field();
      kernels::normalize_backward(space, gy, x_cells, mean, rstd, a1, a2, a3,
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
  DoublesArena arena(layout, true, doubles_);
  const Statistics stats = batch_statistics(comm_, input.value(), layout, arena);
  return normalize(comm_, input, layout,
                   coefficients<double>(layout, stats.mean, stats.var, eps_, weight_, bias_, arena),
                   stats.count, true, name_, weight_, bias_, input_packing(), activation_,
                   output_ghosts_, value_needed, arena);
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
    const double count = double(x.batch()) * double(x.decomposition().global_cells());
    DoublesArena arena(layout, false, doubles_);
    return normalize(
        comm_, input, layout,
        coefficients<T>(layout, running_mean_, running_var_, eps_, weight_, bias_, arena), count,
        false, name_, weight_, bias_, input_packing(), activation_, output_ghosts_, value_needed,
        arena);
  }
  const Index global_cells = x.decomposition().global_cells();
  SHARDTENSOR_REQUIRE(x.batch() * global_cells > 1, where_,
                      "training needs more than one value per channel, got batch "
                          << x.batch() << " of " << global_cells << " cell(s)");
  DoublesArena arena(layout, true, doubles_);
  const Statistics stats = batch_statistics(comm_, x, layout, arena);
  // Running estimates: PyTorch's update, with the unbiased variance. A recomputed forward
  // (layers/recompute.hpp) normalizes alike but updates nothing: the step's first forward did.
  if (!impl::recomputing_flag()) {
    kernels::update_running_statistics(ExecutionSpace(), stats.mean, stats.var, momentum_,
                                       stats.count / (stats.count - 1), running_mean_,
                                       running_var_);
    ++batches_tracked_;
  }
  return normalize(comm_, input, layout,
                   coefficients<double>(layout, stats.mean, stats.var, eps_, weight_, bias_, arena),
                   stats.count, true, name_, weight_, bias_, input_packing(), activation_,
                   output_ghosts_, value_needed, arena);
}

template class GroupNorm<float>;
template class GroupNorm<double>;
template class LayerNorm<float>;
template class LayerNorm<double>;
template class BatchNorm<float>;
template class BatchNorm<double>;

}  // namespace shardtensor
