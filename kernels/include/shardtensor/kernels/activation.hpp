#pragma once
// The activations' scalar functions and derivatives, for the portable kernels that apply them
// (layers/pointwise.hpp's activate, and the normalization's fused activation in
// kernels/normalization.hpp), and the other elementwise functions imported graphs apply
// (ONNX's Exp, Sqrt, Clip, ...). GELU on float arrays has a vector path too: kernels/gelu.hpp.

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
  mish,         ///< x tanh(softplus(x))
  celu,         ///< max(0, x) + min(0, alpha (e^(x / alpha) - 1)); alpha: `slope`
  erf,
  exp,
  log,
  sqrt,
  abs,          ///< derivative sign(x), 0 at 0 (PyTorch's)
  neg,
  reciprocal,
  pow,          ///< x^p, p: `slope`
  clip          ///< min(max(x, slope), upper); derivative 1 on [slope, upper] (PyTorch's)
};

namespace kernels {

/// f(x) and f'(x) of each activation. GELU is the exact (erf) form, PyTorch's default,
/// written x erfc(-x / sqrt 2) / 2: 1 + erf(x / sqrt 2) would cancel to nothing for x < -5.
template <class T>
struct ActivationFunction {
  Activation kind;
  T slope;  // leaky_relu's slope, elu's and celu's alpha, pow's exponent, clip's lower bound
  T upper = T(0);  // clip's upper bound

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
      case Activation::celu:
        return x > T(0) ? x : slope * (math::exp(x / slope) - T(1));
      case Activation::erf:
        return math::erf(x);
      case Activation::exp:
        return math::exp(x);
      case Activation::log:
        return math::log(x);
      case Activation::sqrt:
        return math::sqrt(x);
      case Activation::abs:
        return math::fabs(x);
      case Activation::neg:
        return -x;
      case Activation::reciprocal:
        return T(1) / x;
      case Activation::pow:
        return slope == T(2) ? x * x : math::pow(x, slope);
      case Activation::clip:
        return x < slope ? slope : x > upper ? upper : x;
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
      case Activation::celu:
        return x > T(0) ? T(1) : math::exp(x / slope);
      case Activation::erf:
        return T(1.12837916709551257390) * math::exp(-x * x);  // 2 / sqrt(pi) e^(-x^2)
      case Activation::exp:
        return math::exp(x);
      case Activation::log:
        return T(1) / x;
      case Activation::sqrt:
        return T(0.5) / math::sqrt(x);
      case Activation::abs:
        return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0);
      case Activation::neg:
        return T(-1);
      case Activation::reciprocal:
        return T(-1) / (x * x);
      case Activation::pow:
        return slope == T(2) ? T(2) * x : slope * math::pow(x, slope - T(1));
      case Activation::clip:
        return x >= slope && x <= upper ? T(1) : T(0);
      default: {
        const T s = T(1) / (T(1) + math::exp(-x));
        return s * (T(1) - s);
      }
    }
  }
};

}  // namespace kernels
}  // namespace shardtensor
