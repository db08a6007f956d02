#pragma once
// redistribute: move a ShardTensor onto another decomposition of the same global field.

#include <utility>
#include <vector>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

namespace impl {

/// redistribute's work: sends `from` onto `to`, then writes (or adds, `mode`) what arrives into
/// the owned cells of make_destination() (a field laid out by `to` with from's batch and
/// channels), called once the send buffer is gone, and returns it. `from` goes once packed
/// where it was the last handle of its array.
template <class T, class MakeDestination>
ShardTensor<T> redistribute_into(const Communicator& comm, ShardTensor<T> from,
                                 const Decomposition& to, const MakeDestination& make_destination,
                                 UnpackMode mode, const char* where) {
  CommTimerScope timer(CommKind::collective);
  impl::check_layout_on_all_ranks(comm, from, where);
  const Decomposition source = from.decomposition();
  comm.require_same(impl::signature(to), where, "target decomposition");
  SHARDTENSOR_REQUIRE(to.nranks() == comm.size(), where,
                      "target decomposition (" << to.describe() << ") has " << to.nranks()
                                               << " ranks, the communicator " << comm.size());
  SHARDTENSOR_REQUIRE(
      to.ndims() == source.ndims() && to.global_extents() == source.global_extents(), where,
      "target decomposition (" << to.describe() << ") covers another field than the source ("
                               << source.describe() << ")");
  const Index values_per_cell = from.batch() * from.channels();
  const int p = comm.size();
  const Box own = to.box(comm.rank());  // the destination's owned cells

  std::vector<std::size_t> send_counts(p), recv_counts(p);
  std::vector<Box> send_boxes(p), recv_boxes(p);
  for (int r = 0; r < p; ++r) {
    send_boxes[r] = intersect(from.global_box(), to.box(r));
    recv_boxes[r] = intersect(source.box(r), own);
    send_counts[r] = static_cast<std::size_t>(send_boxes[r].size() * values_per_cell);
    recv_counts[r] = static_cast<std::size_t>(recv_boxes[r].size() * values_per_cell);
  }
  const MemoryCategory caller_category = current_memory_category();
  MemoryCategoryScope memory(MemoryCategory::comm_buffers);
  Kokkos::View<T*, DefaultMemorySpace> send(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "redistribute_send"), impl::sum(send_counts));
  std::size_t offset = 0;
  for (int r = 0; r < p; ++r) {
    pack_box(ExecutionSpace(), from.view(), from.to_local(send_boxes[r]), send, offset);
    offset += send_counts[r];
  }
  from = ShardTensor<T>();  // freed after the packing kernels (the same stream on a GPU)
  Kokkos::View<T*, DefaultMemorySpace> recv(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "redistribute_recv"), impl::sum(recv_counts));
  alltoallv(comm, send, send_counts, recv, recv_counts);
  send = Kokkos::View<T*, DefaultMemorySpace>();
  ShardTensor<T> destination = [&] {
    MemoryCategoryScope as_caller(caller_category);
    return make_destination();
  }();
  offset = 0;
  for (int r = 0; r < p; ++r) {
    unpack_box(ExecutionSpace(), recv, destination.view(), destination.to_local(recv_boxes[r]),
               mode, offset);
    offset += recv_counts[r];
  }
  Kokkos::fence();
  return destination;
}

}  // namespace impl

/// The same global field laid out by `to` (another process grid, other split points, other
/// ghost widths; ghost cells zero-filled). One all-to-all: every rank sends each other rank
/// the intersection of its old box with that rank's new box. Values are copied, never
/// combined, so the result is bit-exact. Collective.
///
/// `from` is taken by value: handed over as the last handle of its array, it goes once packed,
/// and the send buffer once sent, so at most one field-sized array exists beside the source
/// or the result at a time (not three: both buffers and the result beside the source). Hand
/// it over with `std::exchange(x, {})`: a moved-from Kokkos 3.4 View keeps its reference.
template <class T>
ShardTensor<T> redistribute(const Communicator& comm, ShardTensor<T> from, const Decomposition& to,
                            const GhostWidths& to_ghosts = {}) {
  const Index batch = from.batch(), channels = from.channels();
  return impl::redistribute_into(
      comm, std::exchange(from, ShardTensor<T>()), to,
      [&] {
        return ShardTensor<T>(to, comm.rank(), batch, channels, to_ghosts, "redistributed_field");
      },
      UnpackMode::assign, "redistribute");
}

/// Adds the field `from`, laid out by `into`'s decomposition, to `into`'s owned cells (a
/// gradient brought back onto its input's layout), without a redistributed copy beside
/// `into`. The same sums as adding redistribute(comm, from, ...) cell by cell. Collective.
template <class T>
void redistribute_add(const Communicator& comm, ShardTensor<T> from, const ShardTensor<T>& into) {
  SHARDTENSOR_REQUIRE(from.batch() == into.batch() && from.channels() == into.channels(),
                      "redistribute_add",
                      "batch " << from.batch() << " and " << from.channels()
                               << " channels do not match the destination's " << into.batch()
                               << " and " << into.channels());
  impl::redistribute_into(
      comm, std::exchange(from, ShardTensor<T>()), into.decomposition(), [&] { return into; },
      UnpackMode::add, "redistribute_add");
}

}  // namespace shardtensor
