#pragma once
// The initialisation seed of one layer of a model.

#include <cstdint>
#include <string>

#include "shardtensor/core/random.hpp"

namespace shardtensor::impl {

/// A layer's seed from the model seed and the layer's path in the model ("down0.conv1"), so
/// each layer starts differently and the model's own name changes nothing. Never 0 (0 would
/// make the layer derive a seed from its name instead).
inline std::uint64_t layer_seed(std::uint64_t model_seed, const std::string& path) {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (unsigned char ch : path) hash = (hash ^ ch) * 1099511628211ull;
  const std::uint64_t seed = hash_bits(model_seed, hash);
  return seed == 0 ? 1 : seed;
}

}  // namespace shardtensor::impl
