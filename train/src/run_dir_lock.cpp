#include "run_dir_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <fstream>
#include <sstream>

namespace shardtensor::impl {

namespace {

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("?");
}

std::string now_text() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

/// Whether the lock's holder, as the file names it, is a process that is gone from this host.
bool stale(const std::string& host, long pid) {
  return host == host_name() && pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

RunDirLock::RunDirLock(const Communicator& comm, const std::string& run_dir)
    : path_(run_dir + ".lock") {
  std::string error;
  if (comm.rank() == 0) {
    content_ = host_name() + " " + std::to_string(long(getpid())) + " " + now_text() + "\n";
    for (int attempt = 0; attempt < 2 && !held_ && error.empty(); ++attempt) {
      const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd >= 0) {
        held_ = ::write(fd, content_.data(), content_.size()) == ssize_t(content_.size());
        ::close(fd);
        if (!held_) ::unlink(path_.c_str());
        break;
      }
      // Where no lock file can be made (a missing parent, a file in the way, no permission),
      // the run dir checks that follow name the cause.
      if (errno != EEXIST) break;
      std::ifstream in(path_);
      std::string host, started;
      long pid = 0;
      in >> host >> pid >> started;
      if (attempt == 0 && stale(host, pid)) {
        ::unlink(path_.c_str());  // its process is gone: take it over
        continue;
      }
      std::ostringstream message;
      message << "train: run_dir '" << run_dir << "' is in use by another train (host "
              << (host.empty() ? "?" : host) << ", PID " << pid << ", since "
              << (started.empty() ? "?" : started) << "; lock file " << path_
              << "): wait for it to end, or remove " << path_ << " if that process is gone";
      error = message.str();
    }
  }
  comm.agree(error);
}

RunDirLock::~RunDirLock() {
  if (!held_) return;
  std::ifstream in(path_);
  std::stringstream text;
  text << in.rdbuf();
  if (text.str() == content_) ::unlink(path_.c_str());
}

}  // namespace shardtensor::impl
