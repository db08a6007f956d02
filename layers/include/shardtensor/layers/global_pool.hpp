#pragma once
// global_average_pool, global_max_pool: the mean or the largest value of each (sample,
// channel) of a sharded field over the whole field, a replicated (N, C) tensor (every rank's
// partial result, then one allreduce): what the classifier heads of CNNs (layers/linear.hpp) and
// squeeze-and-excitation gates (layers/broadcast_binary.hpp) read; and back, a vector spread over
// a field (an image-pooling branch resized to the field's size).

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/autograd/variable.hpp"

namespace shardtensor {

/// Replicated (N, C): y(n, c) = mean over the global field's cells of x(n, c, cell). Backward
/// spreads dy(n, c) / cells over this rank's cells. Collective over `comm`.
template <class T>
Variable<T> global_average_pool(const Communicator& comm, const Variable<T>& input) {
  SHARDTENSOR_REQUIRE(input.is_field(), "global_average_pool",
                      "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(x.ghosts().none(), "global_average_pool",
                      "input '" << input.name() << "' carries ghost cells");
  const Index batch = x.batch(), channels = x.channels();
  const Index cells = Index(x.view().span()) / (batch * channels);
  const double count = double(x.decomposition().global_cells());
  // Sums in double per (sample, channel), each over this rank's cells in one order, then over
  // the ranks: the same on every rank.
  Kokkos::View<double*> sums("global_average_pool.sums", batch * channels);
  const T* values = x.view().data();
  Kokkos::parallel_for(
      "global_average_pool", batch * channels, KOKKOS_LAMBDA(const Index i) {
        double s = 0;
        for (Index k = 0; k < cells; ++k) s += double(values[i * cells + k]);
        sums(i) = s;
      });
  allreduce(comm, sums);
  ReplicatedView<T> mean("global_average_pool", batch * channels);
  Kokkos::parallel_for(
      "global_average_pool.mean", batch * channels,
      KOKKOS_LAMBDA(const Index i) { mean(i) = T(sums(i) / count); });
  auto node = make_result_node<T>("global_average_pool", {input.node()});
  node->is_field = false;
  node->data = mean;
  node->shape = {batch, channels};
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, cells, count](impl::Node<T>& self) {
      const auto g = self.grad_data();
      const auto gx = in->grad_field().view();
      T* gx_data = gx.data();
      Kokkos::parallel_for(
          "global_average_pool_backward", gx.span(), KOKKOS_LAMBDA(const std::size_t i) {
            gx_data[i] += T(double(g(Index(i) / cells)) / count);
          });
    };
  }
  return Variable<T>(node);
}

/// Replicated (N, C): y(n, c) = the largest x(n, c, cell) over the global field. Backward sends
/// dy(n, c) to the cells that hold it, split evenly where several do (on any rank: the count
/// is global). Collective over `comm`.
template <class T>
Variable<T> global_max_pool(const Communicator& comm, const Variable<T>& input) {
  SHARDTENSOR_REQUIRE(input.is_field(), "global_max_pool",
                      "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(x.ghosts().none(), "global_max_pool",
                      "input '" << input.name() << "' carries ghost cells");
  const Index batch = x.batch(), channels = x.channels();
  const Index cells = Index(x.view().span()) / (batch * channels);
  ReplicatedView<T> largest("global_max_pool", batch * channels);
  const T* values = x.view().data();
  Kokkos::parallel_for(
      "global_max_pool", batch * channels, KOKKOS_LAMBDA(const Index i) {
        T m = -math::infinity<T>();
        for (Index k = 0; k < cells; ++k) m = math::max(m, values[i * cells + k]);
        largest(i) = m;
      });
  allreduce(comm, largest, ReduceOp::max);
  auto node = make_result_node<T>("global_max_pool", {input.node()});
  node->is_field = false;
  node->data = largest;
  node->shape = {batch, channels};
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, x, largest, cells, batch, channels, comm](impl::Node<T>& self) {
      const auto g = self.grad_data();
      const T* values = x.view().data();
      T* gx = in->grad_field().view().data();
      Kokkos::View<T*> ties("global_max_pool.ties", batch * channels);
      Kokkos::parallel_for(
          "global_max_pool_ties", batch * channels, KOKKOS_LAMBDA(const Index i) {
            T count = 0;
            for (Index k = 0; k < cells; ++k) count += values[i * cells + k] == largest(i);
            ties(i) = count;
          });
      allreduce(comm, ties);
      Kokkos::parallel_for(
          "global_max_pool_backward", batch * channels, KOKKOS_LAMBDA(const Index i) {
            for (Index k = 0; k < cells; ++k)
              if (values[i * cells + k] == largest(i)) gx[i * cells + k] += g(i) / ties(i);
          });
    };
  }
  return Variable<T>(node);
}

/// A field with the split and batch of `like` and the vector's C channels, every cell of
/// (n, c) holding v(n, c): a pooled (N, C) vector resized to a field's size. Backward sums
/// the gradient over every rank's cells (a partial sum per rank). Collective over `comm` in
/// backward.
template <class T>
Variable<T> spread_over_field(const Communicator& comm, const Variable<T>& vector,
                              const ShardTensor<T>& like) {
  SHARDTENSOR_REQUIRE(!vector.is_field() && vector.shape().size() == 2 &&
                          vector.shape()[0] == like.batch(),
                      "spread_over_field",
                      "'" << vector.name() << "' is not an (N, C) vector of the field's batch "
                          << like.batch());
  const Index batch = like.batch(), channels = vector.shape()[1];
  ShardTensor<T> y = ShardTensor<T>::uninitialized(like.decomposition(), like.rank(), batch,
                                                   channels, GhostWidths{}, "spread_over_field");
  const Index cells = Index(y.view().span()) / (batch * channels);
  const ReplicatedView<T> v = vector.data();
  T* yv = y.view().data();
  Kokkos::parallel_for(
      "spread_over_field", Index(y.view().span()),
      KOKKOS_LAMBDA(const Index i) { yv[i] = v(i / cells); });
  auto node = make_result_node<T>("spread_over_field", {vector.node()});
  node->field = y;
  if (node->requires_grad) {
    auto in = vector.node();
    node->backward = [in, cells, batch, channels, comm](impl::Node<T>& self) {
      const T* gy = self.grad_field().view().data();
      const ReplicatedView<T> gv = in->grad_partial(comm);
      Kokkos::parallel_for(
          "spread_over_field_backward", batch * channels, KOKKOS_LAMBDA(const Index j) {
            T sum = 0;
            for (Index k = 0; k < cells; ++k) sum += gy[j * cells + k];
            gv(j) += sum;
          });
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
