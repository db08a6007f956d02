#include "shardtensor/core/memory_tracker.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

using Callbacks = Kokkos::Tools::Experimental::EventSet;

thread_local MemoryCategory current_category = MemoryCategory::other;

struct Entry {
  std::uint64_t bytes;
  MemoryCategory category;
  std::string label;  // only while peak allocations are recorded
};

struct Tracker {
  std::mutex mutex;  // guards everything below but the atomics
  std::atomic<bool> enabled{false};
  std::atomic<std::uint64_t> budget{0};
  std::unordered_map<const void*, Entry> live;
  std::array<MemoryUsage, memory_category_count> categories{};
  MemoryUsage total;
  std::uint64_t allocations = 0;
  MemoryOverflow overflow;
  bool record_peak = false;               // record_memory_peak_allocations
  std::vector<LiveAllocation> peak_live;  // what was live at total.peak
  std::uint64_t peak_live_counted = 0;    // the total that peak_live belongs to
  // Hooks a Kokkos tool (KOKKOS_TOOLS_LIBS) had installed: called first, restored on disable.
  Kokkos::Tools::allocateDataFunction previous_allocate = nullptr;
  Kokkos::Tools::deallocateDataFunction previous_deallocate = nullptr;

  void reset_counts() {
    live.clear();
    categories = {};
    total = {};
    allocations = 0;
    overflow = {};
    peak_live.clear();
    peak_live_counted = 0;
  }

  /// Keeps the live allocations where the total reached a new peak (mutex held).
  void note_peak() {
    if (!record_peak || total.current < total.peak || total.current == peak_live_counted) return;
    peak_live.clear();
    for (const auto& [ptr, entry] : live)
      peak_live.push_back({entry.label, entry.bytes, entry.category});
    peak_live_counted = total.current;
  }

  /// Records an overflow if the total is above the budget (mutex held).
  void note_budget(MemoryCategory category, const char* label) {
    const std::uint64_t limit = budget.load(std::memory_order_relaxed);
    if (limit == 0 || total.current <= limit) return;
    if (!overflow.active) {
      overflow.active = true;
      overflow.category = category;
      overflow.label = label ? label : "";
    }
    overflow.bytes = std::max(overflow.bytes, total.current);
  }
};

// Never destroyed: Views freed during static destruction (after main) still find it.
Tracker& tracker() {
  static Tracker* t = new Tracker();
  return *t;
}

void add(MemoryUsage& usage, std::uint64_t bytes) {
  usage.current += bytes;
  usage.peak = std::max(usage.peak, usage.current);
}

void subtract(MemoryUsage& usage, std::uint64_t bytes) {
  usage.current -= std::min(usage.current, bytes);
}

void on_allocate(const Kokkos::Tools::SpaceHandle space, const char* label, const void* ptr,
                 const std::uint64_t size) {
  Tracker& t = tracker();
  if (t.previous_allocate) t.previous_allocate(space, label, ptr, size);
  // Kokkos's own buffers ("Kokkos::Serial::scratch_mem", grown by the first parallel_reduce
  // that needs it and kept) belong to no scope that happened to be open: always other.
  const MemoryCategory category =
      label && std::strncmp(label, "Kokkos::", 8) == 0 ? MemoryCategory::other : current_category;
  std::lock_guard<std::mutex> lock(t.mutex);
  Entry entry{size, category, t.record_peak && label ? label : ""};
  auto [it, inserted] = t.live.try_emplace(ptr, entry);
  if (!inserted) {  // the address came back without a deallocation seen: forget the old one
    subtract(t.categories[int(it->second.category)], it->second.bytes);
    subtract(t.total, it->second.bytes);
    it->second = std::move(entry);
  }
  add(t.categories[int(category)], size);
  add(t.total, size);
  ++t.allocations;
  t.note_budget(category, label);
  t.note_peak();
}

void on_deallocate(const Kokkos::Tools::SpaceHandle space, const char* label, const void* ptr,
                   const std::uint64_t size) {
  Tracker& t = tracker();
  if (t.previous_deallocate) t.previous_deallocate(space, label, ptr, size);
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.live.find(ptr);
  if (it == t.live.end()) return;  // allocated before tracking started
  subtract(t.categories[int(it->second.category)], it->second.bytes);
  subtract(t.total, it->second.bytes);
  t.live.erase(it);
}

std::uint64_t heap_free_bytes() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  return static_cast<std::uint64_t>(mallinfo2().fordblks);
#else
  return 0;
#endif
}

/// MiB with the digits that matter: 1024, 55.5, 0.05.
std::string mib_text(std::uint64_t bytes) {
  const double mib = to_mib(bytes);
  char text[32];
  std::snprintf(text, sizeof text, mib >= 100 ? "%.0f" : mib >= 1 ? "%.1f" : "%.2g", mib);
  return text;
}

}  // namespace

MemoryOverflow take_memory_overflow() {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> lock(t.mutex);
  MemoryOverflow o = t.overflow;
  t.overflow = {};
  return o;
}

std::string memory_overflow_message(std::uint64_t budget, std::uint64_t bytes,
                                    MemoryCategory category, const std::string& label, int rank) {
  std::ostringstream message;
  message << "check_memory_budget: memory budget of " << mib_text(budget)
          << " MiB per rank exceeded: " << mib_text(bytes) << " MiB";
  if (rank >= 0) message << " on rank " << rank;
  message << " (category " << to_string(category);
  if (!label.empty()) message << ", allocation '" << label << "'";
  message << ")";
  return message.str();
}

const char* to_string(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::parameters:
      return "parameters";
    case MemoryCategory::optimizer_state:
      return "optimizer_state";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::workspaces:
      return "workspaces";
    case MemoryCategory::comm_buffers:
      return "comm_buffers";
    case MemoryCategory::other:
      return "other";
  }
  return "unknown";
}

MemoryCategory current_memory_category() noexcept {
  return current_category;
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory category) noexcept
    : previous_(current_category) {
  current_category = category;
}

MemoryCategoryScope::~MemoryCategoryScope() {
  current_category = previous_;
}

std::string MemorySnapshot::describe() const {
  std::ostringstream out;
  char line[160];
  if (!enabled) return "memory: tracking is off\n";
  std::snprintf(line, sizeof line, "memory: Kokkos allocations per rank, MiB%s\n",
                ranks > 1 ? (", max over " + std::to_string(ranks) + " ranks").c_str() : "");
  out << line;
  std::snprintf(line, sizeof line, "  %-16s %12s %12s\n", "category", "current", "peak");
  out << line;
  for (int c = 0; c < memory_category_count; ++c) {
    std::snprintf(line, sizeof line, "  %-16s %12.2f %12.2f\n", to_string(MemoryCategory(c)),
                  to_mib(categories[c].current), to_mib(categories[c].peak));
    out << line;
  }
  std::snprintf(line, sizeof line, "  %-16s %12.2f %12.2f\n", "total", to_mib(total.current),
                to_mib(total.peak));
  out << line;
  if (budget_bytes > 0) {
    std::snprintf(line, sizeof line, "  budget %.1f MiB per rank, peak at %.0f%% of it\n",
                  to_mib(budget_bytes), 100.0 * double(total.peak) / double(budget_bytes));
    out << line;
  }
  if (heap_free_bytes > 0) {
    std::snprintf(line, sizeof line,
                  "  freed heap kept for reuse (resident, not counted above): %.2f MiB\n",
                  to_mib(heap_free_bytes));
    out << line;
  }
  return out.str();
}

void enable_memory_tracking() {
  Tracker& t = tracker();
  if (t.enabled.load()) return;
  SHARDTENSOR_REQUIRE(Kokkos::is_initialized(), "enable_memory_tracking",
                      "Kokkos is not initialized: enable tracking after Kokkos::initialize");
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.reset_counts();
    const Callbacks installed = Kokkos::Tools::Experimental::get_callbacks();
    t.previous_allocate = installed.allocate_data;
    t.previous_deallocate = installed.deallocate_data;
  }
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  t.enabled.store(true);
}

void disable_memory_tracking() {
  Tracker& t = tracker();
  if (!t.enabled.load()) return;
  if (Kokkos::is_initialized()) {
    Kokkos::Tools::Experimental::set_allocate_data_callback(t.previous_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(t.previous_deallocate);
  }
  t.enabled.store(false);
  t.budget.store(0);
  std::lock_guard<std::mutex> lock(t.mutex);
  t.reset_counts();
  t.previous_allocate = nullptr;
  t.previous_deallocate = nullptr;
}

bool memory_tracking_enabled() noexcept {
  return tracker().enabled.load();
}

void reset_memory_peak() {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (MemoryUsage& usage : t.categories) usage.peak = usage.current;
  t.total.peak = t.total.current;
  t.peak_live_counted = 0;
  t.note_peak();
}

void record_memory_peak_allocations(bool record) {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.record_peak = record;
  t.peak_live.clear();
  t.peak_live_counted = 0;
}

std::vector<LiveAllocation> memory_peak_allocations() {
  Tracker& t = tracker();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<LiveAllocation> live = t.peak_live;
  std::sort(live.begin(), live.end(),
            [](const LiveAllocation& a, const LiveAllocation& b) { return a.bytes > b.bytes; });
  return live;
}

MemorySnapshot memory_snapshot() {
  Tracker& t = tracker();
  MemorySnapshot s;
  s.enabled = t.enabled.load();
  if (!s.enabled) return s;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    s.categories = t.categories;
    s.total = t.total;
    s.live_allocations = t.live.size();
    s.allocations = t.allocations;
  }
  s.budget_bytes = t.budget.load();
  s.heap_free_bytes = heap_free_bytes();
  return s;
}

void set_memory_budget(std::uint64_t bytes) {
  Tracker& t = tracker();
  if (bytes > 0) enable_memory_tracking();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.budget.store(bytes);
  t.overflow = {};
  if (bytes > 0 && t.total.current > bytes) {
    // Already over: charge it to the largest category.
    int largest = 0;
    for (int c = 1; c < memory_category_count; ++c)
      if (t.categories[c].current > t.categories[largest].current) largest = c;
    t.note_budget(MemoryCategory(largest), "(allocated before the budget was set)");
  }
}

std::uint64_t memory_budget() noexcept {
  return tracker().budget.load();
}

ScopedMemoryBudget::ScopedMemoryBudget(double mib)
    : applied_(mib > 0), was_tracking_(memory_tracking_enabled()), previous_(memory_budget()) {
  if (applied_) set_memory_budget(std::uint64_t(std::ceil(mib * 1024 * 1024)));
}

ScopedMemoryBudget::~ScopedMemoryBudget() {
  if (!applied_) return;
  set_memory_budget(previous_);
  if (!was_tracking_) disable_memory_tracking();
}

void check_memory_budget() {
  const std::uint64_t budget = memory_budget();
  if (budget == 0) return;
  const MemoryOverflow o = take_memory_overflow();
  if (o.active) throw Error(memory_overflow_message(budget, o.bytes, o.category, o.label, -1));
}

}  // namespace shardtensor
