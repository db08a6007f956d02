#pragma once
// SampleSchedule: which samples each data-parallel group trains on at each step. The epoch's
// permutation comes from a counter-based generator seeded by (seed, epoch), so every rank
// computes the same order without communication, and a restarted run repeats it exactly.

#include <cstdint>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/core/types.hpp"

namespace shardtensor {

class SampleSchedule {
 public:
  /// `samples`: file indices to draw from; each step takes batch_size samples per group, so
  /// a step consumes batch_size * data_groups samples; the incomplete remainder of an epoch
  /// is dropped (it changes with the shuffle, so every sample is seen over the epochs).
  SampleSchedule(std::vector<Index> samples, Index batch_size, int data_groups, std::uint64_t seed,
                 bool shuffle)
      : samples_(std::move(samples)),
        batch_size_(batch_size),
        data_groups_(data_groups),
        seed_(seed),
        shuffle_(shuffle) {
    SHARDTENSOR_REQUIRE(
        batch_size >= 1 && data_groups >= 1, "SampleSchedule",
        "batch_size " << batch_size << " and data_groups " << data_groups << " must be positive");
    SHARDTENSOR_REQUIRE(Index(samples_.size()) >= batch_size * data_groups, "SampleSchedule",
                        "one step needs batch_size "
                            << batch_size << " x data_groups " << data_groups << " = "
                            << batch_size * data_groups << " training samples, the data has "
                            << samples_.size());
  }

  Index steps_per_epoch() const { return Index(samples_.size()) / (batch_size_ * data_groups_); }
  Index batch_size() const { return batch_size_; }

  /// The epoch's order of the samples (a Fisher-Yates shuffle driven by hash_bits).
  std::vector<Index> order(std::int64_t epoch) const {
    std::vector<Index> order = samples_;
    if (!shuffle_) return order;
    const std::uint64_t epoch_seed = hash_bits(seed_, static_cast<std::uint64_t>(epoch));
    for (std::size_t i = order.size(); i > 1; --i) {
      const std::size_t j = hash_bits(epoch_seed, i) % i;
      std::swap(order[i - 1], order[j]);
    }
    return order;
  }

  /// The samples data group `group` processes at `step` of `epoch`.
  std::vector<Index> batch(std::int64_t epoch, Index step, int group) const {
    const std::vector<Index> all = order(epoch);
    const Index first = (step * data_groups_ + group) * batch_size_;
    return std::vector<Index>(all.begin() + first, all.begin() + first + batch_size_);
  }

 private:
  std::vector<Index> samples_;
  Index batch_size_;
  int data_groups_;
  std::uint64_t seed_;
  bool shuffle_;
};

}  // namespace shardtensor
