#pragma once
// Collectives on contiguous Kokkos Views: allreduce, allgather(v), reduce-scatter,
// all-to-all(v) and ring shift. Counts are in elements of the View's scalar type. They check
// their arguments and hand the buffers to the communicator's transport for the Views' memory
// (transport.hpp): MPI in place for host memory; for device memory MPI (staged or
// device-aware) or NCCL, as the communicator's options say.

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/reduce_op.hpp"
#include "shardtensor/comm/transport.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace impl {

/// MPI takes int counts: reject anything larger instead of truncating it.
inline int mpi_count(std::size_t count, const char* where) {
  SHARDTENSOR_REQUIRE(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), where,
                      "message of " << count << " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

/// Views handed to a transport must be contiguous.
template <class View>
void check_contiguous(const View& view, const char* where) {
  SHARDTENSOR_REQUIRE(view.span_is_contiguous(), where,
                      "View '" << view.label() << "' is not contiguous");
}

/// Counts must name one block per rank, each and their sum within MPI's int counts.
inline void check_counts(const std::vector<std::size_t>& counts, int nranks, const char* where,
                         const char* what) {
  SHARDTENSOR_REQUIRE(static_cast<int>(counts.size()) == nranks, where,
                      what << " has " << counts.size() << " entries for " << nranks << " ranks");
  std::size_t total = 0;
  for (std::size_t c : counts) {
    mpi_count(c, where);
    total += c;
  }
  mpi_count(total, where);
}

/// The transport of `View`'s memory over `comm`, and the View's element type.
template <class View>
Transport& transport_of(const Communicator& comm) {
  return transport_for<typename View::memory_space>(comm);
}
template <class View>
constexpr WireType wire_type_of() {
  return wire_type<typename View::non_const_value_type>();
}

}  // namespace impl

/// In-place reduction over all ranks of `comm`.
template <class View>
void allreduce(const Communicator& comm, const View& data, ReduceOp op = ReduceOp::sum) {
  CommTimerScope timer(CommKind::collective);
  impl::check_contiguous(data, "allreduce");
  impl::mpi_count(data.span(), "allreduce");
  if (comm.size() == 1) return;  // the sum over one rank: no transport, no fence
  impl::transport_of<View>(comm).allreduce(data.data(), data.span(), impl::wire_type_of<View>(),
                                           op);
}

/// recv = concatenation of every rank's `send` in rank order (recv.span() = size * send.span()).
template <class SendView, class RecvView>
void allgather(const Communicator& comm, const SendView& send, const RecvView& recv) {
  CommTimerScope timer(CommKind::collective);
  impl::check_contiguous(send, "allgather");
  impl::check_contiguous(recv, "allgather");
  SHARDTENSOR_REQUIRE(recv.span() == send.span() * comm.size(), "allgather",
                      "receive View holds " << recv.span() << " elements, need " << comm.size()
                                            << " x " << send.span());
  impl::mpi_count(recv.span(), "allgather");
  impl::transport_of<RecvView>(comm).allgatherv(send.data(), recv.data(),
                                                std::vector<std::size_t>(comm.size(), send.span()),
                                                impl::wire_type_of<SendView>());
}

/// recv = concatenation of every rank's `send`, rank r contributing counts[r] elements.
template <class SendView, class RecvView>
void allgatherv(const Communicator& comm, const SendView& send, const RecvView& recv,
                const std::vector<std::size_t>& counts) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "allgatherv";
  impl::check_contiguous(send, where);
  impl::check_contiguous(recv, where);
  impl::check_counts(counts, comm.size(), where, "counts");
  SHARDTENSOR_REQUIRE(send.span() == counts[comm.rank()], where,
                      "rank " << comm.rank() << " sends " << send.span()
                              << " elements but counts says " << counts[comm.rank()]);
  SHARDTENSOR_REQUIRE(
      recv.span() == impl::sum(counts), where,
      "receive View holds " << recv.span() << " elements, counts sum to " << impl::sum(counts));
  impl::transport_of<RecvView>(comm).allgatherv(send.data(), recv.data(), counts,
                                                impl::wire_type_of<SendView>());
}

/// Element-wise reduction of every rank's `send` (sum of counts elements), after which
/// rank r keeps block r (counts[r] elements) in `recv`.
template <class SendView, class RecvView>
void reduce_scatter(const Communicator& comm, const SendView& send, const RecvView& recv,
                    const std::vector<std::size_t>& counts, ReduceOp op = ReduceOp::sum) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "reduce_scatter";
  impl::check_contiguous(send, where);
  impl::check_contiguous(recv, where);
  impl::check_counts(counts, comm.size(), where, "counts");
  SHARDTENSOR_REQUIRE(
      send.span() == impl::sum(counts), where,
      "send View holds " << send.span() << " elements, counts sum to " << impl::sum(counts));
  SHARDTENSOR_REQUIRE(recv.span() == counts[comm.rank()], where,
                      "rank " << comm.rank() << " receive View holds " << recv.span()
                              << " elements, counts says " << counts[comm.rank()]);
  impl::transport_of<RecvView>(comm).reduce_scatter(send.data(), recv.data(), counts,
                                                    impl::wire_type_of<SendView>(), op);
}

/// Block r of `send` goes to rank r; block s of `recv` comes from rank s. Equal blocks.
template <class SendView, class RecvView>
void alltoall(const Communicator& comm, const SendView& send, const RecvView& recv) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "alltoall";
  impl::check_contiguous(send, where);
  impl::check_contiguous(recv, where);
  SHARDTENSOR_REQUIRE(send.span() % comm.size() == 0 && recv.span() == send.span(), where,
                      "send (" << send.span() << ") and receive (" << recv.span()
                               << ") Views must hold the same multiple of " << comm.size()
                               << " elements");
  const std::vector<std::size_t> blocks(comm.size(), send.span() / comm.size());
  impl::check_counts(blocks, comm.size(), where, "blocks");
  impl::transport_of<RecvView>(comm).alltoallv(send.data(), blocks, recv.data(), blocks,
                                               impl::wire_type_of<SendView>());
}

/// send_counts[r] elements of `send` (in rank order) go to rank r; recv_counts[s] elements
/// from rank s land in `recv` (in rank order).
template <class SendView, class RecvView>
void alltoallv(const Communicator& comm, const SendView& send,
               const std::vector<std::size_t>& send_counts, const RecvView& recv,
               const std::vector<std::size_t>& recv_counts) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "alltoallv";
  impl::check_contiguous(send, where);
  impl::check_contiguous(recv, where);
  impl::check_counts(send_counts, comm.size(), where, "send_counts");
  impl::check_counts(recv_counts, comm.size(), where, "recv_counts");
  SHARDTENSOR_REQUIRE(
      send.span() >= impl::sum(send_counts) && recv.span() >= impl::sum(recv_counts), where,
      "Views hold " << send.span() << " / " << recv.span() << " elements, counts need "
                    << impl::sum(send_counts) << " / " << impl::sum(recv_counts));
  impl::transport_of<RecvView>(comm).alltoallv(send.data(), send_counts, recv.data(), recv_counts,
                                               impl::wire_type_of<SendView>());
}

/// Sends `send` to rank (rank + shift) mod size and receives into `recv` from
/// rank (rank - shift) mod size: one step of a ring. Both Views hold the same count.
template <class SendView, class RecvView>
void ring_shift(const Communicator& comm, const SendView& send, const RecvView& recv,
                int shift = 1) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "ring_shift";
  impl::check_contiguous(send, where);
  impl::check_contiguous(recv, where);
  SHARDTENSOR_REQUIRE(send.span() == recv.span(), where,
                      "send holds " << send.span() << " elements, receive " << recv.span());
  impl::mpi_count(send.span(), where);
  const int p = comm.size();
  const int to = ((comm.rank() + shift) % p + p) % p;
  const int from = ((comm.rank() - shift) % p + p) % p;
  impl::transport_of<RecvView>(comm)
      .exchange({{to, send.data(), send.span(), 0}}, {{from, recv.data(), recv.span(), 0}},
                impl::wire_type_of<SendView>())
      .wait();
}

}  // namespace shardtensor
