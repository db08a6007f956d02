#pragma once
// channel_affine: y = x * scale[c] + shift[c] with constant (not trained) per-channel or scalar
// factors: a field (or a pooled (N, C) vector) plus, minus, times or divided by a constant, as
// imported graphs write their input normalisation ((x - mean) / std) and scalings.

#include <Kokkos_Core.hpp>
#include <string>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

namespace impl {

/// (scale, shift) per channel on the device, from one value for all or one per channel of
/// `channels`; `what` describes the input for the error.
template <class T>
Kokkos::View<T**> channel_factors(const std::vector<double>& scale,
                                  const std::vector<double>& shift, Index channels,
                                  const std::string& what) {
  const auto fits = [&](const std::vector<double>& v) {
    return v.size() == 1 || Index(v.size()) == channels;
  };
  SHARDTENSOR_REQUIRE(channels > 0 && fits(scale) && fits(shift), "channel_affine",
                      scale.size() << " scale(s) and " << shift.size() << " shift(s) for " << what
                                   << ": give 1 or one per channel");
  Kokkos::View<T**> factors("channel_affine.factors", channels, 2);
  auto host = Kokkos::create_mirror_view(factors);
  for (Index c = 0; c < channels; ++c) {
    host(c, 0) = T(scale[scale.size() == 1 ? 0 : c]);
    host(c, 1) = T(shift[shift.size() == 1 ? 0 : c]);
  }
  Kokkos::deep_copy(factors, host);
  return factors;
}

/// The same on a replicated (N, C) tensor (a pooled vector): y(n, c) = x(n, c) scale[c] + shift[c].
template <class T>
Variable<T> channel_affine_replicated(const Variable<T>& input, const std::vector<double>& scale,
                                      const std::vector<double>& shift) {
  const Index channels = input.shape().size() == 2 ? input.shape()[1] : 0;
  const auto factors = channel_factors<T>(
      scale, shift, channels,
      "a replicated tensor of " + std::to_string(input.shape().size()) +
          " axes (an (N, C) one is read)");
  const ReplicatedView<T> x = input.data();
  ReplicatedView<T> y("channel_affine", x.extent(0));
  Kokkos::parallel_for(
      "channel_affine_replicated", x.extent(0), KOKKOS_LAMBDA(const Index i) {
        y(i) = x(i) * factors(i % channels, 0) + factors(i % channels, 1);
      });
  auto node = make_result_node<T>("channel_affine", {input.node()});
  node->is_field = false;
  node->data = y;
  node->shape = input.shape();
  if (node->requires_grad) {
    auto xn = input.node();
    node->backward = [xn, factors, channels](impl::Node<T>& self) {
      const auto dy = self.grad_data();
      const auto dx = xn->grad_data();
      Kokkos::parallel_for(
          "channel_affine_replicated_backward", dy.extent(0),
          KOKKOS_LAMBDA(const Index i) { dx(i) += dy(i) * factors(i % channels, 0); });
    };
  }
  return Variable<T>(node);
}

}  // namespace impl

/// y(n, c, cell) = x(n, c, cell) * scale[c] + shift[c]; `scale` and `shift` hold one value per
/// channel or one for all. Backward: dx = dy * scale[c].
template <class T>
Variable<T> channel_affine(const Variable<T>& input, const std::vector<double>& scale,
                           const std::vector<double>& shift) {
  SHARDTENSOR_REQUIRE(input.defined(), "channel_affine", "the input is undefined");
  if (!input.is_field()) return impl::channel_affine_replicated(input, scale, shift);
  const ShardTensor<T>& x = input.value();
  const Index channels = x.channels();
  const auto factors = impl::channel_factors<T>(
      scale, shift, channels, "a field of " + std::to_string(channels) + " channels");
  ShardTensor<T> y = impl::field_like(x, "channel_affine");
  const auto in = x.view(), out = y.view();  // ghosts included, as the other pointwise ops
  Kokkos::parallel_for(
      "channel_affine",
      Kokkos::MDRangePolicy<RightRank<5>>({0, 0, 0, 0, 0},
                                             {in.extent(0), in.extent(1), in.extent(2),
                                              in.extent(3), in.extent(4)}),
      KOKKOS_LAMBDA(const Index n, const Index c, const Index i, const Index j, const Index k) {
        out(n, c, i, j, k) = in(n, c, i, j, k) * factors(c, 0) + factors(c, 1);
      });
  auto node = make_result_node<T>("channel_affine", {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto xn = input.node();
    node->backward = [xn, factors](impl::Node<T>& self) {
      const auto dy = self.grad_field().view();
      const auto dx = xn->grad_field().view();
      Kokkos::parallel_for(
          "channel_affine_backward",
          Kokkos::MDRangePolicy<RightRank<5>>({0, 0, 0, 0, 0},
                                                 {dy.extent(0), dy.extent(1), dy.extent(2),
                                                  dy.extent(3), dy.extent(4)}),
          KOKKOS_LAMBDA(const Index n, const Index c, const Index i, const Index j,
                        const Index k) { dx(n, c, i, j, k) += dy(n, c, i, j, k) * factors(c, 0); });
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
