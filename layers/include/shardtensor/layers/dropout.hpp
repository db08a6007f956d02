#pragma once
// Dropout<T>: the mask is drawn from (seed, call, global cell index), so a sharded run drops
// exactly the cells an unsharded run drops.

#include <cstdint>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

template <class T>
class Dropout : public Module<T> {
 public:
  explicit Dropout(double probability, std::uint64_t seed = 0x5eed)
      : probability_(probability), seed_(seed) {
    SHARDTENSOR_REQUIRE(probability >= 0 && probability < 1, "Dropout",
                        "probability " << probability << " outside [0, 1)");
  }

  /// Training: zero each value with the given probability, scale the rest by 1 / (1 - p).
  /// Evaluation: identity. Every call draws a new mask (same on every rank).
  Variable<T> forward(const Variable<T>& input) override {
    impl::require_field(input, "Dropout");
    if (!this->is_training() || probability_ == 0) return input;
    const ShardTensor<T>& x = input.value();
    SHARDTENSOR_REQUIRE(x.ghosts().none(), "Dropout",
                        "'" << input.name() << "' carries ghost cells");
    ShardTensor<T> y = impl::field_like(x, "dropout");
    ShardTensor<T> mask = impl::field_like(x, "dropout_mask");
    const std::uint64_t seed = hash_bits(seed_, calls_++);
    const T keep_scale = static_cast<T>(1.0 / (1.0 - probability_));
    const double threshold = 2 * probability_ - 1;  // hashed_uniform is uniform in [-1, 1)
    // Plain integers, not std::array/Box members: a kernel may run where std:: is not.
    const SpatialIndex global = x.decomposition().global_extents();
    const Box box = x.global_box();
    const Index channels = x.channels(), ex = global[0], ey = global[1], ez = global[2];
    const Index x0 = box.lower[0], y0 = box.lower[1], z0 = box.lower[2];
    const auto xv = x.view(), yv = y.view(), mv = mask.view();
    Kokkos::parallel_for(
        "Dropout",
        Kokkos::MDRangePolicy<RightRank<4>>(
            {0, 0, 0, 0}, {x.batch() * channels, box.extent[0], box.extent[1], box.extent[2]}),
        KOKKOS_LAMBDA(const Index nc, const Index i, const Index j, const Index k) {
          const Index n = nc / channels, c = nc % channels;
          const std::uint64_t cell =
              (((n * channels + c) * ex + x0 + i) * ey + y0 + j) * ez + z0 + k;
          const T m = hashed_uniform(seed, cell) >= threshold ? keep_scale : T(0);
          mv(n, c, i, j, k) = m;
          yv(n, c, i, j, k) = m * xv(n, c, i, j, k);
        });
    return multiply_by_mask(input, y, mask);
  }

  double probability() const { return probability_; }

  // Public only because CUDA's device lambdas cannot live in a private member function.
  static Variable<T> multiply_by_mask(const Variable<T>& input, const ShardTensor<T>& y,
                                      const ShardTensor<T>& mask) {
    auto node = make_result_node<T>("dropout", {input.node()});
    node->field = y;
    if (node->requires_grad) {
      auto in = input.node();
      node->backward = [in, mask](impl::Node<T>& self) {
        const auto gy = self.grad_field().view(), gx = in->grad_field().view(), m = mask.view();
        Kokkos::parallel_for(
            "Dropout_backward", gy.span(),
            KOKKOS_LAMBDA(const std::size_t i) { gx.data()[i] += m.data()[i] * gy.data()[i]; });
      };
    }
    return Variable<T>(node);
  }

 private:
  double probability_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
};

}  // namespace shardtensor
