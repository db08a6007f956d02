#pragma once
// Counter-based random numbers: a value is a pure function of (seed, index), so every rank
// draws the same parameter initialisation, and sharded fields draw per global cell the same
// numbers as an unsharded run.

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace shardtensor {

/// splitmix64 of (seed, index): 64 well-mixed bits.
KOKKOS_INLINE_FUNCTION std::uint64_t hash_bits(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform in [-1, 1), 53 random bits.
KOKKOS_INLINE_FUNCTION double hashed_uniform(std::uint64_t seed, std::uint64_t index) {
  return static_cast<double>(hash_bits(seed, index) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

}  // namespace shardtensor
