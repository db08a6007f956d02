#pragma once
// PatchEmbedding<T> and PatchUnembedding<T>: a sharded field to a grid of patch tokens (a
// vision transformer's input) and tokens back to a field.

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/layers/conv.hpp"
#include "shardtensor/layers/conv_transpose.hpp"

namespace shardtensor {

struct PatchEmbeddingOptions {
  int in_channels = 1;
  int embed_dim = 64;
  std::vector<int> patch;    ///< patch size per spatial dim (its length sets the dims)
  std::vector<int> overlap;  ///< cells each patch reads past its edges per dim, default 0
  /// What overlapping patches read past an open global boundary (periodic axes wrap
  /// whatever this says when it is PaddingMode::periodic; see Conv).
  PaddingMode padding_mode = PaddingMode::zeros;
  std::uint64_t seed = 0;  ///< initialisation seed; 0 derives it from the layer name
};

/// Token (t0, t1, t2) of channel e = sum over the patch's cells of weight * field + bias:
/// a convolution with kernel patch + 2 * overlap, stride patch and padding overlap, as
/// PyTorch ViTs embed patches (nn.Conv2d with kernel == stride when overlap is 0). The
/// output is a field of extent / patch tokens per axis with embed_dim channels; token t is
/// owned by the rank owning field cell t * patch, so tokens stay on the rank of their
/// field (no communication for overlap 0; overlapping patches read a halo of `overlap`
/// cells from the neighbours).
///
/// Every field extent must be a multiple of the patch size (so PatchUnembedding restores
/// the field's shape); every rank must own at least one patch origin. Both throw Error.
template <class T>
class PatchEmbedding : public Module<T> {
 public:
  PatchEmbedding(const Communicator& comm, PatchEmbeddingOptions options,
                 const std::string& name = "patch_embedding");

  Variable<T> forward(const Variable<T>& input) override;
  bool reads_owned_cells_only() const override { return true; }

  const PatchEmbeddingOptions& options() const { return options_; }
  /// Token grid of a field decomposition (what forward produces).
  Decomposition token_decomposition(const Decomposition& field) const;

 private:
  void check_field(const Decomposition& field) const;

  PatchEmbeddingOptions options_;
  std::string name_;
  std::shared_ptr<Conv<T>> conv_;
};

struct PatchUnembeddingOptions {
  int embed_dim = 64;
  int out_channels = 1;
  std::vector<int> patch;  ///< patch size per spatial dim
  std::uint64_t seed = 0;
};

/// The inverse map: every token becomes its patch of cells, patch = W token + bias (a
/// transposed convolution with kernel == stride == patch: each output cell comes from one
/// token, so there is no communication). forward(tokens, field) then lays the result out
/// like `field` (redistribute_field: bit-exact, one exchange when the field's split points
/// are not multiples of the patch, none otherwise).
template <class T>
class PatchUnembedding : public Module<T> {
 public:
  PatchUnembedding(const Communicator& comm, PatchUnembeddingOptions options,
                   const std::string& name = "patch_unembedding");

  /// The field in the transposed convolution's decomposition (token split points x patch).
  Variable<T> forward(const Variable<T>& tokens) override;
  /// The field on `field`'s decomposition, which must have tokens x patch cells per axis.
  Variable<T> forward(const Variable<T>& tokens, const Decomposition& field);

  const PatchUnembeddingOptions& options() const { return options_; }

 private:
  Communicator comm_;
  PatchUnembeddingOptions options_;
  std::string name_;
  std::shared_ptr<ConvTranspose<T>> conv_;
};

extern template class PatchEmbedding<float>;
extern template class PatchEmbedding<double>;
extern template class PatchUnembedding<float>;
extern template class PatchUnembedding<double>;

}  // namespace shardtensor
