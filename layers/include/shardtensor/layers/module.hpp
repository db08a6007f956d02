#pragma once
// Module<T>: a layer or model with named, replicated parameters and a train/eval mode.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/core/memory_limits.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/random.hpp"

namespace shardtensor {

template <class T>
class Module {
 public:
  virtual ~Module() = default;

  /// Forward pass on a sharded field.
  virtual Variable<T> forward(const Variable<T>& input) = 0;
  Variable<T> operator()(const Variable<T>& input) { return forward(input); }

  /// Forward for a graph whose output value nothing reads, only its gradient comes back (a
  /// recomputed block's, layers/recompute.hpp): a layer whose backward does not read its own
  /// output may leave that value uncomputed (an empty field of the right layout), saving one
  /// field at the peak of the block's backward. Everything else is forward's, bit for bit.
  virtual Variable<T> forward_graph_only(const Variable<T>& input) { return forward(input); }
  /// Forward on an input handed over: the caller keeps no Variable of it (a Sequential's
  /// running value). Without a graph, a layer may then write its output over the input's
  /// field where nothing else holds that field (an activation in inference: no new field).
  /// Everything else is forward's, bit for bit.
  virtual Variable<T> forward_handed_over(Variable<T>&& input) { return forward(input); }

  /// True if forward reads only the owned cells of its input, so the input may carry ghost
  /// cells of any width (a solver's array wrapped without a copy). The default is the safe
  /// answer; layers that copy their input into a padded buffer say yes.
  virtual bool reads_owned_cells_only() const { return false; }

  /// Parameters of this module and its children, named "child.param" (registration order).
  std::vector<std::pair<std::string, Variable<T>>> named_parameters() const {
    std::vector<std::pair<std::string, Variable<T>>> out = parameters_;
    for (const auto& [name, child] : children_)
      for (auto& [child_name, p] : child->named_parameters())
        out.emplace_back(name + "." + child_name, p);
    return out;
  }

  /// Non-trainable state saved with the parameters (e.g. BatchNorm running statistics),
  /// named like the parameters. Writing into a view sets the module's state.
  std::vector<std::pair<std::string, ReplicatedView<T>>> named_buffers() const {
    std::vector<std::pair<std::string, ReplicatedView<T>>> out = buffers_;
    for (const auto& [name, child] : children_)
      for (auto& [child_name, b] : child->named_buffers())
        out.emplace_back(name + "." + child_name, b);
    return out;
  }

  void train(bool on = true) {
    training_ = on;
    for (auto& child : children_) child.second->train(on);
  }
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Lets the float convolutions of this module and its children run on TF32 tensor cores
  /// (on a GPU with a convolution library; nothing changes elsewhere): each layer's own
  /// option (ConvOptions::tf32), set for a whole model from training.tf32. A model's setting,
  /// not the process's: two models or sessions in one process may differ.
  virtual void allow_tf32(bool on) {
    for (auto& child : children_) child.second->allow_tf32(on);
  }

  /// The share of the device's free memory that the convolutions of this module and its
  /// children may take as their library's workspace (ConvOptions::library_workspace_share; a
  /// GPU with cuDNN, nothing changes elsewhere), set for a whole model from
  /// memory.library_workspace_share.
  virtual void set_library_workspace_share(double share) {
    for (auto& child : children_) child.second->set_library_workspace_share(share);
  }

  /// Whether the convolutions, transposed convolutions and attention products of this module
  /// and its children take bf16 operands and sum in float (ConvOptions::bf16: PyTorch
  /// autocast's semantics); normalisation, softmax, pointwise layers and losses stay float.
  /// Float models only (a double layer refuses). A model's setting, like allow_tf32.
  virtual void compute_in_bf16(bool on) {
    for (auto& child : children_) child.second->compute_in_bf16(on);
  }

  /// Whether the convolutions of this module and its children overlap their halo exchange
  /// with interior compute (ConvOptions::overlap_halo; on by default, the same results).
  virtual void overlap_halo(bool on) {
    for (auto& child : children_) child.second->overlap_halo(on);
  }

  void zero_grad() {
    for (auto& named : named_parameters()) named.second.zero_grad();
  }

  /// Data parallelism: after backward, replaces every parameter gradient by its mean over
  /// the replicas in `data_parallel` (each replica has processed other samples), so every
  /// replica takes the same optimizer step. Collective over `data_parallel`.
  void average_gradients(const Communicator& data_parallel) {
    if (data_parallel.size() == 1) return;
    const T scale = T(1) / T(data_parallel.size());
    for (auto& named : named_parameters()) {
      const ReplicatedView<T> grad = named.second.data_grad();
      allreduce(data_parallel, grad);
      Kokkos::parallel_for(
          "average_gradients", grad.extent(0),
          KOKKOS_LAMBDA(const std::size_t i) { grad(i) *= scale; });
    }
  }

 protected:
  /// `seed` itself, or for 0 a hash (FNV-1a) of the layer name: the same on every rank and
  /// platform, and different for differently named layers.
  static std::uint64_t initialisation_seed(std::uint64_t seed, const std::string& name) {
    if (seed != 0) return seed;
    std::uint64_t hash = 14695981039346656037ull;
    for (unsigned char ch : name) hash = (hash ^ ch) * 1099511628211ull;
    return hash;
  }

  /// A parameter drawn uniformly from [-bound, bound) with a counter-based generator, so
  /// every rank holds the same values without communication.
  Variable<T> register_parameter(const std::string& name, std::vector<Index> shape, double bound,
                                 std::uint64_t seed) {
    MemoryCategoryScope memory(MemoryCategory::parameters);
    std::uint64_t size = 1;
    for (Index e : shape) size = saturating_product(size, std::uint64_t(e));
    ScopedParameterLimit::charge(name, size, sizeof(T));  // before any memory is taken
    ReplicatedView<T> values(name, size);
    auto host = Kokkos::create_mirror_view(values);
    for (std::uint64_t i = 0; i < size; ++i)
      host(i) = static_cast<T>(bound * hashed_uniform(seed, i));
    Kokkos::deep_copy(values, host);
    Variable<T> p = Variable<T>::replicated(values, std::move(shape), true, name);
    parameters_.emplace_back(name, p);
    return p;
  }

  void register_buffer(const std::string& name, ReplicatedView<T> values) {
    buffers_.emplace_back(name, std::move(values));
  }

  void register_module(const std::string& name, std::shared_ptr<Module> child) {
    children_.emplace_back(name, std::move(child));
  }

 private:
  std::vector<std::pair<std::string, Variable<T>>> parameters_;
  std::vector<std::pair<std::string, ReplicatedView<T>>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace shardtensor
