// AtomicOutput: temporary name in the final directory, renamed by rank 0 on commit.

#include "shardtensor/io/atomic_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "shardtensor/core/error.hpp"

namespace shardtensor::io {

namespace {

// The temporaries a signal handler removes: fixed storage, so the handler reads no heap.
constexpr int signal_slots = 16;
constexpr std::size_t slot_bytes = 4096;
char temporaries[signal_slots][slot_bytes];
volatile std::sig_atomic_t slot_used[signal_slots];
std::mutex slot_mutex;

int hold_for_signals(const std::string& path) {
  const std::lock_guard<std::mutex> lock(slot_mutex);
  for (int i = 0; i < signal_slots; ++i)
    if (!slot_used[i] && path.size() < slot_bytes) {
      std::memcpy(temporaries[i], path.c_str(), path.size() + 1);
      slot_used[i] = 1;
      return i;
    }
  return -1;  // more than 16 at once: that one is left to the destructor
}

void release_for_signals(int& slot) {
  if (slot >= 0) slot_used[slot] = 0;
  slot = -1;
}

extern "C" void remove_temporaries_and_die(int signal) {
  for (int i = 0; i < signal_slots; ++i)
    if (slot_used[i]) ::unlink(temporaries[i]);  // async-signal-safe
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

void remove_temporaries_on_signal() {
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
    struct sigaction handler {};
    handler.sa_handler = remove_temporaries_and_die;
    sigemptyset(&handler.sa_mask);
    sigaction(signal, &handler, nullptr);
  }
}

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
  // Every rank removes it on a signal, not rank 0 alone: when mpirun forwards a SIGTERM, the
  // first rank to die makes it kill the others, rank 0 perhaps before its handler ran.
  signal_slot_ = hold_for_signals(temporary_path_);
}

AtomicOutput::~AtomicOutput() {
  if (!committed_ && comm_.rank() == 0) std::remove(temporary_path_.c_str());
  release_for_signals(signal_slot_);
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
  release_for_signals(signal_slot_);
  comm_.agree(error);
}

}  // namespace shardtensor::io
