#pragma once
// redistribute_field: a differentiable redistribute, so a model can bring a field back onto
// the decomposition another branch uses (a U-Net's skip connection on uneven shards).

#include "shardtensor/comm/redistribute.hpp"
#include "shardtensor/nn/pointwise.hpp"

namespace shardtensor {

/// The field `input` laid out by `to` (same global field, no ghost cells). Values are copied,
/// never combined, so the result is bit-exact; the backward pass redistributes the gradient
/// back onto the input's decomposition (the adjoint of a permutation is its inverse).
/// Collective over `comm`. Returns `input` itself when it already has that layout.
template <class T>
Variable<T> redistribute_field(const Communicator& comm, const Variable<T>& input,
                               const Decomposition& to) {
  impl::require_field(input, "redistribute_field");
  const ShardTensor<T>& x = input.value();
  if (x.decomposition() == to && x.ghosts().none()) return input;
  auto node = make_result_node<T>("redistribute", {input.node()});
  node->field = redistribute(comm, x, to);
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [comm, in](impl::Node<T>& self) {
      const ShardTensor<T>& gx = in->grad_field();
      const ShardTensor<T> back =
          redistribute(comm, self.grad_field(), gx.decomposition(), gx.ghosts());
      const auto src = back.view(), dst = gx.view();
      // Same layout (ghosts included): add value by value; the ghost cells of `back` are 0.
      Kokkos::parallel_for(
          "redistribute_backward", dst.span(),
          KOKKOS_LAMBDA(const std::size_t i) { dst.data()[i] += src.data()[i]; });
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
