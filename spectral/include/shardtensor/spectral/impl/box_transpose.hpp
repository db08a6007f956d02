#pragma once
// BoxTranspose: a persistent all-to-all between two box layouts of one global array, the
// "transpose" step of the distributed FFT. Unlike `redistribute`, the layouts are lists of
// boxes, not Decompositions, so ranks may own nothing (a slab split of 6 modes over 8 ranks)
// and the values may be complex.

#include <Kokkos_Complex.hpp>
#include <Kokkos_Core.hpp>
#include <type_traits>
#include <vector>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::impl {

/// The real scalar behind a value type: T for T and for Kokkos::complex<T>.
template <class Value>
struct real_scalar {
  using type = Value;
};
template <class T>
struct real_scalar<Kokkos::complex<T>> {
  using type = T;
};

/// Moves an array laid out by `from` (rank r holds the global cells from[r]) to the layout
/// `to`: each rank sends every other rank the intersection of its box with that rank's
/// target box, in one all-to-all (comm/collectives.hpp). Values are copied, never combined. The
/// boxes, counts and buffers are computed once; `apply` allocates nothing. Collective over `comm`.
template <class Value>
class BoxTranspose {
 public:
  using Scalar = typename real_scalar<Value>::type;
  static constexpr std::size_t scalars_per_value = sizeof(Value) / sizeof(Scalar);

  BoxTranspose() = default;
  /// `values_per_cell`: batch x channels. `from` and `to` have one box per rank of `comm`.
  BoxTranspose(const Communicator& comm, const std::vector<Box>& from, const std::vector<Box>& to,
               Index values_per_cell)
      : comm_(comm) {
    const int p = comm.size(), me = comm.rank();
    SHARDTENSOR_REQUIRE(
        int(from.size()) == p && int(to.size()) == p, "BoxTranspose",
        "layouts of " << from.size() << " and " << to.size() << " boxes for " << p << " ranks");
    send_boxes_.resize(p);
    recv_boxes_.resize(p);
    send_counts_.resize(p);
    recv_counts_.resize(p);
    for (int r = 0; r < p; ++r) {
      send_boxes_[r] = intersect(from[me], to[r]);
      recv_boxes_[r] = intersect(from[r], to[me]);
      send_counts_[r] = std::size_t(send_boxes_[r].size() * values_per_cell) * scalars_per_value;
      recv_counts_[r] = std::size_t(recv_boxes_[r].size() * values_per_cell) * scalars_per_value;
    }
    MemoryCategoryScope memory(MemoryCategory::comm_buffers);
    send_ = Kokkos::View<Value*, DefaultMemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "box_transpose_send"),
        sum(send_counts_) / scalars_per_value);
    recv_ = Kokkos::View<Value*, DefaultMemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "box_transpose_recv"),
        sum(recv_counts_) / scalars_per_value);
  }

  /// Reads `src` (local index = global index + src_shift) and writes `dst` (local index =
  /// global index + dst_shift). Both are (batch, channel, x, y, z) Views of Value.
  template <class SrcView, class DstView>
  void apply(const SrcView& src, const SpatialIndex& src_shift, const DstView& dst,
             const SpatialIndex& dst_shift) const {
    std::size_t offset = 0;
    for (std::size_t r = 0; r < send_boxes_.size(); ++r) {
      pack_box(ExecutionSpace(), src, send_boxes_[r].shifted(src_shift), send_, offset);
      offset += send_counts_[r] / scalars_per_value;
    }
    // MPI sees the (possibly complex) buffers as arrays of real scalars.
    using Unmanaged = Kokkos::View<Scalar*, DefaultMemorySpace, Kokkos::MemoryUnmanaged>;
    alltoallv(comm_, Unmanaged(reinterpret_cast<Scalar*>(send_.data()), sum(send_counts_)),
              send_counts_, Unmanaged(reinterpret_cast<Scalar*>(recv_.data()), sum(recv_counts_)),
              recv_counts_);
    offset = 0;
    for (std::size_t r = 0; r < recv_boxes_.size(); ++r) {
      unpack_box(ExecutionSpace(), recv_, dst, recv_boxes_[r].shifted(dst_shift),
                 UnpackMode::assign, offset);
      offset += recv_counts_[r] / scalars_per_value;
    }
    Kokkos::fence();
  }

  /// Real numbers (a complex value counts two) this rank sends to other ranks per apply.
  std::size_t scalars_sent() const {
    std::size_t total = 0;
    for (std::size_t r = 0; r < send_counts_.size(); ++r)
      if (int(r) != comm_.rank()) total += send_counts_[r];
    return total;
  }

 private:
  Communicator comm_;
  std::vector<Box> send_boxes_, recv_boxes_;
  std::vector<std::size_t> send_counts_, recv_counts_;  // in real scalars
  Kokkos::View<Value*, DefaultMemorySpace> send_, recv_;
};

}  // namespace shardtensor::impl
