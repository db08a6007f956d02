#pragma once
// Rounding arrays of floats to bfloat16 values (core/bfloat16.hpp): the operands of layers
// that compute in bf16 (ConvOptions::bf16). Elementwise, so any split of the work over
// threads gives the same bits. Double arrays are left alone: bf16 is a float model's option.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// to[i] = round_to_bfloat16(from[i]) for i < n (from == to rounds in place). Float only:
/// throws for double (the layers refuse bf16 in a double model before they get here). On a
/// host build with a vector path on, a vector kernel (the same bits).
template <class T>
void round_to_bfloat16(const ExecutionSpace& space, const T* from, T* to, std::size_t n);

/// bits[i] = bfloat16_bits(from[i]) for i < n: the values packed into 16 bits, rounded. Returns
/// how many were not bfloat16 values already (0: unpacking gives them back exactly). Float
/// only, like round_to_bfloat16.
template <class T>
std::size_t pack_bfloat16(const ExecutionSpace& space, const T* from, std::uint16_t* bits,
                          std::size_t n);

/// to[i] = bfloat16_value(bits[i]) for i < n (exact).
template <class T>
void unpack_bfloat16(const ExecutionSpace& space, const std::uint16_t* bits, T* to, std::size_t n) {
  Kokkos::parallel_for(
      "unpack_bfloat16", kernel_range(space, Index(n)),
      KOKKOS_LAMBDA(const Index i) { to[i] = T(bfloat16_value(bits[i])); });
}

/// bits[i] = bfloat16_bits(from[i]) for i < n, float only: pack_bfloat16 without its count
/// (no value is read back on the host, so a GPU stream does not wait).
void store_bfloat16_bits(const ExecutionSpace& space, const float* from, std::uint16_t* bits,
                         std::size_t n);

/// Rounds every value of `view` (a contiguous View: a field with its ghosts, a parameter).
template <class ViewType>
void round_to_bfloat16(const ExecutionSpace& space, const ViewType& view) {
  round_to_bfloat16(space, view.data(), view.data(), view.span());
}

/// `values` rounded to bfloat16 in a new View (a bf16 layer's weight: the parameter itself
/// stays float, the optimizer's master copy).
template <class T>
ReplicatedView<T> bfloat16_copy(const ReplicatedView<T>& values, const std::string& label) {
  ReplicatedView<T> rounded(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                            values.extent(0));
  round_to_bfloat16(ExecutionSpace(), values.data(), rounded.data(), values.span());
  return rounded;
}

/// A field with `field`'s layout (ghosts included) holding its values rounded to bfloat16.
template <class T>
ShardTensor<T> bfloat16_copy(const ShardTensor<T>& field, const std::string& label) {
  ShardTensor<T> rounded = ShardTensor<T>::uninitialized(
      field.decomposition(), field.rank(), field.batch(), field.channels(), field.ghosts(), label);
  round_to_bfloat16(ExecutionSpace(), field.view().data(), rounded.view().data(),
                    field.view().span());
  return rounded;
}

/// `field` with its values rounded to bfloat16: the field itself, rounded in place, where no
/// other copy shares its memory (a gradient only its node holds), else a rounded copy.
template <class T>
ShardTensor<T> bfloat16_rounded(const ShardTensor<T>& field, const std::string& label) {
  if (field.view().use_count() != 1) return bfloat16_copy(field, label);
  round_to_bfloat16(ExecutionSpace(), field.view());
  return field;
}

}  // namespace shardtensor::kernels
