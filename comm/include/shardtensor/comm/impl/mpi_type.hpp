#pragma once
// MPI datatype of a C++ scalar type.

#include <mpi.h>

#include <cstdint>
#include <type_traits>

namespace shardtensor::impl {

template <class T>
MPI_Datatype mpi_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, int>)
    return MPI_INT;
  else if constexpr (std::is_same_v<U, long>)
    return MPI_LONG;
  else if constexpr (std::is_same_v<U, long long>)
    return MPI_LONG_LONG;
  else if constexpr (std::is_same_v<U, unsigned>)
    return MPI_UNSIGNED;
  else if constexpr (std::is_same_v<U, unsigned long>)
    return MPI_UNSIGNED_LONG;
  else if constexpr (std::is_same_v<U, unsigned long long>)
    return MPI_UNSIGNED_LONG_LONG;
  else if constexpr (std::is_same_v<U, char>)
    return MPI_CHAR;
  else
    static_assert(sizeof(U) == 0, "no MPI datatype for this scalar type");
}

}  // namespace shardtensor::impl
