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

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// One message in flight. wait() before touching its buffer; a message still in flight when
/// destroyed is waited for (its buffer must outlive it).
class PendingMessage {
 public:
  PendingMessage() = default;
  PendingMessage(PendingMessage&& other) noexcept : request_(other.request_) {
    other.request_ = MPI_REQUEST_NULL;
  }
  PendingMessage& operator=(PendingMessage&& other) noexcept {
    if (this != &other) {
      wait();
      request_ = other.request_;
      other.request_ = MPI_REQUEST_NULL;
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
  }
  /// Lets MPI progress the message without blocking; true when it is complete.
  bool test() {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }

 private:
  template <class T>
  friend PendingMessage post_send(const Communicator&, const T*, Index, int, int);
  template <class T>
  friend PendingMessage post_receive(const Communicator&, T*, Index, int, int);
  MPI_Request request_ = MPI_REQUEST_NULL;
};

/// Starts sending `count` values at host memory `data` to rank `to` with `tag`.
template <class T>
PendingMessage post_send(const Communicator& comm, const T* data, Index count, int to, int tag) {
  PendingMessage m;
  MPI_Isend(data, impl::mpi_count(static_cast<std::size_t>(count), "post_send"),
            impl::mpi_type<T>(), to, tag, comm.get(), &m.request_);
  return m;
}

/// Starts receiving `count` values into host memory `data` from rank `from` with `tag`.
template <class T>
PendingMessage post_receive(const Communicator& comm, T* data, Index count, int from, int tag) {
  PendingMessage m;
  MPI_Irecv(data, impl::mpi_count(static_cast<std::size_t>(count), "post_receive"),
            impl::mpi_type<T>(), from, tag, comm.get(), &m.request_);
  return m;
}

}  // namespace shardtensor
