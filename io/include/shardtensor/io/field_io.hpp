#pragma once
// Collective hyperslab reads and writes of sharded fields: each rank moves only its patch.

#include <Kokkos_Core.hpp>
#include <string>

#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/io/impl/element_type.hpp"

namespace shardtensor {
namespace impl {

/// Where one rank's shard lies in the global field and in its local (ghosted) array.
struct ShardLayout {
  int ndims = 1;
  Index batch = 1;
  Index channels = 1;
  SpatialIndex global_extent{1, 1, 1};
  Box owned;                        ///< global cells owned
  GhostWidths ghosts;               ///< ghost cells on each side in the local array
  SpatialIndex allocated{1, 1, 1};  ///< local array extents (ghosts included)
};

template <class T>
ShardLayout shard_layout(const ShardTensor<T>& t) {
  ShardLayout s;
  s.ndims = t.ndims();
  s.batch = t.batch();
  s.channels = t.channels();
  s.global_extent = t.decomposition().global_extents();
  s.owned = t.global_box();
  s.ghosts = t.ghosts();
  for (int d = 0; d < max_spatial_dims; ++d) s.allocated[d] = t.allocated_extent(d);
  return s;
}

/// Reads (into) or writes (from) a C-order array (batch, channels, allocated...) of `type`.
void read_shard(const io::File& file, const std::string& name, Index first_sample,
                const ShardLayout& layout, ElementType type, void* data, bool fill_ghosts);
void write_shard(io::File& file, const std::string& name, Index first_sample,
                 const ShardLayout& layout, ElementType type, const void* data);

}  // namespace impl

namespace io {

/// Reads samples [first_sample, first_sample + out.batch()) of field dataset `name`
/// ([samples, channels, spatial...], spatial extents those of out's decomposition) into
/// out's owned cells, and, if `fill_ghosts`, into its ghost cells that lie inside the
/// global domain (ghosts past the boundary, periodic ones included, are left untouched).
///
/// Collective over file's communicator, one collective MPI-IO transfer: every rank reads
/// only its own patch, straight into the tensor's memory. `first_sample` may differ per
/// rank (data-parallel groups read different samples in the same call); out.rank() is the
/// rank in out's decomposition, which may be a sub-group of the file's communicator.
/// The file's float type may differ from T: HDF5 converts.
template <class T>
void read_field(const File& file, const std::string& name, Index first_sample, ShardTensor<T>& out,
                bool fill_ghosts = false) {
  Kokkos::fence();
  // On host memory the mirror is the View itself; otherwise read through a host copy that
  // starts as the tensor's values, so cells the read skips keep them.
  auto host = Kokkos::create_mirror_view(out.view());
  const bool mirrored = host.data() != out.view().data();
  if (mirrored) Kokkos::deep_copy(host, out.view());
  impl::read_shard(file, name, first_sample, impl::shard_layout(out), impl::element_type_of<T>(),
                   host.data(), fill_ghosts);
  if (mirrored) Kokkos::deep_copy(out.view(), host);
}

/// Writes in's owned cells (not its ghosts) into samples [first_sample, first_sample +
/// in.batch()) of field dataset `name`, which must exist (create_field_dataset) with
/// matching channels and spatial extents. Collective, one collective MPI-IO transfer.
template <class T>
void write_field(File& file, const std::string& name, Index first_sample,
                 const ShardTensor<T>& in) {
  Kokkos::fence();
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), in.view());
  impl::write_shard(file, name, first_sample, impl::shard_layout(in), impl::element_type_of<T>(),
                    host.data());
}

}  // namespace io
}  // namespace shardtensor
