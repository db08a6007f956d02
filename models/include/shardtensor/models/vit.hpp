#pragma once
// ViT<T>: a vision transformer from a sharded field to a sharded field (a surrogate model),
// with global ring attention or neighbourhood attention over the patch tokens.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/layers.hpp"

namespace shardtensor::models {

struct ViTOptions {
  int dims = 2;                 ///< spatial dims: 1, 2 or 3
  Index in_channels = 1;        ///< channels of the input field
  Index out_channels = 1;       ///< channels of the output field
  std::vector<int> patch{4};    ///< patch size per axis (one value: every axis)
  std::vector<int> overlap{0};  ///< cells a patch reads past its edges (one value: every axis)
  PaddingMode padding = PaddingMode::zeros;  ///< what overlapping patches read at open edges
  Index embed_dim = 64;                      ///< token width
  int depth = 4;                             ///< transformer blocks
  int heads = 4;                             ///< attention heads (divide embed_dim)
  Index mlp_channels = 0;                    ///< hidden width of the MLP; 0: 4 x embed_dim
  AttentionKind attention = AttentionKind::global;
  std::vector<Index> window{7};    ///< neighbourhood attention window (tokens per axis)
  std::vector<Index> dilation{1};  ///< neighbourhood attention dilation
  PositionKind position = PositionKind::sincos;
  std::vector<Index> extents;  ///< global field extents: needed for position learned
  Activation activation = Activation::gelu;
  bool input_skip = false;  ///< add a 1x1 convolution of the input to the output
  /// A TokenLayerNorm before the head, as in classification ViTs. Off by default: it sets
  /// every token's spread to one, so the head can no longer see amplitudes, which a
  /// regression of physical fields must reproduce.
  bool final_norm = false;
  std::uint64_t seed = 1;  ///< initialisation: same seed, same parameters
};

/// patch_embed (PatchEmbedding: in -> embed_dim tokens, one per patch), position
/// (PositionalEmbedding), then `depth` pre-norm blocks
///   x = x + attention{l}(norm{l}a(x));   x = x + mlp{l}(norm{l}b(x))
/// (MultiHeadAttention; MLP = 1x1 conv embed -> mlp_channels, activation, 1x1 conv back;
/// norms are TokenLayerNorm), then head_norm (final_norm only) and head (PatchUnembedding:
/// each token back to its patch of out_channels cells) on the input field's
/// decomposition; with input_skip,
/// plus skip (1x1 conv in -> out) of the input, which carries the linear, cell-by-cell part
/// of a surrogate at full resolution.
///
/// Sharding: tokens live on the rank of their patch; only attention communicates (a ring of
/// K/V blocks per block for global attention, a K/V halo for neighbourhood attention), plus
/// one redistribution of the output when split points are not multiples of the patch.
/// Every field extent must be a multiple of the patch size, every rank must own at least one
/// patch origin.
template <class T>
class ViT : public Module<T> {
 public:
  ViT(const Communicator& comm, ViTOptions options, const std::string& name = "vit");

  Variable<T> forward(const Variable<T>& input) override;
  /// The input feeds only the patch embedding (a convolution).
  bool reads_owned_cells_only() const override { return true; }

  const ViTOptions& options() const { return options_; }

 private:
  struct Block {
    std::shared_ptr<TokenLayerNorm<T>> norm_a, norm_b;
    std::shared_ptr<MultiHeadAttention<T>> attention;
    std::shared_ptr<Conv<T>> mlp_in, mlp_out;
  };
  std::shared_ptr<Conv<T>> pointwise(const std::string& name, Index in, Index out);

  Communicator comm_;
  ViTOptions options_;
  std::string name_;
  std::shared_ptr<PatchEmbedding<T>> patch_embed_;
  std::shared_ptr<PositionalEmbedding<T>> position_;
  std::vector<Block> blocks_;
  std::shared_ptr<TokenLayerNorm<T>> head_norm_;
  std::shared_ptr<PatchUnembedding<T>> head_;
  std::shared_ptr<Conv<T>> skip_;  // input_skip only
};

extern template class ViT<float>;
extern template class ViT<double>;

}  // namespace shardtensor::models
