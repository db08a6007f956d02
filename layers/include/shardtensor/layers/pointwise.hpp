#pragma once
// Pointwise ops on sharded fields: activations, add, multiply. They need no communication:
// every cell depends only on itself, so sharded == single-rank cell by cell.

#include <cmath>
#include <string>
#include <type_traits>

#include "shardtensor/kernels/activation.hpp"
#include "shardtensor/kernels/gelu.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

namespace impl {

template <class T>
using ActivationFunction = kernels::ActivationFunction<T>;

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

/// sums(v) += the sum of term(i) over the values i of channel v of a (batch, channels, cells)
/// field (`values` == channels), or of every channel (`values` == 1), in the order n, c, cell:
/// the partial gradient of a parameter per channel (PRelu's slopes, channel_parameter).
template <class T, class Term>
void add_channel_sums(const std::string& label, const ReplicatedView<T>& sums, Index values,
                      Index batch, Index channels, Index cells, const Term& term) {
  Kokkos::parallel_for(
      label, values, KOKKOS_LAMBDA(const Index v) {
        T sum = 0;
        for (Index n = 0; n < batch; ++n)
          for (Index c = values == 1 ? 0 : v; c < (values == 1 ? channels : v + 1); ++c) {
            const Index line = (n * channels + c) * cells;
            for (Index k = 0; k < cells; ++k) sum += term(line + k);
          }
        sums(v) += sum;
      });
}

/// y = f(x) for every value, ghosts included (y may be x: in place).
template <class T>
void apply_activation(const ActivationFunction<T>& f, const ShardTensor<T>& x,
                      const ShardTensor<T>& y) {
  const auto xv = x.view(), yv = y.view();
  if constexpr (std::is_same<T, float>::value)
    if (f.kind == Activation::gelu && kernels::gelu_kernel(xv.data(), yv.data(), xv.span()))
      return;
  Kokkos::parallel_for(
      "activate", xv.span(),
      KOKKOS_LAMBDA(const std::size_t i) { yv.data()[i] = f.value(xv.data()[i]); });
}

/// y = f(x) for every value of a replicated tensor (a pooled vector), and its backward.
template <class T>
Variable<T> activate_replicated(const Variable<T>& input, const ActivationFunction<T>& f) {
  const ReplicatedView<T> x = input.data();
  ReplicatedView<T> y("activation", x.extent(0));
  Kokkos::parallel_for(
      "activate_replicated", x.extent(0), KOKKOS_LAMBDA(const std::size_t i) { y(i) = f.value(x(i)); });
  auto node = make_result_node<T>("activation", {input.node()});
  node->is_field = false;
  node->data = y;
  node->shape = input.shape();
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, f, x](impl::Node<T>& self) {
      const auto gy = self.grad_data();
      const auto gx = in->grad_data();
      Kokkos::parallel_for(
          "activate_replicated_backward", x.extent(0),
          KOKKOS_LAMBDA(const std::size_t i) { gx(i) += gy(i) * f.derivative(x(i)); });
    };
  }
  return Variable<T>(node);
}

}  // namespace impl

/// Elementwise activation (or other function: kernels/activation.hpp) of a field, or of a
/// replicated tensor. `slope` and `upper` are the function's parameters (there).
template <class T>
Variable<T> activate(const Variable<T>& input, Activation kind, double slope = 0.01,
                     double upper = 0) {
  SHARDTENSOR_REQUIRE(input.defined(), "activate", "the input is undefined");
  const impl::ActivationFunction<T> f{kind, static_cast<T>(slope), static_cast<T>(upper)};
  if (!input.is_field()) return impl::activate_replicated(input, f);
  const ShardTensor<T>& x = input.value();
  ShardTensor<T> y = impl::field_like(x, "activation");
  impl::apply_activation(f, x, y);
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

/// The same for an input handed over: without a graph, and where nothing else holds the
/// input's field (no other Variable of it, no copy of its View, not a caller's array wrapped
/// without a copy), the activation is written over that field, no new one (an inference's
/// activations in a Sequential: Module::forward_handed_over).
template <class T>
Variable<T> activate(Variable<T>&& input, Activation kind, double slope = 0.01,
                     double upper = 0) {
  SHARDTENSOR_REQUIRE(input.defined(), "activate", "the input is undefined");
  const bool graph = grad_enabled() && input.requires_grad();
  if (!input.is_field() || graph || input.node().use_count() != 1 ||
      input.value().view().use_count() != 1)
    return activate(static_cast<const Variable<T>&>(input), kind, slope, upper);
  const ShardTensor<T> x = input.value();
  input = Variable<T>();  // the field is x's alone now
  impl::apply_activation(
      impl::ActivationFunction<T>{kind, static_cast<T>(slope), static_cast<T>(upper)}, x, x);
  auto node = make_result_node<T>("activation", {});
  node->field = x;
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
  Variable<T> forward_handed_over(Variable<T>&& input) override {
    return activate(std::move(input), kind_, slope_);
  }

 private:
  Activation kind_;
  double slope_;
};

}  // namespace shardtensor
