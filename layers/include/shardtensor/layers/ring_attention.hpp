#pragma once
// Ring attention: multi-head scaled dot-product attention over a token sequence sharded
// across the ranks of a communicator, without any rank holding the whole attention matrix.
//
// Representation: a token sequence is a 1-D field. q, k and v are Variables holding
// ShardTensors of shape (batch N, channels C = heads * head_dim, x = tokens) over a 1-D
// Decomposition with one part per rank of `comm` (uneven parts allowed); channel
// h * head_dim + j is component j of head h. Ghost cells are ignored.
//
// Forward: each rank keeps its Q block; the K/V blocks travel once around the ring
// (non-blocking send/receive of the next block overlaps compute on the current one) and
// each rank folds every block into a running max / running sum (online softmax), so memory
// per rank is O(local tokens x (head_dim + block)). Backward (flash-attention style) rings
// K/V again; dK/dV accumulators travel with their block and arrive home after the last step.
// See docs/attention.md.

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/variable.hpp"

namespace shardtensor {

/// softmax(Q K^T / sqrt(head_dim)) V per head and batch entry. With `causal`, query token i
/// attends to key tokens j <= i (global positions). Collective over `comm`; q, k and v must
/// share one layout (same decomposition, batch and channels). Returns a field of that
/// layout without ghost cells. Throws shardtensor::Error (on every rank) if channels are not
/// a multiple of `heads`, there are fewer tokens than ranks, the decomposition is not 1-D
/// with one part per rank, or the layouts differ.
template <class T>
Variable<T> ring_attention(const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                           const Variable<T>& v, int heads, bool causal = false);

extern template Variable<float> ring_attention(const Communicator&, const Variable<float>&,
                                               const Variable<float>&, const Variable<float>&,
                                               int, bool);
extern template Variable<double> ring_attention(const Communicator&, const Variable<double>&,
                                                const Variable<double>&, const Variable<double>&,
                                                int, bool);

}  // namespace shardtensor
