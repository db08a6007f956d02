// Replicated arrays: collective creation, rank 0 writes, rank 0 reads and broadcasts.

#include "shardtensor/io/array_io.hpp"

#include <numeric>

#include "hdf5_support.hpp"
#include "shardtensor/core/memory_limits.hpp"

namespace shardtensor::impl {
namespace {

/// Little-endian file type of an element type.
hid_t file_type(ElementType type) {
  switch (type) {
    case ElementType::float32:
      return H5T_IEEE_F32LE;
    case ElementType::float64:
      return H5T_IEEE_F64LE;
    case ElementType::int32:
      return H5T_STD_I32LE;
    case ElementType::int64:
      return H5T_STD_I64LE;
    case ElementType::uint64:
      return H5T_STD_U64LE;
  }
  return H5T_IEEE_F64LE;
}

std::size_t element_size(ElementType type) {
  return type == ElementType::float32 || type == ElementType::int32 ? 4 : 8;
}

Index element_count(const std::vector<Index>& shape) {
  return std::accumulate(shape.begin(), shape.end(), Index(1), std::multiplies<Index>());
}

/// A scalar dataspace for an empty shape, a simple one otherwise.
Hid make_space(const std::vector<Index>& shape) {
  if (shape.empty()) return Hid(H5Screate(H5S_SCALAR), H5Sclose);
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Hid(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
}

}  // namespace

void write_array(io::File& file, const std::string& name, const std::vector<Index>& shape,
                 ElementType type, const void* data) {
  constexpr const char* where = "io::write_array";
  const Communicator& comm = file.communicator();
  agreed(comm, [&] {
    const hid_t fid = file_id(file, where);
    require_writable(file, where);
    for (std::size_t d = 0; d < shape.size(); ++d)
      SHARDTENSOR_REQUIRE(
          shape[d] >= 0, where,
          "negative extent " << shape[d] << " in dim " << d << " of '" << name << "'");
    SHARDTENSOR_REQUIRE(data != nullptr || element_count(shape) == 0, where,
                        "null data for '" << name << "'");
    QuietHdf5 quiet;
    SHARDTENSOR_REQUIRE(!path_exists(fid, name), where,
                        "'" << name << "' already exists in '" << file.path() << "'");
  });
  QuietHdf5 quiet;
  // Creation is collective metadata work; the values are the same everywhere, so only rank 0
  // transfers them (the others take part in the collective write with empty selections).
  const Hid space = make_space(shape);
  const Hid lcpl = intermediate_groups_lcpl();
  const Hid dataset(H5Dcreate2(static_cast<hid_t>(file.id()), name.c_str(), file_type(type),
                               space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose);
  comm.agree(dataset.valid() ? ""
                             : std::string(where) + ": creating '" + name + "' in '" + file.path() +
                                   "' failed");
  const Hid memory_space = make_space(shape);
  if (comm.rank() != 0 || element_count(shape) == 0) {
    H5Sselect_none(memory_space.get());
    H5Sselect_none(space.get());
  }
  const Hid transfer_list(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(transfer_list.get(), H5FD_MPIO_COLLECTIVE);
  const unsigned char dummy = 0;
  const herr_t status = H5Dwrite(dataset.get(), native_type(type), memory_space.get(), space.get(),
                                 transfer_list.get(), data ? data : &dummy);
  comm.agree(status >= 0 ? ""
                         : std::string(where) + ": writing '" + name + "' to '" + file.path() +
                               "' failed on rank " + std::to_string(comm.rank()));
}

void read_array(const io::File& file, const std::string& name, ElementType type,
                std::vector<unsigned char>& bytes, std::vector<Index>& shape) {
  constexpr const char* where = "io::read_array";
  const Communicator& comm = file.communicator();
  // One rank reads (one file access instead of one per rank), then everyone gets a copy.
  agreed(comm, [&] {
    if (comm.rank() != 0) return;
    const Hid dataset = open_dataset(file, name, where);
    const Hid space(H5Dget_space(dataset.get()), H5Sclose);
    const Hid stored_type(H5Dget_type(dataset.get()), H5Tclose);
    const H5T_class_t type_class = H5Tget_class(stored_type.get());
    SHARDTENSOR_REQUIRE(type_class == H5T_FLOAT || type_class == H5T_INTEGER, where,
                        "dataset '" << name << "' in '" << file.path() << "' is not numeric");
    shape = dataspace_dims(space.get());
    // Every rank will hold a copy: a declared size (which a damaged file may make anything)
    // that this node cannot hold is refused before it is allocated.
    std::uint64_t size = element_size(type);
    for (const Index e : shape) size = saturating_product(size, std::uint64_t(e));
    const std::uint64_t available = node_available_bytes();
    SHARDTENSOR_REQUIRE(available == 0 || size <= available, where,
                        "dataset '" << name << "' in '" << file.path() << "' declares ["
                                    << join(shape) << "] values (" << describe_bytes(size)
                                    << "), more than this node has free ("
                                    << describe_bytes(available) << ")");
    bytes.resize(static_cast<std::size_t>(size));
    QuietHdf5 quiet;
    if (!bytes.empty())
      SHARDTENSOR_REQUIRE(H5Dread(dataset.get(), native_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                  bytes.data()) >= 0,
                          where, "reading '" << name << "' from '" << file.path() << "' failed");
  });
  std::vector<std::int64_t> extents(shape.begin(), shape.end());
  comm.broadcast(extents);
  shape.assign(extents.begin(), extents.end());
  comm.broadcast(bytes);
}

}  // namespace shardtensor::impl
