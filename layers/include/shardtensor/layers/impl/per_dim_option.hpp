#pragma once
// Per-dimension layer options (stride, padding, ...): empty means "the default on every
// axis", otherwise one value per spatial dim.

#include <string>
#include <vector>

#include "shardtensor/core/error.hpp"

namespace shardtensor::impl {

inline std::vector<int> per_dim_option(const std::vector<int>& values, int ndims,
                                       const std::vector<int>& fallback, const char* what,
                                       const std::string& where) {
  if (values.empty()) return fallback;
  SHARDTENSOR_REQUIRE(
      static_cast<int>(values.size()) == ndims, where,
      what << " has " << values.size() << " values for " << ndims << " spatial dims");
  return values;
}

inline std::vector<int> per_dim_option(const std::vector<int>& values, int ndims, int fallback,
                                       const char* what, const std::string& where) {
  return per_dim_option(values, ndims, std::vector<int>(ndims, fallback), what, where);
}

}  // namespace shardtensor::impl
