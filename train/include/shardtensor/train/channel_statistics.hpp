#pragma once
// Per-channel normalisation of fields: statistics computed once, in parallel, over the
// training samples (each rank reads only its patch), then applied to every batch.

#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/io/file.hpp"

namespace shardtensor {

struct ChannelStatistics {
  std::vector<double> mean, std;  ///< one per channel; std > 0

  /// mean 0 and std 1: normalisation that changes nothing.
  static ChannelStatistics identity(Index channels) {
    return {std::vector<double>(channels, 0.0), std::vector<double>(channels, 1.0)};
  }
  Index channels() const { return Index(mean.size()); }
  /// True where normalising with these statistics changes nothing.
  bool is_identity() const {
    for (Index c = 0; c < channels(); ++c)
      if (mean[c] != 0.0 || std[c] != 1.0) return false;
    return true;
  }
};

/// Mean and standard deviation (population) per channel of field dataset `name` over
/// `samples`. The data groups of `mesh` share the samples, each domain rank reads its
/// patch; the sums are combined over mesh.world. Collective over `file`'s communicator,
/// which must be mesh.world. A constant channel gets std 1.
ChannelStatistics compute_channel_statistics(const io::File& file, const std::string& name,
                                             Index channels, const Decomposition& domain,
                                             const RankMesh& mesh,
                                             const std::vector<Index>& samples);

/// Mean and standard deviation per channel over the owned cells of every sample of
/// `field`, all ranks of `comm` together (its decomposition's ranks). Collective.
template <class T>
ChannelStatistics field_channel_statistics(const Communicator& comm, const ShardTensor<T>& field);

/// x = (x - mean) / std per channel, in place (owned cells and ghosts alike).
template <class T>
void normalize(const ShardTensor<T>& x, const ChannelStatistics& statistics);
/// x = x * std + mean per channel, in place.
template <class T>
void denormalize(const ShardTensor<T>& x, const ChannelStatistics& statistics);

}  // namespace shardtensor
