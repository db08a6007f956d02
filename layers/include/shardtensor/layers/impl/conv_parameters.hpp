#pragma once
// What Conv and ConvTranspose share about their parameters: the groups check and the
// PyTorch default initialisation bound.

#include <cmath>
#include <string>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor::impl {

inline void check_channel_groups(int in_channels, int out_channels, int groups,
                                 const std::string& where) {
  SHARDTENSOR_REQUIRE(in_channels >= 1 && out_channels >= 1 && groups >= 1 &&
                          in_channels % groups == 0 && out_channels % groups == 0,
                      where,
                      "groups " << groups << " must divide in_channels " << in_channels
                                << " and out_channels " << out_channels);
}

/// Weight shape {first, second, kernel...} and PyTorch's bound 1 / sqrt(fan_in) with
/// fan_in = second * kernel volume, for U(-bound, bound) weights and biases.
inline std::vector<Index> kernel_weight_shape(Index first, Index second,
                                              const std::vector<int>& kernel, double& bound) {
  std::vector<Index> shape{first, second};
  Index fan_in = second;
  for (int k : kernel) {
    shape.push_back(k);
    fan_in *= k;
  }
  bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return shape;
}

}  // namespace shardtensor::impl
