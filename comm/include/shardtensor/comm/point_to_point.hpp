#pragma once
// Non-blocking point-to-point messages between two ranks of a Communicator, for operations
// that pipeline their own transfers with compute (ring attention's blocks travelling around
// the ranks). Tags come from the communicator (Communicator::operation_tags), so these
// messages never match a halo exchange's. Waiting counts as communication time
// (CommKind::collective) in the comm timers.
//
//   PendingMessage in = post_receive(comm, buffer, count, from, tag);
//   PendingMessage out = post_send(comm, block, count, to, tag);
//   ... compute, calling in.test() now and then to let MPI progress ...
//   in.wait(); out.wait();

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// One message in flight. wait() before touching its buffer; a message still in flight when
/// destroyed is waited for (its buffer must outlive it).
///
/// Buffers are in the default memory space. Where the host cannot read that (a GPU build), the
/// message is staged: a send copies its block to a host buffer first, a receive lands in a host
/// buffer and is copied to the caller's memory when it completes (wait(), or a test() that
/// finds it done). MPI never sees device memory.
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

  /// Whether messages of this build go through host buffers.
  static constexpr bool staged =
      !Kokkos::SpaceAccessibility<Kokkos::HostSpace, DefaultMemorySpace>::accessible;

 private:
  using Bytes = Kokkos::View<unsigned char*, Kokkos::HostSpace>;
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
    if (destination_) {
      using DeviceBytes =
          Kokkos::View<unsigned char*, DefaultMemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
      Kokkos::deep_copy(DeviceBytes(static_cast<unsigned char*>(destination_), staging_.extent(0)),
                        staging_);
    }
    staging_ = Bytes();
    destination_ = nullptr;
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  Bytes staging_;                // the host copy of a staged message
  void* destination_ = nullptr;  // where a staged receive goes
};

/// Starts sending `count` values at `data` (default memory space; written by kernels that have
/// finished) to rank `to` with `tag`.
template <class T>
PendingMessage post_send(const Communicator& comm, const T* data, Index count, int to, int tag) {
  PendingMessage m;
  const int n = impl::mpi_count(static_cast<std::size_t>(count), "post_send");
  const void* from = data;
  if constexpr (PendingMessage::staged) {
    using DeviceBytes = Kokkos::View<const unsigned char*, DefaultMemorySpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    m.staging_ = PendingMessage::Bytes(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "post_send.staging"), count * sizeof(T));
    Kokkos::deep_copy(m.staging_,
                      DeviceBytes(reinterpret_cast<const unsigned char*>(data), count * sizeof(T)));
    from = m.staging_.data();
  }
  MPI_Isend(from, n, impl::mpi_type<T>(), to, tag, comm.get(), &m.request_);
  return m;
}

/// Starts receiving `count` values into `data` (default memory space) from rank `from` with
/// `tag`; the values are there once the message is complete.
template <class T>
PendingMessage post_receive(const Communicator& comm, T* data, Index count, int from, int tag) {
  PendingMessage m;
  const int n = impl::mpi_count(static_cast<std::size_t>(count), "post_receive");
  void* into = data;
  if constexpr (PendingMessage::staged) {
    m.staging_ = PendingMessage::Bytes(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "post_receive.staging"), count * sizeof(T));
    m.destination_ = data;
    into = m.staging_.data();
  }
  MPI_Irecv(into, n, impl::mpi_type<T>(), from, tag, comm.get(), &m.request_);
  return m;
}

}  // namespace shardtensor
