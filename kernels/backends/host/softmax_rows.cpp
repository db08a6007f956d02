#include "shardtensor/kernels/softmax_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "avx512_math.hpp"

namespace shardtensor::kernels {

namespace {

#ifdef SHARDTENSOR_HOST_AVX512
SHARDTENSOR_AVX512_BEGIN

using host::avx512::exp;
using host::avx512::first_lanes;

__attribute__((target("avx512f"))) float row_max_avx512(const float* x, Index n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  Index j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
  if (j < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, first_lanes(n - j), x + j));
  return _mm512_reduce_max_ps(m);
}

__attribute__((target("avx512f"))) float exp_row_avx512(float* x, Index n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  Index j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 p = exp(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
    _mm512_storeu_ps(x + j, p);
    sum = _mm512_add_ps(sum, p);
  }
  if (j < n) {
    const __mmask16 lanes = first_lanes(n - j);
    const __m512 p = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + j), s));
    _mm512_mask_storeu_ps(x + j, lanes, p);
    sum = _mm512_mask_add_ps(sum, lanes, sum, p);
  }
  return _mm512_reduce_add_ps(sum);
}

SHARDTENSOR_AVX512_END
#endif

}  // namespace

template <class T>
T row_max(const T* x, Index n) {
#ifdef SHARDTENSOR_HOST_AVX512
  if constexpr (std::is_same<T, float>::value)
    if (host::avx512_available()) return row_max_avx512(x, n);
#endif
  T m = -std::numeric_limits<T>::infinity();
  for (Index j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

template <class T>
T exp_row(T* x, Index n, T shift) {
#ifdef SHARDTENSOR_HOST_AVX512
  if constexpr (std::is_same<T, float>::value)
    if (host::avx512_available()) return exp_row_avx512(x, n, shift);
#endif
  T sum = 0;
  for (Index j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - shift));
  return sum;
}

template float row_max(const float*, Index);
template double row_max(const double*, Index);
template float exp_row(float*, Index, float);
template double exp_row(double*, Index, double);

}  // namespace shardtensor::kernels
