#include "shardtensor/layers/positional_embedding.hpp"

#include <cmath>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

PositionKind position_kind_from_string(const std::string& name) {
  if (name == "sincos") return PositionKind::sincos;
  if (name == "learned") return PositionKind::learned;
  if (name == "none") return PositionKind::none;
  SHARDTENSOR_FAIL("PositionalEmbedding",
                   "unknown kind '" << name << "'; accepted values: sincos, learned, none");
}

template <class T>
PositionalEmbedding<T>::PositionalEmbedding(const Communicator& comm, PositionKind kind,
                                            int channels, std::vector<Index> grid,
                                            std::uint64_t seed, const std::string& name)
    : comm_(comm), kind_(kind), channels_(channels), grid_(std::move(grid)), name_(name) {
  const std::string where = "PositionalEmbedding '" + name_ + "'";
  SHARDTENSOR_REQUIRE(channels >= 1, where, "channels " << channels << " must be at least 1");
  if (kind_ != PositionKind::learned) return;
  SHARDTENSOR_REQUIRE(
      !grid_.empty() && grid_.size() <= std::size_t(max_spatial_dims), where,
      "a learned embedding needs the token grid (1-3 extents), got " << grid_.size() << " extents");
  std::vector<Index> shape{channels};
  for (Index e : grid_) {
    SHARDTENSOR_REQUIRE(e >= 1, where, "token grid extent " << e << " must be at least 1");
    shape.push_back(e);
  }
  table_ =
      this->register_parameter("table", shape, 0.02, Module<T>::initialisation_seed(seed, name_));
}

template <class T>
Variable<T> PositionalEmbedding<T>::forward(const Variable<T>& input) {
  impl::require_field(input, "PositionalEmbedding");
  const ShardTensor<T>& x = input.value();
  const std::string where = "PositionalEmbedding '" + name_ + "'";
  SHARDTENSOR_REQUIRE(x.channels() == channels_, where,
                      "input has " << x.channels() << " channels, the layer expects " << channels_);
  if (kind_ == PositionKind::none) return input;
  const Decomposition& dec = x.decomposition();
  const int dims = dec.ndims();
  if (kind_ == PositionKind::learned) {
    bool same = int(grid_.size()) == dims;
    for (int d = 0; same && d < dims; ++d) same = grid_[d] == dec.global_extent(d);
    SHARDTENSOR_REQUIRE(same, where,
                        "the learned table is for a token grid of "
                            << grid_.size() << " extents (first " << grid_[0] << "), the input is "
                            << dec.describe());
  }
  const Index C = channels_, N = x.batch();
  const Index e0 = x.local_extent(0), e1 = x.local_extent(1), e2 = x.local_extent(2);
  const Box& box = x.global_box();
  const Index o0 = box.lower[0], o1 = box.lower[1], o2 = box.lower[2];
  const Index g0 = dec.global_extent(0), g1 = dec.global_extent(1), g2 = dec.global_extent(2);
  const Index per_axis = 2 * (C / (2 * dims));  // sincos channels per axis
  const bool learned = kind_ == PositionKind::learned;
  const ReplicatedView<T> table = learned ? table_.data() : ReplicatedView<T>();

  ShardTensor<T> y = ShardTensor<T>::uninitialized(dec, x.rank(), N, C, {}, name_ + ".output");
  const auto xi = x.interior();
  const auto yv = y.view();
  const Kokkos::MDRangePolicy<RightRank<4>> cells({0, 0, 0, 0}, {C, e0, e1, e2});
  Kokkos::parallel_for(
      "positional_embedding", cells,
      KOKKOS_LAMBDA(const Index c, const Index i, const Index j, const Index k) {
        T value = 0;
        if (learned) {
          value = table(((c * g0 + o0 + i) * g1 + o1 + j) * g2 + o2 + k);
        } else if (c < dims * per_axis) {
          const Index axis = c / per_axis, f = (c % per_axis) / 2;
          const Index t = axis == 0 ? o0 + i : (axis == 1 ? o1 + j : o2 + k);
          const double w = math::pow(10000.0, -double(f) / double(per_axis / 2));
          value = static_cast<T>(c % 2 == 0 ? math::sin(w * double(t)) : math::cos(w * double(t)));
        }
        for (Index n = 0; n < N; ++n) yv(n, c, i, j, k) = xi(n, c, i, j, k) + value;
      });

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node()};
  if (learned) inputs.push_back(table_.node());
  auto node = make_result_node<T>(name_, inputs);
  node->field = y;
  if (!node->requires_grad) return Variable<T>(node);
  auto x_node = input.node();
  auto t_node = learned ? table_.node() : nullptr;
  const Communicator comm = comm_;
  node->backward = [=](impl::Node<T>& self) {
    const auto gy = self.grad_field().view();
    if (x_node->requires_grad) {
      const auto gx = x_node->grad_field().interior();
      const Kokkos::MDRangePolicy<RightRank<4>> all({0, 0, 0, 0}, {N * C, e0, e1, e2});
      Kokkos::parallel_for(
          "positional_embedding_backward", all,
          KOKKOS_LAMBDA(const Index nc, const Index i, const Index j, const Index k) {
            gx(nc / C, nc % C, i, j, k) += gy(nc / C, nc % C, i, j, k);
          });
    }
    if (t_node && t_node->requires_grad) {
      // This rank's tokens only; the other entries get the other ranks' partial sums.
      const auto gt = t_node->grad_partial(comm);
      Kokkos::parallel_for(
          "positional_embedding_table_grad", cells,
          KOKKOS_LAMBDA(const Index c, const Index i, const Index j, const Index k) {
            T s = 0;
            for (Index n = 0; n < N; ++n) s += gy(n, c, i, j, k);
            gt(((c * g0 + o0 + i) * g1 + o1 + j) * g2 + o2 + k) += s;
          });
    }
  };
  return Variable<T>(node);
}

template class PositionalEmbedding<float>;
template class PositionalEmbedding<double>;

}  // namespace shardtensor
