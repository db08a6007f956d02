#pragma once
// Ops across the channels of each cell: a reduction to one channel (ONNX's ReduceMean over
// axis 1 and kin), softmax and log-softmax over the channels (a segmentation's class
// probabilities), a range of channels (Split), a shuffle of the channels (ShuffleNet's). Every
// cell depends on itself only: no
// communication, sharded == single-rank cell by cell.

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

enum class ChannelReduction { mean, sum, max, min };

namespace impl {

/// (batch, channels, cells) of a field: cells of one (n, c) contiguous, ghosts included.
template <class T>
struct ChannelLines {
  Index batch, channels, cells;
  explicit ChannelLines(const ShardTensor<T>& x)
      : batch(x.batch()),
        channels(x.channels()),
        cells(Index(x.view().span()) / (x.batch() * x.channels())) {}
  /// The first value of line j (one (n, cell)); the next channel is `cells` further on.
  KOKKOS_INLINE_FUNCTION Index start(Index j) const {
    return j / cells * channels * cells + j % cells;
  }
};

/// The index in x of y's value i, where y is channels [begin, begin + count) of x.
struct ChannelRange {
  Index begin, count, channels, cells;
  KOKKOS_INLINE_FUNCTION Index operator()(Index i) const {
    const Index n = i / (count * cells), k = i / cells % count;
    return (n * channels + begin + k) * cells + i % cells;
  }
};

/// The index in x of y's value i, where y's channel a g + b is x's channel b (C / g) + a.
struct ChannelShuffle {
  Index groups, channels, cells;
  KOKKOS_INLINE_FUNCTION Index operator()(Index i) const {
    const Index n = i / (channels * cells), j = i / cells % channels;
    return (n * channels + j % groups * (channels / groups) + j / groups) * cells + i % cells;
  }
};

}  // namespace impl

/// y(n, 0, cell) = the mean, sum, max or min over c of x(n, c, cell): a one-channel field.
/// Max and min send the gradient to the channels that hold the extreme, split evenly where
/// several do (PyTorch's amax).
template <class T>
Variable<T> reduce_channels(const Variable<T>& input, ChannelReduction kind) {
  impl::require_field(input, "reduce_channels");
  const ShardTensor<T>& x = input.value();
  const impl::ChannelLines<T> lines(x);
  ShardTensor<T> y = impl::field_like(x, "reduce_channels", 1);
  const T* xv = x.view().data();
  T* yv = y.view().data();
  Kokkos::parallel_for(
      "reduce_channels", lines.batch * lines.cells, KOKKOS_LAMBDA(const Index j) {
        const Index s = lines.start(j);
        T r = xv[s];
        for (Index c = 1; c < lines.channels; ++c) {
          const T v = xv[s + c * lines.cells];
          r = kind == ChannelReduction::max   ? math::max(r, v)
              : kind == ChannelReduction::min ? math::min(r, v)
                                              : r + v;
        }
        yv[j] = kind == ChannelReduction::mean ? r / T(lines.channels) : r;
      });
  auto node = make_result_node<T>("reduce_channels", {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, x, y, lines, kind](impl::Node<T>& self) {
      const T* gy = self.grad_field().view().data();
      T* gx = in->grad_field().view().data();
      const T* xv = x.view().data();
      const T* yv = y.view().data();
      Kokkos::parallel_for(
          "reduce_channels_backward", lines.batch * lines.cells, KOKKOS_LAMBDA(const Index j) {
            const Index s = lines.start(j);
            if (kind == ChannelReduction::mean || kind == ChannelReduction::sum) {
              const T g = kind == ChannelReduction::mean ? gy[j] / T(lines.channels) : gy[j];
              for (Index c = 0; c < lines.channels; ++c) gx[s + c * lines.cells] += g;
              return;
            }
            Index ties = 0;
            for (Index c = 0; c < lines.channels; ++c) ties += xv[s + c * lines.cells] == yv[j];
            for (Index c = 0; c < lines.channels; ++c)
              if (xv[s + c * lines.cells] == yv[j]) gx[s + c * lines.cells] += gy[j] / T(ties);
          });
    };
  }
  return Variable<T>(node);
}

/// Softmax over the channels of each cell (`log`: log-softmax), with the largest value
/// subtracted first (no overflow).
template <class T>
Variable<T> softmax_channels(const Variable<T>& input, bool log = false) {
  impl::require_field(input, "softmax_channels");
  const ShardTensor<T>& x = input.value();
  const impl::ChannelLines<T> lines(x);
  ShardTensor<T> y = impl::field_like(x, log ? "log_softmax" : "softmax");
  const T* xv = x.view().data();
  T* yv = y.view().data();
  Kokkos::parallel_for(
      "softmax_channels", lines.batch * lines.cells, KOKKOS_LAMBDA(const Index j) {
        const Index s = lines.start(j), step = lines.cells;
        T m = xv[s];
        for (Index c = 1; c < lines.channels; ++c) m = math::max(m, xv[s + c * step]);
        T sum = 0;
        for (Index c = 0; c < lines.channels; ++c) sum += math::exp(xv[s + c * step] - m);
        const T log_sum = math::log(sum);
        for (Index c = 0; c < lines.channels; ++c) {
          const T shifted = xv[s + c * step] - m;
          yv[s + c * step] = log ? shifted - log_sum : math::exp(shifted) / sum;
        }
      });
  auto node = make_result_node<T>(log ? "log_softmax" : "softmax", {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, y, lines, log](impl::Node<T>& self) {
      const T* gy = self.grad_field().view().data();
      T* gx = in->grad_field().view().data();
      const T* yv = y.view().data();
      Kokkos::parallel_for(
          "softmax_channels_backward", lines.batch * lines.cells, KOKKOS_LAMBDA(const Index j) {
            const Index s = lines.start(j), step = lines.cells;
            // softmax: dx = y (dy - sum dy y); log-softmax: dx = dy - e^y sum dy.
            T dot = 0;
            for (Index c = 0; c < lines.channels; ++c)
              dot += log ? gy[s + c * step] : gy[s + c * step] * yv[s + c * step];
            for (Index c = 0; c < lines.channels; ++c) {
              const Index i = s + c * step;
              gx[i] += log ? gy[i] - math::exp(yv[i]) * dot : yv[i] * (gy[i] - dot);
            }
          });
    };
  }
  return Variable<T>(node);
}

namespace impl {

/// y's value i is x's value source(i) (y has `channels` channels; every value of y is one of
/// x's, and no two read the same one): a range or a permutation of the channels. The
/// gradient goes back along the same map, so its scatter has no two writers.
template <class T, class Source>
Variable<T> gather_channels(const Variable<T>& input, Index channels, const Source& source,
                            const std::string& label) {
  const ShardTensor<T>& x = input.value();
  ShardTensor<T> y = field_like(x, label, channels);
  const T* xv = x.view().data();
  T* yv = y.view().data();
  Kokkos::parallel_for(
      label, Index(y.view().span()), KOKKOS_LAMBDA(const Index i) { yv[i] = xv[source(i)]; });
  auto node = make_result_node<T>(label, {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto in = input.node();
    const Index size = Index(y.view().span());
    const std::string backward_label = label + "_backward";
    node->backward = [in, source, size, backward_label](impl::Node<T>& self) {
      const T* gy = self.grad_field().view().data();
      T* gx = in->grad_field().view().data();
      Kokkos::parallel_for(
          backward_label, size, KOKKOS_LAMBDA(const Index i) { gx[source(i)] += gy[i]; });
    };
  }
  return Variable<T>(node);
}

}  // namespace impl

/// Channels [begin, begin + count) of a field (one output of a Split).
template <class T>
Variable<T> slice_channels(const Variable<T>& input, Index begin, Index count) {
  impl::require_field(input, "slice_channels");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(begin >= 0 && count > 0 && begin + count <= x.channels(), "slice_channels",
                      "channels [" << begin << ", " << begin + count << ") of '" << input.name()
                                   << "', which has " << x.channels());
  const impl::ChannelLines<T> lines(x);
  return impl::gather_channels(input, count,
                               impl::ChannelRange{begin, count, lines.channels, lines.cells},
                               "slice_channels");
}

/// PyTorch's nn.ChannelShuffle(groups), ShuffleNet's channel_shuffle: the channels viewed as
/// (groups, C / groups), transposed and flattened, so output channel a * groups + b is input
/// channel b * (C / groups) + a. A permutation: its gradient is the inverse one.
template <class T>
Variable<T> channel_shuffle(const Variable<T>& input, Index groups) {
  impl::require_field(input, "channel_shuffle");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(groups >= 1 && x.channels() % groups == 0, "channel_shuffle",
                      groups << " groups for the " << x.channels() << " channels of '"
                             << input.name() << "': the groups must divide the channels");
  const impl::ChannelLines<T> lines(x);
  return impl::gather_channels(input, lines.channels,
                               impl::ChannelShuffle{groups, lines.channels, lines.cells},
                               "channel_shuffle");
}

}  // namespace shardtensor
