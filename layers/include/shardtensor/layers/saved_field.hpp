#pragma once
// SavedField: a field an op keeps from forward for its backward, in 16 bits where that loses
// nothing the op reads: the operand of a bf16 layer (which only ever reads it rounded), or a
// field whose values are all bfloat16 values already (a bf16 layer's output, read by the
// normalization after it). Half the bytes of what the graph holds between forward and
// backward: what bf16 training saves in memory (PyTorch's autocast saves such tensors in
// bf16 too).

#include <cstdint>
#include <optional>
#include <string>

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/kernels/bfloat16_rounding.hpp"

namespace shardtensor {

/// How a field is kept.
enum class SavedPacking {
  none,      ///< as it is
  rounded,   ///< rounded to bfloat16 and packed (the op reads only the rounded values)
  if_exact,  ///< packed if every value is a bfloat16 value, else as it is
};

template <class T>
class SavedField {
 public:
  SavedField() = default;

  /// Keeps the value of `input` (its ghost cells too) as `packing` says. Packed only where
  /// that frees memory: an op's result, whose float value goes with its last Variable; a
  /// leaf's value (a batch, a recomputed block's input) is held by whoever made it, and a
  /// packed copy would come on top. Double fields are kept as they are.
  SavedField(const Variable<T>& input, SavedPacking packing, const std::string& label)
      : field_(input.value()) {
    const ShardTensor<T>& field = input.value();
    const bool op_result = !input.node()->inputs.empty();
    if (packing == SavedPacking::none || !op_result || !std::is_same<T, float>::value ||
        field.view().span() == 0)
      return;
    const std::size_t n = field.view().span();
    Kokkos::View<std::uint16_t*, DefaultMemorySpace> bits(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, label + " (bf16)"), n);
    const std::size_t inexact =
        kernels::pack_bfloat16(ExecutionSpace(), field.view().data(), bits.data(), n);
    if (packing == SavedPacking::if_exact && inexact > 0) return;  // keep the field
    bits_ = bits;
    label_ = label;
    field_ = ShardTensor<T>();  // this copy's reference goes: the values live in bits_
    layout_.emplace(Layout{field.decomposition(), field.rank(), field.batch(), field.channels(),
                           field.ghosts()});
  }

  bool packed() const { return bits_.extent(0) > 0; }

  /// The field: the one kept, or a new one unpacked from the 16 bits (rounded values for
  /// SavedPacking::rounded, the exact values for if_exact).
  ShardTensor<T> value() const {
    if (!packed()) return field_;
    ShardTensor<T> field = ShardTensor<T>::uninitialized(
        layout_->decomposition, layout_->rank, layout_->batch, layout_->channels,
        layout_->ghosts, label_);
    kernels::unpack_bfloat16(ExecutionSpace(), bits_.data(), field.view().data(), bits_.span());
    return field;
  }

 private:
  struct Layout {
    Decomposition decomposition;
    int rank = 0;
    Index batch = 0, channels = 0;
    GhostWidths ghosts;
  };
  ShardTensor<T> field_;
  Kokkos::View<std::uint16_t*, DefaultMemorySpace> bits_;
  std::optional<Layout> layout_;  // of a packed field
  std::string label_;
};

}  // namespace shardtensor
