#pragma once
// redistribute: move a ShardTensor onto another decomposition of the same global field.

#include <vector>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// The same global field laid out by `to` (another process grid, other split points, other
/// ghost widths; ghost cells zero-filled). One all-to-all: every rank sends each other rank
/// the intersection of its old box with that rank's new box. Values are copied, never
/// combined, so the result is bit-exact. Collective.
template <class T>
ShardTensor<T> redistribute(const Communicator& comm, const ShardTensor<T>& from,
                            const Decomposition& to, const GhostWidths& to_ghosts = {}) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "redistribute";
  impl::check_layout_on_all_ranks(comm, from, where);
  const Decomposition& source = from.decomposition();
  comm.require_same(impl::signature(to), where, "target decomposition");
  SHARDTENSOR_REQUIRE(to.nranks() == comm.size(), where,
                      "target decomposition (" << to.describe() << ") has " << to.nranks()
                                               << " ranks, the communicator " << comm.size());
  SHARDTENSOR_REQUIRE(
      to.ndims() == source.ndims() && to.global_extents() == source.global_extents(), where,
      "target decomposition (" << to.describe() << ") covers another field than the source ("
                               << source.describe() << ")");
  ShardTensor<T> result(to, comm.rank(), from.batch(), from.channels(), to_ghosts,
                        "redistributed_field");
  const Index values_per_cell = from.batch() * from.channels();
  const int p = comm.size();

  std::vector<std::size_t> send_counts(p), recv_counts(p);
  std::vector<Box> send_boxes(p), recv_boxes(p);
  for (int r = 0; r < p; ++r) {
    send_boxes[r] = intersect(from.global_box(), to.box(r));
    recv_boxes[r] = intersect(source.box(r), result.global_box());
    send_counts[r] = static_cast<std::size_t>(send_boxes[r].size() * values_per_cell);
    recv_counts[r] = static_cast<std::size_t>(recv_boxes[r].size() * values_per_cell);
  }
  MemoryCategoryScope memory(MemoryCategory::comm_buffers);  // the result is allocated above
  Kokkos::View<T*, DefaultMemorySpace> send(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "redistribute_send"), impl::sum(send_counts));
  Kokkos::View<T*, DefaultMemorySpace> recv(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "redistribute_recv"), impl::sum(recv_counts));
  std::size_t offset = 0;
  for (int r = 0; r < p; ++r) {
    pack_box(ExecutionSpace(), from.view(), from.to_local(send_boxes[r]), send, offset);
    offset += send_counts[r];
  }
  alltoallv(comm, send, send_counts, recv, recv_counts);
  offset = 0;
  for (int r = 0; r < p; ++r) {
    unpack_box(ExecutionSpace(), recv, result.view(), result.to_local(recv_boxes[r]),
               UnpackMode::assign, offset);
    offset += recv_counts[r];
  }
  Kokkos::fence();
  return result;
}

}  // namespace shardtensor
