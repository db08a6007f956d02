#pragma once
// ShardTensor<T>: one rank's subdomain of a global (N, C, spatial...) field, with ghost cells.

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/ghost_widths.hpp"

namespace shardtensor {

/// Memory space of every ShardTensor (the default execution space's).
using DefaultMemorySpace = Kokkos::DefaultExecutionSpace::memory_space;
/// True where host code (and MPI) can read and write the default memory space in place: the
/// CPU backends. Where false (a GPU build), host access goes through copies.
constexpr bool host_reads_default_memory =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, DefaultMemorySpace>::accessible;

/// Five-axis field View (batch, channel, x, y, z), C order: z varies fastest, as in
/// PyTorch's NCDHW tensors and HDF5 datasets. 1-D and 2-D fields have y/z extents of 1.
template <class T>
using FieldView = Kokkos::View<T*****, Kokkos::LayoutRight, DefaultMemorySpace>;

/// Flat storage of a replicated tensor (same values on every rank of a domain group):
/// parameters, their gradients, scalars.
template <class T>
using ReplicatedView = Kokkos::View<T*, DefaultMemorySpace>;

/// The local piece of a domain-decomposed field on one rank.
///
/// The View holds the owned cells plus `ghosts()` cells on each side of each spatial axis:
/// its spatial extents are local_extent(d) + ghosts.lower[d] + ghosts.upper[d]. Local
/// spatial indices count from the first ghost cell; `interior()` is the owned part.
/// Batch and channel axes are never split. Copies share memory (like Kokkos Views).
template <class T>
class ShardTensor {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "ShardTensor holds float or double");

 public:
  using value_type = T;
  using view_type = FieldView<T>;
  using memory_space = DefaultMemorySpace;

  ShardTensor() = default;

  /// Allocates (zero-filled) the shard of `rank` in `decomposition`.
  ShardTensor(const Decomposition& decomposition, int rank, Index batch, Index channels,
              const GhostWidths& ghosts = {}, const std::string& label = "shard_tensor")
      : ShardTensor(decomposition, rank, batch, channels, ghosts, nullptr, label) {}

  /// Allocates without zero-filling: for results every cell of which is written next.
  static ShardTensor uninitialized(const Decomposition& decomposition, int rank, Index batch,
                                   Index channels, const GhostWidths& ghosts = {},
                                   const std::string& label = "shard_tensor") {
    return ShardTensor(decomposition, rank, batch, channels, ghosts, nullptr, label,
                       /*zero_fill=*/false);
  }

  /// Wraps the caller's array without copying. `data` must hold
  /// batch x channels x allocated_extent(0) x allocated_extent(1) x allocated_extent(2)
  /// values in C order, in memory_space, and outlive every copy of the returned tensor.
  static ShardTensor wrap(T* data, const Decomposition& decomposition, int rank, Index batch,
                          Index channels, const GhostWidths& ghosts = {}) {
    SHARDTENSOR_REQUIRE(data != nullptr, "ShardTensor::wrap",
                        "null data pointer for rank " << rank);
    return ShardTensor(decomposition, rank, batch, channels, ghosts, data, "");
  }

  const Decomposition& decomposition() const { return decomposition_; }
  int rank() const { return rank_; }
  int ndims() const { return decomposition_.ndims(); }
  Index batch() const { return view_.extent(0); }
  Index channels() const { return view_.extent(1); }
  const GhostWidths& ghosts() const { return ghosts_; }
  bool owns_memory() const { return owns_memory_; }

  /// Owned cells along `dim` (1 past ndims()).
  Index local_extent(int dim) const { return box_.extent[dim]; }
  /// Owned plus ghost cells along `dim`: the View's spatial extent.
  Index allocated_extent(int dim) const { return view_.extent(2 + dim); }
  /// The global cells this shard owns.
  const Box& global_box() const { return box_; }
  /// Owned cells in local (allocation) indices.
  Box interior_box() const {
    Box b;
    for (int d = 0; d < max_spatial_dims; ++d) {
      b.lower[d] = ghosts_.lower[d];
      b.extent[d] = box_.extent[d];
    }
    return b;
  }

  /// The whole allocation, ghost cells included.
  const view_type& view() const { return view_; }

  /// The owned cells only (a strided subview of view()).
  auto interior() const {
    using range = Kokkos::pair<Index, Index>;
    const Box b = interior_box();
    return Kokkos::subview(view_, Kokkos::ALL, Kokkos::ALL, range(b.lower[0], b.upper(0)),
                           range(b.lower[1], b.upper(1)), range(b.lower[2], b.upper(2)));
  }

  /// Global index of local (allocation) index `local` along `dim`. Ghost cells map to
  /// indices outside [0, global extent) at open boundaries; they are not wrapped.
  Index to_global(int dim, Index local) const {
    return box_.lower[dim] + local - ghosts_.lower[dim];
  }
  /// Local (allocation) index of global index `global` along `dim`.
  Index to_local(int dim, Index global) const {
    return global - box_.lower[dim] + ghosts_.lower[dim];
  }
  SpatialIndex to_global(const SpatialIndex& local) const {
    return {to_global(0, local[0]), to_global(1, local[1]), to_global(2, local[2])};
  }
  SpatialIndex to_local(const SpatialIndex& global) const {
    return {to_local(0, global[0]), to_local(1, global[1]), to_local(2, global[2])};
  }
  /// A global box in local (allocation) indices.
  Box to_local(const Box& global) const {
    return global.shifted({ghosts_.lower[0] - box_.lower[0], ghosts_.lower[1] - box_.lower[1],
                           ghosts_.lower[2] - box_.lower[2]});
  }

  /// True if the shard owns the global cell (ghost cells excluded).
  bool owns(const SpatialIndex& global_cell) const { return box_.contains(global_cell); }

  /// Same decomposition, rank, batch, channels and ghost widths.
  bool same_layout(const ShardTensor& other) const {
    return rank_ == other.rank_ && ghosts_ == other.ghosts_ && batch() == other.batch() &&
           channels() == other.channels() && decomposition_ == other.decomposition_;
  }

 private:
  ShardTensor(const Decomposition& decomposition, int rank, Index batch, Index channels,
              const GhostWidths& ghosts, T* data, const std::string& label, bool zero_fill = true)
      : decomposition_(decomposition), rank_(rank), ghosts_(ghosts) {
    constexpr const char* where = "ShardTensor";
    SHARDTENSOR_REQUIRE(
        rank >= 0 && rank < decomposition.nranks(), where,
        "rank " << rank << " outside a decomposition of " << decomposition.nranks() << " ranks");
    SHARDTENSOR_REQUIRE(batch >= 1 && channels >= 1, where,
                        "batch " << batch << " and channels " << channels << " must be positive");
    for (int d = 0; d < max_spatial_dims; ++d) {
      SHARDTENSOR_REQUIRE(ghosts.lower[d] >= 0 && ghosts.upper[d] >= 0, where,
                          "negative ghost width (" << ghosts << ") in dim " << d);
      SHARDTENSOR_REQUIRE(
          d < decomposition.ndims() || (ghosts.lower[d] == 0 && ghosts.upper[d] == 0), where,
          "ghost width in dim " << d << " of a " << decomposition.ndims() << "-D field (" << ghosts
                                << ")");
    }
    box_ = decomposition.box(rank);
    const Index nx = box_.extent[0] + ghosts.lower[0] + ghosts.upper[0];
    const Index ny = box_.extent[1] + ghosts.lower[1] + ghosts.upper[1];
    const Index nz = box_.extent[2] + ghosts.lower[2] + ghosts.upper[2];
    if (data) {
      view_ = view_type(data, batch, channels, nx, ny, nz);
      owns_memory_ = false;
    } else if (zero_fill) {
      view_ = view_type(label, batch, channels, nx, ny, nz);
      owns_memory_ = true;
    } else {
      view_ = view_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), batch, channels, nx,
                        ny, nz);
      owns_memory_ = true;
    }
  }

  Decomposition decomposition_{std::vector<Index>{1}, std::vector<int>{1}};
  int rank_ = 0;
  GhostWidths ghosts_;
  Box box_;
  view_type view_;
  bool owns_memory_ = false;
};

}  // namespace shardtensor
