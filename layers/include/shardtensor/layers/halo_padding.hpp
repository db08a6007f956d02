#pragma once
// HaloPadding: the input of a windowed op (convolution, pooling) as its windows read it --
// the shard plus ghost cells from the neighbours (halo exchange) and padding past the global
// boundary -- and the adjoint that takes a gradient of that buffer back to the shard.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/comm/halo_plan_cache.hpp"
#include "shardtensor/comm/slab_exchange.hpp"
#include "shardtensor/layers/padding.hpp"
#include "shardtensor/layers/window_geometry.hpp"

namespace shardtensor {

/// The ghost cells of a padded buffer that the halo exchange wrote (what only the neighbours
/// had), packed box by box: with the input, all it takes to rebuild the buffer (the boundary
/// padding is filled again from the cells it copies).
template <class T>
struct PaddedShell {
  std::vector<Box> boxes;
  Kokkos::View<T*, DefaultMemorySpace> values;
  /// Instead of `values` where the buffer holds bfloat16 values (round_to_bfloat16): their
  /// bits, half the bytes.
  Kokkos::View<std::uint16_t*, DefaultMemorySpace> bfloat16_values;
  bool in_place = false;  // the buffer was the input itself (padded in place): rebuilt there
};

template <class T>
class HaloPadding {
 public:
  /// `constant` fills zeros-mode padding (0 for convolution, -inf for max pooling).
  /// `where` names the layer in error messages.
  HaloPadding(const Communicator& comm, const WindowGeometry& geometry, PaddingMode mode,
              T constant, std::string where);

  /// Explicit ghost widths (the same on every rank) and the padding filled past open global
  /// boundaries (its widths at most the ghost widths), for ops whose reads are not a
  /// WindowGeometry's (e.g. transposed convolution).
  HaloPadding(const Communicator& comm, const GhostWidths& ghosts, const BoundaryPadding& boundary,
              std::string where);

  /// Copy of the shard with the ghost cells the windows read: exchanged from neighbours
  /// (wrapped for periodic padding), boundary padding filled. Collective. Where the windows
  /// read no ghost cell and the input carries none (reads_in_place), the input itself: the
  /// caller must not write into the result. With `ghosts_are_scratch` (the caller's promise
  /// that nothing reads the input's ghost cells as values: an op allocated them for this
  /// layer, see pads_in_place), an input that carries the buffer's ghost cells is padded in
  /// place: its ghost cells are filled and it is returned, no copy.
  ShardTensor<T> forward(const ShardTensor<T>& input, bool ghosts_are_scratch = false);

  /// Whether the buffer holds the input's values rounded to bfloat16 (the operand of a layer
  /// computing in bf16): rounded as they are copied in, so the exchanged ghosts and the
  /// boundary padding are rounded too. The halo exchange may then move them as bfloat16 (half
  /// the bytes, the same values: CommOptions::bf16_wire), and a shell keeps them so. Float only;
  /// off by default.
  void round_to_bfloat16(bool on);
  bool rounds_to_bfloat16() const { return bfloat16_; }

  /// True if forward(input) and rebuild(input, ...) return the input itself, with no copy: no
  /// ghost or padding cell to fill and no rounding (1x1 convolutions; a transposed
  /// convolution whose kernel is its stride, on splits at multiples of it).
  bool reads_in_place(const ShardTensor<T>& input) const;

  /// True if forward(input, true) fills the input's own ghost cells instead of copying it: it
  /// carries exactly the buffer's ghost widths and layout (padded_decomposition), in memory of
  /// its own (never a caller's array wrapped without a copy), and no rounding is asked. What a
  /// producer gets by allocating its output with ghosts() (concat_channels' `ghosts`): the
  /// buffer and its input are one field, at the peak of a recomputed U-Net level.
  bool pads_in_place(const ShardTensor<T>& input) const;

  /// Whether a kernel may read the input itself instead of a padded copy (the convolutions'
  /// plane path): every cell the windows read outside the owned cells is a zero of the
  /// padding (zeros padding, nothing exchanged on any rank), or, where `wraps` marks an axis,
  /// the owned cell an extent away (periodic padding on one rank). Also needs an input without
  /// ghost cells, and no rounding unless the kernel rounds as it reads (`reader_rounds`: the
  /// bf16 dot-product tiles). The same answer on every rank.
  bool reads_input_itself(const ShardTensor<T>& input, std::array<bool, 3>& wraps,
                          bool reader_rounds = false) const;
  /// Whether a kernel may read the input itself with its ghost planes along x taken from a
  /// SlabExchange (comm/slab_exchange.hpp) instead of a padded copy: as reads_input_itself,
  /// but with x split over several ranks (SlabExchange::covers) and no other axis with ghost
  /// cells split (`wraps` marks the periodic ones). The same answer on every rank.
  bool reads_input_with_slabs(const ShardTensor<T>& input, std::array<bool, 3>& wraps,
                              bool reader_rounds = false) const;
  /// Whether the padding wraps around the global field (a slab exchange's neighbours).
  bool periodic() const { return boundary_.mode == PaddingMode::periodic; }
  /// True if no rank sends or receives a ghost cell for this decomposition: one part along
  /// every axis with ghost cells, and no periodic wrap. Then start(), finish() and backward()
  /// are local (no exchange plan, whose making is collective).
  bool exchanges_nothing(const Decomposition& decomposition) const;

  /// forward() in two halves, so that work on cells that need no exchanged ghost can run
  /// while the messages travel: start() copies the shard and posts the exchange; finish()
  /// completes it and fills the boundary padding. Between the two, the owned cells are
  /// final, and so are zeros-mode padding cells (the buffer starts zero-filled).
  ShardTensor<T> start(const ShardTensor<T>& input, bool ghosts_are_scratch = false);
  void finish(const ShardTensor<T>& padded);

  /// The ghost boxes (local indices of `padded`) that the exchange writes: a computation that
  /// reads none of them may run between start() and finish().
  std::vector<Box> exchanged_boxes(const ShardTensor<T>& padded);
  /// True if every cell outside the exchanged boxes is final after start(): zeros padding
  /// (the buffer starts zero-filled) or periodic (no boundary padding at all).
  bool padding_ready_after_start() const {
    return (boundary_.mode == PaddingMode::zeros && boundary_.constant == 0) ||
           boundary_.mode == PaddingMode::periodic;
  }

  /// Adjoint of forward: gradients of padding cells go to the cells they copied, ghost
  /// gradients go back to their owners, and the owned part is added into `input_grad` (with
  /// `overwrite`, written into it: its owned cells' old values are not read).
  /// Overwrites `padded_grad` (whose cells past the owned ones are garbage after). Collective
  /// where a rank exchanges ghosts; a `padded_grad` without ghost cells (the input itself) is
  /// only added or copied. `input_grad` may be `padded_grad` itself (a gradient of an input
  /// padded in place, with `overwrite`): then its owned cells stay where they are and its
  /// ghost cells end zero, as in a gradient allocated afresh.
  void backward(const ShardTensor<T>& padded_grad, const ShardTensor<T>& input_grad,
                bool overwrite = false);

  /// A finished padded buffer's shell: what a layer keeps for its backward instead of the
  /// buffer (its exchanged ghosts: a surface, not a second copy of the volume, and nothing on
  /// one rank without periodic padding), and hands to rebuild(). Local.
  PaddedShell<T> shell(const ShardTensor<T>& padded, const ShardTensor<T>& input);
  /// The buffer forward(input) returned, from the same input and that buffer's shell, with
  /// no communication (the input itself where reads_in_place, or where it was padded in
  /// place: its ghost cells filled again). Local.
  ShardTensor<T> rebuild(const ShardTensor<T>& input, const PaddedShell<T>& shell) const;

  /// Layout of forward's result for an input decomposition.
  Decomposition padded_decomposition(const Decomposition& input) const;

  /// Ghost widths of forward's result.
  const GhostWidths& ghosts() const { return ghosts_; }

 private:
  HaloExchange<T>& plan_for(const ShardTensor<T>& padded);
  /// Starts the forward exchange of a buffer: bfloat16 values as the options say
  /// (HaloExchange::wire_for_bfloat16_values).
  void start_exchange(const ShardTensor<T>& padded);

  Communicator comm_;
  GhostWidths ghosts_;
  BoundaryPadding boundary_;
  std::string where_;
  HaloPlanCache<T> plans_;
  bool bfloat16_ = false;
};

extern template class HaloPadding<float>;
extern template class HaloPadding<double>;

}  // namespace shardtensor
