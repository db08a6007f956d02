#pragma once
// count_parameters and describe: what a model holds, for logs and for checking imports.

#include <sstream>
#include <string>

#include "shardtensor/layers/module.hpp"

namespace shardtensor::models {

/// Number of trainable values (the sum of the sizes of named_parameters()).
template <class T>
Index count_parameters(const Module<T>& module) {
  Index total = 0;
  for (const auto& named : module.named_parameters()) total += Index(named.second.data().extent(0));
  return total;
}

/// One line per parameter, "name (shape) size", then the total; e.g.
///   down0.conv0.weight (8, 1, 3, 3) 72
///   ...
///   total 1234 parameters
template <class T>
std::string describe(const Module<T>& module) {
  std::ostringstream out;
  for (const auto& [name, p] : module.named_parameters()) {
    out << name << " (";
    for (std::size_t i = 0; i < p.shape().size(); ++i) out << (i ? ", " : "") << p.shape()[i];
    out << ") " << p.data().extent(0) << "\n";
  }
  out << "total " << count_parameters(module) << " parameters\n";
  return out.str();
}

}  // namespace shardtensor::models
