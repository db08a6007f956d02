#pragma once
// Activation recomputation: a block (a U-Net level, any Module) that keeps only its input in
// forward and runs again inside backward, as PyTorch's torch.utils.checkpoint does. Memory
// per block falls from all its activations to its input; the step pays one more forward.
//
// The numbers are the same bit for bit as without: the block's forward runs the same ops in
// the same order (dropout masks are a function of global index and seed), its backward the
// same sweep, and its input's gradient is the block's (or added to what it already has). The
// halo exchanges run again inside the recomputed forward, in the same order on every rank.
// BatchNorm's running statistics are updated by the first forward only
// (impl::recomputing_flag). Blocks may nest (models::Sequential::recompute_range).

#include <memory>
#include <vector>

#include "shardtensor/autograd/grad_mode.hpp"
#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/nn/module.hpp"

namespace shardtensor {

namespace impl {

/// Computes `block` with the grad mode and the recomputing flag set, then restores them.
template <class Function>
auto with_graph_recomputing(const Function& block) {
  struct Modes {
    bool grad = impl::grad_mode_flag(), recomputing = impl::recomputing_flag();
    ~Modes() { impl::grad_mode_flag() = grad, impl::recomputing_flag() = recomputing; }
  } restore;
  impl::grad_mode_flag() = true;  // with a graph even where backward itself runs without one
  impl::recomputing_flag() = true;
  return block();
}

/// Adds the gradient `gradient` (of a leaf standing for `input`) to the input's. The first is
/// taken as it is (0 + g is g, and there is no second buffer); later ones add to it.
template <class T>
void add_input_gradient(impl::Node<T>& input, const ShardTensor<T>& gradient) {
  if (input.field_grad.view().span() == 0) {  // the leaf's layout is the input's
    input.field_grad = gradient;
    return;
  }
  const auto from = gradient.view(), to = input.grad_field().view();
  Kokkos::parallel_for(
      "recompute::input_grad", to.span(),
      KOKKOS_LAMBDA(const std::size_t i) { to.data()[i] += from.data()[i]; });
}

}  // namespace impl

/// block->forward(input), keeping only `input` (and the block's parameters) for backward.
/// Outside a graph (NoGradGuard, or nothing requires a gradient) it is block->forward(input).
template <class T>
Variable<T> recompute(const std::shared_ptr<Module<T>>& block, const Variable<T>& input) {
  Variable<T> output;
  {
    const NoGradGuard no_graph;  // the block's inside is not kept
    output = block->forward(input);
  }
  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node()};
  for (const auto& named : block->named_parameters()) inputs.push_back(named.second.node());
  auto node = make_result_node<T>("recompute", std::move(inputs));
  node->field = output.value();
  if (node->requires_grad) {
    node->backward = [block, input = Variable<T>(input)](impl::Node<T>& self) mutable {
      const std::shared_ptr<impl::Node<T>> input_node = input.node();
      const bool input_requires_grad = input.requires_grad();
      // The block again, with a graph, on a leaf that shares the input's values. Then neither
      // the input nor the leaf is held here any more: the value lives in what the block's ops
      // saved of it (unless a caller holds the input), so it goes when the first op's backward
      // is done with it, before that op allocates the input's gradient.
      std::shared_ptr<impl::Node<T>> leaf_node;
      Variable<T> again;
      {
        const Variable<T> leaf = Variable<T>::field(input.value(), input_requires_grad,
                                                    input.name() + ".recomputed");
        input = Variable<T>();
        again = impl::with_graph_recomputing([&] { return block->forward_graph_only(leaf); });
        leaf_node = leaf.node();
      }
      // Parameters' gradients accumulate as usual. The output's value (no op of the block
      // reads it in backward) and gradient are handed over: they go as the sweep passes them
      // (so, like any node's inside the graph, this output's gradient is not kept after).
      ShardTensor<T> gradient = self.grad_field();  // allocated (zero) if nothing reached it
      self.field_grad = ShardTensor<T>();
      backward(std::move(again), std::move(gradient));
      if (input_requires_grad) impl::add_input_gradient(*input_node, leaf_node->grad_field());
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
