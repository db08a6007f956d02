#pragma once
// Attention over tokens sharded across the ranks of a communicator, without any rank holding
// the whole attention matrix: ring attention (queries and keys/values both sharded) and the
// two variants where one side is replicated on every rank.
//
// Tokens: a sharded token set is a field (ShardTensor of shape (batch N, channels C, cells))
// over any 1-D, 2-D or 3-D Decomposition with one part per rank of `comm` (any process grid,
// uneven parts allowed); every owned cell is a token, a rank's tokens are its owned cells in
// C order. Ghost cells are ignored. A replicated token set is a Variable::replicated of shape
// {N, tokens, C} (C order: channels of one token contiguous, as PyTorch's batch_first
// (N, L, E)), the same values on every rank. Channel h * head_dim + j is component j of head
// h (C = heads * head_dim). Attention without a mask is permutation-equivariant, so the token
// order inside a rank and the process grid do not matter; causal masking needs positions and
// is offered for 1-D fields only.
//
// Compute: per (batch, head), tiles of queries x keys: S = scale Q K^T and the output by
// GEMMs (KokkosBlas::gemm), an online softmax in between (running max, sum); backward
// recomputes P from the saved log-sum-exp (flash-attention style): kernels/flash_attention.hpp,
// on the default execution space. Memory per rank is O(local tokens x channels) plus one
// bounded score tile. See docs/attention.md.

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/comm/communicator.hpp"

namespace shardtensor {

/// softmax(Q K^T / sqrt(head_dim)) V per head and batch entry, q, k and v sharded fields of
/// one layout (same decomposition, batch and channels; any dimensionality). The K/V blocks
/// travel once around the ring of ranks (the next block's transfer overlaps compute on the
/// current one); backward rings them again with their dK/dV accumulators. With `causal`
/// (1-D fields only), query token i attends to key tokens j <= i (global positions). With
/// `tf32`, float products may run on TF32 tensor cores where the GPU has them (as
/// ConvOptions::tf32; the host ignores it). With `bf16` (float only; Module::compute_in_bf16),
/// autocast's numerics: Q, K, V and the output's gradient rounded to bfloat16, scores,
/// softmax and sums in float, the output rounded; the K/V blocks then travel as bfloat16 (half
/// the bytes, the same values) unless the communicator's options say `bf16_wire: off`.
/// Collective over `comm`. Returns a field of q's layout without ghost cells. Throws
/// shardtensor::Error (on every rank) if channels are not a multiple of `heads`, there are
/// fewer tokens than ranks, the decomposition does not have one part per rank, the layouts
/// differ, or `causal` is asked of a 2-D/3-D field.
template <class T>
Variable<T> ring_attention(const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                           const Variable<T>& v, int heads, bool causal = false, bool tf32 = false,
                           bool bf16 = false);

/// Replicated queries, sharded keys/values: q is replicated {N, query_tokens, C}, k and v
/// sharded fields of one layout (any dimensionality), e.g. learned queries pooling a field.
/// Each rank folds its own K/V into per-query (max, sum, output); a max-allreduce and a
/// sum-allreduce combine them (log-sum-exp combine). Returns a replicated {N, query_tokens, C}.
/// Backward: dK, dV local; dQ is a per-rank partial sum, added over `comm` by the autodiff.
/// Throws shardtensor::Error (on every rank) for channels not a multiple of `heads`,
/// mismatched batch or channels, a q that is not {N, tokens, C}, fewer key tokens than ranks.
template <class T>
Variable<T> attention_replicated_queries(const Communicator& comm, const Variable<T>& q,
                                         const Variable<T>& k, const Variable<T>& v, int heads);

/// Sharded queries, replicated keys/values: q a sharded field (any dimensionality), k and v
/// replicated {N, key_tokens, C} of one shape, e.g. a field attending to a small global
/// context. No communication in forward. Returns a field of q's layout without ghost cells.
/// Backward: dQ local; dK, dV per-rank partial sums, added over `comm` by the autodiff.
/// Throws like attention_replicated_queries (fewer query tokens than ranks).
template <class T>
Variable<T> attention_replicated_keys(const Communicator& comm, const Variable<T>& q,
                                      const Variable<T>& k, const Variable<T>& v, int heads);

extern template Variable<float> ring_attention(const Communicator&, const Variable<float>&,
                                               const Variable<float>&, const Variable<float>&, int,
                                               bool, bool, bool);
extern template Variable<float> attention_replicated_queries(const Communicator&,
                                                             const Variable<float>&,
                                                             const Variable<float>&,
                                                             const Variable<float>&, int);
extern template Variable<float> attention_replicated_keys(const Communicator&,
                                                          const Variable<float>&,
                                                          const Variable<float>&,
                                                          const Variable<float>&, int);
extern template Variable<double> ring_attention(const Communicator&, const Variable<double>&,
                                                const Variable<double>&, const Variable<double>&,
                                                int, bool, bool, bool);
extern template Variable<double> attention_replicated_queries(const Communicator&,
                                                              const Variable<double>&,
                                                              const Variable<double>&,
                                                              const Variable<double>&, int);
extern template Variable<double> attention_replicated_keys(const Communicator&,
                                                           const Variable<double>&,
                                                           const Variable<double>&,
                                                           const Variable<double>&, int);

}  // namespace shardtensor
