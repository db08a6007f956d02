#pragma once
// Graph<T>: a model as a directed acyclic graph of named values, each made by one step (a
// layer, a pointwise op, a concatenation) from values made before it. What an imported ONNX
// network becomes (models/onnx_import.hpp); every step is a sharded op, so the graph on P ranks
// computes what it computes on one.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/layers.hpp"

namespace shardtensor::models {

template <class T>
class Graph : public Module<T> {
 public:
  /// A step's computation on its input values, in the order the step names them.
  using Operation = std::function<Variable<T>(const std::vector<Variable<T>>&)>;

  /// The graph's input value (one field, (N, C, spatial...)).
  explicit Graph(std::string input_name) : input_(std::move(input_name)) {
    index_of(input_);
  }

  /// Appends a step: the value `output` = operation(the values named `inputs`), all made by
  /// earlier steps or the graph's input. `node` and `op` name it in errors and summaries.
  void add_step(std::string node, std::string op, const std::vector<std::string>& inputs,
                const std::string& output, Operation operation) {
    Step step{std::move(node), std::move(op), {}, 0, std::move(operation), {}};
    for (const std::string& name : inputs) {
      const auto found = values_.find(name);
      SHARDTENSOR_REQUIRE(found != values_.end(), "Graph", "step '" << step.node << "' ("
                                                                     << step.op << ") reads '"
                                                                     << name
                                                                     << "', which no earlier "
                                                                        "step makes");
      step.inputs.push_back(found->second);
    }
    SHARDTENSOR_REQUIRE(values_.count(output) == 0, "Graph",
                        "step '" << step.node << "' makes '" << output
                                 << "', which an earlier step makes too");
    step.output = index_of(output);
    steps_.push_back(std::move(step));
    plan_releases();
  }

  /// Registers `child` (its parameters and buffers) under `name`; returns it.
  template <class M>
  std::shared_ptr<M> add_module(const std::string& name, std::shared_ptr<M> child) {
    this->register_module(name, child);
    return child;
  }

  /// A parameter of the graph itself, named `name` (an imported file's initializer that
  /// trains outside any layer, e.g. "features.1.0.layer_scale"), zero-filled: the caller
  /// writes its values.
  Variable<T> add_parameter(const std::string& name, std::vector<Index> shape) {
    return this->register_parameter(name, std::move(shape), 0.0, 0);
  }

  /// The value forward returns.
  void set_output(const std::string& name) {
    const auto found = values_.find(name);
    SHARDTENSOR_REQUIRE(found != values_.end(), "Graph",
                        "the output '" << name << "' is made by no step");
    output_ = found->second;
    plan_releases();
  }

  /// As Sequential's: the output goes back onto the input's split when it is the same global
  /// field split elsewhere (pooling and upsampling on split points that are not multiples of
  /// their factor move them). Forward is then collective over `comm`.
  void restore_input_layout(const Communicator& comm) { comm_ = comm; }

  Variable<T> forward(const Variable<T>& input) override {
    SHARDTENSOR_REQUIRE(output_ >= 0, "Graph", "no output was set");
    std::vector<std::optional<Variable<T>>> values(values_.size());
    values[0] = input;
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      const Step& step = steps_[s];
      std::vector<Variable<T>> arguments;
      arguments.reserve(step.inputs.size());
      for (const int i : step.inputs) arguments.push_back(*values[i]);
      values[step.output] = step.operation(arguments);
      // Values no later step reads go now: a graph's memory is a sequence's.
      for (const int i : step.release)
        if (i != 0) values[i].reset();
    }
    Variable<T> y = *values[output_];
    if (comm_ && input.is_field() && y.is_field())
      y = resplit_like(*comm_, y, input.value().decomposition());
    return y;
  }

  /// Where a parameter or buffer ("enc.weight") came from in the file the graph was read from
  /// (an initializer's or a constant's name): what export_onnx writes it back into.
  /// `transposed`: the file holds the (rows, columns) matrix transposed (a MatMul's weight,
  /// which a Linear or 1x1 Conv holds as (out, in)).
  void set_source(const std::string& name, const std::string& file_value, bool transposed = false) {
    sources_[name] = file_value;
    if (transposed) transposed_.insert(name);
  }
  const std::map<std::string, std::string>& sources() const { return sources_; }
  bool source_transposed(const std::string& name) const { return transposed_.count(name) > 0; }

  std::size_t size() const { return steps_.size(); }
  /// (node name, op) of every step, in order.
  std::vector<std::pair<std::string, std::string>> steps() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Step& s : steps_) out.emplace_back(s.node, s.op);
    return out;
  }

 private:
  struct Step {
    std::string node, op;
    std::vector<int> inputs;
    int output;
    Operation operation;
    std::vector<int> release;  ///< values read for the last time here
  };

  int index_of(const std::string& name) {
    const auto [it, added] = values_.emplace(name, int(values_.size()));
    (void)added;
    return it->second;
  }

  void plan_releases() {
    std::vector<int> last(values_.size(), -1);
    for (std::size_t s = 0; s < steps_.size(); ++s)
      for (const int i : steps_[s].inputs) last[i] = int(s);
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      steps_[s].release.clear();
      for (const int i : steps_[s].inputs)
        if (last[i] == int(s) && i != output_) steps_[s].release.push_back(i);
    }
  }

  std::string input_;
  std::map<std::string, int> values_;
  std::vector<Step> steps_;
  int output_ = -1;
  std::optional<Communicator> comm_;
  std::map<std::string, std::string> sources_;
  std::set<std::string> transposed_;
};

}  // namespace shardtensor::models
