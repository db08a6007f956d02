#include "shardtensor/core/memory_limits.hpp"

#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

std::uint64_t node_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (meminfo >> key) {
    if (key == "MemAvailable:" && meminfo >> kib) return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

std::uint64_t saturating_product(std::uint64_t a, std::uint64_t b) {
  std::uint64_t p = 0;
  return __builtin_mul_overflow(a, b, &p) ? std::numeric_limits<std::uint64_t>::max() : p;
}

std::string describe_bytes(std::uint64_t bytes) {
  if (bytes == std::numeric_limits<std::uint64_t>::max()) return "more than 16 EiB";
  if (bytes >= 10 * 1048576ull) return std::to_string(bytes / 1048576) + " MiB";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", double(bytes) / 1048576.0);
  return text;
}

namespace {
thread_local ScopedParameterLimit* active_limit = nullptr;
}

ScopedParameterLimit::ScopedParameterLimit(std::uint64_t limit_bytes, std::string limit_name,
                                           int copies, std::string copies_reason)
    : previous_(active_limit),
      limit_(limit_bytes),
      limit_name_(std::move(limit_name)),
      copies_reason_(std::move(copies_reason)),
      copies_(copies) {
  active_limit = this;
}

ScopedParameterLimit::~ScopedParameterLimit() {
  active_limit = previous_;
}

void ScopedParameterLimit::charge(const std::string& parameter, std::uint64_t values,
                                  std::size_t value_bytes) {
  ScopedParameterLimit* l = active_limit;
  if (l == nullptr) return;
  l->values_ += values;
  const std::uint64_t bytes = saturating_product(values, value_bytes);
  l->charged_ = l->charged_ > std::numeric_limits<std::uint64_t>::max() - bytes
                    ? std::numeric_limits<std::uint64_t>::max()
                    : l->charged_ + bytes;
  const std::uint64_t needed = saturating_product(l->charged_, std::uint64_t(l->copies_));
  SHARDTENSOR_REQUIRE(l->limit_ == 0 || needed <= l->limit_, "model",
                      "the parameters need at least "
                          << describe_bytes(needed) << " per rank (" << l->values_ << " values of "
                          << value_bytes << " bytes by '" << parameter << "', x" << l->copies_
                          << " for " << l->copies_reason_ << "), more than " << l->limit_name_
                          << ": choose a smaller model");
}

}  // namespace shardtensor
