// Collective hyperslab transfers between a field dataset and each rank's shard.

#include "shardtensor/io/field_io.hpp"

#include <sstream>

#include "hdf5_support.hpp"

namespace shardtensor::impl {
namespace {

/// The global cells a rank transfers: its owned box, grown by its ghost widths (clipped to
/// the domain) when ghosts are read too.
Box transfer_box(const ShardLayout& s, bool with_ghosts) {
  if (!with_ghosts) return s.owned;
  Box grown;
  for (int d = 0; d < max_spatial_dims; ++d) {
    grown.lower[d] = s.owned.lower[d] - s.ghosts.lower[d];
    grown.extent[d] = s.owned.extent[d] + s.ghosts.lower[d] + s.ghosts.upper[d];
  }
  Box domain;
  domain.extent = s.global_extent;
  return intersect(grown, domain);
}

/// Selects `box` of samples [first_sample, first_sample + batch) in the file dataspace
/// [samples, channels, spatial (ndims)...] and the same cells of the local array
/// (batch, channels, allocated x, y, z), then moves them with one collective transfer.
void transfer(const io::File& file, const std::string& name, Index first_sample,
              const ShardLayout& s, ElementType type, void* data, bool with_ghosts, bool write,
              const char* where) {
  const Communicator& comm = file.communicator();
  Hid dataset;
  bool chunked = false;
  agreed(comm, [&] {
    if (write) require_writable(file, where);
    std::vector<Index> extents(s.global_extent.begin(), s.global_extent.begin() + s.ndims);
    const io::DatasetInfo info = check_field_dataset(file, name, s.channels, extents, where);
    SHARDTENSOR_REQUIRE(first_sample >= 0 && first_sample + s.batch <= info.dims[0], where,
                        "samples [" << first_sample << ", " << first_sample + s.batch
                                    << ") lie outside the " << info.dims[0]
                                    << " samples of dataset '" << name << "' in '" << file.path()
                                    << "'");
    dataset = open_dataset(file, name, where);
    chunked = !info.chunk_dims.empty();
  });

  QuietHdf5 quiet;
  const Box box = transfer_box(s, with_ghosts);
  // File side: dims [samples, channels, spatial...].
  const Hid file_space(H5Dget_space(dataset.get()), H5Sclose);
  std::vector<hsize_t> file_start{hsize_t(first_sample), 0};
  std::vector<hsize_t> file_count{hsize_t(s.batch), hsize_t(s.channels)};
  for (int d = 0; d < s.ndims; ++d) {
    file_start.push_back(hsize_t(box.lower[d]));
    file_count.push_back(hsize_t(box.extent[d]));
  }
  herr_t status = H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, file_start.data(), nullptr,
                                      file_count.data(), nullptr);
  // Memory side: the same cells inside the ghosted local array, which has all 5 axes.
  // Both selections are boxes of the same shape (up to axes of extent 1), so HDF5 pairs
  // their cells in the same C order.
  const hsize_t memory_dims[5] = {hsize_t(s.batch), hsize_t(s.channels), hsize_t(s.allocated[0]),
                                  hsize_t(s.allocated[1]), hsize_t(s.allocated[2])};
  hsize_t memory_start[5] = {0, 0, 0, 0, 0};
  hsize_t memory_count[5] = {hsize_t(s.batch), hsize_t(s.channels), 1, 1, 1};
  for (int d = 0; d < max_spatial_dims; ++d) {
    memory_start[2 + d] = hsize_t(box.lower[d] - s.owned.lower[d] + s.ghosts.lower[d]);
    memory_count[2 + d] = hsize_t(box.extent[d]);
  }
  const Hid memory_space(H5Screate_simple(5, memory_dims, nullptr), H5Sclose);
  if (status >= 0)
    status = H5Sselect_hyperslab(memory_space.get(), H5S_SELECT_SET, memory_start, nullptr,
                                 memory_count, nullptr);
  // Collective MPI-IO: the ranks' requests are merged into large contiguous file accesses.
  const Hid transfer_list(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(transfer_list.get(), H5FD_MPIO_COLLECTIVE);
#ifdef OPEN_MPI
  // Open MPI 4.1's default MPI-IO (OMPIO) returned wrong cells for collective reads of
  // chunked datasets when ranks' selections overlap (ghost reads; reproduced in test_io).
  // The call stays collective; only the chunks' file accesses are made independently.
  if (chunked) H5Pset_dxpl_mpio_collective_opt(transfer_list.get(), H5FD_MPIO_INDIVIDUAL_IO);
#endif
  // Every rank takes part even if its selection failed (an empty one), so none hangs.
  if (status < 0) {
    H5Sselect_none(file_space.get());
    H5Sselect_none(memory_space.get());
  }
  const hid_t memory_type = native_type(type);
  const herr_t io_status = write ? H5Dwrite(dataset.get(), memory_type, memory_space.get(),
                                            file_space.get(), transfer_list.get(), data)
                                 : H5Dread(dataset.get(), memory_type, memory_space.get(),
                                           file_space.get(), transfer_list.get(), data);
  std::string error;
  if (status < 0 || io_status < 0) {
    std::ostringstream os;
    os << where << ": " << (write ? "writing" : "reading") << " samples [" << first_sample << ", "
       << first_sample + s.batch << "), cells " << box << " of '" << name << "' in '" << file.path()
       << "' failed on rank " << comm.rank();
    error = os.str();
  }
  comm.agree(error);
}

}  // namespace

void read_shard(const io::File& file, const std::string& name, Index first_sample,
                const ShardLayout& layout, ElementType type, void* data, bool fill_ghosts) {
  transfer(file, name, first_sample, layout, type, data, fill_ghosts, /*write=*/false,
           "io::read_field");
}

void write_shard(io::File& file, const std::string& name, Index first_sample,
                 const ShardLayout& layout, ElementType type, const void* data) {
  transfer(file, name, first_sample, layout, type, const_cast<void*>(data), false,
           /*write=*/true, "io::write_field");
}

}  // namespace shardtensor::impl
