#pragma once
// PRelu<T>: y = x for x > 0, a[c] x otherwise, with a trained slope per channel (or one for
// all): PyTorch's nn.PReLU, ONNX's PRelu. The slope's gradient is a sum over every rank's
// cells (a partial sum per rank, completed by one allreduce before it is read).

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

template <class T>
class PRelu : public Module<T> {
 public:
  /// `slopes`: 1 (shared) or the field's channels; initialised to 0.25 (PyTorch's).
  PRelu(const Communicator& comm, Index slopes, const std::string& name = "prelu")
      : comm_(comm), name_(name) {
    SHARDTENSOR_REQUIRE(slopes >= 1, "PRelu '" << name_ << "'",
                        slopes << " slopes; 1 or one per channel");
    weight_ = this->register_parameter("weight", {slopes}, 0.0, 0);
    fill_values(ExecutionSpace(), weight_.data(), T(0.25));
  }

  Variable<T> forward(const Variable<T>& input) override {
    impl::require_field(input, "PRelu");
    const ShardTensor<T>& x = input.value();
    const Index slopes = Index(weight_.data().extent(0)), channels = x.channels();
    SHARDTENSOR_REQUIRE(slopes == 1 || slopes == channels, "PRelu '" << name_ << "'",
                        slopes << " slopes for a field of " << channels << " channels");
    SHARDTENSOR_REQUIRE(x.ghosts().none(), "PRelu '" << name_ << "'",
                        "'" << input.name() << "' carries ghost cells");
    const Index cells = Index(x.view().span()) / (x.batch() * channels), batch = x.batch();
    ShardTensor<T> y = impl::field_like(x, name_);
    const T* xv = x.view().data();
    T* yv = y.view().data();
    const ReplicatedView<T> a = weight_.data();
    // Channel of value i: i / cells % channels; its slope: that one, or the only one.
    Kokkos::parallel_for(
        "PRelu", Index(x.view().span()), KOKKOS_LAMBDA(const Index i) {
          const T slope = a(slopes == 1 ? 0 : i / cells % channels);
          yv[i] = xv[i] > T(0) ? xv[i] : slope * xv[i];
        });
    auto node = make_result_node<T>("prelu", {input.node(), weight_.node()});
    node->field = y;
    if (node->requires_grad) {
      auto xn = input.node(), an = weight_.node();
      const Communicator comm = comm_;
      node->backward = [xn, an, x, a, slopes, channels, cells, batch, comm](impl::Node<T>& self) {
        const T* gy = self.grad_field().view().data();
        const T* xv = x.view().data();
        if (xn->requires_grad) {
          T* gx = xn->grad_field().view().data();
          Kokkos::parallel_for(
              "PRelu_backward_input", Index(x.view().span()), KOKKOS_LAMBDA(const Index i) {
                gx[i] += xv[i] > T(0) ? gy[i] : a(slopes == 1 ? 0 : i / cells % channels) * gy[i];
              });
        }
        if (an->requires_grad) {
          impl::add_channel_sums(
              "PRelu_backward_slope", an->grad_partial(comm), slopes, batch, channels, cells,
              KOKKOS_LAMBDA(const Index i)->T { return xv[i] > T(0) ? T(0) : gy[i] * xv[i]; });
        }
      };
    }
    return Variable<T>(node);
  }

 private:
  Communicator comm_;
  std::string name_;
  Variable<T> weight_;
};

}  // namespace shardtensor
