#pragma once
// Activation recomputation: a block (a U-Net level, any Module) that keeps only its input in
// forward and runs again inside backward, as PyTorch's torch.utils.checkpoint does. Memory
// per block falls from all its activations to its input; the step pays one more forward.
//
// The numbers are the same bit for bit as without: the block's forward runs the same ops in
// the same order (dropout masks are a function of global index and seed), its backward the
// same sweep, and its input's gradient arrives by one addition to zero. The halo exchanges
// run again inside the recomputed forward, in the same order on every rank. BatchNorm's
// running statistics are updated by the first forward only (impl::recomputing_flag).

#include <memory>

#include "shardtensor/autograd/grad_mode.hpp"
#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/nn/module.hpp"

namespace shardtensor {

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
    node->backward = [block, input](impl::Node<T>& self) {
      // The block again, with a graph, on a leaf that shares the input's values.
      const Variable<T> leaf = Variable<T>::field(input.value(), input.requires_grad(),
                                                  input.name() + ".recomputed");
      Variable<T> again;
      {  // with a graph even where backward itself runs without one
        struct Modes {
          bool grad = impl::grad_mode_flag(), recomputing = impl::recomputing_flag();
          ~Modes() { impl::grad_mode_flag() = grad, impl::recomputing_flag() = recomputing; }
        } restore;
        impl::grad_mode_flag() = true;
        impl::recomputing_flag() = true;
        again = block->forward(leaf);
      }
      backward(again, self.grad_field());  // parameters' gradients accumulate as usual
      if (!input.requires_grad()) return;
      const auto from = leaf.grad().view(), to = input.node()->grad_field().view();
      Kokkos::parallel_for(
          "recompute::input_grad", to.span(),
          KOKKOS_LAMBDA(const std::size_t i) { to.data()[i] += from.data()[i]; });
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
