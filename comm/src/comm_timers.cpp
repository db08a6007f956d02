#include "shardtensor/comm/comm_timers.hpp"

#include <chrono>

namespace shardtensor {

namespace {

std::atomic<std::int64_t> counted_ns[2]{};
std::atomic<std::uint64_t> counted_bytes[2]{};
// Scopes of each kind open on this thread: only the outermost one counts.
thread_local int depth[2] = {0, 0};

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace impl {

std::atomic<bool> comm_timers_on{false};

std::int64_t comm_timer_enter(CommKind kind) noexcept {
  return depth[int(kind)]++ == 0 ? now_ns() : -1;
}

void comm_timer_leave(CommKind kind, std::int64_t start) noexcept {
  --depth[int(kind)];
  if (start >= 0) counted_ns[int(kind)].fetch_add(now_ns() - start, std::memory_order_relaxed);
}

void count_bytes_sent(CommKind kind, std::uint64_t bytes) noexcept {
  if (comm_timers_on.load(std::memory_order_relaxed))
    counted_bytes[int(kind)].fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace impl

void enable_comm_timers(bool on) noexcept {
  impl::comm_timers_on.store(on, std::memory_order_relaxed);
}

bool comm_timers_enabled() noexcept {
  return impl::comm_timers_on.load(std::memory_order_relaxed);
}

void reset_comm_timers() noexcept {
  for (auto& ns : counted_ns) ns.store(0, std::memory_order_relaxed);
  for (auto& bytes : counted_bytes) bytes.store(0, std::memory_order_relaxed);
}

double comm_seconds(CommKind kind) noexcept {
  return 1e-9 * double(counted_ns[int(kind)].load(std::memory_order_relaxed));
}

std::uint64_t comm_bytes_sent(CommKind kind) noexcept {
  return counted_bytes[int(kind)].load(std::memory_order_relaxed);
}

}  // namespace shardtensor
