#pragma once
// Channel concatenation of sharded fields (U-Net skip connections): local, no communication.

#include <algorithm>
#include <vector>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/nn/pointwise.hpp"

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
  // A sample's channels [offset, offset + c) of y are one contiguous block of c fields: copy
  // (and in the backward, add) channel by channel, each a contiguous run of cells: one team
  // per run of `chunk` cells of a channel, its threads along the run. On a host a run is the
  // whole channel (a plain loop); on a GPU runs of 4096 cells, so that the teams fill the
  // device (a team per channel left most of it idle: 90 GB/s on an H200).
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  using Member = typename Policy::member_type;
  const Index cells = static_cast<Index>(first.view().span()) / (first.batch() * first.channels());
  const Index chunk = kernels_run_on_host ? std::max<Index>(cells, 1) : Index(4096);
  const Index chunks = (cells + chunk - 1) / chunk;
  const auto yv = y.view();
  for (const Variable<T>& v : inputs) {
    const Index c = v.value().channels();
    const auto xv = v.value().view();
    const Index at = offset;
    Kokkos::parallel_for(
        "concat", Policy(static_cast<int>(first.batch() * c * chunks), Kokkos::AUTO),
        KOKKOS_LAMBDA(const Member& team) {
          const Index nc = team.league_rank() / chunks, n = nc / c, k = nc % c;
          const Index begin = team.league_rank() % chunks * chunk;
          const Index end = begin + chunk < cells ? begin + chunk : cells;
          const T* from = xv.data() + nc * cells;
          T* to = yv.data() + (n * channels + at + k) * cells;
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, begin, end),
                               [&](const Index i) { to[i] = from[i]; });
        });
    nodes.push_back(v.node());
    offsets.push_back(offset);
    offset += c;
  }
  auto node = make_result_node<T>("concat", nodes);
  node->field = y;
  if (node->requires_grad) {
    node->backward = [nodes, offsets, channels, cells, chunk, chunks](impl::Node<T>& self) {
      using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
      using Member = typename Policy::member_type;
      const auto gy = self.grad_field().view();
      for (std::size_t k = 0; k < nodes.size(); ++k) {
        if (!nodes[k]->requires_grad) continue;
        const auto gx = nodes[k]->grad_field().view();
        const Index c = gx.extent(1), at = offsets[k];
        Kokkos::parallel_for(
            "concat_backward", Policy(static_cast<int>(gx.extent(0) * c * chunks), Kokkos::AUTO),
            KOKKOS_LAMBDA(const Member& team) {
              const Index nc = team.league_rank() / chunks, n = nc / c, j = nc % c;
              const Index begin = team.league_rank() % chunks * chunk;
              const Index end = begin + chunk < cells ? begin + chunk : cells;
              const T* from = gy.data() + (n * channels + at + j) * cells;
              T* to = gx.data() + nc * cells;
              Kokkos::parallel_for(Kokkos::TeamVectorRange(team, begin, end),
                                   [&](const Index i) { to[i] += from[i]; });
            });
      }
    };
  }
  return Variable<T>(node);
}

}  // namespace shardtensor
