#pragma once
// Collectives on contiguous Kokkos Views: allreduce, allgather(v), reduce-scatter,
// all-to-all(v) and ring shift. Counts are in elements of the View's scalar type.

#include <Kokkos_Core.hpp>
#include <limits>
#include <numeric>
#include <vector>

#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {

enum class ReduceOp { sum, max, min };

namespace impl {

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}

/// MPI takes int counts: reject anything larger instead of truncating it.
inline int mpi_count(std::size_t count, const char* where) {
  SHARDTENSOR_REQUIRE(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), where,
                      "message of " << count << " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

/// Views handed to MPI must be contiguous.
template <class View>
void check_contiguous(const View& view, const char* where) {
  SHARDTENSOR_REQUIRE(view.span_is_contiguous(), where,
                      "View '" << view.label() << "' is not contiguous");
}

/// MPI reads and writes host memory (no GPU-aware MPI yet): these give a host View of the
/// same data, the View itself when it is host-accessible (no copy), else a host mirror.
template <class View>
auto host_copy_of(const View& view) {
  Kokkos::fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
}
template <class View>
auto host_buffer_for(const View& view) {
  return Kokkos::create_mirror_view(Kokkos::HostSpace(), view);
}
/// Copies MPI's result back to the device View when host_buffer_for made a mirror.
template <class View, class HostView>
void copy_back(const View& view, const HostView& host) {
  if (host.data() != view.data()) Kokkos::deep_copy(view, host);
}

/// Counts must name one block per rank.
inline std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> displs(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  return displs;
}

inline std::vector<int> to_mpi_counts(const std::vector<std::size_t>& counts, int nranks,
                                      const char* where, const char* what) {
  SHARDTENSOR_REQUIRE(static_cast<int>(counts.size()) == nranks, where,
                      what << " has " << counts.size() << " entries for " << nranks << " ranks");
  std::vector<int> out;
  std::size_t total = 0;
  for (std::size_t c : counts) {
    out.push_back(mpi_count(c, where));
    total += c;
  }
  mpi_count(total, where);
  return out;
}

inline std::size_t sum(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

}  // namespace impl

/// In-place reduction over all ranks of `comm`.
template <class View>
void allreduce(const Communicator& comm, const View& data, ReduceOp op = ReduceOp::sum) {
  CommTimerScope timer(CommKind::collective);
  impl::check_contiguous(data, "allreduce");
  const auto host = impl::host_copy_of(data);
  MPI_Allreduce(MPI_IN_PLACE, host.data(), impl::mpi_count(data.span(), "allreduce"),
                impl::mpi_type<typename View::value_type>(), impl::mpi_op(op), comm.get());
  impl::copy_back(data, host);
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
  const auto host_send = impl::host_copy_of(send);
  const auto host_recv = impl::host_buffer_for(recv);
  using T = typename SendView::value_type;
  MPI_Allgather(host_send.data(), impl::mpi_count(send.span(), "allgather"), impl::mpi_type<T>(),
                host_recv.data(), impl::mpi_count(send.span(), "allgather"), impl::mpi_type<T>(),
                comm.get());
  impl::copy_back(recv, host_recv);
}

/// recv = concatenation of every rank's `send`, rank r contributing counts[r] elements.
template <class SendView, class RecvView>
void allgatherv(const Communicator& comm, const SendView& send, const RecvView& recv,
                const std::vector<std::size_t>& counts) {
  CommTimerScope timer(CommKind::collective);
  constexpr const char* where = "allgatherv";
  impl::check_contiguous(send, where);
  impl::check_contiguous(recv, where);
  const std::vector<int> c = impl::to_mpi_counts(counts, comm.size(), where, "counts");
  SHARDTENSOR_REQUIRE(send.span() == counts[comm.rank()], where,
                      "rank " << comm.rank() << " sends " << send.span()
                              << " elements but counts says " << counts[comm.rank()]);
  SHARDTENSOR_REQUIRE(
      recv.span() == impl::sum(counts), where,
      "receive View holds " << recv.span() << " elements, counts sum to " << impl::sum(counts));
  const auto host_send = impl::host_copy_of(send);
  const auto host_recv = impl::host_buffer_for(recv);
  using T = typename SendView::value_type;
  const std::vector<int> displs = impl::displacements(c);
  MPI_Allgatherv(host_send.data(), c[comm.rank()], impl::mpi_type<T>(), host_recv.data(), c.data(),
                 displs.data(), impl::mpi_type<T>(), comm.get());
  impl::copy_back(recv, host_recv);
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
  const std::vector<int> c = impl::to_mpi_counts(counts, comm.size(), where, "counts");
  SHARDTENSOR_REQUIRE(
      send.span() == impl::sum(counts), where,
      "send View holds " << send.span() << " elements, counts sum to " << impl::sum(counts));
  SHARDTENSOR_REQUIRE(recv.span() == counts[comm.rank()], where,
                      "rank " << comm.rank() << " receive View holds " << recv.span()
                              << " elements, counts says " << counts[comm.rank()]);
  const auto host_send = impl::host_copy_of(send);
  const auto host_recv = impl::host_buffer_for(recv);
  using T = typename SendView::value_type;
  MPI_Reduce_scatter(host_send.data(), host_recv.data(), c.data(), impl::mpi_type<T>(),
                     impl::mpi_op(op), comm.get());
  impl::copy_back(recv, host_recv);
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
  const auto host_send = impl::host_copy_of(send);
  const auto host_recv = impl::host_buffer_for(recv);
  using T = typename SendView::value_type;
  const int block = impl::mpi_count(send.span() / comm.size(), where);
  MPI_Alltoall(host_send.data(), block, impl::mpi_type<T>(), host_recv.data(), block,
               impl::mpi_type<T>(), comm.get());
  impl::copy_back(recv, host_recv);
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
  const std::vector<int> sc = impl::to_mpi_counts(send_counts, comm.size(), where, "send_counts");
  const std::vector<int> rc = impl::to_mpi_counts(recv_counts, comm.size(), where, "recv_counts");
  SHARDTENSOR_REQUIRE(
      send.span() >= impl::sum(send_counts) && recv.span() >= impl::sum(recv_counts), where,
      "Views hold " << send.span() << " / " << recv.span() << " elements, counts need "
                    << impl::sum(send_counts) << " / " << impl::sum(recv_counts));
  const auto host_send = impl::host_copy_of(send);
  const auto host_recv = impl::host_buffer_for(recv);
  using T = typename SendView::value_type;
  const std::vector<int> sd = impl::displacements(sc);
  const std::vector<int> rd = impl::displacements(rc);
  MPI_Alltoallv(host_send.data(), sc.data(), sd.data(), impl::mpi_type<T>(), host_recv.data(),
                rc.data(), rd.data(), impl::mpi_type<T>(), comm.get());
  impl::copy_back(recv, host_recv);
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
  const auto host_send = impl::host_copy_of(send);
  const auto host_recv = impl::host_buffer_for(recv);
  using T = typename SendView::value_type;
  const int p = comm.size();
  const int to = ((comm.rank() + shift) % p + p) % p;
  const int from = ((comm.rank() - shift) % p + p) % p;
  const int count = impl::mpi_count(send.span(), where);
  MPI_Sendrecv(host_send.data(), count, impl::mpi_type<T>(), to, 0, host_recv.data(), count,
               impl::mpi_type<T>(), from, 0, comm.get(), MPI_STATUS_IGNORE);
  impl::copy_back(recv, host_recv);
}

}  // namespace shardtensor
