#pragma once
// broadcast_binary: a + b, a - b, a * b, a / b, min(a, b), max(a, b) with the broadcasts that
// convolutional graphs write: two fields of one layout; a field and a field of one channel on
// its split (x - x.mean(1, keepdim=True)); a field and a replicated (N, C) vector, the vector
// repeated over the cells (squeeze-and-excitation's x * gate); two replicated tensors of one
// shape. Local, except the gradient of a vector broadcast over the cells: a sum over every
// rank's cells (a partial sum per rank, completed by one allreduce before it is read).

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

enum class BinaryOp { add, subtract, multiply, divide, minimum, maximum };

namespace impl {

/// The value of `op` and its partial derivatives; min and max send half the gradient to each
/// side where the two are equal (PyTorch's).
template <class T>
struct BinaryFunction {
  BinaryOp op;

  KOKKOS_INLINE_FUNCTION T value(T a, T b) const {
    switch (op) {
      case BinaryOp::add: return a + b;
      case BinaryOp::subtract: return a - b;
      case BinaryOp::multiply: return a * b;
      case BinaryOp::divide: return a / b;
      case BinaryOp::minimum: return b < a ? b : a;
      default: return a < b ? b : a;
    }
  }
  /// d value / d a (`first`) or d value / d b.
  KOKKOS_INLINE_FUNCTION T derivative(T a, T b, bool first) const {
    switch (op) {
      case BinaryOp::add: return T(1);
      case BinaryOp::subtract: return first ? T(1) : T(-1);
      case BinaryOp::multiply: return first ? b : a;
      case BinaryOp::divide: return first ? T(1) / b : -a / (b * b);
      case BinaryOp::minimum:
        return a == b ? T(0.5) : (first ? (a < b) : (b < a)) ? T(1) : T(0);
      default:
        return a == b ? T(0.5) : (first ? (a > b) : (b > a)) ? T(1) : T(0);
    }
  }
};

/// How an operand's values repeat over the output's (n, c, cell), cells of one (n, c)
/// contiguous: not at all, over the channels (a one-channel field), or over the cells (an
/// (N, C) vector).
enum class Repeat { none, channels, cells };

struct OperandIndex {
  Repeat repeat;
  Index channels, cells;  // the output's
  KOKKOS_INLINE_FUNCTION Index operator()(Index i) const {
    if (repeat == Repeat::none) return i;
    if (repeat == Repeat::channels) return i / (channels * cells) * cells + i % cells;
    return i / cells;
  }
};

}  // namespace impl

/// y = a op b (see above). Collective over `comm` in backward where a vector meets a field.
template <class T>
Variable<T> broadcast_binary(const Communicator& comm, BinaryOp op, const Variable<T>& a,
                             const Variable<T>& b) {
  using impl::Repeat;
  const char* where = "broadcast_binary";
  SHARDTENSOR_REQUIRE(a.defined() && b.defined(), where, "an operand is undefined");
  const bool fields = a.is_field() || b.is_field();
  // The output's layout follows the operand that repeats nothing.
  const Variable<T>& whole =
      !fields ? a : !a.is_field() ? b : !b.is_field() ? a
                                                      : (a.value().channels() >= b.value().channels() ? a : b);
  Index batch = 0, channels = 1, cells = 1;
  if (fields) {
    const ShardTensor<T>& y = whole.value();
    batch = y.batch(), channels = y.channels();
    cells = Index(y.view().span()) / (batch * channels);
  }
  const auto repeat_of = [&](const Variable<T>& v) {
    if (!fields) {
      SHARDTENSOR_REQUIRE(v.shape() == whole.shape(), where,
                          "replicated '" << a.name() << "' and '" << b.name()
                                         << "' differ in shape");
      return Repeat::none;
    }
    if (!v.is_field()) {
      SHARDTENSOR_REQUIRE(Index(v.data().extent(0)) == batch * channels &&
                              whole.value().ghosts().none(),
                          where,
                          "'" << v.name() << "' (" << v.data().extent(0)
                              << " values) is not an (N, C) vector for the " << batch << " x "
                              << channels << " field '" << whole.name()
                              << "' without ghost cells");
      return Repeat::cells;
    }
    const ShardTensor<T>& x = v.value();
    const ShardTensor<T>& y = whole.value();
    SHARDTENSOR_REQUIRE(x.batch() == y.batch() && x.decomposition() == y.decomposition() &&
                            x.ghosts() == y.ghosts() &&
                            (x.channels() == y.channels() || x.channels() == 1),
                        where,
                        "'" << v.name() << "' (batch " << x.batch() << ", channels "
                            << x.channels() << ", " << x.decomposition().describe()
                            << ") does not broadcast against '" << whole.name() << "' (batch "
                            << y.batch() << ", channels " << y.channels() << ", "
                            << y.decomposition().describe() << ")");
    return x.channels() == y.channels() ? Repeat::none : Repeat::channels;
  };
  const impl::OperandIndex ia{repeat_of(a), channels, cells}, ib{repeat_of(b), channels, cells};
  // The operands' values, held (not only pointed to) for the backward.
  const ShardTensor<T> a_field = a.is_field() ? a.value() : ShardTensor<T>(),
                       b_field = b.is_field() ? b.value() : ShardTensor<T>();
  const ReplicatedView<T> a_data = a.is_field() ? ReplicatedView<T>() : a.data(),
                          b_data = b.is_field() ? ReplicatedView<T>() : b.data();
  const T* av = a.is_field() ? a_field.view().data() : a_data.data();
  const T* bv = b.is_field() ? b_field.view().data() : b_data.data();
  const impl::BinaryFunction<T> f{op};
  auto node = make_result_node<T>("broadcast_binary", {a.node(), b.node()});
  T* yv = nullptr;
  Index size = 0;
  if (fields) {
    node->field = impl::field_like(whole.value(), "broadcast_binary");
    yv = node->field.view().data(), size = Index(node->field.view().span());
  } else {
    node->is_field = false;
    node->data = ReplicatedView<T>("broadcast_binary", whole.data().extent(0));
    node->shape = whole.shape();
    yv = node->data.data(), size = Index(node->data.extent(0));
  }
  Kokkos::parallel_for(
      "broadcast_binary", size,
      KOKKOS_LAMBDA(const Index i) { yv[i] = f.value(av[ia(i)], bv[ib(i)]); });
  if (node->requires_grad) {
    auto an = a.node(), bn = b.node();
    node->backward = [an, bn, ia, ib, a_field, b_field, a_data, b_data, av, bv, f, size, batch,
                      channels, cells, comm](impl::Node<T>& self) {
      const T* gy = self.is_field ? self.grad_field().view().data() : self.grad_data().data();
      for (const bool first : {true, false}) {
        impl::Node<T>& in = first ? *an : *bn;
        const impl::OperandIndex index = first ? ia : ib;
        if (!in.requires_grad) continue;
        if (index.repeat == Repeat::none) {  // one output value per input value
          T* gx = in.is_field ? in.grad_field().view().data() : in.grad_data().data();
          Kokkos::parallel_for(
              "broadcast_binary_backward", size, KOKKOS_LAMBDA(const Index i) {
                gx[i] += gy[i] * f.derivative(av[ia(i)], bv[ib(i)], first);
              });
        } else if (index.repeat == Repeat::channels) {  // sum over the channels of a cell
          T* gx = in.grad_field().view().data();
          Kokkos::parallel_for(
              "broadcast_binary_backward_channels", batch * cells, KOKKOS_LAMBDA(const Index j) {
                const Index n = j / cells, cell = j % cells;
                T sum = 0;
                for (Index c = 0; c < channels; ++c) {
                  const Index i = (n * channels + c) * cells + cell;
                  sum += gy[i] * f.derivative(av[ia(i)], bv[ib(i)], first);
                }
                gx[j] += sum;
              });
        } else {  // sum over this rank's cells; the ranks' sums are added before it is read
          T* gx = in.grad_partial(comm).data();
          Kokkos::parallel_for(
              "broadcast_binary_backward_cells", batch * channels, KOKKOS_LAMBDA(const Index j) {
                T sum = 0;
                for (Index cell = 0; cell < cells; ++cell) {
                  const Index i = j * cells + cell;
                  sum += gy[i] * f.derivative(av[ia(i)], bv[ib(i)], first);
                }
                gx[j] += sum;
              });
        }
      }
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
