// File: collective open/create/close of parallel HDF5 files, and shared HDF5 helpers.

#include "shardtensor/io/file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "hdf5_support.hpp"
#include "shardtensor/core/input_file.hpp"
#include "shardtensor/io/dataset.hpp"

namespace shardtensor {
namespace impl {

hid_t file_id(const io::File& file, const char* where) {
  SHARDTENSOR_REQUIRE(file.is_open(), where, "the file is not open");
  return static_cast<hid_t>(file.id());
}

void require_writable(const io::File& file, const char* where) {
  SHARDTENSOR_REQUIRE(file.mode() == io::Mode::read_write, where,
                      "'" << file.path() << "' is open read-only");
}

hid_t native_type(ElementType type) {
  switch (type) {
    case ElementType::float32:
      return H5T_NATIVE_FLOAT;
    case ElementType::float64:
      return H5T_NATIVE_DOUBLE;
    case ElementType::int32:
      return H5T_NATIVE_INT32;
    case ElementType::int64:
      return H5T_NATIVE_INT64;
    case ElementType::uint64:
      return H5T_NATIVE_UINT64;
  }
  return H5T_NATIVE_DOUBLE;
}

bool path_exists(hid_t file, const std::string& name) {
  // H5Lexists fails (rather than returning false) when a parent group is missing, so walk
  // the path one component at a time.
  std::string prefix;
  std::istringstream parts(name);
  std::string part;
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    prefix += "/" + part;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return !prefix.empty();
}

Hid open_dataset(const io::File& file, const std::string& name, const char* where) {
  const hid_t fid = file_id(file, where);
  QuietHdf5 quiet;
  if (!path_exists(fid, name)) {
    std::string existing;
    const std::vector<std::string> names = dataset_names(fid);
    for (std::size_t i = 0; i < names.size(); ++i) existing += (i ? ", " : "") + names[i];
    SHARDTENSOR_FAIL(where, "no dataset '" << name << "' in '" << file.path() << "'; it has "
                                           << (names.empty() ? "no datasets" : existing));
  }
  Hid dataset(H5Dopen2(fid, name.c_str(), H5P_DEFAULT), H5Dclose);
  SHARDTENSOR_REQUIRE(dataset.valid(), where,
                      "'" << name << "' in '" << file.path() << "' is not a dataset");
  return dataset;
}

Hid open_object(const io::File& file, const std::string& object, const char* where) {
  const hid_t fid = file_id(file, where);
  const std::string path = object.empty() ? "/" : object;
  QuietHdf5 quiet;
  SHARDTENSOR_REQUIRE(path == "/" || path_exists(fid, path), where,
                      "no object '" << path << "' in '" << file.path() << "'");
  Hid id(H5Oopen(fid, path.c_str(), H5P_DEFAULT), H5Oclose);
  SHARDTENSOR_REQUIRE(id.valid(), where, "cannot open '" << path << "' in '" << file.path() << "'");
  return id;
}

Hid intermediate_groups_lcpl() {
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  return lcpl;
}

std::vector<Index> dataspace_dims(hid_t space) {
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<Index>(dims.begin(), dims.end());
}

std::string join(const std::vector<Index>& values) {
  std::ostringstream os;
  for (std::size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  return os.str();
}

namespace {

/// File access property list for MPI-IO over `comm`.
Hid mpio_access(const Communicator& comm) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm.get(), MPI_INFO_NULL);
  return fapl;
}

/// Agrees on whether the collective open/create succeeded everywhere; a rank that got a
/// handle while another failed closes it before throwing.
void agree_on_open(const Communicator& comm, hid_t id, const std::string& message) {
  try {
    comm.agree(id < 0 ? message : "");
  } catch (...) {
    if (id >= 0) H5Fclose(id);
    throw;
  }
}

/// Why H5Fopen refused a file that exists and that H5Fis_hdf5 recognised: the permissions, or
/// else a damaged file (its size included: a truncated copy is the common case), or a lock.
std::string why_open_failed(const std::string& path, bool write) {
  if (::access(path.c_str(), R_OK) != 0)
    return std::string("no permission to read it (") + std::strerror(errno) + ")";
  if (write && ::access(path.c_str(), W_OK) != 0)
    return std::string("no permission to write it (") + std::strerror(errno) + ")";
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  return "the HDF5 file is damaged (truncated or corrupt; " +
         (ec ? std::string("size unknown") : std::to_string(bytes) + " bytes") +
         "), or another process holds it open with HDF5 file locking";
}

}  // namespace
}  // namespace impl

namespace io {

File File::create(const Communicator& comm, const std::string& path) {
  impl::QuietHdf5 quiet;
  const impl::Hid fapl = impl::mpio_access(comm);
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  impl::agree_on_open(comm, id,
                      "io::File::create: cannot create '" + path +
                          "' (missing directory, no permission, or open elsewhere?)");
  return File(comm, id, path, Mode::read_write);
}

File File::open(const Communicator& comm, const std::string& path, Mode mode) {
  impl::QuietHdf5 quiet;
  // Rank 0 diagnoses the common failures first, so every rank gets the same clear message.
  impl::agreed(comm, [&] {
    if (comm.rank() != 0) return;
    std::error_code ec;
    SHARDTENSOR_REQUIRE(std::filesystem::exists(path, ec) || ec, "io::File::open",
                        "no file '" << path << "'");
    SHARDTENSOR_REQUIRE(!std::filesystem::is_directory(path, ec), "io::File::open",
                        "'" << path << "' is a directory, not an HDF5 file");
    // Symlink loops, named pipes (whose open waits for a writer forever), unreadable files.
    require_input_file(path, "file", "io::File::open");
    SHARDTENSOR_REQUIRE(std::filesystem::file_size(path, ec) > 0, "io::File::open",
                        "'" << path << "' is empty (0 bytes), not an HDF5 file");
    SHARDTENSOR_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "io::File::open",
                        "'" << path << "' is not an HDF5 file");
  });
  const impl::Hid fapl = impl::mpio_access(comm);
  const hid_t id =
      H5Fopen(path.c_str(), mode == Mode::read ? H5F_ACC_RDONLY : H5F_ACC_RDWR, fapl.get());
  impl::agree_on_open(comm, id,
                      "io::File::open: cannot open '" + path + "'" +
                          (mode == Mode::read_write ? " for writing" : "") + ": " +
                          impl::why_open_failed(path, mode == Mode::read_write));
  return File(comm, id, path, mode);
}

File::File(File&& other) noexcept
    : comm_(std::move(other.comm_)),
      id_(std::exchange(other.id_, -1)),
      path_(std::move(other.path_)),
      mode_(other.mode_) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::move(other.comm_);
    id_ = std::exchange(other.id_, -1);
    path_ = std::move(other.path_);
    mode_ = other.mode_;
  }
  return *this;
}

File::~File() {
  release();
}

void File::release() noexcept {
  if (id_ < 0) return;
  impl::QuietHdf5 quiet;
  H5Fclose(static_cast<hid_t>(id_));
  id_ = -1;
}

void File::close() {
  if (id_ < 0) return;
  impl::QuietHdf5 quiet;
  const herr_t status = H5Fclose(static_cast<hid_t>(id_));
  id_ = -1;
  comm_->agree(status < 0 ? "io::File::close: closing '" + path_ + "' failed" : "");
}

void set_hdf5_error_printing(bool enabled) {
  if (enabled) {
    H5Eset_auto2(H5E_DEFAULT, reinterpret_cast<H5E_auto2_t>(H5Eprint2), stderr);
  } else {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
}

}  // namespace io
}  // namespace shardtensor
