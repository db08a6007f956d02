// Dataset introspection, listing, validation and creation of field datasets.

#include "shardtensor/io/dataset.hpp"

#include <algorithm>
#include <sstream>

#include "hdf5_support.hpp"

namespace shardtensor {
namespace impl {

std::vector<std::string> dataset_names(hid_t group) {
  std::vector<std::string> names;
  QuietHdf5 quiet;
  H5Lvisit(
      group, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t parent, const char* link, const H5L_info_t*, void* out) -> herr_t {
        const Hid object(H5Oopen(parent, link, H5P_DEFAULT), H5Oclose);
        if (object.valid() && H5Iget_type(object.get()) == H5I_DATASET)
          static_cast<std::vector<std::string>*>(out)->push_back(link);
        return 0;
      },
      &names);
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

std::string describe_type(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  const std::size_t bits = 8 * H5Tget_size(type);
  switch (type_class) {
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    default:
      return "other";
  }
}

/// dataset_info without agreement (a local metadata read).
io::DatasetInfo local_info(const io::File& file, const std::string& name, const char* where) {
  const Hid dataset = open_dataset(file, name, where);
  const Hid space(H5Dget_space(dataset.get()), H5Sclose);
  const Hid type(H5Dget_type(dataset.get()), H5Tclose);
  const Hid dcpl(H5Dget_create_plist(dataset.get()), H5Pclose);
  io::DatasetInfo info;
  info.dims = dataspace_dims(space.get());
  info.type_description = describe_type(type.get());
  if (H5Tget_class(type.get()) == H5T_FLOAT) {
    const std::size_t size = H5Tget_size(type.get());
    if (size == 4) info.dtype = io::DataType::float32;
    if (size == 8) info.dtype = io::DataType::float64;
  }
  if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(info.dims.size());
    H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    info.chunk_dims.assign(chunk.begin(), chunk.end());
  }
  return info;
}

const char* axis_name(std::size_t dim) {
  static const char* names[] = {"samples", "channels", "spatial x", "spatial y", "spatial z"};
  return names[std::min<std::size_t>(dim, 4)];
}

}  // namespace

io::DatasetInfo check_field_dataset(const io::File& file, const std::string& name, Index channels,
                                    const std::vector<Index>& global_extents, const char* where) {
  const io::DatasetInfo info = local_info(file, name, where);
  const std::size_t want_rank = 2 + global_extents.size();
  std::vector<Index> expected{-1, channels};
  expected.insert(expected.end(), global_extents.begin(), global_extents.end());
  SHARDTENSOR_REQUIRE(info.dims.size() == want_rank, where,
                      "dataset '" << name << "' in '" << file.path() << "' has " << info.dims.size()
                                  << " dims [" << join(info.dims) << "], expected " << want_rank
                                  << " ([samples, channels, " << global_extents.size()
                                  << " spatial] = [samples, "
                                  << join({expected.begin() + 1, expected.end()}) << "])");
  for (std::size_t d = 1; d < want_rank; ++d)
    SHARDTENSOR_REQUIRE(info.dims[d] == expected[d], where,
                        "dataset '" << name << "' in '" << file.path() << "': dim " << d << " ("
                                    << axis_name(d) << ") is " << info.dims[d] << ", expected "
                                    << expected[d] << " (dims [" << join(info.dims) << "])");
  SHARDTENSOR_REQUIRE(info.dtype.has_value(), where,
                      "dataset '" << name << "' in '" << file.path() << "' holds "
                                  << info.type_description << ", expected float32 or float64");
  return info;
}

}  // namespace impl

namespace io {

const char* to_string(DataType type) {
  return type == DataType::float32 ? "float32" : "float64";
}

std::string DatasetInfo::shape() const {
  return "[" + impl::join(dims) + "]";
}

DatasetInfo dataset_info(const File& file, const std::string& name) {
  DatasetInfo info;
  impl::agreed(file.communicator(),
               [&] { info = impl::local_info(file, name, "io::dataset_info"); });
  return info;
}

bool has_dataset(const File& file, const std::string& name) {
  bool found = false;
  impl::agreed(file.communicator(), [&] {
    const hid_t fid = impl::file_id(file, "io::has_dataset");
    impl::QuietHdf5 quiet;
    if (!impl::path_exists(fid, name)) return;
    const impl::Hid object(H5Oopen(fid, name.c_str(), H5P_DEFAULT), H5Oclose);
    found = object.valid() && H5Iget_type(object.get()) == H5I_DATASET;
  });
  return found;
}

std::vector<std::string> list_datasets(const File& file, const std::string& group) {
  std::vector<std::string> names;
  impl::agreed(file.communicator(), [&] {
    const impl::Hid object = impl::open_object(file, group, "io::list_datasets");
    SHARDTENSOR_REQUIRE(H5Iget_type(object.get()) == H5I_GROUP, "io::list_datasets",
                        "'" << group << "' in '" << file.path() << "' is not a group");
    names = impl::dataset_names(object.get());
  });
  return names;
}

void validate_field_dataset(const File& file, const std::string& name, Index channels,
                            const std::vector<Index>& global_extents) {
  impl::agreed(file.communicator(), [&] {
    impl::check_field_dataset(file, name, channels, global_extents, "io::validate_field_dataset");
  });
}

void create_field_dataset(File& file, const std::string& name, Index samples, Index channels,
                          const std::vector<Index>& global_extents, DataType type,
                          const std::vector<Index>& chunk_dims) {
  constexpr const char* where = "io::create_field_dataset";
  std::vector<hsize_t> dims{static_cast<hsize_t>(samples), static_cast<hsize_t>(channels)};
  impl::agreed(file.communicator(), [&] {
    const hid_t fid = impl::file_id(file, where);
    impl::require_writable(file, where);
    SHARDTENSOR_REQUIRE(samples >= 1 && channels >= 1, where,
                        "samples " << samples << " and channels " << channels
                                   << " must be positive (dataset '" << name << "')");
    SHARDTENSOR_REQUIRE(!global_extents.empty() && global_extents.size() <= 3, where,
                        global_extents.size()
                            << " spatial dims (1 to 3 supported) for '" << name << "'");
    for (std::size_t d = 0; d < global_extents.size(); ++d) {
      SHARDTENSOR_REQUIRE(global_extents[d] >= 1, where,
                          "global extent " << global_extents[d] << " in spatial dim " << d
                                           << " of '" << name << "'");
      dims.push_back(static_cast<hsize_t>(global_extents[d]));
    }
    SHARDTENSOR_REQUIRE(chunk_dims.empty() || chunk_dims.size() == dims.size(), where,
                        chunk_dims.size() << " chunk dims for the " << dims.size()
                                          << "-dim dataset '" << name << "'");
    for (std::size_t d = 0; d < chunk_dims.size(); ++d)
      SHARDTENSOR_REQUIRE(chunk_dims[d] >= 1 && hsize_t(chunk_dims[d]) <= dims[d], where,
                          "chunk dim " << d << " is " << chunk_dims[d] << ", must be in [1, "
                                       << dims[d] << "] for '" << name << "'");
    impl::QuietHdf5 quiet;
    SHARDTENSOR_REQUIRE(!impl::path_exists(fid, name), where,
                        "'" << name << "' already exists in '" << file.path() << "'");
  });
  // Creation is a collective metadata operation: every rank, same arguments.
  bool created = false;
  {
    impl::QuietHdf5 quiet;
    const hid_t fid = static_cast<hid_t>(file.id());
    const impl::Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                          H5Sclose);
    const impl::Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (!chunk_dims.empty()) {
      const std::vector<hsize_t> chunk(chunk_dims.begin(), chunk_dims.end());
      H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    }
    // Every cell is written by write_field: skip writing fill values at allocation.
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    const impl::Hid lcpl = impl::intermediate_groups_lcpl();
    const impl::Hid dataset(
        H5Dcreate2(fid, name.c_str(), type == DataType::float32 ? H5T_IEEE_F32LE : H5T_IEEE_F64LE,
                   space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
        H5Dclose);
    created = dataset.valid();
  }
  file.communicator().agree(created ? ""
                                    : std::string(where) + ": creating '" + name + "' in '" +
                                          file.path() + "' failed");
}

}  // namespace io
}  // namespace shardtensor
