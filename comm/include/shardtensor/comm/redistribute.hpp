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

/// The checks every redistribution of `from` onto `to` makes, on every rank's behalf.
template <class T>
void require_redistributable(const Communicator& comm, const ShardTensor<T>& from,
                             const Decomposition& to, const char* where) {
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
}

/// What this rank sends each rank (its old box's intersection with that rank's new box) and
/// receives from each (that rank's old box's intersection with its own new box), in global
/// cells, with the values they hold.
struct RedistributionBoxes {
  std::vector<Box> send, recv;
  std::vector<std::size_t> send_counts, recv_counts;

  RedistributionBoxes(const Decomposition& source, const Box& own_source, const Decomposition& to,
                      int rank, Index values_per_cell) {
    const int p = to.nranks();
    send.resize(p), recv.resize(p), send_counts.resize(p), recv_counts.resize(p);
    for (int r = 0; r < p; ++r) {
      send[r] = intersect(own_source, to.box(r));
      recv[r] = intersect(source.box(r), to.box(rank));
      send_counts[r] = static_cast<std::size_t>(send[r].size() * values_per_cell);
      recv_counts[r] = static_cast<std::size_t>(recv[r].size() * values_per_cell);
    }
  }
  /// The cells `rank` keeps (what it would send itself), taken out of the messages: for a
  /// caller that copies them directly.
  Box take_own_part(int rank) {
    const Box own = send[rank];  // == recv[rank]
    send[rank] = recv[rank] = Box{};
    send_counts[rank] = recv_counts[rank] = 0;
    return own;
  }
};

/// The send buffer: `source`'s part for every rank packed in rank order (`source`: `from`'s
/// View or a channel range of it).
template <class T, class SourceView>
Kokkos::View<T*, DefaultMemorySpace> pack_parts(const RedistributionBoxes& boxes,
                                                const SourceView& source,
                                                const ShardTensor<T>& from) {
  Kokkos::View<T*, DefaultMemorySpace> send(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "redistribute_send"),
      impl::sum(boxes.send_counts));
  std::size_t offset = 0;
  for (std::size_t r = 0; r < boxes.send.size(); ++r) {
    pack_box(ExecutionSpace(), source, from.to_local(boxes.send[r]), send, offset);
    offset += boxes.send_counts[r];
  }
  return send;
}

/// The all-to-all: returns what arrives; the send buffer goes once sent.
template <class T>
Kokkos::View<T*, DefaultMemorySpace> exchange_parts(const Communicator& comm,
                                                    const RedistributionBoxes& boxes,
                                                    Kokkos::View<T*, DefaultMemorySpace>& send) {
  Kokkos::View<T*, DefaultMemorySpace> recv(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "redistribute_recv"),
      impl::sum(boxes.recv_counts));
  alltoallv(comm, send, boxes.send_counts, recv, boxes.recv_counts);
  send = Kokkos::View<T*, DefaultMemorySpace>();
  return recv;
}

/// Writes (or adds) every rank's part from `recv` into `destination` (`into`'s View or a
/// channel range of it).
template <class T, class DestinationView>
void unpack_parts(const RedistributionBoxes& boxes,
                  const Kokkos::View<T*, DefaultMemorySpace>& recv,
                  const DestinationView& destination, const ShardTensor<T>& into, UnpackMode mode) {
  std::size_t offset = 0;
  for (std::size_t r = 0; r < boxes.recv.size(); ++r) {
    unpack_box(ExecutionSpace(), recv, destination, into.to_local(boxes.recv[r]), mode, offset);
    offset += boxes.recv_counts[r];
  }
}

/// A field's channels [first, first + count) as a View (a concatenation's part).
template <class T>
auto channel_range(const ShardTensor<T>& field, Index first, Index count) {
  return Kokkos::subview(field.view(), Kokkos::ALL, Kokkos::make_pair(first, first + count),
                         Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
}

}  // namespace impl

/// Writes (or adds, `mode`) channels [from_first, from_first + count) of `from` into channels
/// [into_first, into_first + count) of `into`'s owned cells, `into` laid out by another
/// decomposition of the same global field (with any ghost widths) and the same batch. The part
/// this rank keeps is copied directly; one all-to-all moves the rest, so the buffers hold only
/// what changes rank (a few planes where split points move by a cell). `from` goes once
/// packed where it was the last handle of its array. Values are copied (or each added once),
/// so the result is bit-exact. Collective.
template <class T>
void redistribute_channels(const Communicator& comm, ShardTensor<T> from, Index from_first,
                           const ShardTensor<T>& into, Index into_first, Index count,
                           UnpackMode mode, const char* where = "redistribute_channels") {
  CommTimerScope timer(CommKind::collective);
  impl::require_redistributable(comm, from, into.decomposition(), where);
  SHARDTENSOR_REQUIRE(
      from.batch() == into.batch() && count >= 0 && from_first >= 0 && into_first >= 0 &&
          from_first + count <= from.channels() && into_first + count <= into.channels(),
      where,
      "channels [" << from_first << ", " << from_first + count << ") of a field of "
                   << from.channels() << " (batch " << from.batch() << ") do not fit channels ["
                   << into_first << ", " << into_first + count << ") of one of " << into.channels()
                   << " (batch " << into.batch() << ")");
  impl::RedistributionBoxes boxes(from.decomposition(), from.global_box(), into.decomposition(),
                                  comm.rank(), from.batch() * count);
  const Box own_part = boxes.take_own_part(comm.rank());
  const auto source = impl::channel_range(from, from_first, count);
  const auto destination = impl::channel_range(into, into_first, count);
  MemoryCategoryScope memory(MemoryCategory::comm_buffers);
  Kokkos::View<T*, DefaultMemorySpace> send = impl::pack_parts(boxes, source, from);
  copy_box_between(source, from.to_local(own_part), destination, into.to_local(own_part), mode);
  from = ShardTensor<T>();  // freed after the kernels above (the same stream on a GPU)
  const Kokkos::View<T*, DefaultMemorySpace> recv = impl::exchange_parts(comm, boxes, send);
  impl::unpack_parts(boxes, recv, destination, into, mode);
  Kokkos::fence();
}

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
  CommTimerScope timer(CommKind::collective);
  impl::require_redistributable(comm, from, to, "redistribute");
  const Index batch = from.batch(), channels = from.channels();
  const impl::RedistributionBoxes boxes(from.decomposition(), from.global_box(), to, comm.rank(),
                                        batch * channels);
  const MemoryCategory caller_category = current_memory_category();
  MemoryCategoryScope memory(MemoryCategory::comm_buffers);
  Kokkos::View<T*, DefaultMemorySpace> send = impl::pack_parts(boxes, from.view(), from);
  from = ShardTensor<T>();  // freed after the packing kernels (the same stream on a GPU)
  const Kokkos::View<T*, DefaultMemorySpace> recv = impl::exchange_parts(comm, boxes, send);
  // The result is made once the send buffer is gone, in the caller's memory category.
  ShardTensor<T> result = [&] {
    MemoryCategoryScope as_caller(caller_category);
    return ShardTensor<T>(to, comm.rank(), batch, channels, to_ghosts, "redistributed_field");
  }();
  impl::unpack_parts(boxes, recv, result.view(), result, UnpackMode::assign);
  Kokkos::fence();
  return result;
}

/// Adds the field `from`, laid out by `into`'s decomposition, to `into`'s owned cells (a
/// gradient brought back onto its input's layout), without a redistributed copy beside
/// `into`. The same sums as adding redistribute(comm, from, ...) cell by cell. Collective.
template <class T>
void redistribute_add(const Communicator& comm, ShardTensor<T> from, const ShardTensor<T>& into) {
  const Index channels = from.channels();
  SHARDTENSOR_REQUIRE(channels == into.channels(), "redistribute_add",
                      channels << " channels do not match the destination's " << into.channels());
  redistribute_channels(comm, std::exchange(from, ShardTensor<T>()), 0, into, 0, channels,
                        UnpackMode::add, "redistribute_add");
}

}  // namespace shardtensor
