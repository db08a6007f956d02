// AtomicOutput: temporary name in the final directory, renamed by rank 0 on commit.

#include "shardtensor/io/atomic_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "shardtensor/core/error.hpp"

namespace shardtensor::io {

AtomicOutput::AtomicOutput(const Communicator& comm, std::string final_path)
    : comm_(comm), final_path_(std::move(final_path)) {
  SHARDTENSOR_REQUIRE(!final_path_.empty(), "io::AtomicOutput", "empty output path");
  // Same directory as the final file (so rename() is atomic); process id and clock make the
  // name unique between concurrent jobs. Rank 0 picks it, every rank uses it.
  // The directory must take a new file: say why not (the OS's reason) before HDF5 tries.
  std::string problem;
  if (comm_.rank() == 0) {
    const std::filesystem::path parent = std::filesystem::path(final_path_).parent_path().empty()
                                             ? std::filesystem::path(".")
                                             : std::filesystem::path(final_path_).parent_path();
    if (::access(parent.c_str(), W_OK | X_OK) != 0)
      problem = "io::AtomicOutput: cannot write '" + final_path_ + "': directory '" +
                parent.string() + "': " + std::strerror(errno);
  }
  comm_.agree(problem);
  if (comm_.rank() == 0) {
    const auto ticks = std::chrono::steady_clock::now().time_since_epoch().count();
    temporary_path_ = final_path_ + ".tmp-" + std::to_string(::getpid()) + "-" +
                      std::to_string(static_cast<unsigned long long>(ticks) % 1000000007ull);
  }
  comm_.broadcast(temporary_path_);
}

AtomicOutput::~AtomicOutput() {
  if (!committed_ && comm_.rank() == 0) std::remove(temporary_path_.c_str());
}

void AtomicOutput::commit() {
  SHARDTENSOR_REQUIRE(!committed_, "io::AtomicOutput::commit",
                      "'" << final_path_ << "' was already committed");
  // Every rank got here, so every rank wrote and closed its part without error.
  comm_.barrier();
  std::string error;
  if (comm_.rank() == 0 && std::rename(temporary_path_.c_str(), final_path_.c_str()) != 0) {
    error = "io::AtomicOutput::commit: renaming '" + temporary_path_ + "' to '" + final_path_ +
            "' failed: " + std::strerror(errno);
    std::remove(temporary_path_.c_str());
  }
  committed_ = true;  // either renamed or removed: nothing left for the destructor
  comm_.agree(error);
}

}  // namespace shardtensor::io
