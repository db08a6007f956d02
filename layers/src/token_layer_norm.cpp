#include "shardtensor/layers/token_layer_norm.hpp"

#include <cmath>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

template <class T>
TokenLayerNorm<T>::TokenLayerNorm(const Communicator& comm, int channels, double eps,
                                  const std::string& name)
    : comm_(comm), channels_(channels), eps_(eps), name_(name) {
  SHARDTENSOR_REQUIRE(channels >= 1, "TokenLayerNorm '" + name + "'",
                      "channels " << channels << " must be at least 1");
  SHARDTENSOR_REQUIRE(eps > 0, "TokenLayerNorm '" + name + "'",
                      "eps " << eps << " must be positive");
  // bound 0 draws zeros; the weight starts at one.
  weight_ = this->register_parameter("weight", {channels}, 0.0, 1);
  bias_ = this->register_parameter("bias", {channels}, 0.0, 1);
  Kokkos::deep_copy(weight_.data(), T(1));
}

template <class T>
Variable<T> TokenLayerNorm<T>::forward_rows(const Variable<T>& input) {
  SHARDTENSOR_REQUIRE(input.shape().size() == 2 && input.shape()[1] == channels_,
                      "TokenLayerNorm '" + name_ + "'",
                      "a replicated input must be (N, " << channels_ << ")");
  const Index C = channels_, N = input.shape()[0];
  const double eps = eps_;
  const ReplicatedView<T> x = input.data(), w = weight_.data(), b = bias_.data();
  ReplicatedView<T> y(name_ + ".output", N * C);
  Kokkos::View<double*, DefaultMemorySpace> mean(name_ + ".mean", N), rstd(name_ + ".rstd", N);
  Kokkos::parallel_for(
      "token_layer_norm_rows", N, KOKKOS_LAMBDA(const Index n) {
        double s = 0, v = 0;
        for (Index c = 0; c < C; ++c) s += static_cast<double>(x(n * C + c));
        const double m = s / double(C);
        for (Index c = 0; c < C; ++c) {
          const double d = static_cast<double>(x(n * C + c)) - m;
          v += d * d;
        }
        const double r = 1.0 / math::sqrt(v / double(C) + eps);
        mean(n) = m;
        rstd(n) = r;
        for (Index c = 0; c < C; ++c)
          y(n * C + c) =
              static_cast<T>((static_cast<double>(x(n * C + c)) - m) * r * double(w(c)) + double(b(c)));
      });
  auto node = make_result_node<T>(name_, {input.node(), weight_.node(), bias_.node()});
  node->is_field = false;
  node->data = y;
  node->shape = input.shape();
  if (!node->requires_grad) return Variable<T>(node);
  auto x_node = input.node(), w_node = weight_.node(), b_node = bias_.node();
  node->backward = [=](impl::Node<T>& self) {
    const auto gy = self.grad_data();
    // Every rank holds every row: the gradients are whole on each, no partial sums.
    if (w_node->requires_grad || b_node->requires_grad) {
      const auto gw = w_node->grad_data(), gb = b_node->grad_data();
      Kokkos::parallel_for(
          "token_layer_norm_rows_weight_grad", C, KOKKOS_LAMBDA(const Index c) {
            double sw = 0, sb = 0;
            for (Index n = 0; n < N; ++n) {
              const double g = static_cast<double>(gy(n * C + c));
              sw += g * (static_cast<double>(x(n * C + c)) - mean(n)) * rstd(n);
              sb += g;
            }
            gw(c) += static_cast<T>(sw);
            gb(c) += static_cast<T>(sb);
          });
    }
    if (!x_node->requires_grad) return;
    const auto gx = x_node->grad_data();
    Kokkos::parallel_for(
        "token_layer_norm_rows_backward", N, KOKKOS_LAMBDA(const Index n) {
          double sg = 0, sgx = 0;
          for (Index c = 0; c < C; ++c) {
            const double g = static_cast<double>(gy(n * C + c)) * double(w(c));
            sg += g;
            sgx += g * (static_cast<double>(x(n * C + c)) - mean(n)) * rstd(n);
          }
          sg /= double(C);
          sgx /= double(C);
          for (Index c = 0; c < C; ++c) {
            const double g = static_cast<double>(gy(n * C + c)) * double(w(c));
            const double xhat = (static_cast<double>(x(n * C + c)) - mean(n)) * rstd(n);
            gx(n * C + c) += static_cast<T>(rstd(n) * (g - sg - xhat * sgx));
          }
        });
  };
  return Variable<T>(node);
}

template <class T>
Variable<T> TokenLayerNorm<T>::forward(const Variable<T>& input) {
  SHARDTENSOR_REQUIRE(input.defined(), "TokenLayerNorm '" + name_ + "'", "the input is undefined");
  if (!input.is_field()) return forward_rows(input);
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(x.channels() == channels_, "TokenLayerNorm '" + name_ + "'",
                      "input has " << x.channels() << " channels, the layer expects " << channels_);
  const Index C = channels_, N = x.batch();
  const Index e0 = x.local_extent(0), e1 = x.local_extent(1), e2 = x.local_extent(2);
  const double eps = eps_;
  ShardTensor<T> y =
      ShardTensor<T>::uninitialized(x.decomposition(), x.rank(), N, C, {}, name_ + ".output");
  // Per cell: mean and 1 / std, kept for backward.
  Kokkos::View<double****, DefaultMemorySpace> mean(name_ + ".mean", N, e0, e1, e2);
  Kokkos::View<double****, DefaultMemorySpace> rstd(name_ + ".rstd", N, e0, e1, e2);
  const auto xi = x.interior();
  const auto yv = y.view();
  const auto w = weight_.data(), b = bias_.data();
  const Kokkos::MDRangePolicy<RightRank<4>> cells({0, 0, 0, 0}, {N, e0, e1, e2});
  Kokkos::parallel_for(
      "token_layer_norm", cells,
      KOKKOS_LAMBDA(const Index n, const Index i, const Index j, const Index k) {
        double s = 0;
        for (Index c = 0; c < C; ++c) s += static_cast<double>(xi(n, c, i, j, k));
        const double m = s / double(C);
        double v = 0;
        for (Index c = 0; c < C; ++c) {
          const double d = static_cast<double>(xi(n, c, i, j, k)) - m;
          v += d * d;
        }
        const double r = 1.0 / math::sqrt(v / double(C) + eps);
        mean(n, i, j, k) = m;
        rstd(n, i, j, k) = r;
        for (Index c = 0; c < C; ++c)
          yv(n, c, i, j, k) = static_cast<T>(
              (static_cast<double>(xi(n, c, i, j, k)) - m) * r * double(w(c)) + double(b(c)));
      });

  auto node = make_result_node<T>(name_, {input.node(), weight_.node(), bias_.node()});
  node->field = y;
  if (!node->requires_grad) return Variable<T>(node);
  auto x_node = input.node(), w_node = weight_.node(), b_node = bias_.node();
  const Communicator comm = comm_;
  node->backward = [=](impl::Node<T>& self) {
    const auto gy = self.grad_field().view();
    auto xhat = KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
      return (static_cast<double>(xi(n, c, i, j, k)) - mean(n, i, j, k)) * rstd(n, i, j, k);
    };
    // Weight and bias gradients: this rank's sums over its cells (added over the ranks).
    if (w_node->requires_grad || b_node->requires_grad) {
      const auto gw = w_node->grad_partial(comm);
      const auto gb = b_node->grad_partial(comm);
      Kokkos::parallel_for(
          "token_layer_norm_weight_grad", C, KOKKOS_LAMBDA(const Index c) {
            double sw = 0, sb = 0;
            for (Index n = 0; n < N; ++n)
              for (Index i = 0; i < e0; ++i)
                for (Index j = 0; j < e1; ++j)
                  for (Index k = 0; k < e2; ++k) {
                    const double g = static_cast<double>(gy(n, c, i, j, k));
                    sw += g * xhat(n, c, i, j, k);
                    sb += g;
                  }
            gw(c) += static_cast<T>(sw);
            gb(c) += static_cast<T>(sb);
          });
    }
    if (!x_node->requires_grad) return;
    // dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)), g = dy * weight.
    const auto gx = x_node->grad_field().interior();
    Kokkos::parallel_for(
        "token_layer_norm_backward", cells,
        KOKKOS_LAMBDA(const Index n, const Index i, const Index j, const Index k) {
          double sg = 0, sgx = 0;
          for (Index c = 0; c < C; ++c) {
            const double g = static_cast<double>(gy(n, c, i, j, k)) * double(w(c));
            sg += g;
            sgx += g * xhat(n, c, i, j, k);
          }
          sg /= double(C);
          sgx /= double(C);
          for (Index c = 0; c < C; ++c) {
            const double g = static_cast<double>(gy(n, c, i, j, k)) * double(w(c));
            gx(n, c, i, j, k) +=
                static_cast<T>(rstd(n, i, j, k) * (g - sg - xhat(n, c, i, j, k) * sgx));
          }
        });
  };
  return Variable<T>(node);
}

template class TokenLayerNorm<float>;
template class TokenLayerNorm<double>;

}  // namespace shardtensor
