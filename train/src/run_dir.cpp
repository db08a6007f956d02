#include "run_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/train/checkpoint.hpp"

namespace shardtensor::impl {

namespace fs = std::filesystem;

namespace {

/// What a run dir already holds of an earlier run ("" if nothing): its metrics, config or
/// checkpoints.
std::string earlier_run_in(const std::string& run_dir) {
  std::error_code error;
  std::string found;
  for (const char* name : {"metrics.csv", "config.yaml"})
    if (fs::exists(fs::path(run_dir) / name, error))
      found += std::string(found.empty() ? "" : ", ") + name;
  const auto checkpoints = list_checkpoints((fs::path(run_dir) / "checkpoints").string());
  if (!checkpoints.empty())
    found += (found.empty() ? "" : ", ") + std::to_string(checkpoints.size()) + " checkpoint(s)";
  return found;
}

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

void write_text_file(const Communicator& comm, const std::string& path, const std::string& text) {
  io::AtomicOutput output(comm, path);
  std::string error;
  if (comm.rank() == 0) {
    errno = 0;
    std::ofstream out(output.temporary_path());
    out << text;
    out.close();
    if (!out.good())
      error = "train: cannot write '" + output.temporary_path() +
              "': " + (errno != 0 ? std::strerror(errno) : "the stream failed");
  }
  comm.agree(error);
  output.commit();
}

void make_directories(const Communicator& comm, const std::string& path) {
  std::string error;
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) error = "train: cannot create directory '" + path + "': " + ec.message();
  }
  comm.agree(error);
}

void prepare_run_dir(const Communicator& comm, const std::string& run_dir,
                     const TrainOptions& options) {
  std::string error;
  if (comm.rank() == 0) {
    const std::string earlier = earlier_run_in(run_dir);
    if (!options.resume.empty() && options.overwrite) {
      error =
          "train: --resume and --overwrite exclude each other: --resume continues the run in '" +
          run_dir + "', --overwrite starts a new one there";
    } else if (!earlier.empty() && options.resume.empty()) {
      if (!options.overwrite) {
        error = "train: run_dir '" + run_dir + "' already holds a run (" + earlier +
                "): continue it with --resume latest, start over with --overwrite (the old run "
                "is moved to " +
                run_dir + ".old), or set another run_dir";
      } else {
        std::string aside = run_dir + ".old";
        std::error_code ec;
        for (int i = 1; fs::exists(aside, ec); ++i) aside = run_dir + ".old." + std::to_string(i);
        fs::rename(run_dir, aside, ec);
        if (ec)
          error = "train --overwrite: cannot move '" + run_dir + "' to '" + aside +
                  "': " + ec.message();
        else if (options.progress)
          std::printf("train: moved the earlier run in %s to %s\n", run_dir.c_str(), aside.c_str());
      }
    }
  }
  comm.agree(error);
}

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
