#pragma once
// Communication timers: wall seconds this process has spent inside halo exchanges
// (HaloExchange start / finish / reverse_start / reverse_finish) and inside collectives
// (allreduce, allgather(v), reduce-scatter, all-to-all(v), ring shift, redistribute), summed
// since the last reset. They answer "what fraction of a step is communication"
// (bench/bench_scaling). Beside them, the bytes sent to other ranks: by halo exchanges
// (CommKind::halo), and by the point-to-point transfers of operations that pipeline their own
// (CommKind::collective: ring attention's blocks, post_exchange).
//
//   enable_comm_timers();  reset_comm_timers();  ...one step...
//   double halo = comm_seconds(CommKind::halo);
//
// Off by default. While off, a CommTimerScope reads one flag and no clock. Nested scopes of
// one kind count once (redistribute's all-to-all is inside redistribute's scope). Time
// between HaloExchange::start() and finish() is not counted: that is the overlapped interior
// work. finish() counts its wait, including a wait for a slower neighbour.

#include <atomic>
#include <cstdint>

namespace shardtensor {

enum class CommKind : int { halo = 0, collective = 1 };

/// Starts (or stops) counting. Counts are kept until reset_comm_timers().
void enable_comm_timers(bool on = true) noexcept;
bool comm_timers_enabled() noexcept;
/// Sets both counts to zero.
void reset_comm_timers() noexcept;
/// Seconds counted for `kind` since the last reset, on all threads of this process.
double comm_seconds(CommKind kind) noexcept;
/// Bytes this process handed the transport to send to other ranks while counting was on,
/// since the last reset: halo exchanges' (forward and adjoint) for CommKind::halo, post_exchange's
/// for CommKind::collective (the collectives proper are not counted).
std::uint64_t comm_bytes_sent(CommKind kind) noexcept;

namespace impl {
extern std::atomic<bool> comm_timers_on;
/// Enters a scope of `kind` on this thread; returns the start time (ns) of an outermost scope,
/// -1 for a nested one.
std::int64_t comm_timer_enter(CommKind kind) noexcept;
/// Leaves it; an outermost scope (start >= 0) adds its time.
void comm_timer_leave(CommKind kind, std::int64_t start) noexcept;
/// Adds to comm_bytes_sent(kind) while counting is on.
void count_bytes_sent(CommKind kind, std::uint64_t bytes) noexcept;
}  // namespace impl

/// Counts the time until it goes out of scope as communication of `kind`.
class CommTimerScope {
 public:
  explicit CommTimerScope(CommKind kind) noexcept
      : kind_(kind), active_(impl::comm_timers_on.load(std::memory_order_relaxed)) {
    if (active_) start_ = impl::comm_timer_enter(kind);
  }
  ~CommTimerScope() {
    if (active_) impl::comm_timer_leave(kind_, start_);
  }
  CommTimerScope(const CommTimerScope&) = delete;
  CommTimerScope& operator=(const CommTimerScope&) = delete;

 private:
  CommKind kind_;
  bool active_;
  std::int64_t start_ = -1;
};

}  // namespace shardtensor
