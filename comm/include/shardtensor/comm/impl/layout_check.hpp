#pragma once
// Collective checks that a ShardTensor fits a communicator and has the same layout on
// every rank: run before any operation whose messages would otherwise mismatch and hang.

#include <sstream>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::impl {

/// The split points and periodic flags of a decomposition, as one list of numbers.
inline std::vector<long long> signature(const Decomposition& decomposition) {
  std::vector<long long> values{decomposition.ndims()};
  for (int k = 0; k < decomposition.ndims(); ++k) {
    values.push_back(decomposition.periodic(k));
    values.push_back(static_cast<long long>(decomposition.split_points(k).size()));
    for (Index point : decomposition.split_points(k)) values.push_back(point);
  }
  return values;
}

/// Every rank throws the same Error if, on any rank, the communicator size differs from the
/// decomposition's rank count or the tensor is not that rank's shard, or if batch,
/// channels, ghost widths or decomposition differ between ranks.
template <class T>
void check_layout_on_all_ranks(const Communicator& comm, const ShardTensor<T>& tensor,
                               const char* where) {
  const Decomposition& decomposition = tensor.decomposition();
  std::ostringstream local_error;
  if (comm.size() != decomposition.nranks())
    local_error << where << ": communicator has " << comm.size() << " ranks but the decomposition ("
                << decomposition.describe() << ") has " << decomposition.nranks();
  else if (tensor.rank() != comm.rank())
    local_error << where << ": the shard of rank " << tensor.rank() << " was given on rank "
                << comm.rank();
  comm.agree(local_error.str());

  std::vector<long long> layout{tensor.batch(), tensor.channels()};
  for (int k = 0; k < max_spatial_dims; ++k) {
    layout.push_back(tensor.ghosts().lower[k]);
    layout.push_back(tensor.ghosts().upper[k]);
  }
  const std::vector<long long> split = signature(decomposition);
  layout.insert(layout.end(), split.begin(), split.end());
  comm.require_same(layout, where,
                    "field layout (batch, channels, ghost lower/upper per dim, ndims, then per "
                    "dim: periodic, split point count, split points)");
}

}  // namespace shardtensor::impl
