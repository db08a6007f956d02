#pragma once
// The NCCL backend's operations on device memory, behind an interface free of NCCL and CUDA
// headers (comm/backends/nccl/nccl_transport.cpp). Each call first fences Kokkos (the kernels
// that wrote its inputs have finished), then enqueues on the group's own CUDA stream: the
// collectives return once their result is in place; exchange() returns at once, with a
// Completion to test or wait on, so the caller computes while the transfers run.
//
// In a build without NCCL every function throws; Communicator never selects this backend
// there (comm_backend_named refuses it), so they are not reached.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "shardtensor/comm/reduce_op.hpp"

namespace shardtensor::impl::nccl {

enum class ElementType { int8, uint8, int32, uint32, int64, uint64, float32, float64 };

template <class T>
constexpr ElementType element_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return ElementType::float32;
  else if constexpr (std::is_same_v<U, double>)
    return ElementType::float64;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 1)
    return std::is_signed_v<U> ? ElementType::int8 : ElementType::uint8;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 4)
    return std::is_signed_v<U> ? ElementType::int32 : ElementType::uint32;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 8)
    return std::is_signed_v<U> ? ElementType::int64 : ElementType::uint64;
  else
    static_assert(sizeof(U) == 0, "no NCCL datatype for this scalar type");
}

/// An NCCL communicator over the ranks of an MPI communicator, with its own CUDA stream.
struct Group;

/// Collective over `comm`: rank 0's unique id broadcast over MPI, then ncclCommInitRank on
/// the GPU the rank's Kokkos runs on.
std::shared_ptr<Group> create_group(MPI_Comm comm);

/// The completion of an exchange: an event recorded on the group's stream after it.
class Completion {
 public:
  /// True once the transfers are done (or for an empty Completion); never blocks.
  bool test();
  /// Blocks until the transfers are done.
  void wait();

  struct Event;
  explicit Completion(std::shared_ptr<Event> event) : event_(std::move(event)) {}
  Completion() = default;

 private:
  std::shared_ptr<Event> event_;
};

void allreduce(Group& group, void* data, std::size_t count, ElementType type, ReduceOp op);
void allgather(Group& group, const void* send, void* recv, std::size_t count, ElementType type);
/// Equal blocks of `count` elements per rank.
void reduce_scatter(Group& group, const void* send, void* recv, std::size_t count, ElementType type,
                    ReduceOp op);

/// One point-to-point transfer of an exchange: `count` elements to or from rank `peer`.
struct Send {
  int peer;
  const void* data;
  std::size_t count;
};
struct Receive {
  int peer;
  void* data;
  std::size_t count;
};

/// All receives and sends as one NCCL group (no deadlock whatever the order of the peers).
/// Transfers between the same two ranks match in the order they are listed: a rank's sends
/// to a peer in the order of that peer's receives from it.
Completion exchange(Group& group, const std::vector<Send>& sends,
                    const std::vector<Receive>& receives, ElementType type);

}  // namespace shardtensor::impl::nccl
