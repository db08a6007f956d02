#pragma once
// MetricsFile: the run dir's metrics.csv, written by rank 0, one row per optimizer step.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::impl {

/// metrics.csv: one row per optimizer step; validation columns on the last step of an
/// epoch that validated. Resuming drops rows past the checkpoint's step.
class MetricsFile {
 public:
  /// Collective: rank 0 reads and rewrites the file; a row it cannot read (a hand-edited
  /// line) stops every rank before the file is touched.
  MetricsFile(const Communicator& comm, const std::string& path, std::int64_t resumed_step)
      : enabled_(comm.rank() == 0) {
    comm.agree(enabled_ ? open(path, resumed_step) : std::string());
  }

  void row(std::int64_t step, std::int64_t epoch, double loss, double val_loss, double val_rel,
           double lr, double grad_norm, double samples_per_s) {
    if (!enabled_) return;
    char line[512];
    std::snprintf(line, sizeof line, "%lld,%lld,%.9g,", (long long)step, (long long)epoch, loss);
    out_ << line;
    if (val_loss >= 0) {
      std::snprintf(line, sizeof line, "%.9g,%.9g,", val_loss, val_rel);
      out_ << line;
    } else {
      out_ << ",,";
    }
    std::snprintf(line, sizeof line, "%.9g,%.9g,%.6g\n", lr, grad_norm, samples_per_s);
    out_ << line;
    out_.flush();
    note_failure();
  }

  /// The first write that failed, with the OS's reason ("" if none). Rank 0 writes alone, so
  /// the caller agrees on it over the ranks where no other collective is in flight.
  const std::string& error() const { return error_; }

 private:
  /// Keeps the rows up to `resumed_step` and reopens the file for the next ones; returns why
  /// a row cannot be read ("" otherwise; write failures wait in error()).
  std::string open(const std::string& path, std::int64_t resumed_step) {
    std::vector<std::string> kept;
    std::error_code ec;
    if (resumed_step > 0 &&
        std::filesystem::is_regular_file(path, ec)) {  // not a device that never ends
      std::ifstream in(path);
      std::string line;
      std::getline(in, line);  // header
      for (int number = 2; std::getline(in, line); ++number) {
        if (line.empty()) continue;
        const std::string first = line.substr(0, line.find(','));
        std::size_t used = 0;
        long long step = 0;
        try {
          step = std::stoll(first, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != first.size())
          return "train: cannot resume with " + path + ": line " + std::to_string(number) +
                 " does not start with a step number: '" +
                 (line.size() > 80 ? line.substr(0, 80) + "..." : line) +
                 "' (a hand-edited line? remove it)";
        if (step <= resumed_step) kept.push_back(line);
      }
    }
    path_ = path;
    errno = 0;
    out_.open(path, std::ios::trunc);
    out_ << "step,epoch,loss,val_loss,val_rel_l2,lr,grad_norm,samples_per_s\n";
    for (const std::string& line : kept) out_ << line << "\n";
    out_.flush();
    note_failure();
    return "";
  }

  void note_failure() {
    if (out_.good() || !error_.empty()) return;
    error_ = "train: cannot write '" + path_ +
             "': " + (errno != 0 ? std::strerror(errno) : "the stream failed");
  }

  bool enabled_;
  std::string path_, error_;
  std::ofstream out_;
};

}  // namespace shardtensor::impl
