#pragma once
// bfloat16: the 16-bit float of mixed-precision training (8 exponent bits like float, 7
// mantissa bits), as bit patterns and as the float values it can hold. Conversion rounds to
// nearest, ties to even, as the tensor cores' and PyTorch's float-to-bfloat16 conversions do;
// NaN stays NaN (quiet) and infinities stay infinite.
//
// A float holding a bfloat16 value multiplies another exactly (8 x 8 significant bits fit
// float's 24), so a product summed in float on bfloat16-valued operands is what a bf16
// tensor core computes with fp32 accumulation: the CPU kernels run bf16 that way.

#include <cstdint>
#include <cstring>

#include <Kokkos_Core.hpp>

namespace shardtensor {

/// The upper half of `x`'s bits, rounded to nearest even on the lower half. Without a branch,
/// so that loops over arrays of it vectorize (the convolutions' bf16 pair copies).
KOKKOS_INLINE_FUNCTION std::uint16_t bfloat16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  // Carries into the exponent where it must (and to inf past the top).
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const std::uint32_t quiet_nan = u | 0x00400000u;
  return std::uint16_t(((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded) >> 16);
}

/// The float whose upper half is `bits` (exact).
KOKKOS_INLINE_FUNCTION float bfloat16_value(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// `x` rounded to the nearest bfloat16, as a float.
KOKKOS_INLINE_FUNCTION float round_to_bfloat16(float x) {
  return bfloat16_value(bfloat16_bits(x));
}

}  // namespace shardtensor
