#pragma once
// Sums of long runs of values in double, with independent partial sums: a single running sum
// waits for every add to finish before the next (four cycles each), so reductions over
// millions of cells ran at a quarter of the speed the adds allow.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/types.hpp"

namespace shardtensor::impl {

/// Values per chunk of a chunked reduction (run_sum's partial sums, per_sample_sums' items).
inline constexpr Index sum_chunk = 8;

/// Sum of value(i) for i in [first, last) in double: chunks of eight summed pairwise, chunk by
/// chunk. The same order on every backend and thread count for the same run.
template <class Value>
KOKKOS_INLINE_FUNCTION double chunk_sum(const Value& value, Index first, Index last) {
  if (last - first == sum_chunk) {
    const double a = double(value(first)) + double(value(first + 1));
    const double b = double(value(first + 2)) + double(value(first + 3));
    const double c = double(value(first + 4)) + double(value(first + 5));
    const double d = double(value(first + 6)) + double(value(first + 7));
    return (a + b) + (c + d);
  }
  double s = 0;
  for (Index i = first; i < last; ++i) s += double(value(i));
  return s;
}

/// Sum of the `count` values at `p` in double, eight at a time (see chunk_sum).
template <class T>
KOKKOS_INLINE_FUNCTION double run_sum(const T* p, Index count) {
  const auto at = [p](Index i) { return p[i]; };
  double s = 0;
  for (Index first = 0; first < count; first += sum_chunk)
    s += chunk_sum(at, first, first + sum_chunk < count ? first + sum_chunk : count);
  return s;
}

}  // namespace shardtensor::impl
