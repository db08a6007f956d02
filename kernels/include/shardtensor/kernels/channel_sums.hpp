#pragma once
// Per-channel sums over every sample and cell of a field: the bias gradients of the
// convolutions (Conv, ConvTranspose).

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// out(c) += sum over n < batch and the cells [0, cells) of gy(n, c, x, y, z), in double. One
/// team per channel, its threads over the rows (n, x, y), each row summed eight values at a
/// time (run_sum): parallel on a GPU, the same order as one plain loop on a host (a team of
/// one thread), and the same bits on every run (a fixed reduction tree, no atomics).
template <class T>
void add_channel_sums(const ExecutionSpace& space, const char* label, const FieldView<T>& gy,
                      Index batch, const Index cells[3], const ReplicatedView<T>& out);

}  // namespace shardtensor::kernels
