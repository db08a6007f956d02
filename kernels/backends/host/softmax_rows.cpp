#include "softmax_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "shardtensor/core/execution.hpp"
#include "vector_kernels.hpp"

namespace shardtensor::kernels::host {

namespace {

/// Runs row(i) for i < rows on the host threads, or (inline_rows) on the calling thread.
template <class Row>
void for_each_row(Index rows, bool inline_rows, const Row& row) {
  if (inline_rows) {
    for (Index i = 0; i < rows; ++i) row(i);
    return;
  }
  Kokkos::parallel_for("flash_attention::vector_rows",
                       Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, rows), row);
}

}  // namespace

bool online_softmax_rows(const Tile<float>& s, const Visibility& visible, Index i0, Index j0,
                         float* max, float* sum, float* out, Index head_dim, bool inline_rows) {
  if (!kernels_run_on_host || !vector_kernels_on()) return false;
  const Index cols = s.extent(1);
  for_each_row(s.extent(0), inline_rows, [&](const Index i) {
    float* row = &s(i, 0);
    const Index n = visible.count(i0 + i, j0, cols);
    for (Index j = n; j < cols; ++j) row[j] = 0;  // masked keys get P = 0
    if (n == 0) return;
    const float new_max = std::max(max[i], row_max(row, n));
    // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first tile).
    const float correction = std::exp(max[i] - new_max);
    sum[i] = sum[i] * correction + exp_row(row, n, new_max);
    max[i] = new_max;
    if (correction != 1.0f)
      for (Index d = 0; d < head_dim; ++d) out[i * head_dim + d] *= correction;
  });
  return true;
}

bool softmax_probabilities(const Tile<float>& p, const Visibility& visible, Index i0, Index j0,
                           const float* lse, bool inline_rows) {
  if (!kernels_run_on_host || !vector_kernels_on()) return false;
  const Index cols = p.extent(1);
  for_each_row(p.extent(0), inline_rows, [&](const Index i) {
    float* row = &p(i, 0);
    const Index n = visible.count(i0 + i, j0, cols);
    exp_row(row, n, lse[i]);
    for (Index j = n; j < cols; ++j) row[j] = 0;
  });
  return true;
}

}  // namespace shardtensor::kernels::host
