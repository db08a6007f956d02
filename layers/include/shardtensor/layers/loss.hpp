#pragma once
// Global reductions and losses: a sharded field in, a replicated scalar out. The local sums
// are summed over the ranks that share the field, so every rank holds the global value;
// the backward needs no communication. The losses between a prediction and a target accept a
// prediction split differently from the target (same global field, other split points: it is
// redistributed onto the target's split) and refuse any other difference, naming both layouts.

#include <cmath>
#include <string>
#include <vector>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/kernels/run_sum.hpp"
#include "shardtensor/layers/pointwise.hpp"
#include "shardtensor/layers/redistribute_field.hpp"

namespace shardtensor {

namespace impl {

/// The prediction on the target's layout: itself when the layouts match; redistributed onto
/// the target's decomposition (differentiably, bit-exact) when only the split points differ
/// (same batch, channels and global extents: a model whose pooling or strides moved a split
/// point); otherwise an error naming both layouts. Losses never compare shards of different
/// layouts cell by cell.
template <class T>
Variable<T> on_layout_of(const Communicator& comm, const Variable<T>& prediction,
                         const Variable<T>& target, const char* where) {
  require_field(prediction, where);
  require_field(target, where);
  const ShardTensor<T>& p = prediction.value();
  const ShardTensor<T>& t = target.value();
  if (!p.same_layout(t) && p.batch() == t.batch() && p.channels() == t.channels() &&
      t.ghosts().none() && same_global_field(p.decomposition(), t.decomposition()))
    return redistribute_field(comm, prediction, t.decomposition());
  require_same_layout(prediction, target, where);
  return prediction;
}

/// A replicated scalar result node.
template <class T>
std::shared_ptr<Node<T>> scalar_node(const std::string& op, double value,
                                     std::vector<std::shared_ptr<Node<T>>> inputs) {
  auto node = make_result_node<T>(op, std::move(inputs));
  node->is_field = false;
  node->shape = {1};
  node->data = ReplicatedView<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, op), 1);
  fill_values(ExecutionSpace(), node->data, static_cast<T>(value));
  return node;
}

/// Host copy of a replicated scalar gradient.
template <class T>
double scalar_grad(Node<T>& node) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), node.grad_data());
  return static_cast<double>(host(0));
}

template <class T>
void require_no_ghosts(const Variable<T>& v, const char* where) {
  require_field(v, where);
  SHARDTENSOR_REQUIRE(v.value().ghosts().none(), where,
                      "'" << v.name() << "' carries ghost cells (" << v.value().ghosts() << ")");
}

// The per-cell values of the sums below are functors, not lambdas: a CUDA __host__ __device__
// lambda made in a header template and handed to another template (per_sample_sums) is the
// pattern whose host-side wrapper nvcc left a null pointer in (see core/box_copy.hpp).
template <class T>
struct ValueOf {  // x
  const T* x;
  KOKKOS_INLINE_FUNCTION double operator()(Index i) const { return double(x[i]); }
};
template <class T>
struct SquareOf {  // x^2
  const T* x;
  KOKKOS_INLINE_FUNCTION double operator()(Index i) const { return double(x[i]) * double(x[i]); }
};
template <class T>
struct SquaredDifference {  // (a - b)^2
  const T *a, *b;
  KOKKOS_INLINE_FUNCTION double operator()(Index i) const {
    const double d = double(a[i]) - double(b[i]);
    return d * d;
  }
};
template <class T>
struct AbsoluteDifference {  // |a - b|
  const T *a, *b;
  KOKKOS_INLINE_FUNCTION double operator()(Index i) const {
    return math::fabs(double(a[i]) - double(b[i]));
  }
};

/// Sum over all ranks of a local per-sample reduction: out[n] = sum over (c, cells) of f(i).
template <class T, class F>
std::vector<double> per_sample_sums(const Communicator& comm, const ShardTensor<T>& like, F f) {
  const Index batch = like.batch();
  const Index per_sample = static_cast<Index>(like.view().span()) / batch;
  std::vector<double> sums(batch, 0.0);
  const Index chunks = (per_sample + sum_chunk - 1) / sum_chunk;  // chunk_sum's, per sample
  for (Index n = 0; n < batch; ++n) {
    double s = 0;
    const Index begin = n * per_sample, end = begin + per_sample;
    Kokkos::parallel_reduce(
        "per_sample_sum", chunks,
        KOKKOS_LAMBDA(const Index chunk, double& acc) {
          const Index first = begin + chunk * sum_chunk;
          acc += chunk_sum(f, first, first + sum_chunk < end ? first + sum_chunk : end);
        },
        s);
    sums[n] = s;
  }
  Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view(
      sums.data(), sums.size());
  allreduce(comm, view);
  return sums;
}

}  // namespace impl

/// Sum of every value of the field (all batches, channels and cells).
template <class T>
Variable<T> sum(const Communicator& comm, const Variable<T>& input) {
  impl::require_no_ghosts(input, "sum");
  const auto x = input.value().view();
  const std::vector<double> s =
      impl::per_sample_sums(comm, input.value(), impl::ValueOf<T>{x.data()});
  double total = 0;
  for (double v : s) total += v;
  auto node = impl::scalar_node<T>("sum", total, {input.node()});
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in](impl::Node<T>& self) {
      const T g = static_cast<T>(impl::scalar_grad(self));
      const auto gx = in->grad_field().view();
      Kokkos::parallel_for(
          "sum_backward", gx.span(), KOKKOS_LAMBDA(const std::size_t i) { gx.data()[i] += g; });
    };
  }
  return Variable<T>(node);
}

/// Mean of every value of the field over the global field.
template <class T>
Variable<T> mean(const Communicator& comm, const Variable<T>& input) {
  impl::require_no_ghosts(input, "mean");
  const ShardTensor<T>& x = input.value();
  const double count = double(x.batch()) * x.channels() * x.decomposition().global_cells();
  const auto xv = x.view();
  const std::vector<double> s = impl::per_sample_sums(comm, x, impl::ValueOf<T>{xv.data()});
  double total = 0;
  for (double v : s) total += v;
  auto node = impl::scalar_node<T>("mean", total / count, {input.node()});
  if (node->requires_grad) {
    auto in = input.node();
    node->backward = [in, count](impl::Node<T>& self) {
      const T g = static_cast<T>(impl::scalar_grad(self) / count);
      const auto gx = in->grad_field().view();
      Kokkos::parallel_for(
          "mean_backward", gx.span(), KOKKOS_LAMBDA(const std::size_t i) { gx.data()[i] += g; });
    };
  }
  return Variable<T>(node);
}

/// Mean squared error over the global field.
template <class T>
Variable<T> mse_loss(const Communicator& comm, const Variable<T>& output,
                     const Variable<T>& target) {
  const Variable<T> prediction = impl::on_layout_of(comm, output, target, "mse_loss");
  impl::require_no_ghosts(prediction, "mse_loss");
  const ShardTensor<T>& p = prediction.value();
  const double count = double(p.batch()) * p.channels() * p.decomposition().global_cells();
  const auto pv = p.view(), tv = target.value().view();
  const std::vector<double> s =
      impl::per_sample_sums(comm, p, impl::SquaredDifference<T>{pv.data(), tv.data()});
  double total = 0;
  for (double v : s) total += v;
  auto node = impl::scalar_node<T>("mse_loss", total / count, {prediction.node(), target.node()});
  if (node->requires_grad) {
    auto pn = prediction.node(), tn = target.node();
    node->backward = [pn, tn, pv, tv, count](impl::Node<T>& self) {
      const T g = static_cast<T>(2.0 * impl::scalar_grad(self) / count);
      for (const auto& [n, sign] : {std::make_pair(pn, T(1)), std::make_pair(tn, T(-1))}) {
        if (!n->requires_grad) continue;
        const auto gx = n->grad_field().view();
        const T scale = sign * g;
        Kokkos::parallel_for(
            "mse_backward", gx.span(), KOKKOS_LAMBDA(const std::size_t i) {
              gx.data()[i] += scale * (pv.data()[i] - tv.data()[i]);
            });
      }
    };
  }
  return Variable<T>(node);
}

/// Mean absolute error over the global field (gradient 0 where prediction == target).
template <class T>
Variable<T> l1_loss(const Communicator& comm, const Variable<T>& output,
                    const Variable<T>& target) {
  const Variable<T> prediction = impl::on_layout_of(comm, output, target, "l1_loss");
  impl::require_no_ghosts(prediction, "l1_loss");
  const ShardTensor<T>& p = prediction.value();
  const double count = double(p.batch()) * p.channels() * p.decomposition().global_cells();
  const auto pv = p.view(), tv = target.value().view();
  const std::vector<double> s =
      impl::per_sample_sums(comm, p, impl::AbsoluteDifference<T>{pv.data(), tv.data()});
  double total = 0;
  for (double v : s) total += v;
  auto node = impl::scalar_node<T>("l1_loss", total / count, {prediction.node(), target.node()});
  if (node->requires_grad) {
    auto pn = prediction.node(), tn = target.node();
    node->backward = [pn, tn, pv, tv, count](impl::Node<T>& self) {
      const T g = static_cast<T>(impl::scalar_grad(self) / count);
      for (const auto& [n, sign] : {std::make_pair(pn, T(1)), std::make_pair(tn, T(-1))}) {
        if (!n->requires_grad) continue;
        const auto gx = n->grad_field().view();
        const T scale = sign * g;
        Kokkos::parallel_for(
            "l1_backward", gx.span(), KOKKOS_LAMBDA(const std::size_t i) {
              const T d = pv.data()[i] - tv.data()[i];
              gx.data()[i] += d > T(0) ? scale : (d < T(0) ? -scale : T(0));
            });
      }
    };
  }
  return Variable<T>(node);
}

/// Relative L2 error, the neural-operator convention: mean over samples of
/// ||prediction_n - target_n|| / ||target_n||, norms over channels and the global field.
template <class T>
Variable<T> relative_l2_loss(const Communicator& comm, const Variable<T>& output,
                             const Variable<T>& target) {
  const Variable<T> prediction = impl::on_layout_of(comm, output, target, "relative_l2_loss");
  impl::require_no_ghosts(prediction, "relative_l2_loss");
  const ShardTensor<T>& p = prediction.value();
  const auto pv = p.view(), tv = target.value().view();
  const std::vector<double> error =
      impl::per_sample_sums(comm, p, impl::SquaredDifference<T>{pv.data(), tv.data()});
  const std::vector<double> norm = impl::per_sample_sums(comm, p, impl::SquareOf<T>{tv.data()});
  const Index batch = p.batch();
  double value = 0;
  for (Index n = 0; n < batch; ++n) {
    SHARDTENSOR_REQUIRE(norm[n] > 0, "relative_l2_loss", "target sample " << n << " is all zeros");
    value += std::sqrt(error[n] / norm[n]) / batch;
  }
  auto node = impl::scalar_node<T>("relative_l2_loss", value, {prediction.node(), target.node()});
  if (node->requires_grad) {
    auto pn = prediction.node(), tn = target.node();
    node->backward = [pn, tn, pv, tv, error, norm, batch](impl::Node<T>& self) {
      const double g = impl::scalar_grad(self);
      const Index per_sample = static_cast<Index>(pv.span()) / batch;
      for (Index n = 0; n < batch; ++n) {
        const double e = std::sqrt(error[n]), t = std::sqrt(norm[n]);
        // d/dp ||p-t||/||t|| = (p-t)/(||p-t|| ||t||); d/dt adds -(p-t)/(...) - ||p-t|| t/||t||^3.
        const T ap = e > 0 ? static_cast<T>(g / batch / (e * t)) : T(0);
        const T at = static_cast<T>(g / batch * e / (t * t * t));
        const Kokkos::RangePolicy<> range(n * per_sample, (n + 1) * per_sample);
        if (pn->requires_grad) {
          const auto gp = pn->grad_field().view();
          Kokkos::parallel_for(
              "relative_l2_backward_p", range,
              KOKKOS_LAMBDA(const Index i) { gp.data()[i] += ap * (pv.data()[i] - tv.data()[i]); });
        }
        if (tn->requires_grad) {
          const auto gt = tn->grad_field().view();
          Kokkos::parallel_for(
              "relative_l2_backward_t", range, KOKKOS_LAMBDA(const Index i) {
                gt.data()[i] += -ap * (pv.data()[i] - tv.data()[i]) - at * tv.data()[i];
              });
        }
      }
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
