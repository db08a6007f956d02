#pragma once
// Whether layers overlap their forward halo exchange with interior compute: Conv computes
// the outputs whose windows read no exchanged ghost cell while the messages travel, then
// the rest. On by default (the results are the same either way); set_halo_overlap(false)
// exists to measure what the overlap saves (bench_scaling --overlap off). Process-wide.

#include <atomic>

namespace shardtensor {

namespace impl {
inline std::atomic<bool> halo_overlap_on{true};
}  // namespace impl

inline void set_halo_overlap(bool on) noexcept {
  impl::halo_overlap_on.store(on, std::memory_order_relaxed);
}
inline bool halo_overlap() noexcept {
  return impl::halo_overlap_on.load(std::memory_order_relaxed);
}

}  // namespace shardtensor
