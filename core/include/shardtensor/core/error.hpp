#pragma once
// shardtensor::Error and the one macro that raises it.

#include <sstream>
#include <stdexcept>
#include <string>

namespace shardtensor {

/// Every error ShardTensor reports. The message names the function that detected the
/// problem and the offending values, e.g.
/// "HaloExchange: halo width 3 exceeds local extent 2 on rank 5 (dim 1)".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace shardtensor

/// Throws shardtensor::Error unless `condition` holds. `where` is the qualified function
/// name; the rest is streamed into the message:
///   SHARDTENSOR_REQUIRE(n > 0, "Decomposition", "extent " << n << " in dim " << d);
#define SHARDTENSOR_REQUIRE(condition, where, message)             \
  do {                                                             \
    if (!(condition)) {                                            \
      std::ostringstream shardtensor_error_stream_;                \
      shardtensor_error_stream_ << where << ": " << message;       \
      throw ::shardtensor::Error(shardtensor_error_stream_.str()); \
    }                                                              \
  } while (false)

/// Unconditional form of SHARDTENSOR_REQUIRE.
#define SHARDTENSOR_FAIL(where, message) SHARDTENSOR_REQUIRE(false, where, message)
