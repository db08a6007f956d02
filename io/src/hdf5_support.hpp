#pragma once
// Private helpers of the io module: HDF5 handles, quiet error stacks, agreed errors.

#include <hdf5.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/types.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/io/impl/element_type.hpp"

namespace shardtensor::impl {

static_assert(sizeof(hid_t) == sizeof(std::int64_t), "File::id() stores an hid_t");

/// Owns an HDF5 identifier and closes it with the matching H5?close.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

/// Silences HDF5's automatic error-stack printing for the lifetime of the object (the io
/// module reports its own errors), restoring the caller's setting afterwards.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

/// Runs `body` on this rank and agrees on errors: if it threw on any rank, every rank throws
/// the lowest failing rank's message. `body` must not call collective operations that
/// could be left half-done by another rank's failure.
template <class F>
void agreed(const Communicator& comm, F&& body) {
  std::string error;
  try {
    body();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  comm.agree(error);
}

/// The file's HDF5 id, after checking that it is open.
hid_t file_id(const io::File& file, const char* where);
/// Throws unless the file was opened for writing.
void require_writable(const io::File& file, const char* where);

/// Native memory type of an element type.
hid_t native_type(ElementType type);

/// Opens dataset `name`; a missing one's error lists the datasets that exist.
Hid open_dataset(const io::File& file, const std::string& name, const char* where);
/// Opens group or dataset `object` ("/" or "" for the root).
Hid open_object(const io::File& file, const std::string& object, const char* where);
/// True if every component of the path `name` exists (no error if a parent is missing).
bool path_exists(hid_t file, const std::string& name);

/// Paths of the datasets under `group`, relative to it, sorted (a local metadata read).
std::vector<std::string> dataset_names(hid_t group);

/// Link creation property list that creates intermediate groups.
Hid intermediate_groups_lcpl();

/// Dataspace extents of a dataset.
std::vector<Index> dataspace_dims(hid_t space);

/// validate_field_dataset without agreement (a local metadata read); returns the info.
io::DatasetInfo check_field_dataset(const io::File& file, const std::string& name, Index channels,
                                    const std::vector<Index>& global_extents, const char* where);

/// Comma-separated list.
std::string join(const std::vector<Index>& values);

}  // namespace shardtensor::impl
