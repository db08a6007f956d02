#pragma once
// Channel concatenation of sharded fields (U-Net skip connections): local, no communication.

#include <vector>

#include "shardtensor/layers/pointwise.hpp"

namespace shardtensor {

/// Fields with the same decomposition and batch, stacked along the channel axis in order.
template <class T>
Variable<T> concat_channels(const std::vector<Variable<T>>& inputs) {
  SHARDTENSOR_REQUIRE(!inputs.empty(), "concat_channels", "no inputs");
  Index channels = 0;
  for (const Variable<T>& v : inputs) {
    impl::require_field(v, "concat_channels");
    const ShardTensor<T>& a = inputs.front().value();
    const ShardTensor<T>& b = v.value();
    SHARDTENSOR_REQUIRE(
        a.batch() == b.batch() && a.decomposition() == b.decomposition() && b.ghosts().none(),
        "concat_channels",
        "'" << v.name() << "' (batch " << b.batch() << ", " << b.decomposition().describe()
            << ") does not match '" << inputs.front().name() << "' (batch " << a.batch() << ", "
            << a.decomposition().describe() << ")");
    channels += b.channels();
  }
  const ShardTensor<T>& first = inputs.front().value();
  ShardTensor<T> y = impl::field_like(first, "concat", channels);
  std::vector<std::shared_ptr<impl::Node<T>>> nodes;
  std::vector<Index> offsets;
  Index offset = 0;
  for (const Variable<T>& v : inputs) {
    const Index c = v.value().channels();
    Kokkos::deep_copy(
        Kokkos::subview(y.view(), Kokkos::ALL, Kokkos::pair<Index, Index>(offset, offset + c),
                        Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
        v.value().view());
    nodes.push_back(v.node());
    offsets.push_back(offset);
    offset += c;
  }
  auto node = make_result_node<T>("concat", nodes);
  node->field = y;
  if (node->requires_grad) {
    node->backward = [nodes, offsets](impl::Node<T>& self) {
      const auto gy = self.grad_field().view();
      for (std::size_t k = 0; k < nodes.size(); ++k) {
        if (!nodes[k]->requires_grad) continue;
        const auto gx = nodes[k]->grad_field().view();
        const auto part = Kokkos::subview(
            gy, Kokkos::ALL,
            Kokkos::pair<Index, Index>(offsets[k], offsets[k] + Index(gx.extent(1))), Kokkos::ALL,
            Kokkos::ALL, Kokkos::ALL);
        Kokkos::parallel_for(
            "concat_backward",
            Kokkos::MDRangePolicy<Kokkos::Rank<4>>(
                {0, 0, 0, 0}, {Index(gx.extent(0) * gx.extent(1)), Index(gx.extent(2)),
                               Index(gx.extent(3)), Index(gx.extent(4))}),
            KOKKOS_LAMBDA(const Index nc, const Index x, const Index y, const Index z) {
              const Index n = nc / gx.extent(1), c = nc % gx.extent(1);
              gx(n, c, x, y, z) += part(n, c, x, y, z);
            });
      }
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
