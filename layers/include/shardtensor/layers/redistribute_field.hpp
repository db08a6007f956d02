#pragma once
// redistribute_field: a differentiable redistribute, so a model can bring a field back onto
// the decomposition another branch uses (a U-Net's skip connection on uneven shards).

#include <utility>

#include "shardtensor/comm/redistribute.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

/// The field `input` laid out by `to` (same global field, no ghost cells). Values are copied,
/// never combined, so the result is bit-exact; the backward pass redistributes the gradient
/// back onto the input's decomposition (the adjoint of a permutation is its inverse).
/// Collective over `comm`. Returns `input` itself when it already has that layout.
///
/// `input` is taken by value: handed over as the last Variable of its value (a temporary, an
/// upsampling's output), the value goes once it is packed for sending (see redistribute).
template <class T>
Variable<T> redistribute_field(const Communicator& comm, Variable<T> input,
                               const Decomposition& to) {
  impl::require_field(input, "redistribute_field");
  ShardTensor<T> x = input.value();
  if (x.decomposition() == to && x.ghosts().none()) return input;
  auto node = make_result_node<T>("redistribute", {input.node()});
  const std::shared_ptr<impl::Node<T>> in = input.node();
  const Decomposition from = x.decomposition();
  const bool ghost_free = x.ghosts().none();
  input = Variable<T>();  // the node lets go of its value unless another Variable holds it
  node->field = redistribute(comm, std::exchange(x, ShardTensor<T>()), to);
  if (node->requires_grad) {
    node->backward = [comm, in, from, ghost_free](impl::Node<T>& self) {
      // The gradient goes once packed where it is this node's alone.
      ShardTensor<T> grad = self.owns_grad_field()
                                ? std::exchange(self.field_grad, ShardTensor<T>())
                                : self.grad_field();
      if (ghost_free && in->field_grad.view().span() == 0) {
        // The first gradient to reach the input: the redistributed field becomes it, made
        // once the send buffer is gone (not a zero-filled gradient beside both buffers).
        in->field_grad = redistribute(comm, std::exchange(grad, ShardTensor<T>()), from);
        return;
      }
      // Else added into the input's gradient as it arrives: no redistributed copy beside it.
      redistribute_add(comm, std::exchange(grad, ShardTensor<T>()), in->grad_field());
    };
  }
  return Variable<T>(node);
}

/// Whether a and b lay out the same global field (dimensionality and extents), whatever their
/// split points and process grids.
inline bool same_global_field(const Decomposition& a, const Decomposition& b) {
  if (a.ndims() != b.ndims()) return false;
  for (int d = 0; d < a.ndims(); ++d)
    if (a.global_extent(d) != b.global_extent(d)) return false;
  return true;
}

/// `input` on decomposition `to` when it is the same global field split elsewhere (e.g. a model
/// whose pooling moved a split point), else `input` unchanged. Collective over `comm`.
template <class T>
Variable<T> resplit_like(const Communicator& comm, const Variable<T>& input,
                         const Decomposition& to) {
  impl::require_field(input, "resplit_like");
  const Decomposition& from = input.value().decomposition();
  if (from == to || !same_global_field(from, to)) return input;
  return redistribute_field(comm, input, to);
}

}  // namespace shardtensor
