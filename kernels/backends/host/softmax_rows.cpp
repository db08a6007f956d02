#include "softmax_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "avx512_math.hpp"

namespace shardtensor::kernels::host {

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

/// Runs row(i) for i < rows on the host threads, or (inline_rows) on the calling thread.
template <class Row>
void for_each_row(Index rows, bool inline_rows, const Row& row) {
  if (inline_rows) {
    for (Index i = 0; i < rows; ++i) row(i);
    return;
  }
  Kokkos::parallel_for("flash_attention::rows_avx512",
                       Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, rows), row);
}

}  // namespace

bool online_softmax_rows(const Tile<float>& s, const Visibility& visible, Index i0, Index j0,
                         float* max, float* sum, float* out, Index head_dim, bool inline_rows) {
#ifdef SHARDTENSOR_HOST_AVX512
  if (!avx512_kernels_run_here()) return false;
  const Index cols = s.extent(1);
  for_each_row(s.extent(0), inline_rows, [&](const Index i) {
    float* row = &s(i, 0);
    const Index n = visible.count(i0 + i, j0, cols);
    for (Index j = n; j < cols; ++j) row[j] = 0;  // masked keys get P = 0
    if (n == 0) return;
    const float new_max = std::max(max[i], row_max_avx512(row, n));
    // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first tile).
    const float correction = std::exp(max[i] - new_max);
    sum[i] = sum[i] * correction + exp_row_avx512(row, n, new_max);
    max[i] = new_max;
    if (correction != 1.0f)
      for (Index d = 0; d < head_dim; ++d) out[i * head_dim + d] *= correction;
  });
  return true;
#else
  (void)s, (void)visible, (void)i0, (void)j0, (void)max, (void)sum, (void)out, (void)head_dim,
      (void)inline_rows;
  return false;
#endif
}

bool softmax_probabilities(const Tile<float>& p, const Visibility& visible, Index i0, Index j0,
                           const float* lse, bool inline_rows) {
#ifdef SHARDTENSOR_HOST_AVX512
  if (!avx512_kernels_run_here()) return false;
  const Index cols = p.extent(1);
  for_each_row(p.extent(0), inline_rows, [&](const Index i) {
    float* row = &p(i, 0);
    const Index n = visible.count(i0 + i, j0, cols);
    exp_row_avx512(row, n, lse[i]);
    for (Index j = n; j < cols; ++j) row[j] = 0;
  });
  return true;
#else
  (void)p, (void)visible, (void)i0, (void)j0, (void)lse, (void)inline_rows;
  return false;
#endif
}

}  // namespace shardtensor::kernels::host
