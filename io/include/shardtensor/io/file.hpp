#pragma once
// File: a parallel HDF5 file opened collectively over a Communicator (MPI-IO driver).

#include <cstdint>
#include <optional>
#include <string>

#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::io {

/// How File::open opens an existing file.
enum class Mode { read, read_write };

/// An HDF5 file opened by every rank of a communicator through MPI-IO, closed when the
/// last handle goes away. Move-only.
///
/// Every function of the io module that takes a File is collective over its communicator:
/// all ranks call it, in the same order. Errors are agreed between ranks (the lowest
/// failing rank's message is thrown on every rank), so no rank is left waiting.
class File {
 public:
  /// Creates (truncating) `path` for reading and writing. Collective.
  static File create(const Communicator& comm, const std::string& path);
  /// Opens an existing HDF5 file. Collective. Throws on every rank if `path` is missing or
  /// not an HDF5 file; the message names the path.
  static File open(const Communicator& comm, const std::string& path, Mode mode = Mode::read);

  File() = default;
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  /// Closes the file if still open (errors ignored; call close() to see them).
  ~File();

  /// Flushes and closes. Collective; throws on every rank if any rank failed.
  void close();

  bool is_open() const { return id_ >= 0; }
  const std::string& path() const { return path_; }
  Mode mode() const { return mode_; }
  /// The communicator the file was opened over (the file must be open).
  const Communicator& communicator() const { return *comm_; }
  /// The HDF5 file identifier (an hid_t), for direct HDF5 calls.
  std::int64_t id() const { return id_; }

 private:
  File(const Communicator& comm, std::int64_t id, std::string path, Mode mode)
      : comm_(comm), id_(id), path_(std::move(path)), mode_(mode) {}
  void release() noexcept;

  std::optional<Communicator> comm_;
  std::int64_t id_ = -1;
  std::string path_;
  Mode mode_ = Mode::read;
};

/// Turns HDF5's automatic printing of its error stack on or off for this process. The io
/// module never lets HDF5 print during its own calls (it reports shardtensor::Error
/// instead); this switch is for the caller's direct HDF5 calls.
void set_hdf5_error_printing(bool enabled);

}  // namespace shardtensor::io
