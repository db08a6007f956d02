#pragma once
// An on/off switch from the environment, for the host kernels' paths that a run may forbid
// (SHARDTENSOR_AMX).

#include <cstdlib>
#include <string>

#include "shardtensor/core/error.hpp"

namespace shardtensor::kernels::host {

/// Whether the environment variable `name` leaves its path on: unset, "" or "on" yes, "off"
/// no; anything else throws shardtensor::Error naming the variable and the value.
inline bool environment_switch(const char* name) {
  const char* env = std::getenv(name);
  const std::string value = env ? env : "";
  SHARDTENSOR_REQUIRE(value.empty() || value == "on" || value == "off", name,
                      "'" << value << "' is not on or off");
  return value != "off";
}

}  // namespace shardtensor::kernels::host
