#pragma once
// Pool<T>: max and average pooling of a sharded field with any window, stride, padding and
// (max) dilation; windows that cross a shard's edge read ghost cells.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/kernels/pooling.hpp"  // PoolKind
#include "shardtensor/layers/halo_padding.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

struct PoolOptions {
  PoolKind kind = PoolKind::max;
  std::vector<int> window;    ///< one size per spatial dim (its length sets the dims)
  std::vector<int> stride;    ///< default: the window (non-overlapping)
  std::vector<int> padding;   ///< before (and after); default 0; at most half the window
  std::vector<int> padding_after;  ///< default: `padding` (ONNX's asymmetric pads)
  /// PyTorch's ceil_mode: a last window that runs past the padded field still makes an output
  /// (unless it starts past the field and its lower padding); zeros padding only.
  bool ceil_mode = false;
  std::vector<int> dilation;  ///< default 1; max pooling only
  /// zeros: max pooling pads with -inf, average pooling with 0; periodic: wraps around.
  PaddingMode padding_mode = PaddingMode::zeros;
  /// Average pooling: divide by the window's cells inside the padded field (PyTorch's
  /// default: the whole window, less what ceil_mode's last window reaches past it) or by its
  /// cells inside the field.
  bool count_include_pad = true;
};

/// Pooling layer (no parameters). Output o is owned by the rank owning input o * stride.
template <class T>
class Pool : public Module<T> {
 public:
  Pool(const Communicator& comm, PoolOptions options, const std::string& name = "pool");
  Variable<T> forward(const Variable<T>& input) override;
  const WindowGeometry& geometry() const { return geometry_; }

 private:
  Communicator comm_;
  PoolOptions options_;
  WindowGeometry geometry_;
  std::string name_;
  std::shared_ptr<HaloPadding<T>> halo_;  // shared with backward closures
  std::optional<kernels::PoolPlan> plan_;  // the last input's shape's
};

extern template class Pool<float>;
extern template class Pool<double>;

}  // namespace shardtensor
