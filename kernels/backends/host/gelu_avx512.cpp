#include "shardtensor/kernels/gelu.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <type_traits>

#include "avx512_math.hpp"

namespace shardtensor::kernels {

namespace {

/// Runs work(first, last) on contiguous shares of [0, n), one per host thread, each share a
/// whole number of 16-value vectors but the last (elementwise: any split gives the same bits).
template <class Work>
void split_over_host_threads(std::size_t n, const Work& work) {
  const std::size_t threads =
      static_cast<std::size_t>(Kokkos::DefaultHostExecutionSpace().concurrency());
  const std::size_t vectors = (n + 15) / 16;
  if (threads <= 1 || vectors < 2 * threads) return work(std::size_t(0), n);
  Kokkos::parallel_for(
      "gelu_avx512",
      Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, static_cast<int>(threads)),
      [&](const int t) {
        const std::size_t first = std::min(n, vectors * t / threads * 16);
        const std::size_t last = std::min(n, vectors * (t + 1) / threads * 16);
        work(first, last);
      });
}

#ifdef SHARDTENSOR_HOST_AVX512
SHARDTENSOR_AVX512_BEGIN

namespace avx512 = host::avx512;

/// Phi(x) on 16 lanes, and exp(-x^2 / 2) (for the density) when `density` is given.
__attribute__((target("avx512f"))) inline __m512 normal_cdf(__m512 x, __m512* density) {
  // -x^2 / 2 as hi + lo (hi = fl(x^2), lo = its rounding error): the exponent's absolute
  // error is what becomes the tail's relative error, and x^2 reaches ~170 there.
  const __m512 square = _mm512_mul_ps(x, x);
  const __m512 square_error = _mm512_fmsub_ps(x, x, square);
  const __m512 minus_half = _mm512_set1_ps(-0.5f);
  const __m512 hi = _mm512_mul_ps(minus_half, square);  // exact: a power of two
  const __m512 lo = _mm512_mul_ps(minus_half, square_error);
  // z = |x| / sqrt 2; t = 1 / (1 + z / 2).
  const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.5f), z, one));
  __m512 p = _mm512_set1_ps(0.17087277f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.82215223f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.48851587f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.13520398f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.27886807f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.18628806f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.09678418f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.37409196f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.00002368f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.26551223f));
  // erfc(z) / 2 = t exp(-z^2 + P) / 2; exp underflows to 0 below -87 (exp clamps there).
  const __m512 exponent = _mm512_add_ps(hi, _mm512_add_ps(p, lo));
  const __mmask16 nonzero = _mm512_cmp_ps_mask(exponent, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  const __m512 tail =
      _mm512_maskz_mul_ps(nonzero, _mm512_mul_ps(_mm512_set1_ps(0.5f), t), avx512::exp(exponent));
  if (density) {
    const __m512 e = _mm512_add_ps(hi, lo);
    *density = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, _mm512_set1_ps(-87.0f), _CMP_GE_OQ),
                                   avx512::exp(e));
  }
  // Phi(x) = tail for x < 0, 1 - tail otherwise.
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(_mm512_sub_ps(one, tail), negative, tail);
}

__attribute__((target("avx512f"))) void gelu_avx512(const float* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(v, normal_cdf(v, nullptr)));
  }
  if (i < n) {
    const __mmask16 lanes = avx512::first_lanes(static_cast<std::ptrdiff_t>(n - i));
    const __m512 v = _mm512_maskz_loadu_ps(lanes, x + i);
    _mm512_mask_storeu_ps(y + i, lanes, _mm512_mul_ps(v, normal_cdf(v, nullptr)));
  }
}

/// gx += gy (Phi(x) + x phi(x)) on 16 lanes.
__attribute__((target("avx512f"))) inline __m512 gelu_gradient(__m512 x, __m512 gy, __m512 gx) {
  __m512 density;
  const __m512 cdf = normal_cdf(x, &density);
  const __m512 pdf = _mm512_mul_ps(density, _mm512_set1_ps(0.39894228040143267794f));
  return _mm512_fmadd_ps(gy, _mm512_fmadd_ps(x, pdf, cdf), gx);
}

__attribute__((target("avx512f"))) void gelu_backward_avx512(const float* x, const float* gy,
                                                             float* gx, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(gx + i, gelu_gradient(_mm512_loadu_ps(x + i), _mm512_loadu_ps(gy + i),
                                           _mm512_loadu_ps(gx + i)));
  if (i < n) {
    const __mmask16 lanes = avx512::first_lanes(static_cast<std::ptrdiff_t>(n - i));
    _mm512_mask_storeu_ps(
        gx + i, lanes,
        gelu_gradient(_mm512_maskz_loadu_ps(lanes, x + i), _mm512_maskz_loadu_ps(lanes, gy + i),
                      _mm512_maskz_loadu_ps(lanes, gx + i)));
  }
}

SHARDTENSOR_AVX512_END
#endif

}  // namespace

bool gelu_kernel(const float* x, float* y, std::size_t n) {
#ifdef SHARDTENSOR_HOST_AVX512
  if (!host::avx512_kernels_run_here()) return false;
  split_over_host_threads(n, [&](std::size_t first, std::size_t last) {
    gelu_avx512(x + first, y + first, last - first);
  });
  return true;
#else
  (void)x, (void)y, (void)n;
  return false;
#endif
}

bool gelu_backward_kernel(const float* x, const float* gy, float* gx, std::size_t n) {
#ifdef SHARDTENSOR_HOST_AVX512
  if (!host::avx512_kernels_run_here()) return false;
  split_over_host_threads(n, [&](std::size_t first, std::size_t last) {
    gelu_backward_avx512(x + first, gy + first, gx + first, last - first);
  });
  return true;
#else
  (void)x, (void)gy, (void)gx, (void)n;
  return false;
#endif
}

}  // namespace shardtensor::kernels
