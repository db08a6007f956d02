#include "shardtensor/core/kernel_counter.hpp"

#include <Kokkos_Core.hpp>
#include <atomic>
#include <cstring>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

namespace tools = Kokkos::Tools::Experimental;

std::atomic<bool> counting{false};
std::atomic<std::int64_t> launches{0}, fences{0}, deep_copies{0}, allocations{0};
// The callbacks installed before the counter (a loaded tool's): called first, restored after.
tools::EventSet previous;

void on_launch_for(const char* name, std::uint32_t device, std::uint64_t* id) {
  if (previous.begin_parallel_for) previous.begin_parallel_for(name, device, id);
  ++launches;
}
void on_launch_reduce(const char* name, std::uint32_t device, std::uint64_t* id) {
  if (previous.begin_parallel_reduce) previous.begin_parallel_reduce(name, device, id);
  ++launches;
}
void on_launch_scan(const char* name, std::uint32_t device, std::uint64_t* id) {
  if (previous.begin_parallel_scan) previous.begin_parallel_scan(name, device, id);
  ++launches;
}
void on_fence(const char* name, std::uint32_t device, std::uint64_t* id) {
  if (previous.begin_fence) previous.begin_fence(name, device, id);
  if (std::strncmp(name, "Kokkos::Tools::", 15) != 0) ++fences;  // not a tool's own fence
}
void on_deep_copy(Kokkos::Tools::SpaceHandle dst_space, const char* dst_label, const void* dst,
                  Kokkos::Tools::SpaceHandle src_space, const char* src_label, const void* src,
                  std::uint64_t bytes) {
  if (previous.begin_deep_copy)
    previous.begin_deep_copy(dst_space, dst_label, dst, src_space, src_label, src, bytes);
  ++deep_copies;
}

// Allocation callbacks are chained by the memory tracker as well, so the chain may come back
// here (a tracker enabled while an earlier counter lived calls this one as its previous): a
// nested call returns at once.
thread_local bool in_allocate = false;
void on_allocate(Kokkos::Tools::SpaceHandle space, const char* label, const void* ptr,
                 std::uint64_t bytes) {
  if (in_allocate) return;
  in_allocate = true;
  if (previous.allocate_data) previous.allocate_data(space, label, ptr, bytes);
  in_allocate = false;
  if (counting.load()) ++allocations;
}

}  // namespace

KernelCounter::KernelCounter() {
  SHARDTENSOR_REQUIRE(Kokkos::is_initialized(), "KernelCounter",
                      "Kokkos is not initialized: count after Kokkos::initialize");
  SHARDTENSOR_REQUIRE(!counting.exchange(true), "KernelCounter",
                      "another KernelCounter is alive: one at a time per process");
  previous = tools::get_callbacks();
  reset();
  tools::set_begin_parallel_for_callback(on_launch_for);
  tools::set_begin_parallel_reduce_callback(on_launch_reduce);
  tools::set_begin_parallel_scan_callback(on_launch_scan);
  tools::set_begin_fence_callback(on_fence);
  tools::set_begin_deep_copy_callback(on_deep_copy);
  tools::set_allocate_data_callback(on_allocate);
}

KernelCounter::~KernelCounter() {
  if (Kokkos::is_initialized()) {
    tools::set_begin_parallel_for_callback(previous.begin_parallel_for);
    tools::set_begin_parallel_reduce_callback(previous.begin_parallel_reduce);
    tools::set_begin_parallel_scan_callback(previous.begin_parallel_scan);
    tools::set_begin_fence_callback(previous.begin_fence);
    tools::set_begin_deep_copy_callback(previous.begin_deep_copy);
    // The memory tracker chains allocation callbacks too: if it was enabled after this
    // counter, it calls on_allocate, which then only forwards (counting is off below).
    if (tools::get_callbacks().allocate_data == on_allocate)
      tools::set_allocate_data_callback(previous.allocate_data);
  }
  counting.store(false);
}

KernelCounts KernelCounter::counts() const {
  return {launches.load(), fences.load(), deep_copies.load(), allocations.load()};
}

void KernelCounter::reset() {
  launches = 0, fences = 0, deep_copies = 0, allocations = 0;
}

}  // namespace shardtensor
