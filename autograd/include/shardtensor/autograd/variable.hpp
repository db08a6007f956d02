#pragma once
// Variable<T>: a value in a reverse-mode autodiff graph, either a sharded field or a
// replicated tensor (parameters, scalars), with its gradient and the op that made it.

#include <Kokkos_Core.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "shardtensor/autograd/grad_mode.hpp"
#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

namespace impl {

template <class T>
struct Node;

/// Shared by every Variable of one node: when the last of them goes, so does the node's field
/// value (Node::release_value). The graph may keep the node for its gradient, but no op reads
/// a value through the graph: a backward closure captures the values it needs.
template <class T>
struct ValueHandle {
  std::weak_ptr<Node<T>> node;
  ~ValueHandle();
};

/// One node of the graph. Gradients are allocated (zero) on first use.
template <class T>
struct Node {
  std::string op;  // what produced the value, for messages
  bool is_field = true;
  bool requires_grad = false;
  /// The field's ghost cells hold no values: its producer allocated them for a consumer to
  /// fill in place (HaloPadding::pads_in_place), which may overwrite them.
  bool scratch_ghosts = false;
  // Sharded field (is_field) ...
  ShardTensor<T> field, field_grad;
  // ... or replicated tensor of the given shape.
  ReplicatedView<T> data, data_grad;
  std::vector<Index> shape;
  /// Per-rank partial sums of a replicated gradient (e.g. a weight gradient summed over the
  /// local cells only); added to data_grad after a sum over `partial_comm`. Where data_grad
  /// holds zeros when the first partial sum arrives (a training step's, after zero_grad), the
  /// partial sums go into data_grad itself and are summed over the ranks in place: no second
  /// buffer per parameter, no add.
  ReplicatedView<T> partial_grad;
  std::optional<Communicator> partial_comm;
  bool partial_in_grad = false;  // the pending partial sums are in data_grad
  bool grad_zero = false;        // data_grad holds zeros (allocated, or zero_grad since)

  std::vector<std::shared_ptr<Node>> inputs;
  std::function<void(Node&)> backward;   // reads this node's gradient, adds into inputs'
  std::weak_ptr<ValueHandle<T>> handle;  // of its Variables

  /// The layout of a released field: what its gradient is allocated from.
  struct Layout {
    Decomposition decomposition;
    int rank = 0;
    Index batch = 0, channels = 0;
    GhostWidths ghosts;
    /// Whether `f` has this layout (ShardTensor::same_layout, for a released value).
    bool matches(const ShardTensor<T>& f) const {
      return rank == f.rank() && ghosts == f.ghosts() && batch == f.batch() &&
             channels == f.channels() && decomposition == f.decomposition();
    }
  };
  std::optional<Layout> released;

  const ShardTensor<T>& grad_field() {
    if (field_grad.view().span() == 0 && field.view().span() != 0) {
      field_grad = ShardTensor<T>(field.decomposition(), field.rank(), field.batch(),
                                  field.channels(), field.ghosts(), op + ".grad");
    } else if (field_grad.view().span() == 0 && released) {
      field_grad = ShardTensor<T>(released->decomposition, released->rank, released->batch,
                                  released->channels, released->ghosts, op + ".grad");
    }
    return field_grad;
  }
  /// Whether this node's gradient is its own to consume in its backward: no other node shares
  /// the buffer, and no Variable of the node is left (a caller could read its gradient).
  bool owns_grad_field() { return grad_field().view().use_count() == 1 && handle.expired(); }
  /// For a backward that writes, rather than adds to, every owned cell of this gradient: true
  /// where no gradient has reached this node yet and the field has no ghost cells, with the
  /// buffer allocated without its zero fill (a pass over it that the write makes useless);
  /// false where the backward must add into grad_field().
  bool take_unfilled_grad_field() {
    if (field_grad.view().span() != 0) return false;
    const bool has_field = field.view().span() != 0;
    if (!has_field && !released) return false;
    const GhostWidths& ghosts = has_field ? field.ghosts() : released->ghosts;
    if (!(ghosts == GhostWidths{})) return false;
    field_grad =
        has_field
            ? ShardTensor<T>::uninitialized(field.decomposition(), field.rank(), field.batch(),
                                            field.channels(), {}, op + ".grad")
            : ShardTensor<T>::uninitialized(released->decomposition, released->rank,
                                            released->batch, released->channels, {}, op + ".grad");
    return true;
  }
  /// For a backward that writes this gradient over `buffer`, a field of the same layout that
  /// nothing reads again (the op's own output gradient): true where take_unfilled_grad_field()
  /// would be, with `buffer` taken as the gradient (one field fewer in flight); false where the
  /// backward must use grad_field() or take_unfilled_grad_field().
  /// A buffer with ghost cells only with `ghosts_zeroed` (they become the gradient's).
  bool adopt_grad_field(const ShardTensor<T>& buffer, bool ghosts_zeroed = false) {
    if (field_grad.view().span() != 0 || !(ghosts_zeroed || buffer.ghosts() == GhostWidths{}))
      return false;
    if (field.view().span() != 0 ? !field.same_layout(buffer)
                                 : !released || !released->matches(buffer))
      return false;
    field_grad = buffer;
    return true;
  }
  /// Lets the field's value go (this node's copy of it), keeping its layout for the gradient.
  void release_value() {
    if (field.view().span() == 0) return;
    released = Layout{field.decomposition(), field.rank(), field.batch(), field.channels(),
                      field.ghosts()};
    field = ShardTensor<T>();
  }
  const ReplicatedView<T>& grad_data() {
    if (partial_in_grad) move_partial_out();  // a whole gradient joins pending partial sums
    allocate_grad_data();
    grad_zero = false;  // the caller may write into it
    return data_grad;
  }
  /// data_grad (allocated zero where it is not yet) for a caller that only keeps its address
  /// or writes zeros through it (the optimizer's parameter table): unlike grad_data(), it
  /// leaves the node knowing a gradient of zeros as one.
  const ReplicatedView<T>& grad_storage() {
    if (partial_in_grad) move_partial_out();
    allocate_grad_data();
    return data_grad;
  }
  /// Where an op adds a rank-local partial sum of this replicated gradient.
  const ReplicatedView<T>& grad_partial(const Communicator& comm) {
    if (partial_comm) {
      partial_comm = comm;
      return partial_in_grad ? data_grad : partial_grad;
    }
    partial_comm = comm;
    allocate_grad_data();
    if (grad_zero) {
      partial_in_grad = true;
      grad_zero = false;
      partial_grad = ReplicatedView<T>();  // one from an earlier step's other path goes
      return data_grad;
    }
    allocate_partial_grad();
    return partial_grad;
  }
  /// Sums pending partial gradients over their communicator into data_grad.
  void complete_grad() {
    if (!partial_comm) return;
    if (partial_in_grad) {
      allreduce(*partial_comm, data_grad);
    } else {
      allreduce(*partial_comm, partial_grad);
      const auto total = grad_data();
      const auto partial = partial_grad;
      // The partial sum is zeroed for the next step in the same kernel (one launch, no fence).
      Kokkos::parallel_for(
          "complete_grad", total.extent(0), KOKKOS_LAMBDA(const std::size_t i) {
            total(i) += partial(i);
            partial(i) = T(0);
          });
    }
    partial_in_grad = false;
    partial_comm.reset();
  }
  /// Tells the node that data_grad was filled with zeros elsewhere (Optimizer::zero_grad, one
  /// kernel for every parameter): the next partial sums may go into it.
  void note_grad_zeroed() {
    if (data_grad.extent(0) != data.extent(0) || partial_comm) return;
    grad_zero = true;
  }
  /// data_grad filled with zeros (Variable::zero_grad).
  void zero_data_grad() {
    if (data_grad.extent(0) == 0) return;
    fill_values(ExecutionSpace(), data_grad);
    if (partial_in_grad) partial_comm.reset();  // the pending partial sums went with it
    partial_in_grad = false;
    grad_zero = true;
  }

  /// Allocates data_grad (zeros: grad_zero) where it has not the data's size.
  void allocate_grad_data() {
    if (data_grad.extent(0) == data.extent(0)) return;
    // A leaf's (a parameter's) gradient lives as long as the parameter: count it there.
    MemoryCategoryScope memory(inputs.empty() ? MemoryCategory::parameters
                                              : current_memory_category());
    data_grad = ReplicatedView<T>(op + ".grad", data.extent(0));
    grad_zero = true;
  }
  void allocate_partial_grad() {
    if (partial_grad.extent(0) == data.extent(0)) return;
    MemoryCategoryScope memory(MemoryCategory::parameters);  // a weight's; kept across steps
    partial_grad = ReplicatedView<T>(op + ".partial_grad", data.extent(0));
  }
  /// The pending partial sums from data_grad into partial_grad, data_grad zero again: where
  /// a whole gradient is added while partial sums are pending (a weight read by a sharded
  /// op and a replicated one).
  void move_partial_out() {
    allocate_partial_grad();
    Kokkos::deep_copy(ExecutionSpace(), partial_grad, data_grad);
    fill_values(ExecutionSpace(), data_grad);
    partial_in_grad = false;
  }
};

template <class T>
ValueHandle<T>::~ValueHandle() {
  if (const std::shared_ptr<Node<T>> n = node.lock()) n->release_value();
}

}  // namespace impl

/// A handle to a graph node; copies share it. Ops (free functions and Module::forward) take
/// Variables and return new ones that remember how to propagate gradients back. A node's
/// field value lives as long as a Variable of it does (and as long as a backward closure
/// captured it): the graph itself keeps only what the ops saved.
template <class T>
class Variable {
 public:
  using Node = impl::Node<T>;

  Variable() = default;
  explicit Variable(std::shared_ptr<Node> node) : node_(std::move(node)) {
    if (!node_) return;
    handle_ = node_->handle.lock();
    if (!handle_) {
      handle_ = std::make_shared<impl::ValueHandle<T>>();
      handle_->node = node_;
      node_->handle = handle_;
    }
  }

  /// A sharded field (activations, inputs, targets). Its ghost cells are ignored.
  static Variable field(const ShardTensor<T>& value, bool requires_grad = false,
                        const std::string& name = "field") {
    auto n = std::make_shared<Node>();
    n->op = name;
    n->field = value;
    n->requires_grad = requires_grad;
    return Variable(n);
  }

  /// A replicated tensor: the same values on every rank (parameters, losses).
  static Variable replicated(const ReplicatedView<T>& value, std::vector<Index> shape,
                             bool requires_grad = false, const std::string& name = "replicated") {
    auto n = std::make_shared<Node>();
    n->op = name;
    n->is_field = false;
    n->data = value;
    n->shape = std::move(shape);
    n->requires_grad = requires_grad;
    return Variable(n);
  }

  bool defined() const { return node_ != nullptr; }
  bool is_field() const { return node_->is_field; }
  bool requires_grad() const { return node_->requires_grad; }
  const std::string& name() const { return node_->op; }

  const ShardTensor<T>& value() const { return node_->field; }
  const ReplicatedView<T>& data() const { return node_->data; }
  const std::vector<Index>& shape() const { return node_->shape; }
  /// Gradient of a field (allocated zero on first use).
  const ShardTensor<T>& grad() const { return node_->grad_field(); }
  /// Gradient of a replicated tensor (allocated zero on first use).
  const ReplicatedView<T>& data_grad() const { return node_->grad_data(); }

  void zero_grad() const {
    if (node_->field_grad.view().span()) fill_values(ExecutionSpace(), node_->field_grad.view());
    node_->zero_data_grad();
  }

  /// Host copy of a replicated scalar (losses).
  T item() const {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), node_->data);
    return host(0);
  }

  const std::shared_ptr<Node>& node() const { return node_; }

 private:
  std::shared_ptr<Node> node_;
  std::shared_ptr<impl::ValueHandle<T>> handle_;  // destroyed first: may release the value
};

/// Creates the node of an op's result: it needs gradients if any input does, unless a
/// NoGradGuard is alive (then it keeps no inputs and the op saves nothing for backward).
template <class T>
std::shared_ptr<impl::Node<T>> make_result_node(
    const std::string& op, std::vector<std::shared_ptr<impl::Node<T>>> inputs) {
  auto n = std::make_shared<impl::Node<T>>();
  n->op = op;
  if (!grad_enabled()) return n;
  for (const auto& input : inputs) n->requires_grad = n->requires_grad || input->requires_grad;
  if (n->requires_grad) n->inputs = std::move(inputs);
  return n;
}

namespace impl {

/// Reverse-mode sweep from `root`, whose gradient is set: every node reachable through inputs
/// that require gradients gets its gradient accumulated, in reverse topological order, the
/// same order on every rank (so collectives in backward functions match). Leaves' gradients
/// accumulate across calls until zero_grad(). As the sweep goes, a node that no caller holds
/// loses its value once its readers have run and its gradient once it has been propagated.
///
/// `root` is taken by value: where the caller passes its only pointer, the root is like any
/// other node and its value goes as soon as its gradient is set.
template <class T>
void sweep(std::shared_ptr<Node<T>> root) {
  using Node = impl::Node<T>;
  // Owning pointers: releasing a node's inputs below must not free nodes still to visit.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::function<void(const std::shared_ptr<Node>&)> visit = [&](const std::shared_ptr<Node>& n) {
    if (!seen.insert(n.get()).second) return;
    for (const auto& input : n->inputs)
      if (input->requires_grad) visit(input);
    order.push_back(n);
  };
  visit(root);
  root.reset();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& n = **it;
    n.complete_grad();
    // Every node that reads this one's value in backward is a consumer, and the consumers
    // ran before it: unless a caller still holds a Variable of it, its value can go before
    // its own closure runs (a closure that needs its op's output captures it), and the
    // gradient, once allocated, no longer needs the value for its layout.
    if (it->use_count() == 1 && n.field_grad.view().span() != 0) n.release_value();
    if (n.backward) {
      n.backward(n);
      n.backward = nullptr;  // release what the op saved for backward
      n.inputs.clear();
    }
    // The nodes that read this one ran before it and let go of it: unless a caller still
    // holds a Variable of it, nothing can read its value or gradient again, so both go now
    // rather than when the sweep ends (at that moment every activation and gradient of the
    // graph was alive at once).
    if (it->use_count() == 1) it->reset();
  }
}

}  // namespace impl

/// Back-propagates from a replicated scalar `loss` (its gradient set to 1): see impl::sweep.
template <class T>
void backward(const Variable<T>& loss) {
  SHARDTENSOR_REQUIRE(!loss.is_field() && loss.data().extent(0) == 1, "backward",
                      "the loss must be a replicated scalar, got '" << loss.name() << "'");
  if (!loss.requires_grad()) return;
  fill_values(ExecutionSpace(), loss.node()->grad_data(), T(1));
  impl::sweep(loss.node());
}

/// Back-propagates from a field `output` whose gradient is `gradient` (it becomes the output's
/// gradient, shared, not copied): a graph inside another's backward (layers/recompute.hpp).
template <class T>
void backward(const Variable<T>& output, const ShardTensor<T>& gradient) {
  SHARDTENSOR_REQUIRE(output.is_field(), "backward",
                      "a gradient field needs a field output, got '" << output.name() << "'");
  if (!output.requires_grad()) return;
  output.node()->field_grad = gradient;
  impl::sweep(output.node());
}

/// As above for an output and a gradient nobody reads again (a recomputed block's): both are
/// handed over, so the output's value goes as the sweep starts and the gradient once the
/// output's op has used it, not at the end of the sweep.
template <class T>
void backward(Variable<T>&& output, ShardTensor<T>&& gradient) {
  SHARDTENSOR_REQUIRE(output.is_field(), "backward",
                      "a gradient field needs a field output, got '" << output.name() << "'");
  if (!output.requires_grad()) return;
  std::shared_ptr<impl::Node<T>> root = output.node();
  output = Variable<T>();
  root->field_grad = gradient;
  gradient = ShardTensor<T>();  // a moved-from View may keep its pointer: empty it outright
  impl::sweep(std::move(root));
}

}  // namespace shardtensor
