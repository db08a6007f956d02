#pragma once
// Neighbourhood (window) attention: multi-head scaled dot-product attention in which every
// cell of a sharded 1-D, 2-D or 3-D field attends only to the key cells in a window around
// it (as in NATTEN / Neighborhood Attention Transformers), as an autodiff op.
//
// Representation: q, k and v are Variables holding ShardTensors of shape
// (batch N, channels C = heads * head_dim, spatial...) over one Decomposition (any 1-D, 2-D or
// 3-D process grid with one part per rank of `comm`; uneven parts and periodic axes allowed).
// Channel h * head_dim + j is component j of head h. Ghost cells of the inputs are ignored.
//
// Window: along spatial axis a, query cell x sees the key cells
//   x + dilation[a] * (o - lower[a]),  o = 0 .. window[a] - 1,
//   lower[a] = (window[a] - 1) / 2 cells below, upper[a] = window[a] - 1 - lower[a] above,
// so an odd window is centred and an even window has one more key above the query than below
// (the convention of PyTorch's padding="same"). The key set is the product over axes.
// Along a periodic axis keys wrap around the field; along an open axis keys past the global
// boundary are left out of the softmax (a query always sees at least itself).
//
// Computation: K and V are copied into one padded buffer with ghost widths
// dilation * lower / dilation * upper per axis, filled by one HaloExchange (cached per layout);
// queries whose windows need no ghost cell are computed while the messages travel. Backward
// recomputes the softmax from the saved log-sum-exp; dK/dV of ghost keys go back to their
// owners with the adjoint exchange (reverse_accumulate), overlapped with the interior.
// See docs/attention.md ("Neighbourhood attention") for costs.

#include <vector>

#include "shardtensor/autograd/variable.hpp"
#include "shardtensor/comm/communicator.hpp"

namespace shardtensor {

/// Options of neighborhood_attention.
struct NeighborhoodAttentionOptions {
  int heads = 1;
  /// Window size per spatial axis (one value: every axis). Odd or even, at least 1.
  std::vector<Index> window{7};
  /// Spacing of the window's keys per spatial axis (one value: every axis), at least 1.
  std::vector<Index> dilation{1};
  /// Autocast's numerics (float only; Module::compute_in_bf16): Q, K, V and the output's
  /// gradient rounded to bfloat16, scores, softmax and sums in float, the output rounded; the
  /// K/V halo then moves as the communicator's options say (CommOptions::bf16_wire).
  bool bf16 = false;
};

/// softmax(q . k / sqrt(head_dim)) v over each query cell's window of keys, per head and batch
/// entry. Collective over `comm`. Returns a field of q's decomposition, batch and channels,
/// without ghost cells.
///
/// Throws shardtensor::Error, on every rank alike, if: channels are not a multiple of
/// `heads`; a window or dilation is below 1 or has neither one nor ndims entries; a window
/// spans more cells than the global field along an axis ((window - 1) * dilation + 1 > extent,
/// periodic axes included); a rank along a split axis owns fewer cells than the halo width
/// its neighbour needs (dilation * lower or dilation * upper); q, k and v differ in
/// decomposition, batch or channels; or the decomposition does not have one part per rank of
/// `comm`.
template <class T>
Variable<T> neighborhood_attention(const Communicator& comm, const Variable<T>& q,
                                   const Variable<T>& k, const Variable<T>& v,
                                   const NeighborhoodAttentionOptions& options);

extern template Variable<float> neighborhood_attention(const Communicator&, const Variable<float>&,
                                                       const Variable<float>&,
                                                       const Variable<float>&,
                                                       const NeighborhoodAttentionOptions&);
extern template Variable<double> neighborhood_attention(const Communicator&,
                                                        const Variable<double>&,
                                                        const Variable<double>&,
                                                        const Variable<double>&,
                                                        const NeighborhoodAttentionOptions&);

}  // namespace shardtensor
