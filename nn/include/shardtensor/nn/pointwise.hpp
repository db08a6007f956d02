#pragma once
// Pointwise ops on sharded fields: activations, add, multiply. They need no communication:
// every cell depends only on itself, so sharded == single-rank cell by cell.

#include <cmath>
#include <string>
#include <type_traits>

#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/kernels/gelu.hpp"
#include "shardtensor/nn/module.hpp"

namespace shardtensor {

enum class Activation { relu, leaky_relu, gelu, silu, tanh, sigmoid };

namespace impl {

/// f(x) and f'(x) of each activation. GELU is the exact (erf) form, PyTorch's default,
/// written x erfc(-x / sqrt 2) / 2: 1 + erf(x / sqrt 2) would cancel to nothing for x < -5.
template <class T>
struct ActivationFunction {
  Activation kind;
  T slope;  // leaky_relu only

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
      default:
        return T(1) / (T(1) + math::exp(-x));
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
      default: {
        const T s = T(1) / (T(1) + math::exp(-x));
        return s * (T(1) - s);
      }
    }
  }
};

template <class T>
void require_field(const Variable<T>& v, const char* where) {
  SHARDTENSOR_REQUIRE(
      v.defined() && v.is_field(), where,
      "'" << (v.defined() ? v.name() : std::string("undefined")) << "' is not a sharded field");
}

template <class T>
void require_same_layout(const Variable<T>& a, const Variable<T>& b, const char* where) {
  require_field(a, where);
  require_field(b, where);
  const ShardTensor<T>& x = a.value();
  const ShardTensor<T>& y = b.value();
  SHARDTENSOR_REQUIRE(x.same_layout(y), where,
                      "'" << a.name() << "' (batch " << x.batch() << ", channels " << x.channels()
                          << ", " << x.decomposition().describe() << ") and '" << b.name()
                          << "' (batch " << y.batch() << ", channels " << y.channels() << ", "
                          << y.decomposition().describe() << ") differ");
}

/// A field with the layout of `like`, not zero-filled: for outputs whose every value, ghosts
/// included, the caller writes (activations, add, multiply, concat, dropout).
template <class T>
ShardTensor<T> field_like(const ShardTensor<T>& like, const std::string& label,
                          Index channels = -1) {
  return ShardTensor<T>::uninitialized(like.decomposition(), like.rank(), like.batch(),
                                       channels < 0 ? like.channels() : channels, like.ghosts(),
                                       label);
}

}  // namespace impl

/// Elementwise activation.
template <class T>
Variable<T> activate(const Variable<T>& input, Activation kind, double slope = 0.01) {
  impl::require_field(input, "activate");
  const ShardTensor<T>& x = input.value();
  const impl::ActivationFunction<T> f{kind, static_cast<T>(slope)};
  ShardTensor<T> y = impl::field_like(x, "activation");
  const auto xv = x.view(), yv = y.view();
  bool done = false;
  if constexpr (std::is_same<T, float>::value)
    done = kind == Activation::gelu && kernels::gelu_kernel(xv.data(), yv.data(), xv.span());
  if (!done)
    Kokkos::parallel_for(
        "activate", xv.span(),
        KOKKOS_LAMBDA(const std::size_t i) { yv.data()[i] = f.value(xv.data()[i]); });
  auto node = make_result_node<T>("activation", {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, f, x](impl::Node<T>& self) {
      const auto gy = self.grad_field().view();
      const auto gx = in->grad_field().view();
      const auto xv = x.view();
      if constexpr (std::is_same<T, float>::value)
        if (f.kind == Activation::gelu &&
            kernels::gelu_backward_kernel(xv.data(), gy.data(), gx.data(), xv.span()))
          return;
      Kokkos::parallel_for(
          "activate_backward", xv.span(), KOKKOS_LAMBDA(const std::size_t i) {
            gx.data()[i] += gy.data()[i] * f.derivative(xv.data()[i]);
          });
    };
  }
  return Variable<T>(node);
}

/// a + b (same layout).
template <class T>
Variable<T> add(const Variable<T>& a, const Variable<T>& b) {
  impl::require_same_layout(a, b, "add");
  ShardTensor<T> y = impl::field_like(a.value(), "add");
  const auto av = a.value().view(), bv = b.value().view(), yv = y.view();
  Kokkos::parallel_for(
      "add", yv.span(),
      KOKKOS_LAMBDA(const std::size_t i) { yv.data()[i] = av.data()[i] + bv.data()[i]; });
  auto node = make_result_node<T>("add", {a.node(), b.node()});
  node->field = y;
  if (node->requires_grad) {
    auto an = a.node(), bn = b.node();
    node->backward = [an, bn](impl::Node<T>& self) {
      const auto gy = self.grad_field().view();
      for (const auto& in : {an, bn}) {
        if (!in->requires_grad) continue;
        const auto gx = in->grad_field().view();
        Kokkos::parallel_for(
            "add_backward", gy.span(),
            KOKKOS_LAMBDA(const std::size_t i) { gx.data()[i] += gy.data()[i]; });
      }
    };
  }
  return Variable<T>(node);
}

/// a * b elementwise (same layout).
template <class T>
Variable<T> multiply(const Variable<T>& a, const Variable<T>& b) {
  impl::require_same_layout(a, b, "multiply");
  ShardTensor<T> y = impl::field_like(a.value(), "multiply");
  const auto av = a.value().view(), bv = b.value().view(), yv = y.view();
  Kokkos::parallel_for(
      "multiply", yv.span(),
      KOKKOS_LAMBDA(const std::size_t i) { yv.data()[i] = av.data()[i] * bv.data()[i]; });
  auto node = make_result_node<T>("multiply", {a.node(), b.node()});
  node->field = y;
  if (node->requires_grad) {
    auto an = a.node(), bn = b.node();
    node->backward = [an, bn, av, bv](impl::Node<T>& self) {
      const auto gy = self.grad_field().view();
      if (an->requires_grad) {
        const auto ga = an->grad_field().view();
        Kokkos::parallel_for(
            "multiply_backward_a", gy.span(),
            KOKKOS_LAMBDA(const std::size_t i) { ga.data()[i] += gy.data()[i] * bv.data()[i]; });
      }
      if (bn->requires_grad) {
        const auto gb = bn->grad_field().view();
        Kokkos::parallel_for(
            "multiply_backward_b", gy.span(),
            KOKKOS_LAMBDA(const std::size_t i) { gb.data()[i] += gy.data()[i] * av.data()[i]; });
      }
    };
  }
  return Variable<T>(node);
}

/// Activation as a module (no parameters), for model builders.
template <class T>
class ActivationLayer : public Module<T> {
 public:
  explicit ActivationLayer(Activation kind, double slope = 0.01) : kind_(kind), slope_(slope) {}
  Variable<T> forward(const Variable<T>& input) override { return activate(input, kind_, slope_); }

 private:
  Activation kind_;
  double slope_;
};

}  // namespace shardtensor
