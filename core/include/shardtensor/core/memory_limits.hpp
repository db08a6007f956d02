#pragma once
// Memory limits checked before allocating: a config or a file that asks for more memory than
// a rank may use stops with a message while nothing large has been allocated yet.

#include <cstdint>
#include <string>

namespace shardtensor {

/// The memory this node has free for new allocations (MemAvailable), 0 if unknown.
std::uint64_t node_available_bytes();

/// a * b, or the largest value where it overflows (sizes of absurd declared datasets or
/// models: never a wrapped-around small number).
std::uint64_t saturating_product(std::uint64_t a, std::uint64_t b);

/// "512 MiB", "0.02 MiB" (two decimals below 10 MiB), or "more than 16 EiB" for a
/// saturated size.
std::string describe_bytes(std::uint64_t bytes);

/// While alive, every parameter a module registers on this thread is charged against a
/// limit before its memory is allocated: building a model that would need more (its
/// parameters times `copies`, for gradients and optimizer state) throws, naming the
/// parameter, the sizes and the limit. The limit is the same on every rank (the caller
/// agrees on it), and so is every model's list of parameters: all ranks throw together.
///
///   ScopedParameterLimit limit(bytes, "memory.budget_mib (512 MiB)", 4, "adam");
///   auto model = build_model<T>(...);
class ScopedParameterLimit {
 public:
  /// `limit_bytes` 0: no limit. `limit_name` says where the limit comes from; `copies` and
  /// `copies_reason` how many copies of each parameter a step holds.
  ScopedParameterLimit(std::uint64_t limit_bytes, std::string limit_name, int copies,
                       std::string copies_reason);
  ~ScopedParameterLimit();
  ScopedParameterLimit(const ScopedParameterLimit&) = delete;
  ScopedParameterLimit& operator=(const ScopedParameterLimit&) = delete;

  /// Called before a parameter of `values` values of `value_bytes` bytes is allocated.
  static void charge(const std::string& parameter, std::uint64_t values, std::size_t value_bytes);

 private:
  ScopedParameterLimit* previous_;
  std::uint64_t limit_, charged_ = 0, values_ = 0;
  std::string limit_name_, copies_reason_;
  int copies_;
};

}  // namespace shardtensor
