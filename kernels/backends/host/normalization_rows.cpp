// The normalization rows of the host's vector kernels (vector_kernels.hpp): float cells in
// double arithmetic, compiled by Highway's foreach_target.h once per instruction set (this
// file includes itself) and dispatched like vector_kernels.cpp. Built with -ffp-contract=off
// (kernels/backends/host/CMakeLists.txt): a product and a sum stay two roundings, as in the
// portable kernels (kernels/src/normalization.cpp), whose bits each cell must have; the
// compiler would otherwise fuse them wherever the target has fused multiply-adds.

#include "host/vector_kernels.hpp"

#include <array>
#include <cstddef>

#include "shardtensor/core/error.hpp"

#ifdef SHARDTENSOR_HOST_VECTOR_KERNELS

#include "host/vector_targets.hpp"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "host/normalization_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace shardtensor::kernels::host {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Each expression is written once, generic over double and vectors of doubles (Highway's
// operators), so a vector and the scalar tail compute alike.

using DD = hn::CappedTag<double, 8>;
using VD = hn::Vec<DD>;
using DF = hn::Rebind<float, DD>;  // as many floats as DD has doubles
constexpr int double_lanes = static_cast<int>(hn::MaxLanes(DD()));
constexpr int partial_sums = 8;
static_assert(partial_sums % double_lanes == 0, "whole vectors of partial sums");

HWY_INLINE VD LoadDoubles(const float* p) {
  return hn::PromoteTo(DD(), hn::LoadU(DF(), p));
}

/// The 8 partial sums added in one fixed tree.
inline double sum_of_8(const double* s) {
  double q[4];
  for (int i = 0; i < 4; ++i) q[i] = s[i + 4] + s[i];
  return (q[0] + q[2]) + (q[1] + q[3]);
}

/// out[s] = the sum over a row's n cells of term s (S terms per cell: vector_terms(j) for cells
/// j.. j + double_lanes, scalar_terms(j) for one), cell j into partial sum j mod 8.
template <int S, class VectorTerms, class ScalarTerms>
HWY_INLINE void RowSums(std::size_t n, const VectorTerms& vector_terms,
                        const ScalarTerms& scalar_terms, double* out) {
  constexpr int parts = partial_sums / double_lanes;
  const DD dd;
  VD sum[S][parts];
  for (int s = 0; s < S; ++s)
    for (int k = 0; k < parts; ++k) sum[s][k] = hn::Zero(dd);
  std::size_t j = 0;
  for (; j + partial_sums <= n; j += partial_sums)
    for (int k = 0; k < parts; ++k) {
      const auto terms = vector_terms(j + k * double_lanes);
      for (int s = 0; s < S; ++s) sum[s][k] = hn::Add(sum[s][k], terms[s]);
    }
  HWY_ALIGN double partial[S][partial_sums];
  for (int s = 0; s < S; ++s)
    for (int k = 0; k < parts; ++k) hn::Store(sum[s][k], dd, partial[s] + k * double_lanes);
  for (std::size_t i = j; i < n; ++i) {
    const auto terms = scalar_terms(i);
    for (int s = 0; s < S; ++s) partial[s][i - j] += terms[s];
  }
  for (int s = 0; s < S; ++s) out[s] = sum_of_8(partial[s]);
}

double SumRow(const float* x, std::size_t n) {
  double sum;
  RowSums<1>(
      n, [&](std::size_t j) { return std::array<VD, 1>{LoadDoubles(x + j)}; },
      [&](std::size_t j) { return std::array<double, 1>{double(x[j])}; }, &sum);
  return sum;
}

void DeviationSumsRow(const float* x, std::size_t n, double mean, double* sums) {
  const auto terms = [](auto x, auto mean) {
    const auto d = x - mean;
    return std::array<decltype(d), 2>{d, d * d};
  };
  const VD vmean = hn::Set(DD(), mean);
  RowSums<2>(
      n, [&](std::size_t j) { return terms(LoadDoubles(x + j), vmean); },
      [&](std::size_t j) { return terms(double(x[j]), mean); }, sums);
}

void GradientSumsRow(const float* dy, const float* x, std::size_t n, double mean, double rstd,
                     double* sums) {
  const auto terms = [](auto g, auto x, auto mean, auto rstd) {
    const auto xhat = (x - mean) * rstd;
    return std::array<decltype(g), 2>{g, g * xhat};
  };
  const VD vmean = hn::Set(DD(), mean), vrstd = hn::Set(DD(), rstd);
  RowSums<2>(
      n,
      [&](std::size_t j) { return terms(LoadDoubles(dy + j), LoadDoubles(x + j), vmean, vrstd); },
      [&](std::size_t j) { return terms(double(dy[j]), double(x[j]), mean, rstd); }, sums);
}

void NormalizeRow(const float* x, float* y, std::size_t n, double mean, double rstd, double scale,
                  double shift) {
  const auto normalized = [](auto x, auto mean, auto rstd, auto scale, auto shift) {
    return (x - mean) * rstd * scale + shift;
  };
  const DD dd;
  const DF df;
  const VD vmean = hn::Set(dd, mean), vrstd = hn::Set(dd, rstd), vscale = hn::Set(dd, scale),
           vshift = hn::Set(dd, shift);
  std::size_t j = 0;
  for (; j + double_lanes <= n; j += double_lanes)
    hn::StoreU(hn::DemoteTo(df, normalized(LoadDoubles(x + j), vmean, vrstd, vscale, vshift)), df,
               y + j);
  for (; j < n; ++j) y[j] = static_cast<float>(normalized(double(x[j]), mean, rstd, scale, shift));
}

void NormalizeBackwardRow(const float* dy, const float* x, float* dx, std::size_t n, double mean,
                          double rstd, double c1, double c2, double c3, bool overwrite) {
  const auto gradient = [](auto g, auto x, auto mean, auto rstd, auto c1, auto c2, auto c3) {
    const auto xhat = (x - mean) * rstd;
    return c1 * g - c2 - c3 * xhat;
  };
  const DD dd;
  const DF df;
  const VD vmean = hn::Set(dd, mean), vrstd = hn::Set(dd, rstd), v1 = hn::Set(dd, c1),
           v2 = hn::Set(dd, c2), v3 = hn::Set(dd, c3);
  std::size_t j = 0;
  for (; j + double_lanes <= n; j += double_lanes) {
    const auto g = hn::DemoteTo(
        df, gradient(LoadDoubles(dy + j), LoadDoubles(x + j), vmean, vrstd, v1, v2, v3));
    hn::StoreU(overwrite ? g : hn::Add(hn::LoadU(df, dx + j), g), df, dx + j);
  }
  for (; j < n; ++j) {
    const float g =
        static_cast<float>(gradient(double(dy[j]), double(x[j]), mean, rstd, c1, c2, c3));
    dx[j] = overwrite ? g : dx[j] + g;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace shardtensor::kernels::host
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shardtensor::kernels::host {

HWY_EXPORT(SumRow);
HWY_EXPORT(DeviationSumsRow);
HWY_EXPORT(GradientSumsRow);
HWY_EXPORT(NormalizeRow);
HWY_EXPORT(NormalizeBackwardRow);

double sum_row(const float* x, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(SumRow)(x, n);
}
void deviation_sums_row(const float* x, std::size_t n, double mean, double* sums) {
  HWY_DYNAMIC_DISPATCH(DeviationSumsRow)(x, n, mean, sums);
}
void gradient_sums_row(const float* dy, const float* x, std::size_t n, double mean, double rstd,
                       double* sums) {
  HWY_DYNAMIC_DISPATCH(GradientSumsRow)(dy, x, n, mean, rstd, sums);
}
void normalize_row(const float* x, float* y, std::size_t n, double mean, double rstd, double scale,
                   double shift) {
  HWY_DYNAMIC_DISPATCH(NormalizeRow)(x, y, n, mean, rstd, scale, shift);
}
void normalize_backward_row(const float* dy, const float* x, float* dx, std::size_t n, double mean,
                            double rstd, double c1, double c2, double c3, bool overwrite) {
  HWY_DYNAMIC_DISPATCH(NormalizeBackwardRow)(dy, x, dx, n, mean, rstd, c1, c2, c3, overwrite);
}

}  // namespace shardtensor::kernels::host
#endif  // HWY_ONCE

#else  // no Highway: vector_kernels_on() is false, so nothing calls these

namespace shardtensor::kernels::host {

double sum_row(const float*, std::size_t) {
  SHARDTENSOR_FAIL("sum_row", "this build has no host vector kernels");
}
void deviation_sums_row(const float*, std::size_t, double, double*) {
  SHARDTENSOR_FAIL("deviation_sums_row", "this build has no host vector kernels");
}
void gradient_sums_row(const float*, const float*, std::size_t, double, double, double*) {
  SHARDTENSOR_FAIL("gradient_sums_row", "this build has no host vector kernels");
}
void normalize_row(const float*, float*, std::size_t, double, double, double, double) {
  SHARDTENSOR_FAIL("normalize_row", "this build has no host vector kernels");
}
void normalize_backward_row(const float*, const float*, float*, std::size_t, double, double, double,
                            double, double, bool) {
  SHARDTENSOR_FAIL("normalize_backward_row", "this build has no host vector kernels");
}

}  // namespace shardtensor::kernels::host

#endif
