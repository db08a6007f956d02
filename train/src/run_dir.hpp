#pragma once
// The run directory's rules: what a new run may find there, one run at a time, and the files
// rank 0 writes into it.

#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/train/trainer.hpp"

namespace shardtensor::impl {

/// Rank 0 writes `text` to `path`, atomically; errors reach every rank.
void write_text_file(const Communicator& comm, const std::string& path, const std::string& text);

/// Rank 0 creates `path` and its parents; errors reach every rank.
void make_directories(const Communicator& comm, const std::string& path);

/// A new run never mixes with an earlier one in the same run dir: without --resume, a run dir
/// that holds a run is refused, or with --overwrite moved aside to <run_dir>.old (.old.1, ...
/// if taken), never deleted. Rank 0 decides; every rank gets the same error.
void prepare_run_dir(const Communicator& comm, const std::string& run_dir,
                     const TrainOptions& options);

/// One owner per run dir: `<run_dir>.lock` beside it, created atomically by rank 0 and holding
/// the host, PID and start time of the run, removed when the run ends (any end but SIGKILL).
/// A second train or --resume into the same run dir is refused with a message naming the
/// holder; a lock whose process is gone (same host, no such PID) is stale and taken over.
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
