#pragma once
// UNet<T>: the classic encoder-decoder with skip connections, for 1-, 2- and 3-D sharded
// fields; sharded runs compute what one rank computes on the whole field.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/models/sequential.hpp"
#include "shardtensor/layers.hpp"

namespace shardtensor::models {

/// Normalization after each convolution of a U-Net block.
enum class NormKind { none, group, layer, batch };
/// How a U-Net halves the resolution: max or average pooling (window 2), or a strided
/// convolution (kernel 2, stride 2, channels kept).
enum class DownMode { maxpool, avgpool, conv };
/// How a U-Net doubles the resolution and halves the channels: a transposed convolution
/// (kernel 2, stride 2), or nearest / linear upsampling followed by a 3-wide convolution.
enum class UpMode { transpose, nearest, linear };

const char* to_string(NormKind kind);
const char* to_string(DownMode mode);
const char* to_string(UpMode mode);

struct UNetOptions {
  int dims = 2;              ///< spatial dims: 1, 2 or 3
  Index in_channels = 1;     ///< channels of the input field
  Index out_channels = 1;    ///< channels of the output field
  int depth = 4;             ///< number of downsamplings (0: no resolution change)
  Index base_channels = 32;  ///< channels at full resolution, doubled per level
  NormKind norm = NormKind::group;
  int norm_groups = 8;  ///< GroupNorm groups; must divide base_channels
  Activation activation = Activation::relu;
  DownMode down = DownMode::maxpool;
  UpMode up = UpMode::transpose;
  PaddingMode padding = PaddingMode::zeros;  ///< boundary padding of every 3-wide convolution
  int blocks = 2;                            ///< conv-norm-activation triples per level
  std::uint64_t seed = 1;                    ///< initialisation: same seed, same parameters
  bool input_skip = false;  ///< add a 1x1 convolution of the input to the output ("skip"):
                            ///< the linear part of a surrogate, learned directly
  /// Each level's blocks (down, bottom, up) keep only their input in forward and run again
  /// in backward (layers/recompute.hpp; level 0's up block as two units: recomputes_in_two_units):
  /// the same numbers bit for bit, less memory (the 64^3 bench U-Net's training peak 102 -> 48
  /// MiB on one rank), one more forward of the blocks per step (about 1.3x the step). Config:
  /// model.recompute.
  bool recompute = false;
};

/// U-Net (Ronneberger et al. 2015) with levels l = 0 .. depth of base_channels * 2^l channels.
///
///   down{l}      (l < depth)  block: input (or level l-1) -> c_l; its output is the skip
///   downsample{l}             halves the resolution (a parameterless pooling or a strided conv)
///   bottom                    block at the coarsest level: c_{depth-1} -> c_depth
///   upsample{l}               doubles the resolution: c_{l+1} -> c_l
///   up{l}                     block: concat(skip_l, upsampled) = 2 c_l -> c_l
///   head                      1x1 convolution: c_0 -> out_channels
///
/// A block is `blocks` times conv{i} (3-wide, padding 1, the padding mode) -> norm{i} ->
/// activation (inside norm{i}: fuse_activation; activation{i} of its own with norm none).
/// Convolutions followed by a normalization have no bias (the normalization removes it). Parameter
/// names: "down0.conv0.weight", "down0.norm0.bias", "downsample1.weight", "upsample0.weight"
/// (transpose) or "upsample0.conv.weight", "up0.conv1.weight", "head.bias", ... (see
/// docs/models.md).
///
/// Sharding: each field extent must be divisible by 2^depth. Pooling by 2 puts an odd split
/// point p at ceil(p / 2), so after upsampling the split moves to p + 1; the upsampled field
/// is then redistributed straight into the concatenation's channels (one all-to-all; split
/// points divisible by 2^depth avoid it). A rank must keep at least one cell at every level.
template <class T>
class UNet : public Module<T> {
 public:
  UNet(const Communicator& comm, UNetOptions options, const std::string& name = "unet");

  Variable<T> forward(const Variable<T>& input) override;
  /// The input feeds only convolutions (the first block and the input skip).
  bool reads_owned_cells_only() const override { return true; }

  const UNetOptions& options() const { return options_; }
  /// Channels at level l: base_channels * 2^l.
  Index channels(int level) const { return options_.base_channels << level; }
  /// Throws (on every rank) unless `d` can run through this U-Net: extents divisible by
  /// 2^depth and every rank owning at least one cell at every level.
  void check_decomposition(const Decomposition& d) const;

 private:
  /// With `two_recomputed_units`, the block's children after conv0 and norm0 are one
  /// recomputed unit (Sequential::recompute_range); up_in_two_units runs the block.
  std::shared_ptr<Sequential<T>> make_block(const std::string& name, Index in, Index out,
                                            bool two_recomputed_units = false);
  /// Whether level `level`'s up block is recomputed as two units in a row rather than as one
  /// (up_in_two_units). Its input, the concatenation, is twice its output, and as one unit its
  /// backward would hold it beside both convs' outputs and the output's gradient. As two, the
  /// second keeps the first's output from forward, and each backward holds one conv's fields;
  /// the first keeps the skip and the coarser level's output, not the concatenation. The
  /// finest level only: its backward runs first, right after forward, so that output is kept
  /// no longer than the block's own fields would be; at a coarser level it would sit under
  /// the finer levels' backward, the step's peak.
  bool recomputes_in_two_units(int level) const {
    return level == 0 && options_.recompute && options_.blocks > 1;
  }
  /// Level l's upsampling, concatenation and up block as two recomputed units: the first
  /// (the upsampling, the concatenation, conv0 and norm0) from the skip and `coarse`, the
  /// coarser level's output; the second the rest of the block.
  Variable<T> up_in_two_units(int l, Variable<T>&& skip, const Variable<T>& coarse);
  /// Level l's upsampling, concatenation and up block as one recomputed unit from the skip
  /// and `coarse` (the coarser levels, with recomputation).
  Variable<T> up_as_one_unit(int l, Variable<T>&& skip, const Variable<T>& coarse);
  /// Whether a field made now is kept to the backward: a graph is recorded, and this is not
  /// a recomputed unit's run (whose fields, like those of its first run without a graph, live
  /// only through the unit). Where it is not, a conv's input carries the conv's ghost cells,
  /// so that no padded copy sits beside it (a recomputed level's peak); a kept one would carry
  /// them to the backward's peak.
  static bool kept_to_backward() { return grad_enabled() && !impl::recomputing_flag(); }
  /// The ghost cells of level l's concatenation (laid out like `skip`): those its conv0 pads
  /// in place (Conv::padded_input_ghosts), none where it is kept to the backward (without
  /// recomputation; at a level recomputed as one unit, whose input it is).
  GhostWidths concat_ghosts(int l, const ShardTensor<T>& skip) const;
  /// Level l's concatenation of the skip and the upsampled `coarse`, the skip copied in and
  /// handed over before the upsampling runs. A transposed conv whose output has the skip's
  /// layout writes it straight into the concatenation's channels (concat_channels_written).
  Variable<T> concat_upsampled(int l, Variable<T>&& skip, const Variable<T>& coarse);
  std::shared_ptr<Module<T>> make_down(const std::string& name, Index channels);
  std::shared_ptr<Module<T>> make_up(const std::string& name, Index in, Index out);
  std::shared_ptr<Conv<T>> make_conv(const std::string& name, Index in, Index out, int kernel,
                                     int stride, bool bias);

  Communicator comm_;
  UNetOptions options_;
  std::string name_;
  std::vector<std::shared_ptr<Module<T>>> down_, downsample_, upsample_;
  std::vector<std::shared_ptr<Sequential<T>>> up_;
  std::shared_ptr<Module<T>> bottom_, head_, skip_;
};

extern template class UNet<float>;
extern template class UNet<double>;

}  // namespace shardtensor::models
