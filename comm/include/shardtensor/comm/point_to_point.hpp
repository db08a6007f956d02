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
// An exchange is one send and one receive posted together, the unit every transport runs
// without deadlock (transport.hpp).

#include <Kokkos_Core.hpp>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/transport.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// A send and a receive in flight together (post_exchange). Waited for when destroyed (its
/// buffers must outlive it).
class PendingExchange {
 public:
  PendingExchange() = default;
  explicit PendingExchange(impl::Transfers transfers) : transfers_(std::move(transfers)) {}
  PendingExchange(PendingExchange&&) noexcept = default;
  PendingExchange& operator=(PendingExchange&& other) noexcept {
    if (this != &other) {
      wait();
      transfers_ = std::move(other.transfers_);
    }
    return *this;
  }
  ~PendingExchange() { wait(); }

  /// Blocks until both transfers are complete.
  void wait() {
    if (transfers_.test()) return;
    CommTimerScope timer(CommKind::collective);
    transfers_.wait();
  }
  /// Lets the transfers progress without blocking; true when both are complete.
  bool test() { return transfers_.test(); }

 private:
  impl::Transfers transfers_;
};

/// Starts sending `send_count` values at `send` to rank `to` and receiving `receive_count`
/// values into `receive` from rank `from` (buffers of the default memory space; kernels that
/// wrote `send` are fenced first). Every rank of a ring calls it in the same step; `tag` tells
/// this operation's messages from others. `wire`: what the values are (T's own type, or
/// bfloat16 bits in 16-bit buffers). The bytes sent count as CommKind::collective's.
template <class T>
PendingExchange post_exchange(const Communicator& comm, const T* send, Index send_count, int to,
                              T* receive, Index receive_count, int from, int tag,
                              impl::WireType wire = impl::wire_type<T>()) {
  impl::mpi_count(static_cast<std::size_t>(send_count), "post_exchange");
  impl::mpi_count(static_cast<std::size_t>(receive_count), "post_exchange");
  if (to != comm.rank())
    impl::count_bytes_sent(CommKind::collective, std::uint64_t(send_count) * sizeof(T));
  return PendingExchange(impl::transport_for<DefaultMemorySpace>(comm).exchange(
      {{to, send, static_cast<std::size_t>(send_count), tag}},
      {{from, receive, static_cast<std::size_t>(receive_count), tag}}, wire));
}

}  // namespace shardtensor
