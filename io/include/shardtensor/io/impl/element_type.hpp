#pragma once
// Element types the io module moves between memory and HDF5 files.

#include <cstdint>
#include <type_traits>

namespace shardtensor::impl {

enum class ElementType { float32, float64, int32, int64, uint64 };

template <class T>
constexpr ElementType element_type_of() {
  if constexpr (std::is_same<T, float>::value)
    return ElementType::float32;
  else if constexpr (std::is_same<T, double>::value)
    return ElementType::float64;
  else if constexpr (std::is_same<T, std::int32_t>::value)
    return ElementType::int32;
  else if constexpr (std::is_same<T, std::int64_t>::value)
    return ElementType::int64;
  else {
    static_assert(std::is_same<T, std::uint64_t>::value,
                  "io arrays hold float, double, int32_t, int64_t or uint64_t");
    return ElementType::uint64;
  }
}

}  // namespace shardtensor::impl
