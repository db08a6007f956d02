#pragma once
// Channel concatenation of sharded fields (U-Net skip connections): local, except for a part
// laid out by another decomposition, which is redistributed straight into its channels.

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "shardtensor/comm/redistribute.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

namespace impl {

/// Requires `b` to match `a` (batch, decomposition) and to have no ghost cells.
template <class T>
void require_concat_match(const Variable<T>& a, const Variable<T>& b) {
  impl::require_field(b, "concat_channels");
  const ShardTensor<T>& x = a.value();
  const ShardTensor<T>& y = b.value();
  SHARDTENSOR_REQUIRE(
      x.batch() == y.batch() && x.decomposition() == y.decomposition() && y.ghosts().none(),
      "concat_channels",
      "'" << b.name() << "' (batch " << y.batch() << ", " << y.decomposition().describe()
          << ") does not match '" << a.name() << "' (batch " << x.batch() << ", "
          << x.decomposition().describe() << ")");
}

/// A concatenation's output and its backward: the inputs are copied into y one after another
/// (add_input), then finish() makes the Variable. With `ghosts`, y carries ghost cells for the
/// layer it feeds to fill in place (zero until then; Node::scratch_ghosts).
template <class T>
class ChannelConcat {
 public:
  ChannelConcat(const ShardTensor<T>& like, Index channels, const GhostWidths& ghosts = {})
      : y_(ghosts.none() ? impl::field_like(like, "concat", channels)
                         : ShardTensor<T>(like.decomposition(), like.rank(), like.batch(), channels,
                                          ghosts, "concat")),
        channels_(channels),
        cells_(static_cast<Index>(like.view().span()) / (like.batch() * like.channels())),
        // On a host a run is the whole channel (a plain loop); on a GPU runs of 4096 cells,
        // so that the teams fill the device (a team per channel left most of it idle: 90
        // GB/s on an H200).
        chunk_(kernels_run_on_host ? std::max<Index>(cells_, 1) : Index(4096)),
        chunks_((cells_ + chunk_ - 1) / chunk_) {}

  /// Copies `x` into the next channels of y. A sample's channels [offset, offset + c) of y are
  /// one contiguous block of c fields: copy (and in the backward, add) channel by channel,
  /// each a contiguous run of cells: one team per run of `chunk` cells of a channel, its
  /// threads along the run.
  void add_input(const Variable<T>& x) {
    const Index c = x.value().channels(), at = offset_, channels = channels_, cells = cells_,
                chunk = chunk_, chunks = chunks_;
    require_room(x);
    if (!y_.ghosts().none()) {  // x's cells go into y's owned ones: one run per line
      copy_box_between(x.value().view(), x.value().interior_box(), impl::channel_range(y_, at, c),
                       y_.interior_box());
      add_part(x.node(), c);
      return;
    }
    const auto xv = x.value().view();
    const auto yv = y_.view();
    Kokkos::parallel_for(
        "concat", Policy(static_cast<int>(xv.extent(0) * c * chunks), Kokkos::AUTO),
        KOKKOS_LAMBDA(const Member& team) {
          const Index nc = team.league_rank() / chunks, n = nc / c, k = nc % c;
          const Index begin = team.league_rank() % chunks * chunk;
          const Index end = begin + chunk < cells ? begin + chunk : cells;
          const T* from = xv.data() + nc * cells;
          T* to = yv.data() + (n * channels + at + k) * cells;
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, begin, end),
                               [&](const Index i) { to[i] = from[i]; });
        });
    add_part(x.node(), c);
  }

  /// Writes `x` (y's batch, no ghost cells), laid out by another decomposition of the same
  /// global field (an upsampling on split points that are not multiples of its factor), into
  /// the next channels of y: the redistribution writes straight into them, so no
  /// redistributed copy of x exists beside y, and x's value goes once packed where `x` was its
  /// last Variable. The backward brings those
  /// channels' gradient back onto x's decomposition the same way. Collective over `comm`.
  void add_redistributed_input(const Communicator& comm, Variable<T> x) {
    require_room(x);
    const Index c = x.value().channels(), at = offset_;
    ShardTensor<T> value = x.value();
    const std::shared_ptr<impl::Node<T>> node = x.node();
    x = Variable<T>();  // the node lets go of its value unless another Variable holds it
    redistribute_channels(comm, std::exchange(value, ShardTensor<T>()), 0, y_, at, c,
                          UnpackMode::assign, "concat_channels");
    add_part(node, c, comm);
  }

  /// Records an input written into the next `c` channels (`redistributed`: over that
  /// communicator, from another decomposition).
  void add_part(const std::shared_ptr<impl::Node<T>>& node, Index c,
                std::optional<Communicator> redistributed = {}) {
    nodes_.push_back(node);
    offsets_.push_back(offset_);
    redistributed_.push_back(std::move(redistributed));
    offset_ += c;
  }

  /// The output, and the channel the next input goes to (for add_part after writing it there).
  const ShardTensor<T>& output() const { return y_; }
  Index next_channel() const { return offset_; }

  /// Requires y to have room for x's channels at the next offset.
  void require_room(const Variable<T>& x) const {
    const Index c = x.value().channels();
    SHARDTENSOR_REQUIRE(
        offset_ + c <= channels_, "concat_channels",
        "'" << x.name() << "' brings " << c << " channels to " << offset_ << " of " << channels_);
  }

  Variable<T> finish() {
    SHARDTENSOR_REQUIRE(offset_ == channels_, "concat_channels",
                        "inputs brought " << offset_ << " channels of " << channels_);
    auto node = make_result_node<T>("concat", nodes_);
    node->field = y_;
    node->scratch_ghosts = !y_.ghosts().none();
    if (node->requires_grad) {
      node->backward = [nodes = nodes_, offsets = offsets_, redistributed = redistributed_,
                        channels = channels_, cells = cells_, chunk = chunk_,
                        chunks = chunks_](impl::Node<T>& self) {
        const ShardTensor<T>& grad = self.grad_field();
        const auto gy = grad.view();
        for (std::size_t k = 0; k < nodes.size(); ++k) {
          if (!nodes[k]->requires_grad) continue;
          if (redistributed[k]) {  // written, or added, straight from gy's channels
            impl::Node<T>& in = *nodes[k];
            const UnpackMode mode =
                in.take_unfilled_grad_field() ? UnpackMode::assign : UnpackMode::add;
            const ShardTensor<T>& gx = in.grad_field();
            redistribute_channels(*redistributed[k], self.grad_field(), offsets[k], gx, 0,
                                  gx.channels(), mode, "concat_channels backward");
            continue;
          }
          const ShardTensor<T>& grad_x = nodes[k]->grad_field();
          const auto gx = grad_x.view();
          const Index c = gx.extent(1), at = offsets[k];
          if (!grad.ghosts().none()) {
            copy_box_between(impl::channel_range(grad, at, c), grad.interior_box(), gx,
                             grad_x.interior_box(), UnpackMode::add);
            continue;
          }
          Kokkos::parallel_for(
              "concat_backward", Policy(static_cast<int>(gx.extent(0) * c * chunks), Kokkos::AUTO),
              KOKKOS_LAMBDA(const Member& team) {
                const Index nc = team.league_rank() / chunks, n = nc / c, j = nc % c;
                const Index begin = team.league_rank() % chunks * chunk;
                const Index end = begin + chunk < cells ? begin + chunk : cells;
                const T* from = gy.data() + (n * channels + at + j) * cells;
                T* to = gx.data() + nc * cells;
                Kokkos::parallel_for(Kokkos::TeamVectorRange(team, begin, end),
                                     [&](const Index i) { to[i] += from[i]; });
              });
        }
      };
    }
    return Variable<T>(node);
  }

 private:
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  using Member = typename Policy::member_type;
  ShardTensor<T> y_;
  Index channels_, cells_, chunk_, chunks_, offset_ = 0;
  std::vector<std::shared_ptr<impl::Node<T>>> nodes_;
  std::vector<Index> offsets_;
  std::vector<std::optional<Communicator>> redistributed_;  // for an input redistributed in
};

}  // namespace impl

/// Fields with the same decomposition and batch, stacked along the channel axis in order.
template <class T>
Variable<T> concat_channels(const std::vector<Variable<T>>& inputs) {
  SHARDTENSOR_REQUIRE(!inputs.empty(), "concat_channels", "no inputs");
  Index channels = 0;
  for (const Variable<T>& v : inputs) {
    impl::require_concat_match(inputs.front(), v);
    channels += v.value().channels();
  }
  impl::ChannelConcat<T> concat(inputs.front().value(), channels);
  for (const Variable<T>& v : inputs) concat.add_input(v);
  return concat.finish();
}

namespace impl {

/// The two concat_channels(first, second_channels, make_second) below; `comm` null where the
/// second part must have the first's layout; `ghosts`: the output's.
template <class T, class MakeSecond>
Variable<T> concat_made_second(const Communicator* comm, Variable<T>&& first, Index second_channels,
                               const MakeSecond& make_second, const GhostWidths& ghosts) {
  impl::require_concat_match(first, first);  // a field without ghost cells
  const Index batch = first.value().batch();
  const Decomposition decomposition = first.value().decomposition();
  impl::ChannelConcat<T> concat(first.value(), first.value().channels() + second_channels, ghosts);
  concat.add_input(first);
  first = Variable<T>();
  Variable<T> second = make_second();
  impl::require_field(second, "concat_channels");
  const bool elsewhere = second.value().decomposition() != decomposition;
  SHARDTENSOR_REQUIRE(
      second.value().batch() == batch && (comm || !elsewhere) && second.value().ghosts().none(),
      "concat_channels",
      "'" << second.name() << "' (batch " << second.value().batch() << ", "
          << second.value().decomposition().describe() << ") does not match the first input (batch "
          << batch << ", " << decomposition.describe() << ")");
  if (elsewhere)
    concat.add_redistributed_input(*comm, std::exchange(second, Variable<T>()));
  else
    concat.add_input(second);
  return concat.finish();
}

}  // namespace impl

/// concat_channels({first, make_second()}), with make_second() called once `first` is copied
/// and handed over: where it was the last Variable of its value, the value goes before the
/// second part is made, and the two never exist beside the output at once (a recomputed
/// unit's input, the U-Net's skip). `second_channels`: the channels make_second() returns.
template <class T, class MakeSecond>
Variable<T> concat_channels(Variable<T>&& first, Index second_channels,
                            const MakeSecond& make_second) {
  return impl::concat_made_second<T>(nullptr, std::move(first), second_channels, make_second,
                                     GhostWidths{});
}

/// The same, where make_second() may return the same global field laid out by another
/// decomposition (a U-Net's upsampling on split points that are not multiples of its factor):
/// it is redistributed straight into the concatenation's channels, so neither a
/// redistributed copy nor the whole field in send and receive buffers exists beside the
/// output, only the cells that change rank. Collective over `comm`.
/// With `ghosts` (Conv::padded_input_ghosts of the layer it feeds), the output carries those
/// ghost cells, zero, for that layer to fill in place (Node::scratch_ghosts): no padded copy
/// of it exists beside it.
template <class T, class MakeSecond>
Variable<T> concat_channels(const Communicator& comm, Variable<T>&& first, Index second_channels,
                            const MakeSecond& make_second, const GhostWidths& ghosts = {}) {
  return impl::concat_made_second<T>(&comm, std::move(first), second_channels, make_second, ghosts);
}

/// concat_channels(first, make_second()) where the second part is written straight into the
/// output's channels once `first` is copied and handed over: write_second(into, channel)
/// writes it into channels [channel, channel + second_channels) of into's owned cells and
/// returns its node (ConvTranspose::forward_into), so no field of its own exists beside the
/// output. `ghosts`: the output's, as in the form above.
template <class T, class WriteSecond>
Variable<T> concat_channels_written(Variable<T>&& first, Index second_channels,
                                    const WriteSecond& write_second,
                                    const GhostWidths& ghosts = {}) {
  impl::require_concat_match(first, first);  // a field without ghost cells
  impl::ChannelConcat<T> concat(first.value(), first.value().channels() + second_channels, ghosts);
  concat.add_input(first);
  first = Variable<T>();
  concat.add_part(write_second(concat.output(), concat.next_channel()), second_channels);
  return concat.finish();
}

}  // namespace shardtensor
