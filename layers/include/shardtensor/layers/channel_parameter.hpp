#pragma once
// channel_parameter: a field times, or plus, a trained value per channel (or one for all),
// held replicated on every rank: the per-channel initializers of an imported graph that train
// (ConvNeXt's layer scale, a learned offset). The parameter's gradient is a sum over every
// rank's cells (a partial sum per rank, completed by one allreduce before it is read), as
// PRelu's slopes.

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

/// How the parameter meets the field.
enum class ChannelOp { multiply, add };

/// y(n, c, cell) = x(n, c, cell) * w[c] (multiply) or + w[c] (add); w holds one value per
/// channel of x, or one for all.
template <class T>
Variable<T> channel_parameter(const Communicator& comm, ChannelOp op, const Variable<T>& input,
                              const Variable<T>& weight) {
  impl::require_field(input, "channel_parameter");
  const ShardTensor<T>& x = input.value();
  const Index values = Index(weight.data().extent(0)), channels = x.channels();
  SHARDTENSOR_REQUIRE(values == 1 || values == channels, "channel_parameter",
                      "parameter '" << weight.name() << "' holds " << values
                                    << " values for a field of " << channels
                                    << " channels: give 1 or one per channel");
  SHARDTENSOR_REQUIRE(x.ghosts().none(), "channel_parameter",
                      "'" << input.name() << "' carries ghost cells");
  const Index cells = Index(x.view().span()) / (x.batch() * channels), batch = x.batch();
  ShardTensor<T> y = impl::field_like(x, "channel_parameter");
  const T* xv = x.view().data();
  T* yv = y.view().data();
  const ReplicatedView<T> w = weight.data();
  const bool multiply = op == ChannelOp::multiply;
  // Value i's channel: i / cells % channels; its parameter: that one, or the only one.
  Kokkos::parallel_for(
      "channel_parameter", Index(x.view().span()), KOKKOS_LAMBDA(const Index i) {
        const T a = w(values == 1 ? 0 : i / cells % channels);
        yv[i] = multiply ? xv[i] * a : xv[i] + a;
      });
  auto node = make_result_node<T>("channel_parameter", {input.node(), weight.node()});
  node->field = y;
  if (node->requires_grad) {
    auto xn = input.node(), wn = weight.node();
    // Only a product's gradients read the input (and the parameter).
    const ShardTensor<T> kept = multiply ? x : ShardTensor<T>();
    node->backward = [xn, wn, kept, w, multiply, values, channels, cells, batch,
                      comm](impl::Node<T>& self) {
      const T* gy = self.grad_field().view().data();
      const Index span = batch * channels * cells;
      if (xn->requires_grad) {
        T* gx = xn->grad_field().view().data();
        Kokkos::parallel_for(
            "channel_parameter_backward_input", span, KOKKOS_LAMBDA(const Index i) {
              gx[i] += multiply ? gy[i] * w(values == 1 ? 0 : i / cells % channels) : gy[i];
            });
      }
      if (wn->requires_grad) {
        const T* xv = multiply ? kept.view().data() : nullptr;
        impl::add_channel_sums(
            "channel_parameter_backward_weight", wn->grad_partial(comm), values, batch, channels,
            cells, KOKKOS_LAMBDA(const Index i)->T { return multiply ? gy[i] * xv[i] : gy[i]; });
      }
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
