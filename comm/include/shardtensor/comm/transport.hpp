#pragma once
// Transport: how a Communicator moves the values of contiguous buffers between its ranks. The
// Communicator chooses its transports once, when it is made (comm_options.hpp):
//   host memory    MPI, in place;
//   device memory  MPI on the device pointers (device_aware_mpi), MPI through host staging
//                  buffers (one staging type for every operation, comm/src/mpi_transport.cpp),
//                  or NCCL on the communicator's own stream (comm/backends/nccl/).
// Collectives, point-to-point transfers, the whole-field gathers and the halo exchange call
// the transport of the memory they move (transport_for); none of them asks which one it is.
// A new backend (RCCL, say) is one more implementation of this interface.
//
// Every operation first waits for the Kokkos kernels in flight (they wrote its inputs). The
// collectives return once their result is in place; exchange() returns at once with the
// Transfers in flight, so the caller computes while they travel.

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/reduce_op.hpp"

namespace shardtensor::impl {

/// What a transfer's elements are. bfloat16: 16-bit bfloat16 values (a float field's values
/// packed to half the bytes, core/bfloat16.hpp); moved, never reduced.
enum class WireType { int8, uint8, int32, uint32, int64, uint64, float32, float64, bfloat16 };

template <class T>
constexpr WireType wire_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return WireType::float32;
  else if constexpr (std::is_same_v<U, double>)
    return WireType::float64;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 1)
    return std::is_signed_v<U> ? WireType::int8 : WireType::uint8;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 4)
    return std::is_signed_v<U> ? WireType::int32 : WireType::uint32;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 8)
    return std::is_signed_v<U> ? WireType::int64 : WireType::uint64;
  else
    static_assert(sizeof(U) == 0, "no transport element type for this scalar type");
}

std::size_t wire_size(WireType type);
/// Throws unless `type` can be reduced (sums, maxima): bfloat16 is moved as bits only.
void require_reducible(WireType type, const char* where);

/// Elements of all blocks of a count vector.
inline std::size_t sum(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

/// One transfer of an exchange: `count` elements to or from rank `peer`. `tag` tells this
/// operation's messages from others' (MPI); transfers between the same two ranks also match in
/// the order they are listed (NCCL): a rank's sends to a peer in the order of that peer's
/// receives from it.
/// The box `lower`/`extent` of a C-order array of `shape` (a field's ghost region).
struct BoxLayout {
  int shape[5];
  int lower[5];
  int extent[5];
};
struct Send {
  int peer;
  const void* data;
  std::size_t count;
  int tag;
  /// Where the values come from when they are not contiguous: the box of a C-order array of
  /// `shape` that starts at `data` (count = the box's size). Only for a transport that
  /// moves_boxes(); its values must not change until the send completes.
  const BoxLayout* box = nullptr;
};
struct Receive {
  int peer;
  void* data;
  std::size_t count;
  int tag;
  /// Where the values land when they are not contiguous: the box `lower`/`extent` of a
  /// C-order array of `shape` that starts at `data` (count = the box's size). Only for a
  /// transport that moves_boxes().
  const BoxLayout* box = nullptr;
};

/// The transfers of one exchange in flight. Move-only. Destroying unfinished transfers cancels
/// their receives and waits for their sends, so a plan destroyed while an exception unwinds
/// never leaves a transport writing into freed buffers.
class Transfers {
 public:
  class State {
   public:
    virtual ~State() = default;
    virtual bool test() = 0;
    virtual void wait() = 0;
    virtual int next_received() = 0;
  };
  Transfers() = default;
  explicit Transfers(std::unique_ptr<State> state) : state_(std::move(state)) {}

  /// Lets the transfers progress without blocking; true once all are complete.
  bool test() { return !state_ || state_->test(); }
  /// Blocks until all are complete; the received values are in place.
  void wait() {
    if (state_) state_->wait();
  }
  /// Blocks until a receive not returned before is complete and returns its index in the
  /// exchange's receive list (its values in place); -1 once every receive has been returned.
  int next_received() { return state_ ? state_->next_received() : -1; }

 private:
  std::unique_ptr<State> state_;
};

/// Moves contiguous buffers of one memory space between the ranks of one communicator. Counts
/// are in elements; count vectors hold one entry per rank, in rank order.
class Transport {
 public:
  virtual ~Transport() = default;
  /// "mpi", "mpi (staged)", "mpi (device-aware)" or "nccl".
  virtual const char* name() const = 0;
  /// Whether a Send or a Receive may name a box (BoxLayout): MPI in host memory, which then
  /// needs no packing or unpacking pass and no buffer of ours.
  virtual bool moves_boxes() const { return false; }

  virtual void allreduce(void* data, std::size_t count, WireType type, ReduceOp op) = 0;
  /// recv = every rank's `send` (counts[r] elements from rank r), in rank order.
  virtual void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                          WireType type) = 0;
  /// Reduces every rank's `send` (sum of counts elements); rank r keeps block r in `recv`.
  virtual void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                              WireType type, ReduceOp op) = 0;
  /// send_counts[r] elements of `send` to rank r; recv_counts[s] from rank s into `recv`.
  virtual void alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                         const std::vector<std::size_t>& recv_counts, WireType type) = 0;
  /// `root` receives every rank's `send` (counts[r] elements) into `recv`, in rank order.
  virtual void gatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                       int root, WireType type) = 0;
  /// Block r of `root`'s `send` (counts[r] elements) into rank r's `recv`.
  virtual void scatterv(const void* send, const std::vector<std::size_t>& counts, void* recv,
                        int root, WireType type) = 0;
  /// Posts every receive and send and returns at once.
  virtual Transfers exchange(const std::vector<Send>& sends, const std::vector<Receive>& receives,
                             WireType type) = 0;
};

/// What the buffers an MPI transport moves are: host memory (MPI reads it in place and
/// receives into boxes), device memory MPI may be handed (device-aware MPI), or device memory
/// staged through host copies.
enum class MpiMemory { host, device, staged };

/// MPI over `comm` (which outlives the transport).
std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, MpiMemory memory);
/// NCCL over the ranks of `comm` (its NCCL communicator is made at the first operation,
/// collectively). Throws in a build without NCCL.
std::unique_ptr<Transport> make_nccl_transport(MPI_Comm comm);

/// The transport that moves buffers of `Memory` over `comm`.
template <class Memory>
Transport& transport_for(const Communicator& comm) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible)
    return comm.host_transport();
  else
    return comm.device_transport();
}

}  // namespace shardtensor::impl
