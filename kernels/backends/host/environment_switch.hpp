#pragma once
// Settings of the host kernels' paths, from the environment or a call: an on/off switch
// (SHARDTENSOR_AMX) and a choice among named modes (SHARDTENSOR_BF16_DOT: auto, on, off).

#include <cstdlib>
#include <initializer_list>
#include <sstream>
#include <string>

#include "shardtensor/core/error.hpp"

namespace shardtensor::kernels::host {

/// The index of `value` among `choices` ("" is the first, the default); anything else throws
/// shardtensor::Error naming `setting`, the value and the choices.
inline int setting_choice(const std::string& value, std::initializer_list<const char*> choices,
                          const char* setting) {
  if (value.empty()) return 0;
  int index = 0;
  std::ostringstream names;
  for (const char* choice : choices) {
    if (value == choice) return index;
    names << (index++ == 0 ? "" : index == int(choices.size()) ? " or " : ", ") << choice;
  }
  SHARDTENSOR_FAIL(setting, "'" << value << "' is not " << names.str());
}

/// The choice (setting_choice) that the environment variable `name` makes; unset is "".
inline int environment_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* env = std::getenv(name);
  return setting_choice(env ? env : "", choices, name);
}

/// Whether the environment variable `name` leaves its path on: unset, "" or "on" yes, "off"
/// no; anything else throws shardtensor::Error naming the variable and the value.
inline bool environment_switch(const char* name) {
  return environment_choice(name, {"on", "off"}) == 0;
}

}  // namespace shardtensor::kernels::host
