#pragma once
// Sequential<T> (children applied in order) and Residual<T> (x + layers(x)): the containers
// the config-driven builder and the U-Net blocks are made of.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/layers.hpp"
#include "shardtensor/layers/recompute.hpp"

namespace shardtensor::models {

/// Applies its children in the order they were added. A child's parameters are named
/// "<child name>.<parameter>", so the names are readable and stable.
template <class T>
class Sequential : public Module<T> {
 public:
  /// Appends `child` under `name` and returns it.
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> child) {
    this->register_module(name, child);
    layers_.push_back(child);
    return child;
  }

  /// After the last child, bring the output back onto the input's decomposition when it is the
  /// same global field split elsewhere: layers that pool, stride or upsample on split points
  /// that are not multiples of their factor move them (0,8,15,22 comes back as 0,8,16,22), and
  /// losses, metrics and a solver's in-situ output must line up with the input. Forward is
  /// then collective over `comm`. The config-driven builder sets it on every sequence.
  void restore_input_layout(const Communicator& comm) { comm_ = comm; }

  /// Runs children [first, last) as one recomputed unit (layers/recompute.hpp): forward keeps
  /// only the unit's input, backward runs the unit again. The parameters keep their names
  /// and the numbers stay the same bit for bit. Units must not overlap.
  void recompute_range(std::size_t first, std::size_t last) {
    SHARDTENSOR_REQUIRE(first < last && last <= layers_.size(), "Sequential::recompute_range",
                        "range [" << first << ", " << last << ") of " << layers_.size()
                                  << " layers");
    for (const auto& [start, unit] : units_)
      SHARDTENSOR_REQUIRE(last <= start || first >= unit.first, "Sequential::recompute_range",
                          "range [" << first << ", " << last << ") overlaps [" << start << ", "
                                    << unit.first << ")");
    auto unit = std::make_shared<Sequential<T>>();
    for (std::size_t i = first; i < last; ++i) unit->add(std::to_string(i), layers_[i]);
    units_[first] = {last, unit};
  }

  Variable<T> forward(const Variable<T>& input) override { return run(input, false); }
  /// The last child's forward_graph_only (where no resplit reads the output after it).
  Variable<T> forward_graph_only(const Variable<T>& input) override { return run(input, true); }

  bool reads_owned_cells_only() const override {
    return !layers_.empty() && layers_.front()->reads_owned_cells_only();
  }

  std::size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module<T>>& operator[](std::size_t i) const { return layers_.at(i); }

  /// Children [first, last) applied to `input` (their recomputed units as units), without
  /// restore_input_layout's resplit: a caller that runs a sequence in parts (a U-Net level's
  /// first unit, made of more than this sequence's children). `graph_only`: the last child's
  /// forward_graph_only. A unit must lie inside the range. `input` is taken by value: one
  /// handed over goes once the first child is done with it.
  Variable<T> forward_layers(std::size_t first, std::size_t last, Variable<T> input,
                             bool graph_only = false) {
    SHARDTENSOR_REQUIRE(first <= last && last <= layers_.size(), "Sequential::forward_layers",
                        "range [" << first << ", " << last << ") of " << layers_.size()
                                  << " layers");
    Variable<T> x = std::move(input);
    for (std::size_t i = first; i < last;) {
      const auto unit = units_.find(i);
      if (unit == units_.end()) {
        x = graph_only && i + 1 == last ? layers_[i]->forward_graph_only(x)
                                        : layers_[i]->forward_handed_over(std::move(x));
        ++i;
      } else {
        SHARDTENSOR_REQUIRE(unit->second.first <= last, "Sequential::forward_layers",
                            "range [" << first << ", " << last << ") ends inside the recomputed "
                                      << "unit [" << i << ", " << unit->second.first << ")");
        x = shardtensor::recompute<T>(unit->second.second, x);
        i = unit->second.first;
      }
    }
    return x;
  }

 private:
  Variable<T> run(const Variable<T>& input, bool graph_only) {
    Variable<T> x = forward_layers(0, layers_.size(), input, graph_only && !comm_);
    if (comm_ && input.is_field() && x.is_field())
      x = resplit_like(*comm_, x, input.value().decomposition());
    return x;
  }

  std::vector<std::shared_ptr<Module<T>>> layers_;
  /// Recomputed units by their first layer: (one past their last layer, the unit).
  std::map<std::size_t, std::pair<std::size_t, std::shared_ptr<Module<T>>>> units_;
  std::optional<Communicator> comm_;
};

/// y = layers(x) + projection(x), with projection the identity when it is null (use a 1x1
/// convolution when `layers` changes the channel count). The layers must keep the field's
/// decomposition (same spatial size and split), or forward throws naming the block.
template <class T>
class Residual : public Module<T> {
 public:
  Residual(std::shared_ptr<Sequential<T>> layers, std::shared_ptr<Module<T>> projection,
           std::string name = "residual")
      : layers_(std::move(layers)), projection_(std::move(projection)), name_(std::move(name)) {
    this->register_module("layers", layers_);
    if (projection_) this->register_module("projection", projection_);
  }

  Variable<T> forward(const Variable<T>& input) override {
    const Variable<T> y = layers_->forward(input);
    const Variable<T> skip = projection_ ? projection_->forward(input) : input;
    const ShardTensor<T>& a = y.value();
    const ShardTensor<T>& b = skip.value();
    SHARDTENSOR_REQUIRE(a.decomposition() == b.decomposition() && a.channels() == b.channels(),
                        "Residual '" << name_ << "'",
                        "its layers turn " << b.channels() << " channels on "
                                           << b.decomposition().describe() << " into "
                                           << a.channels() << " channels on "
                                           << a.decomposition().describe()
                                           << "; a residual block must keep the field's size");
    return add(y, skip);
  }

  const std::shared_ptr<Sequential<T>>& layers() const { return layers_; }
  const std::shared_ptr<Module<T>>& projection() const { return projection_; }

 private:
  std::shared_ptr<Sequential<T>> layers_;
  std::shared_ptr<Module<T>> projection_;
  std::string name_;
};

}  // namespace shardtensor::models
