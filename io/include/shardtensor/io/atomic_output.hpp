#pragma once
// AtomicOutput: write a file under a temporary name, rename it over the final path when done.

#include <string>

#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::io {

/// Bad data never overwrites good data:
///
///   AtomicOutput out(comm, "run/checkpoint.h5");
///   File f = File::create(comm, out.temporary_path());
///   ... write ...
///   f.close();
///   out.commit();   // rank 0 renames the temporary over run/checkpoint.h5
///
/// The temporary lies in the same directory (so the rename is atomic on POSIX file
/// systems). If commit() is never reached (an exception), the destructor removes the
/// temporary and the old final file is untouched.
class AtomicOutput {
 public:
  /// Collective: rank 0 chooses the temporary name and broadcasts it.
  AtomicOutput(const Communicator& comm, std::string final_path);
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;
  /// Without commit(): rank 0 removes the temporary (not collective, safe during unwinding).
  ~AtomicOutput();

  const std::string& temporary_path() const { return temporary_path_; }
  const std::string& final_path() const { return final_path_; }
  bool committed() const { return committed_; }

  /// Collective, after every rank has closed the file: rank 0 renames the temporary over
  /// the final path. Throws on every rank if the rename fails (the temporary is removed).
  void commit();

 private:
  Communicator comm_;
  std::string final_path_;
  std::string temporary_path_;
  bool committed_ = false;
  int signal_slot_ = -1;  // where remove_temporaries_on_signal finds the temporary (every rank)
};

/// From now on SIGINT, SIGTERM and SIGHUP first remove the temporaries of the outputs not yet
/// committed, then end the process as the signal would have: for commands with no step
/// boundary to stop at (generate, infer). A signal that has a handler already keeps it.
void remove_temporaries_on_signal();

}  // namespace shardtensor::io
