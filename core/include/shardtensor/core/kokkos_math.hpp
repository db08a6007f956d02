#pragma once
/// Math functions for kernels, on every Kokkos version the project builds against. Kernels
/// call shardtensor::math::exp (never std::exp, which does not run on a GPU): Kokkos 3.4 has
/// these in Kokkos::Experimental, Kokkos 3.7 and later in Kokkos.

#include <Kokkos_Core.hpp>

namespace shardtensor::math {

#if KOKKOS_VERSION >= 30700
using Kokkos::cos;
using Kokkos::erf;
using Kokkos::erfc;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::floor;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::erf;
using Kokkos::Experimental::erfc;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::floor;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

/// min and max for kernels (std::min is host-only on a GPU; Kokkos' own moved namespaces).
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T max(T a, T b) {
  return a < b ? b : a;
}

/// +infinity of T (both versions keep the numeric traits in Kokkos::Experimental).
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  return Kokkos::Experimental::infinity<T>::value;
}

}  // namespace shardtensor::math
