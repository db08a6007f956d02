#pragma once
// BufferLease<T>: a communication buffer borrowed from a process-wide pool for one exchange.
// Halo exchange plans are built once per layer and layout and kept (HaloPlanCache), but only
// one or two exchange at a time: with buffers of their own, a model held every plan's send
// and receive buffers for good (12 plans, 2 MiB per rank of the 64^3 U-Net's 18 at four
// ranks). Leased for start()..finish(), the buffers held are those of the exchanges in flight.
//
// A lease takes the smallest free buffer that is large enough; where none is, it drops the
// largest free one and allocates its size, so the pool converges to the sizes in flight
// together and allocates nothing in a steady step. Buffers are returned idle (the plan has
// waited for its transfers and fenced its kernels), so a later lease on another stream may
// use one at once. Thread-safe; emptied when Kokkos finalizes (the buffers are Views).

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::impl {

template <class T>
class BufferLease {
 public:
  using Buffer = Kokkos::View<T*, DefaultMemorySpace>;

  BufferLease() = default;
  /// A buffer of at least `count` values (none for 0), counted as a communication buffer.
  explicit BufferLease(std::size_t count) {
    if (count == 0) return;
    Pool& pool = shared_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (!pool.release_hooked) {
      pool.release_hooked = true;
      Kokkos::push_finalize_hook([] {
        Pool& p = shared_pool();
        std::lock_guard<std::mutex> hook_lock(p.mutex);
        p.free.clear();
        p.release_hooked = false;
      });
    }
    auto& free = pool.free;
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->extent(0) >= count && (best == free.end() || it->extent(0) < best->extent(0)))
        best = it;
    if (best != free.end()) {
      buffer_ = *best;
      free.erase(best);
      return;
    }
    if (!free.empty())  // too small for this exchange: its memory goes to the new buffer
      free.erase(std::max_element(free.begin(), free.end(), [](const Buffer& a, const Buffer& b) {
        return a.extent(0) < b.extent(0);
      }));
    MemoryCategoryScope memory(MemoryCategory::comm_buffers);
    buffer_ = Buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "halo_buffer"), count);
  }
  BufferLease(BufferLease&& other) noexcept : buffer_(std::move(other.buffer_)) {
    other.buffer_ = Buffer();
  }
  BufferLease& operator=(BufferLease&& other) noexcept {
    if (this != &other) {
      release();
      buffer_ = std::move(other.buffer_);
      other.buffer_ = Buffer();
    }
    return *this;
  }
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { release(); }

  const Buffer& view() const { return buffer_; }

  /// Gives the buffer back (idle: nothing reads or writes it any more).
  void release() {
    if (buffer_.extent(0) == 0) return;
    Pool& pool = shared_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.free.push_back(buffer_);
    buffer_ = Buffer();
  }

  /// Values in the free buffers (for tests).
  static std::size_t free_values() {
    Pool& pool = shared_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    std::size_t values = 0;
    for (const Buffer& b : pool.free) values += b.extent(0);
    return values;
  }

 private:
  struct Pool {
    std::mutex mutex;
    std::vector<Buffer> free;
    bool release_hooked = false;
  };
  static Pool& shared_pool() {
    static Pool pool;
    return pool;
  }

  Buffer buffer_;
};

}  // namespace shardtensor::impl
