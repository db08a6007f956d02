#pragma once
// GELU on float arrays, the host backend's (kernels/backends/host/gelu_rows.cpp, on the vector
// instruction set the CPU runs: AVX2, AVX-512, NEON), for activate(): each call returns false,
// touching nothing, where it cannot run (no vector path: SHARDTENSOR_SIMD=off, a CPU without
// FMA vectors, a build without Highway; Kokkos kernels not on the host); then the caller runs
// its portable kernel. On OpenMP the arrays are split over the host threads (elementwise: same bits).
//
// Phi(x) = 0.5 erfc(-x / sqrt 2) from erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), with
// the Chebyshev-fitted degree-9 P of Numerical Recipes (fractional error < 1.2e-7 for every
// z >= 0), and z^2 = x^2 / 2 carried with its rounding error into the exponent: relative error
// of GELU and of its derivative at most 2e-6 on [-10, 10] (test_pointwise_loss), the far
// tails included, where 1 + erf(x / sqrt 2) in float has no correct digit left (x < -5.5).

#include <cstddef>

namespace shardtensor::kernels {

/// y[i] = x[i] Phi(x[i]) for i < n.
bool gelu_kernel(const float* x, float* y, std::size_t n);

/// gx[i] += gy[i] (Phi(x[i]) + x[i] phi(x[i])) for i < n.
bool gelu_backward_kernel(const float* x, const float* gy, float* gx, std::size_t n);

}  // namespace shardtensor::kernels
