#pragma once
// AVX-512 building blocks shared by the float row kernels (softmax rows, GELU): a lane mask
// and exp on 16 lanes. Only where cpu_features.hpp says so; callers check avx512_available().

#include "cpu_features.hpp"

#ifdef SHARDTENSOR_HOST_AVX512
#include <cstddef>

SHARDTENSOR_AVX512_BEGIN

namespace shardtensor::kernels::host::avx512 {

/// The first n (< 16) lanes.
__attribute__((target("avx512f"))) inline __mmask16 first_lanes(std::ptrdiff_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

/// exp(x) for x <= 88, 16 lanes: x = n ln2 + r, Cephes' degree-5 polynomial for exp(r),
/// 2^n built in the exponent bits (~1 ulp). x < -87 returns exp(-87) ~ 1.6e-38, not 0.
__attribute__((target("avx512f"))) inline __m512 exp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  // x log2(e) + 1.5 * 2^23: round(x log2 e) lands in the low mantissa bits.
  const __m512 shifted =
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(12582912.0f));
  const __m512 n = _mm512_sub_ps(shifted, _mm512_set1_ps(12582912.0f));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 in two parts
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i exponent = _mm512_slli_epi32(
      _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x4B400000 - 127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
}

}  // namespace shardtensor::kernels::host::avx512

SHARDTENSOR_AVX512_END
#endif
