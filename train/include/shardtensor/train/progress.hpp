#pragma once
// Progress: what rank 0 shows while training. On a terminal, a bar redrawn in place with
// loss and ETA; otherwise (a log file, CI) one line per epoch.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace shardtensor {

class Progress {
 public:
  Progress(bool enabled, std::int64_t epochs, std::int64_t steps_per_epoch)
      : enabled_(enabled),
        terminal_(enabled && isatty(fileno(stdout))),
        epochs_(epochs),
        steps_(steps_per_epoch),
        start_(std::chrono::steady_clock::now()) {}

  void start_epoch(std::int64_t epoch) {
    epoch_ = epoch;
    if (first_epoch_ < 0) first_epoch_ = epoch;
  }

  void step(std::int64_t step, double loss, double samples_per_s) {
    if (!terminal_) return;
    // mpirun hands ranks a pseudo-terminal even when its own output goes to a file, so
    // redraw at most twice a second: a log stays short either way.
    const double now = seconds();
    if (now - last_draw_ < 0.5 && step + 1 < steps_) return;
    last_draw_ = now;
    const double done = double((epoch_ - first_epoch_) * steps_ + step + 1);
    const double total = double((epochs_ - first_epoch_) * steps_);
    const double elapsed = now;
    const int width = 30, filled = int(width * (step + 1) / steps_);
    std::printf("\repoch %lld/%lld [%s%s] loss %.4e  %.1f samples/s  ETA %s   ",
                (long long)epoch_ + 1, (long long)epochs_, std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), loss, samples_per_s,
                clock(elapsed / done * (total - done)).c_str());
    std::fflush(stdout);
  }

  void end_epoch(double loss, double val_loss, double val_relative_l2, double lr) {
    if (!enabled_) return;
    if (terminal_) std::printf("\r");
    std::printf("epoch %lld/%lld  loss %.4e", (long long)epoch_ + 1, (long long)epochs_, loss);
    if (val_loss >= 0) std::printf("  val_loss %.4e  val_rel_l2 %.4f", val_loss, val_relative_l2);
    std::printf("  lr %.3e  elapsed %s%s\n", lr, clock(seconds()).c_str(),
                terminal_ ? "                    " : "");
    std::fflush(stdout);
  }

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  static std::string clock(double seconds) {
    const long s = long(seconds + 0.5);
    char text[32];
    std::snprintf(text, sizeof text, "%02ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
    return text;
  }

  bool enabled_, terminal_;
  std::int64_t epochs_, steps_, epoch_ = 0, first_epoch_ = -1;
  double last_draw_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace shardtensor
