#pragma once
// Linear<T>: a fully connected layer on a replicated (N, K) tensor, such as the vector
// global_average_pool makes of a field (a CNN's classifier head).

#include <Kokkos_Core.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

/// y = x W^T + b on a replicated (N, K) tensor: a fully connected layer after global pooling
/// (PyTorch's nn.Linear, ONNX's Gemm with transB). Weight (out, in), bias (out). Every rank
/// computes the same values and the same whole gradients.
template <class T>
class Linear : public Module<T> {
 public:
  Linear(Index in_features, Index out_features, bool bias = true, std::uint64_t seed = 0,
         const std::string& name = "linear")
      : in_(in_features), out_(out_features), name_(name) {
    SHARDTENSOR_REQUIRE(in_ >= 1 && out_ >= 1, "Linear '" << name_ << "'",
                        "in_features " << in_ << " and out_features " << out_
                                       << " must be positive");
    const double bound = 1.0 / std::sqrt(double(in_));  // PyTorch's default range
    const std::uint64_t s = this->initialisation_seed(seed, name);
    weight_ = this->register_parameter("weight", {out_, in_}, bound, 2 * s);
    if (bias) bias_ = this->register_parameter("bias", {out_}, bound, 2 * s + 1);
  }

  Variable<T> forward(const Variable<T>& input) override {
    SHARDTENSOR_REQUIRE(!input.is_field() && input.shape().size() == 2 &&
                            input.shape()[1] == in_,
                        "Linear '" << name_ << "'",
                        "expects a replicated (N, " << in_ << ") tensor, got "
                                                    << (input.is_field() ? "a field" : "shape")
                                                    << describe(input));
    const Index batch = input.shape()[0], in = in_, out = out_;
    const auto x = input.data(), w = weight_.data();
    const bool has_bias = bias_.defined();
    const ReplicatedView<T> b = has_bias ? bias_.data() : ReplicatedView<T>();
    ReplicatedView<T> y(name_ + ".output", batch * out);
    Kokkos::parallel_for(
        "Linear", batch * out, KOKKOS_LAMBDA(const Index i) {
          const Index n = i / out, m = i % out;
          T s = has_bias ? b(m) : T(0);
          for (Index k = 0; k < in; ++k) s += x(n * in + k) * w(m * in + k);
          y(i) = s;
        });
    std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node(), weight_.node()};
    if (has_bias) inputs.push_back(bias_.node());
    auto node = make_result_node<T>("linear", inputs);
    node->is_field = false;
    node->data = y;
    node->shape = {batch, out};
    if (node->requires_grad) {
      auto xn = input.node(), wn = weight_.node();
      auto bn = has_bias ? bias_.node() : nullptr;
      node->backward = [xn, wn, bn, batch, in, out](impl::Node<T>& self) {
        const auto dy = self.grad_data();
        const auto xv = xn->data, wv = wn->data;
        if (xn->requires_grad) {
          const auto dx = xn->grad_data();
          Kokkos::parallel_for(
              "Linear_backward_input", batch * in, KOKKOS_LAMBDA(const Index i) {
                const Index n = i / in, k = i % in;
                T s = 0;
                for (Index m = 0; m < out; ++m) s += dy(n * out + m) * wv(m * in + k);
                dx(i) += s;
              });
        }
        if (wn->requires_grad) {
          const auto dw = wn->grad_data();
          Kokkos::parallel_for(
              "Linear_backward_weight", out * in, KOKKOS_LAMBDA(const Index i) {
                const Index m = i / in, k = i % in;
                T s = 0;
                for (Index n = 0; n < batch; ++n) s += dy(n * out + m) * xv(n * in + k);
                dw(i) += s;
              });
        }
        if (bn && bn->requires_grad) {
          const auto db = bn->grad_data();
          Kokkos::parallel_for(
              "Linear_backward_bias", out, KOKKOS_LAMBDA(const Index m) {
                T s = 0;
                for (Index n = 0; n < batch; ++n) s += dy(n * out + m);
                db(m) += s;
              });
        }
      };
    }
    return Variable<T>(node);
  }

 private:
  static std::string describe(const Variable<T>& v) {
    std::string s = " (";
    for (std::size_t i = 0; i < v.shape().size(); ++i)
      s += (i ? ", " : "") + std::to_string(v.shape()[i]);
    return s + ")";
  }

  Index in_, out_;
  std::string name_;
  Variable<T> weight_, bias_;
};

}  // namespace shardtensor
