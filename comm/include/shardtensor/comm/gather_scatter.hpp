#pragma once
// Whole-field transfers of a ShardTensor: gather to one rank, gather to all ranks,
// scatter from one rank.

#include <sstream>
#include <vector>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

namespace impl {

/// Number of values of each rank's owned cells, in rank order.
inline std::vector<std::size_t> owned_value_counts(const Decomposition& decomposition,
                                                   Index values_per_cell) {
  std::vector<std::size_t> counts;
  for (int r = 0; r < decomposition.nranks(); ++r)
    counts.push_back(static_cast<std::size_t>(decomposition.box(r).size() * values_per_cell));
  return counts;
}

/// Copies the owned cells of a shard into a contiguous buffer.
template <class T>
Kokkos::View<T*, DefaultMemorySpace> pack_owned(const ShardTensor<T>& tensor) {
  Kokkos::View<T*, DefaultMemorySpace> buffer(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "pack_owned"),
      tensor.global_box().size() * tensor.batch() * tensor.channels());
  pack_box(ExecutionSpace(), tensor.view(), tensor.interior_box(), buffer);
  Kokkos::fence();
  return buffer;
}

/// Writes the concatenated owned cells of every rank (rank order) into a global field.
template <class T, class BufferView>
void unpack_all_ranks(const BufferView& buffer, const Decomposition& decomposition,
                      const FieldView<T>& global) {
  std::size_t offset = 0;
  for (int r = 0; r < decomposition.nranks(); ++r) {
    const Box box = decomposition.box(r);
    unpack_box(ExecutionSpace(), buffer, global, box, UnpackMode::assign, offset);
    offset += static_cast<std::size_t>(box.size() * global.extent(0) * global.extent(1));
  }
  Kokkos::fence();
}

template <class T>
FieldView<T> allocate_global(const ShardTensor<T>& tensor, const char* label) {
  const SpatialIndex e = tensor.decomposition().global_extents();
  return FieldView<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                      tensor.batch(), tensor.channels(), e[0], e[1], e[2]);
}

}  // namespace impl

/// The whole field (batch, channels, global extents; no ghosts) on `root`; an empty View on
/// every other rank. Collective.
template <class T>
FieldView<T> gather_to_root(const Communicator& comm, const ShardTensor<T>& tensor, int root = 0) {
  constexpr const char* where = "gather_to_root";
  SHARDTENSOR_REQUIRE(root >= 0 && root < comm.size(), where,
                      "root " << root << " outside a communicator of " << comm.size() << " ranks");
  impl::check_layout_on_all_ranks(comm, tensor, where);
  const auto send = impl::pack_owned(tensor);
  const std::vector<std::size_t> counts =
      impl::owned_value_counts(tensor.decomposition(), tensor.batch() * tensor.channels());
  impl::check_counts(counts, comm.size(), where, "counts");
  FieldView<T> global;
  Kokkos::View<T*, DefaultMemorySpace> recv;
  if (comm.rank() == root) {
    global = impl::allocate_global(tensor, "gathered_field");
    recv = Kokkos::View<T*, DefaultMemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "gather_recv"), global.span());
  }
  impl::transport_for<DefaultMemorySpace>(comm).gatherv(send.data(), recv.data(), counts, root,
                                                        impl::wire_type<T>());
  if (comm.rank() == root) impl::unpack_all_ranks<T>(recv, tensor.decomposition(), global);
  return global;
}

/// The whole field on every rank. Collective.
template <class T>
FieldView<T> all_gather(const Communicator& comm, const ShardTensor<T>& tensor) {
  impl::check_layout_on_all_ranks(comm, tensor, "all_gather");
  const auto send = impl::pack_owned(tensor);
  FieldView<T> global = impl::allocate_global(tensor, "all_gathered_field");
  Kokkos::View<T*, DefaultMemorySpace> recv(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "all_gather_recv"), global.span());
  allgatherv(comm, send, recv,
             impl::owned_value_counts(tensor.decomposition(), tensor.batch() * tensor.channels()));
  impl::unpack_all_ranks<T>(recv, tensor.decomposition(), global);
  return global;
}

/// Splits the whole field `global` held by `root` (other ranks pass an empty View) into the
/// shards of `decomposition`, with zero-filled ghost cells of the given widths. Collective.
template <class T>
ShardTensor<T> scatter_from_root(const Communicator& comm, const FieldView<T>& global,
                                 const Decomposition& decomposition, const GhostWidths& ghosts = {},
                                 int root = 0) {
  constexpr const char* where = "scatter_from_root";
  SHARDTENSOR_REQUIRE(root >= 0 && root < comm.size(), where,
                      "root " << root << " outside a communicator of " << comm.size() << " ranks");
  {
    std::ostringstream local_error;
    if (comm.size() != decomposition.nranks())
      local_error << where << ": communicator has " << comm.size()
                  << " ranks but the decomposition (" << decomposition.describe() << ") has "
                  << decomposition.nranks();
    if (comm.rank() == root) {
      const SpatialIndex e = decomposition.global_extents();
      if (global.extent(2) != std::size_t(e[0]) || global.extent(3) != std::size_t(e[1]) ||
          global.extent(4) != std::size_t(e[2]) || global.extent(0) == 0 || global.extent(1) == 0)
        local_error << where << ": field of shape (" << global.extent(0) << ", " << global.extent(1)
                    << ", " << global.extent(2) << ", " << global.extent(3) << ", "
                    << global.extent(4) << ") does not match the decomposition ("
                    << decomposition.describe() << ")";
    }
    comm.agree(local_error.str());
  }
  std::vector<long long> layout = impl::signature(decomposition);
  for (int k = 0; k < max_spatial_dims; ++k) {
    layout.push_back(ghosts.lower[k]);
    layout.push_back(ghosts.upper[k]);
  }
  comm.require_same(layout, where, "target decomposition and ghost widths");
  std::vector<std::int64_t> shape{static_cast<std::int64_t>(global.extent(0)),
                                  static_cast<std::int64_t>(global.extent(1))};
  comm.broadcast(shape, root);
  ShardTensor<T> tensor(decomposition, comm.rank(), shape[0], shape[1], ghosts, "scattered_field");

  const std::vector<std::size_t> counts =
      impl::owned_value_counts(decomposition, shape[0] * shape[1]);
  impl::check_counts(counts, comm.size(), where, "counts");
  Kokkos::View<T*, DefaultMemorySpace> send;
  if (comm.rank() == root) {
    send = Kokkos::View<T*, DefaultMemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "scatter_send"), global.span());
    std::size_t offset = 0;
    for (int r = 0; r < decomposition.nranks(); ++r) {
      pack_box(ExecutionSpace(), global, decomposition.box(r), send, offset);
      offset += counts[r];
    }
    Kokkos::fence();
  }
  Kokkos::View<T*, DefaultMemorySpace> recv(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "scatter_recv"), counts[comm.rank()]);
  impl::transport_for<DefaultMemorySpace>(comm).scatterv(send.data(), counts, recv.data(), root,
                                                         impl::wire_type<T>());
  unpack_box(ExecutionSpace(), recv, tensor.view(), tensor.interior_box());
  Kokkos::fence();
  return tensor;
}

}  // namespace shardtensor
