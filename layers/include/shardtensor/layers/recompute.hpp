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
#include "shardtensor/layers/module.hpp"
#include "shardtensor/layers/owned_cells.hpp"
#include "shardtensor/layers/pointwise.hpp"

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

/// body(inputs, graph_only), keeping only `inputs` (and the parameters of `modules`, the
/// ones body uses) for backward: a unit of several inputs or of ops that are no module (a
/// U-Net's upsampling and concatenation, recomputed from the skip and the coarser level's
/// output rather than kept as their concatenation, twice the skip). body takes its inputs
/// by value: an op it hands one to (concat_channels) may let the value go once it is done
/// with it, in backward's run too, where nothing else holds it. `graph_only`: body's last op
/// may build its backward without its output (Module::forward_graph_only), which nothing
/// reads in backward's run. Outside a graph (NoGradGuard, or nothing requires a gradient) it
/// is body(inputs, false), the inputs handed over. Every input is a field.
template <class T, class Body>
Variable<T> recompute(std::vector<Variable<T>> inputs,
                      const std::vector<std::shared_ptr<Module<T>>>& modules, Body body) {
  // Without a graph (inference) nothing is kept: the inputs are handed over, so an op that
  // consumes one lets it go as it would outside a unit.
  if (!grad_enabled()) return body(std::move(inputs), false);
  Variable<T> output;
  {
    const NoGradGuard no_graph;  // the unit's inside is not kept
    output = body(inputs, false);
  }
  std::vector<std::shared_ptr<impl::Node<T>>> nodes;
  for (const Variable<T>& input : inputs) {
    impl::require_field(input, "recompute");
    nodes.push_back(input.node());
  }
  for (const auto& module : modules)
    for (const auto& named : module->named_parameters()) nodes.push_back(named.second.node());
  auto node = make_result_node<T>("recompute", std::move(nodes));
  node->field = output.value();
  node->scratch_ghosts = output.node()->scratch_ghosts;
  if (node->requires_grad) {
    node->backward = [body, inputs = std::move(inputs)](impl::Node<T>& self) mutable {
      // The output's gradient first (allocated, zero, if nothing reached it). It may carry
      // its consumer's ghost cells (a conv's padded buffer that became its input's gradient,
      // Conv's backward); the unit runs again beside it and reads only its owned cells, so
      // where nothing else holds it, it is kept without them: a halo's worth less at a
      // recomputed U-Net level's peak.
      ShardTensor<T> gradient = self.grad_field();
      self.field_grad = ShardTensor<T>();
      if (!gradient.ghosts().none() && gradient.view().use_count() == 1)
        gradient = without_ghosts(gradient, self.op + ".grad");
      // The unit again, with a graph, on leaves that share the inputs' values. Then neither
      // the inputs nor the leaves are held here any more: a value lives in what the unit's
      // ops saved of it (unless a caller holds the input), so it goes when the last op that
      // reads it is done with it, before that op allocates the input's gradient.
      std::vector<std::shared_ptr<impl::Node<T>>> input_nodes, leaf_nodes;
      Variable<T> again;
      {
        std::vector<Variable<T>> leaves;
        for (const Variable<T>& input : inputs) {
          leaves.push_back(Variable<T>::field(input.value(), input.requires_grad(),
                                              input.name() + ".recomputed"));
          // The same value: its ghost cells are as much a consumer's to fill.
          leaves.back().node()->scratch_ghosts = input.node()->scratch_ghosts;
          input_nodes.push_back(input.node());
          leaf_nodes.push_back(leaves.back().node());
        }
        inputs.clear();
        again = impl::with_graph_recomputing([&] { return body(std::move(leaves), true); });
      }
      // Parameters' gradients accumulate as usual. The output's value (no op of the unit
      // reads it in backward) and gradient are handed over: they go as the sweep passes them
      // (so, like any node's inside the graph, this output's gradient is not kept after).
      backward(std::move(again), std::move(gradient));
      for (std::size_t i = 0; i < input_nodes.size(); ++i)
        if (input_nodes[i]->requires_grad)
          impl::add_input_gradient(*input_nodes[i], leaf_nodes[i]->grad_field());
    };
  }
  return Variable<T>(node);
}

/// block->forward(input), keeping only `input` (and the block's parameters) for backward.
/// Outside a graph (NoGradGuard, or nothing requires a gradient) it is block->forward(input).
template <class T>
Variable<T> recompute(const std::shared_ptr<Module<T>>& block, const Variable<T>& input) {
  return recompute<T>({input}, {block}, [block](std::vector<Variable<T>> in, bool graph_only) {
    return graph_only ? block->forward_graph_only(in[0]) : block->forward(in[0]);
  });
}

}  // namespace shardtensor
