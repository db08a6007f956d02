#pragma once
// Memory tracker: current and peak bytes of this process's Kokkos allocations, in total and by
// category (parameters, optimizer state, activations, workspaces, communication buffers,
// other), an optional per-rank budget, and a report reduced over the ranks.
//
//   enable_memory_tracking();                      // the CLI and the benchmarks do this
//   { MemoryCategoryScope scope(MemoryCategory::optimizer_state);  // at the allocating code
//     state = ReplicatedView<float>("exp_avg/w", n); }
//   reset_memory_peak();  ...one step...  memory_report(world).describe();  //
//   comm/memory_budget.hpp
//
// How it sees allocations: Kokkos's tool hooks (Kokkos::Tools::Experimental::
// set_allocate_data_callback / set_deallocate_data_callback, the same in Kokkos 3.4 and 4.x)
// report every managed View allocation and deallocation, in every memory space, with its label,
// pointer and size. Unmanaged Views (a solver's arrays wrapped without a copy) allocate
// nothing and are not counted. While tracking is off no hook is installed: Kokkos does exactly
// what it does without the tracker, and MemoryCategoryScope costs two thread-local stores.
//
// How an allocation gets its category: from the innermost MemoryCategoryScope alive on the
// allocating thread when the View is allocated (default: other); the category is remembered
// with the pointer, so the deallocation leaves the same category whatever scope frees it.
// Scopes rather than rules on View labels: labels are free-form text chosen all over the code
// (a rule on "*.grad" or "conv_workspace" breaks silently when someone renames a label), while
// a scope is one line at the few places that own a kind of memory (Module::register_parameter,
// the optimizer's state, the conv workspace, halo and all-to-all buffers, FFT plans) plus one
// around the training step's forward and backward, which makes everything the autodiff graph
// allocates there an activation unless an inner scope says otherwise. One label rule remains:
// Kokkos's internal buffers (labels "Kokkos::...", e.g. the reduction scratch, grown on first
// use and kept) are always other, whatever scope was open. The current category is per
// thread, so the data loader's prefetch thread, which reads the next batch during the step,
// does not charge its buffers to the step's activations.
//
// Freed memory that the C library keeps for reuse (keep_freed_memory() in
// allocation_cache.hpp) is not a Kokkos allocation and is not in the totals: the tracker
// counts live allocations, which is what the budget bounds and what the next allocation
// cannot reuse. It is resident, so MemorySnapshot::heap_free_bytes reports it separately
// (glibc's count of free heap bytes) for comparison with the resident set size.
//
// Budget: set_memory_budget(bytes) records, inside the allocation hook, the first allocation
// that takes the tracked total above the budget (throwing from inside Kokkos's allocation
// path is not safe: it would unwind through Kokkos's allocation record half made). The
// overflow is raised by check_memory_budget(comm) (comm/memory_budget.hpp: the tracker itself
// never communicates), which the training step calls after the
// forward pass and after backward: one small allreduce agrees the outcome, so every rank
// throws the same shardtensor::Error together and none is left waiting in a collective.
//
// Process-wide state, thread-safe. Enable it after Kokkos::initialize.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace shardtensor {

/// What an allocation is for. The order is the report's order.
enum class MemoryCategory : std::uint8_t {
  parameters,       ///< model parameters and their gradients (replicated)
  optimizer_state,  ///< momentum, Adam moments
  activations,      ///< values and gradients of the autodiff graph (saved for backward)
  workspaces,       ///< conv scratch (im2col, packed weights), FFT work arrays
  comm_buffers,     ///< halo exchange and all-to-all (redistribution, FFT transpose) buffers
  other,            ///< everything else: inputs, loaders, layer buffers, Kokkos internals
};
inline constexpr int memory_category_count = 6;

/// "parameters", "optimizer_state", ... (the enumerator's name).
const char* to_string(MemoryCategory category);

/// The category allocations on this thread are charged to now (other outside any scope).
MemoryCategory current_memory_category() noexcept;

/// Charges Kokkos allocations made on this thread while it lives to `category`; restores the
/// previous category when it goes. Nests: the innermost scope wins.
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory category) noexcept;
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemoryCategory previous_;
};

/// Bytes now and the most at any moment since tracking started or reset_memory_peak().
struct MemoryUsage {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
};

/// Tracked memory of one rank (memory_snapshot) or the maximum over ranks (memory_report).
struct MemorySnapshot {
  bool enabled = false;  ///< false: tracking was off, every figure is zero
  std::array<MemoryUsage, memory_category_count> categories{};
  /// All categories together; total.peak is the peak of the sum, which is at most the sum of
  /// the categories' peaks (they need not peak at the same moment).
  MemoryUsage total;
  std::uint64_t live_allocations = 0;  ///< allocations not yet freed
  std::uint64_t allocations = 0;       ///< allocations seen since tracking started
  std::uint64_t budget_bytes = 0;      ///< 0: no budget
  /// Freed heap memory the C library keeps for reuse (resident, not in `total`); 0 where
  /// the C library cannot tell.
  std::uint64_t heap_free_bytes = 0;
  int ranks = 1;  ///< ranks the figures are the maximum over

  const MemoryUsage& operator[](MemoryCategory category) const {
    return categories[static_cast<int>(category)];
  }

  /// A table in MiB: current and peak per category and in total, then the budget.
  std::string describe() const;
};

/// Installs the allocation hooks and starts counting from zero (allocations made before are
/// not seen; their deallocations are ignored). Chains to hooks a Kokkos tool installed
/// before. Needs Kokkos initialized; does nothing if tracking is on already.
void enable_memory_tracking();
/// Removes the hooks (restoring a tool's), forgets every count and removes the budget.
void disable_memory_tracking();
bool memory_tracking_enabled() noexcept;

/// Starts a new peak: every peak becomes the current value.
void reset_memory_peak();

/// This rank's figures now.
MemorySnapshot memory_snapshot();

/// An allocation live at the tracked total's peak: its View label, bytes and category.
struct LiveAllocation {
  std::string label;
  std::uint64_t bytes = 0;
  MemoryCategory category = MemoryCategory::other;
};
/// Starts (or stops) keeping the labels of live allocations and, at each new peak of the
/// total, a copy of what is live: where a peak's bytes sit (bench_scaling --peak-report). A
/// diagnostic: each new peak copies the live list. Allocations made before record no label.
void record_memory_peak_allocations(bool record);
/// What was live at the total's peak since recording started or reset_memory_peak(), the
/// largest first (empty where nothing was recorded).
std::vector<LiveAllocation> memory_peak_allocations();

/// Per-rank budget on the tracked total in bytes; 0 removes it. A budget needs tracking, so
/// a non-zero budget enables it. Clears a recorded overflow; if the total is above the new
/// budget already, that counts as an overflow. Set the same budget on every rank: the checks
/// communicate only when a budget is set.
void set_memory_budget(std::uint64_t bytes);
std::uint64_t memory_budget() noexcept;

/// A per-rank budget of `mib` MiB (a config's memory.budget_mib) for this object's lifetime;
/// afterwards the previous budget and tracking state come back. 0 changes nothing. What
/// `shardtensor train` and a Session hold while they run.
class ScopedMemoryBudget {
 public:
  explicit ScopedMemoryBudget(double mib);
  ~ScopedMemoryBudget();
  ScopedMemoryBudget(const ScopedMemoryBudget&) = delete;
  ScopedMemoryBudget& operator=(const ScopedMemoryBudget&) = delete;

 private:
  bool applied_, was_tracking_;
  std::uint64_t previous_;
};

/// Throws shardtensor::Error "memory budget of X MiB per rank exceeded: Y MiB (category C,
/// allocation 'L')" if an allocation took this rank's tracked total above the budget since
/// the budget was set or last checked (Y: the highest total while above it), and clears the
/// record. Local: no communication. Does nothing without a budget.
void check_memory_budget();

/// An allocation that took this rank's tracked total above the budget: the highest total
/// while above it, and the category and label of the allocation that crossed it.
struct MemoryOverflow {
  bool active = false;
  std::uint64_t bytes = 0;
  MemoryCategory category = MemoryCategory::other;
  std::string label;
};

/// Takes (and clears) this rank's recorded overflow: what the collective checks in
/// comm/memory_budget.hpp agree on.
MemoryOverflow take_memory_overflow();

/// "check_memory_budget: memory budget of X MiB per rank exceeded: Y MiB [on rank R]
/// (category C, allocation 'L')"; rank < 0 names none.
std::string memory_overflow_message(std::uint64_t budget, std::uint64_t bytes,
                                    MemoryCategory category, const std::string& label, int rank);

/// Bytes in MiB, for messages and reports.
inline double to_mib(std::uint64_t bytes) {
  return double(bytes) / (1024.0 * 1024.0);
}

}  // namespace shardtensor
