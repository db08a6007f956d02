#pragma once
// The activations' scalar functions and derivatives, for the portable kernels that apply them
// (nn/pointwise.hpp's activate, and the normalization's fused activation in
// kernels/normalization.hpp). GELU on float arrays has a vector path too: kernels/gelu.hpp.

#include "shardtensor/core/kokkos_math.hpp"

namespace shardtensor {

enum class Activation {
  relu,
  leaky_relu,
  gelu,
  silu,
  tanh,
  sigmoid,
  elu,          ///< alpha: `slope`
  selu,         ///< SELU's fixed constants
  softplus,     ///< log(1 + e^x)
  hardsigmoid,  ///< PyTorch's: relu6(x + 3) / 6
  hardswish,    ///< x hardsigmoid(x)
  relu6,        ///< min(max(x, 0), 6)
  mish          ///< x tanh(softplus(x))
};

namespace kernels {

/// f(x) and f'(x) of each activation. GELU is the exact (erf) form, PyTorch's default,
/// written x erfc(-x / sqrt 2) / 2: 1 + erf(x / sqrt 2) would cancel to nothing for x < -5.
template <class T>
struct ActivationFunction {
  Activation kind;
  T slope;  // leaky_relu's slope, elu's alpha

  static KOKKOS_INLINE_FUNCTION T softplus(T x) {
    return x > T(20) ? x : math::log(T(1) + math::exp(x));  // e^x would overflow past ~88
  }
  static KOKKOS_INLINE_FUNCTION T logistic(T x) { return T(1) / (T(1) + math::exp(-x)); }

  KOKKOS_INLINE_FUNCTION T value(T x) const {
    switch (kind) {
      case Activation::relu:
        return x > T(0) ? x : T(0);
      case Activation::leaky_relu:
        return x > T(0) ? x : slope * x;
      case Activation::gelu:
        return T(0.5) * x * math::erfc(-x * T(0.70710678118654752440));
      case Activation::silu:
        return x / (T(1) + math::exp(-x));
      case Activation::tanh:
        return math::tanh(x);
      case Activation::elu:
        return x > T(0) ? x : slope * (math::exp(x) - T(1));
      case Activation::selu:
        return T(1.0507009873554804934) *
               (x > T(0) ? x : T(1.6732632423543772848) * (math::exp(x) - T(1)));
      case Activation::softplus:
        return softplus(x);
      case Activation::hardsigmoid:
        return x <= T(-3) ? T(0) : x >= T(3) ? T(1) : x / T(6) + T(0.5);
      case Activation::hardswish:
        return x <= T(-3) ? T(0) : x >= T(3) ? x : x * (x + T(3)) / T(6);
      case Activation::relu6:
        return x <= T(0) ? T(0) : x >= T(6) ? T(6) : x;
      case Activation::mish:
        return x * math::tanh(softplus(x));
      default:
        return logistic(x);
    }
  }
  KOKKOS_INLINE_FUNCTION T derivative(T x) const {
    switch (kind) {
      case Activation::relu:
        return x > T(0) ? T(1) : T(0);
      case Activation::leaky_relu:
        return x > T(0) ? T(1) : slope;
      case Activation::gelu: {
        const T cdf = T(0.5) * math::erfc(-x * T(0.70710678118654752440));
        const T pdf = math::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
        return cdf + x * pdf;
      }
      case Activation::silu: {
        const T s = T(1) / (T(1) + math::exp(-x));
        return s * (T(1) + x * (T(1) - s));
      }
      case Activation::tanh: {
        const T t = math::tanh(x);
        return T(1) - t * t;
      }
      case Activation::elu:
        return x > T(0) ? T(1) : slope * math::exp(x);
      case Activation::selu:
        return T(1.0507009873554804934) *
               (x > T(0) ? T(1) : T(1.6732632423543772848) * math::exp(x));
      case Activation::softplus:
        return logistic(x);
      case Activation::hardsigmoid:
        return x <= T(-3) || x >= T(3) ? T(0) : T(1) / T(6);
      case Activation::hardswish:
        return x <= T(-3) ? T(0) : x >= T(3) ? T(1) : (T(2) * x + T(3)) / T(6);
      case Activation::relu6:
        return x <= T(0) || x >= T(6) ? T(0) : T(1);
      case Activation::mish: {
        const T t = math::tanh(softplus(x));
        return t + x * (T(1) - t * t) * logistic(x);
      }
      default: {
        const T s = T(1) / (T(1) + math::exp(-x));
        return s * (T(1) - s);
      }
    }
  }
};

}  // namespace kernels
}  // namespace shardtensor
