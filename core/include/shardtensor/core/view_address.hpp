#pragma once
// address_of: the address of a View element, computed from the View's strides without
// reading it. On the host, `&view(n, c, x, y, z)` is a View access, which Kokkos refuses when
// the View lives on a GPU; pointers handed to kernels and libraries (BLAS) that run where
// the data are come from here.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// Address of element (n, c, x, y, z) of a five-axis View (any memory space).
template <class View>
KOKKOS_INLINE_FUNCTION typename View::pointer_type address_of(const View& v, Index n, Index c,
                                                              Index x, Index y, Index z) {
  static_assert(View::rank == 5, "address_of: a (batch, channel, x, y, z) View");
  return v.data() + n * Index(v.stride(0)) + c * Index(v.stride(1)) + x * Index(v.stride(2)) +
         y * Index(v.stride(3)) + z * Index(v.stride(4));
}

}  // namespace shardtensor
