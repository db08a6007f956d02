#pragma once
// Non-blocking point-to-point transfers between ranks of a Communicator, for operations that
// pipeline their own transfers with compute (ring attention's blocks travelling around the
// ranks). Tags come from the communicator (Communicator::operation_tags), so these messages
// never match a halo exchange's. Waiting counts as communication time (CommKind::collective)
// in the comm timers.
//
//   PendingExchange step = post_exchange(comm, block, count, next, buffer, count_in, prev, tag);
//   ... compute, calling step.test() now and then to let the transfers progress ...
//   step.wait();
//
// An exchange is one send and one receive posted together, the unit every backend can run
// without deadlock: MPI posts the receive and the send (PendingMessage each); NCCL runs both
// as one group on the communicator's stream (its sends and receives must be grouped).

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/comm/impl/nccl_transport.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// One MPI message in flight. wait() before touching its buffer; a message still in flight
/// when destroyed is waited for (its buffer must outlive it).
///
/// Buffers are in the default memory space. Where that is device memory and MPI is not
/// device-aware (CommOptions), the message is staged: a send copies its block to a host buffer
/// first, a receive lands in a host buffer and is copied to the caller's memory when it
/// completes (wait(), or a test() that finds it done).
class PendingMessage {
 public:
  PendingMessage() = default;
  PendingMessage(PendingMessage&& other) noexcept { take(other); }
  PendingMessage& operator=(PendingMessage&& other) noexcept {
    if (this != &other) {
      wait();
      take(other);
    }
    return *this;
  }
  PendingMessage(const PendingMessage&) = delete;
  PendingMessage& operator=(const PendingMessage&) = delete;
  ~PendingMessage() { wait(); }

  /// Blocks until the message is complete (no-op for a completed or empty one).
  void wait() {
    if (request_ == MPI_REQUEST_NULL) return;
    CommTimerScope timer(CommKind::collective);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
    unstage();
  }
  /// Lets MPI progress the message without blocking; true when it is complete.
  bool test() {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    if (done) unstage();
    return done != 0;
  }

  /// Whether messages over `comm` go through host buffers.
  static bool staged(const Communicator& comm) {
    return impl::mpi_stages<DefaultMemorySpace>(comm);
  }

 private:
  using Bytes = Kokkos::View<unsigned char*, Kokkos::HostSpace>;
  using DeviceBytes =
      Kokkos::View<unsigned char*, DefaultMemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  template <class T>
  friend PendingMessage post_send(const Communicator&, const T*, Index, int, int);
  template <class T>
  friend PendingMessage post_receive(const Communicator&, T*, Index, int, int);

  void take(PendingMessage& other) {
    request_ = other.request_;
    staging_ = other.staging_;
    destination_ = other.destination_;
    other.request_ = MPI_REQUEST_NULL;
    other.staging_ = Bytes();
    other.destination_ = nullptr;
  }
  /// A completed staged receive: its bytes to the caller's memory.
  void unstage() {
    if (destination_)
      Kokkos::deep_copy(DeviceBytes(static_cast<unsigned char*>(destination_), staging_.extent(0)),
                        staging_);
    staging_ = Bytes();
    destination_ = nullptr;
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  Bytes staging_;                // the host copy of a staged message
  void* destination_ = nullptr;  // where a staged receive goes
};

/// Starts sending `count` values at `data` (default memory space; written by kernels that have
/// finished) to rank `to` with `tag`, over MPI.
template <class T>
PendingMessage post_send(const Communicator& comm, const T* data, Index count, int to, int tag) {
  PendingMessage m;
  const int n = impl::mpi_count(static_cast<std::size_t>(count), "post_send");
  const void* from = data;
  if (PendingMessage::staged(comm)) {
    m.staging_ = PendingMessage::Bytes(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "post_send.staging"), count * sizeof(T));
    Kokkos::deep_copy(
        m.staging_, PendingMessage::DeviceBytes(
                        reinterpret_cast<unsigned char*>(const_cast<T*>(data)), count * sizeof(T)));
    from = m.staging_.data();
  }
  MPI_Isend(from, n, impl::mpi_type<T>(), to, tag, comm.get(), &m.request_);
  return m;
}

/// Starts receiving `count` values into `data` (default memory space) from rank `from` with
/// `tag`, over MPI; the values are there once the message is complete.
template <class T>
PendingMessage post_receive(const Communicator& comm, T* data, Index count, int from, int tag) {
  PendingMessage m;
  const int n = impl::mpi_count(static_cast<std::size_t>(count), "post_receive");
  void* into = data;
  if (PendingMessage::staged(comm)) {
    m.staging_ = PendingMessage::Bytes(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "post_receive.staging"), count * sizeof(T));
    m.destination_ = data;
    into = m.staging_.data();
  }
  MPI_Irecv(into, n, impl::mpi_type<T>(), from, tag, comm.get(), &m.request_);
  return m;
}

/// A send and a receive in flight together (post_exchange). Waited for when destroyed.
class PendingExchange {
 public:
  PendingExchange() = default;
  PendingExchange(PendingExchange&&) noexcept = default;
  PendingExchange& operator=(PendingExchange&& other) noexcept {
    if (this != &other) {
      wait();
      receive_ = std::move(other.receive_);
      send_ = std::move(other.send_);
      nccl_ = std::move(other.nccl_);
    }
    return *this;
  }
  ~PendingExchange() { wait(); }

  /// Blocks until both transfers are complete.
  void wait() {
    receive_.wait();
    send_.wait();
    if (nccl_.test()) return;
    CommTimerScope timer(CommKind::collective);
    nccl_.wait();
  }
  /// Lets the transfers progress without blocking; true when both are complete.
  bool test() {
    const bool received = receive_.test(), sent = send_.test();
    return nccl_.test() && received && sent;
  }

 private:
  template <class T>
  friend PendingExchange post_exchange(const Communicator&, const T*, Index, int, T*, Index, int,
                                       int);
  PendingMessage receive_, send_;  // MPI
  impl::nccl::Completion nccl_;    // NCCL
};

/// Starts sending `send_count` values at `send` to rank `to` and receiving `receive_count`
/// values into `receive` from rank `from` (buffers of the default memory space; kernels that
/// wrote `send` are fenced first). Every rank of a ring calls it in the same step; `tag` (MPI)
/// tells this operation's messages from others.
template <class T>
PendingExchange post_exchange(const Communicator& comm, const T* send, Index send_count, int to,
                              T* receive, Index receive_count, int from, int tag) {
  PendingExchange x;
  if (impl::on_nccl<Kokkos::View<T*, DefaultMemorySpace>>(comm)) {
    x.nccl_ = impl::nccl::exchange(*comm.nccl(), {{to, send, static_cast<std::size_t>(send_count)}},
                                   {{from, receive, static_cast<std::size_t>(receive_count)}},
                                   impl::nccl::element_type<T>());
    return x;
  }
  x.receive_ = post_receive(comm, receive, receive_count, from, tag);
  Kokkos::fence();  // MPI reads what the kernels wrote
  x.send_ = post_send(comm, send, send_count, to, tag);
  return x;
}

}  // namespace shardtensor
