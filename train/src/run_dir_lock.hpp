#pragma once
// One owner per run dir: `<run_dir>.lock` beside it, created atomically by rank 0 and holding
// the host, PID and start time of the run, removed when the run ends (any end but SIGKILL).
// A second train or --resume into the same run dir is refused with a message naming the
// holder; a lock whose process is gone (same host, no such PID) is stale and taken over.

#include <string>

#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::impl {

class RunDirLock {
 public:
  /// Collective: every rank throws the same error when another run holds the run dir.
  RunDirLock(const Communicator& comm, const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  std::string path_;
  std::string content_;  // what this run wrote: removed only if the file still says so
  bool held_ = false;
};

}  // namespace shardtensor::impl
