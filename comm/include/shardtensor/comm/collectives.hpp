#pragma once
// Collectives on contiguous Kokkos Views: allreduce, allgather(v), reduce-scatter,
// all-to-all(v) and ring shift. Counts are in elements of the View's scalar type.
//
// Host memory goes through MPI in place. Device memory goes as the communicator's options say
// (comm_options.hpp): NCCL (allreduce, allgather and equal-block reduce-scatter natively, the
// rest as grouped sends and receives), or MPI, handed the device pointers (device-aware MPI)
// or staged through host buffers.

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/comm/impl/nccl_transport.hpp"
#include "shardtensor/comm/reduce_op.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {

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

template <class View>
constexpr bool in_host_memory =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible;

/// Whether `comm` moves this View's values with NCCL: device memory on the nccl backend.
template <class View>
bool on_nccl(const Communicator& comm) {
  return !in_host_memory<View> && comm.options().backend == CommBackend::nccl;
}

/// Whether MPI messages of `Memory` over `comm` go through host staging buffers: device memory
/// that MPI may not be handed (device_aware_mpi off). The one rule of every staging decision.
template <class Memory>
bool mpi_stages(const Communicator& comm) {
  return !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible &&
         !comm.options().device_aware_mpi;
}

/// The memory MPI reads (a send) or writes (a receive) for a contiguous View: the View's own
/// where MPI can take it (host memory, or device memory with device-aware MPI), else a host
/// staging copy. Kernels that wrote the View have finished once it is made.
template <class View>
class MpiBuffer {
 public:
  using T = typename View::non_const_value_type;
  /// `send`: MPI reads the View's values (a staging copy is filled); else MPI writes them.
  MpiBuffer(const Communicator& comm, const View& view, bool send) : view_(view) {
    Kokkos::fence();
    if (!mpi_stages<typename View::memory_space>(comm)) {
      data_ = const_cast<T*>(view.data());
      return;
    }
    staging_ = Kokkos::View<T*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "mpi_staging"), view.span());
    if (send) Kokkos::deep_copy(staging_, flat());
    data_ = staging_.data();
  }
  T* data() const { return data_; }
  /// After a receive: a staging copy's values into the View.
  void copy_back() const {
    if (staging_.data()) Kokkos::deep_copy(flat(), staging_);
  }

 private:
  auto flat() const {
    return Kokkos::View<T*, typename View::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
        const_cast<T*>(view_.data()), view_.span());
  }
  View view_;
  Kokkos::View<T*, Kokkos::HostSpace> staging_;
  T* data_ = nullptr;
};

template <class View>
MpiBuffer<View> mpi_send_buffer(const Communicator& comm, const View& view) {
  return MpiBuffer<View>(comm, view, true);
}
template <class View>
MpiBuffer<View> mpi_receive_buffer(const Communicator& comm, const View& view) {
  return MpiBuffer<View>(comm, view, false);
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

/// Device memory over NCCL: block r of `send` (send_counts[r] elements, in rank order) to rank
/// r and recv_counts[s] elements from rank s into `recv` (in rank order), as one group.
template <class T>
void nccl_alltoallv(const Communicator& comm, const T* send,
                    const std::vector<std::size_t>& send_counts, T* recv,
                    const std::vector<std::size_t>& recv_counts) {
  std::vector<nccl::Send> sends;
  std::vector<nccl::Receive> receives;
  std::size_t sent = 0, received = 0;
  for (int r = 0; r < comm.size(); ++r) {
    sends.push_back({r, send + sent, send_counts[r]});
    receives.push_back({r, recv + received, recv_counts[r]});
    sent += send_counts[r];
    received += recv_counts[r];
  }
  nccl::exchange(*comm.nccl(), sends, receives, nccl::element_type<T>()).wait();
}

}  // namespace impl

/// In-place reduction over all ranks of `comm`.
template <class View>
void allreduce(const Communicator& comm, const View& data, ReduceOp op = ReduceOp::sum) {
  CommTimerScope timer(CommKind::collective);
  impl::check_contiguous(data, "allreduce");
  using T = typename View::value_type;
  if (impl::on_nccl<View>(comm))
    return impl::nccl::allreduce(*comm.nccl(), data.data(), data.span(),
                                 impl::nccl::element_type<T>(), op);
  const auto buffer = impl::mpi_send_buffer(comm, data);
  MPI_Allreduce(MPI_IN_PLACE, buffer.data(), impl::mpi_count(data.span(), "allreduce"),
                impl::mpi_type<T>(), impl::mpi_op(op), comm.get());
  buffer.copy_back();
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
  using T = typename SendView::non_const_value_type;
  if (impl::on_nccl<RecvView>(comm))
    return impl::nccl::allgather(*comm.nccl(), send.data(), recv.data(), send.span(),
                                 impl::nccl::element_type<T>());
  const auto mpi_send = impl::mpi_send_buffer(comm, send);
  const auto mpi_recv = impl::mpi_receive_buffer(comm, recv);
  MPI_Allgather(mpi_send.data(), impl::mpi_count(send.span(), "allgather"), impl::mpi_type<T>(),
                mpi_recv.data(), impl::mpi_count(send.span(), "allgather"), impl::mpi_type<T>(),
                comm.get());
  mpi_recv.copy_back();
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
  using T = typename SendView::non_const_value_type;
  if (impl::on_nccl<RecvView>(comm)) {  // the own block to every rank
    std::vector<impl::nccl::Send> sends;
    std::vector<impl::nccl::Receive> receives;
    std::size_t offset = 0;
    for (int r = 0; r < comm.size(); ++r) {
      sends.push_back({r, send.data(), send.span()});
      receives.push_back({r, recv.data() + offset, counts[r]});
      offset += counts[r];
    }
    impl::nccl::exchange(*comm.nccl(), sends, receives, impl::nccl::element_type<T>()).wait();
    return;
  }
  const auto mpi_send = impl::mpi_send_buffer(comm, send);
  const auto mpi_recv = impl::mpi_receive_buffer(comm, recv);
  const std::vector<int> displs = impl::displacements(c);
  MPI_Allgatherv(mpi_send.data(), c[comm.rank()], impl::mpi_type<T>(), mpi_recv.data(), c.data(),
                 displs.data(), impl::mpi_type<T>(), comm.get());
  mpi_recv.copy_back();
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
  using T = typename SendView::non_const_value_type;
  if (impl::on_nccl<RecvView>(comm)) {
    const auto type = impl::nccl::element_type<T>();
    if (std::all_of(counts.begin(), counts.end(), [&](std::size_t n) { return n == counts[0]; }))
      return impl::nccl::reduce_scatter(*comm.nccl(), send.data(), recv.data(), counts[0], type,
                                        op);
    // Unequal blocks (NCCL has no reduce-scatter-v): reduce everything, keep the own block.
    using Memory = typename RecvView::memory_space;
    using Flat = Kokkos::View<T*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::View<T*, Memory> all(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(where)), send.span());
    Kokkos::deep_copy(all, Flat(const_cast<T*>(send.data()), send.span()));
    impl::nccl::allreduce(*comm.nccl(), all.data(), all.span(), type, op);
    const std::size_t first =
        std::accumulate(counts.begin(), counts.begin() + comm.rank(), std::size_t{0});
    Kokkos::deep_copy(Flat(recv.data(), recv.span()),
                      Kokkos::subview(all, std::make_pair(first, first + recv.span())));
    return;
  }
  const auto mpi_send = impl::mpi_send_buffer(comm, send);
  const auto mpi_recv = impl::mpi_receive_buffer(comm, recv);
  MPI_Reduce_scatter(mpi_send.data(), mpi_recv.data(), c.data(), impl::mpi_type<T>(),
                     impl::mpi_op(op), comm.get());
  mpi_recv.copy_back();
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
  using T = typename SendView::non_const_value_type;
  if (impl::on_nccl<RecvView>(comm)) {
    const std::vector<std::size_t> blocks(comm.size(), send.span() / comm.size());
    return impl::nccl_alltoallv(comm, send.data(), blocks, recv.data(), blocks);
  }
  const auto mpi_send = impl::mpi_send_buffer(comm, send);
  const auto mpi_recv = impl::mpi_receive_buffer(comm, recv);
  const int block = impl::mpi_count(send.span() / comm.size(), where);
  MPI_Alltoall(mpi_send.data(), block, impl::mpi_type<T>(), mpi_recv.data(), block,
               impl::mpi_type<T>(), comm.get());
  mpi_recv.copy_back();
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
  using T = typename SendView::non_const_value_type;
  if (impl::on_nccl<RecvView>(comm))
    return impl::nccl_alltoallv(comm, send.data(), send_counts, recv.data(), recv_counts);
  const auto mpi_send = impl::mpi_send_buffer(comm, send);
  const auto mpi_recv = impl::mpi_receive_buffer(comm, recv);
  const std::vector<int> sd = impl::displacements(sc);
  const std::vector<int> rd = impl::displacements(rc);
  MPI_Alltoallv(mpi_send.data(), sc.data(), sd.data(), impl::mpi_type<T>(), mpi_recv.data(),
                rc.data(), rd.data(), impl::mpi_type<T>(), comm.get());
  mpi_recv.copy_back();
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
  using T = typename SendView::non_const_value_type;
  const int p = comm.size();
  const int to = ((comm.rank() + shift) % p + p) % p;
  const int from = ((comm.rank() - shift) % p + p) % p;
  const int count = impl::mpi_count(send.span(), where);
  if (impl::on_nccl<RecvView>(comm)) {
    impl::nccl::exchange(*comm.nccl(), {{to, send.data(), send.span()}},
                         {{from, recv.data(), recv.span()}}, impl::nccl::element_type<T>())
        .wait();
    return;
  }
  const auto mpi_send = impl::mpi_send_buffer(comm, send);
  const auto mpi_recv = impl::mpi_receive_buffer(comm, recv);
  MPI_Sendrecv(mpi_send.data(), count, impl::mpi_type<T>(), to, 0, mpi_recv.data(), count,
               impl::mpi_type<T>(), from, 0, comm.get(), MPI_STATUS_IGNORE);
  mpi_recv.copy_back();
}

}  // namespace shardtensor
