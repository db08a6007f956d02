#include "shardtensor/models/vit.hpp"

#include "shardtensor/models/impl/layer_seed.hpp"

namespace shardtensor::models {

template <class T>
ViT<T>::ViT(const Communicator& comm, ViTOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  ViTOptions& o = options_;
  const std::string where = "ViT '" + name_ + "'";
  SHARDTENSOR_REQUIRE(o.dims >= 1 && o.dims <= 3, where, "dims " << o.dims << " outside [1, 3]");
  SHARDTENSOR_REQUIRE(o.in_channels >= 1 && o.out_channels >= 1 && o.embed_dim >= 1, where,
                      "in_channels " << o.in_channels << ", out_channels " << o.out_channels
                                     << " and embed_dim " << o.embed_dim << " must be at least 1");
  SHARDTENSOR_REQUIRE(o.depth >= 0, where, "depth " << o.depth << " must not be negative");
  SHARDTENSOR_REQUIRE(o.heads >= 1 && o.embed_dim % o.heads == 0, where,
                      "embed_dim " << o.embed_dim << " not divisible by heads " << o.heads);
  if (o.patch.size() == 1) o.patch.assign(o.dims, o.patch[0]);
  if (o.overlap.size() == 1) o.overlap.assign(o.dims, o.overlap[0]);
  SHARDTENSOR_REQUIRE(int(o.patch.size()) == o.dims && int(o.overlap.size()) == o.dims, where,
                      "patch (" << o.patch.size() << " entries) and overlap (" << o.overlap.size()
                                << ") need one value or one per axis of a " << o.dims
                                << "-D field");
  if (o.mlp_channels == 0) o.mlp_channels = 4 * o.embed_dim;

  PatchEmbeddingOptions pe;
  pe.in_channels = int(o.in_channels);
  pe.embed_dim = int(o.embed_dim);
  pe.patch = o.patch;
  pe.overlap = o.overlap;
  pe.padding_mode = o.padding;
  pe.seed = impl::layer_seed(o.seed, "patch_embed");
  patch_embed_ = std::make_shared<PatchEmbedding<T>>(comm_, pe, name_ + ".patch_embed");
  this->register_module("patch_embed", patch_embed_);

  std::vector<Index> grid;
  if (o.position == PositionKind::learned) {
    SHARDTENSOR_REQUIRE(int(o.extents.size()) == o.dims, where,
                        "a learned positional embedding needs the field extents ("
                            << o.extents.size() << " given for a " << o.dims << "-D field)");
    for (int d = 0; d < o.dims; ++d) {
      SHARDTENSOR_REQUIRE(o.extents[d] % o.patch[d] == 0, where,
                          "field extent " << o.extents[d] << " along dim " << d
                                          << " is not a multiple of the patch size " << o.patch[d]);
      grid.push_back(o.extents[d] / o.patch[d]);
    }
  }
  position_ = std::make_shared<PositionalEmbedding<T>>(comm_, o.position, int(o.embed_dim), grid,
                                                       impl::layer_seed(o.seed, "position"),
                                                       name_ + ".position");
  this->register_module("position", position_);

  for (int l = 0; l < o.depth; ++l) {
    const std::string index = std::to_string(l);
    Block b;
    b.norm_a = std::make_shared<TokenLayerNorm<T>>(comm_, int(o.embed_dim), 1e-5,
                                                   name_ + ".norm" + index + "a");
    this->register_module("norm" + index + "a", b.norm_a);
    MultiHeadAttentionOptions a;
    a.dims = o.dims;
    a.channels = int(o.embed_dim);
    a.heads = o.heads;
    a.kind = o.attention;
    a.window = o.window;
    a.dilation = o.dilation;
    a.seed = impl::layer_seed(o.seed, "attention" + index);
    b.attention = std::make_shared<MultiHeadAttention<T>>(comm_, a, name_ + ".attention" + index);
    this->register_module("attention" + index, b.attention);
    b.norm_b = std::make_shared<TokenLayerNorm<T>>(comm_, int(o.embed_dim), 1e-5,
                                                   name_ + ".norm" + index + "b");
    this->register_module("norm" + index + "b", b.norm_b);
    b.mlp_in = pointwise("mlp" + index + "_in", o.embed_dim, o.mlp_channels);
    b.mlp_out = pointwise("mlp" + index + "_out", o.mlp_channels, o.embed_dim);
    blocks_.push_back(b);
  }
  if (o.final_norm) {
    head_norm_ =
        std::make_shared<TokenLayerNorm<T>>(comm_, int(o.embed_dim), 1e-5, name_ + ".head_norm");
    this->register_module("head_norm", head_norm_);
  }
  PatchUnembeddingOptions h;
  h.embed_dim = int(o.embed_dim);
  h.out_channels = int(o.out_channels);
  h.patch = o.patch;
  h.seed = impl::layer_seed(o.seed, "head");
  head_ = std::make_shared<PatchUnembedding<T>>(comm_, h, name_ + ".head");
  this->register_module("head", head_);
  if (o.input_skip) skip_ = pointwise("skip", o.in_channels, o.out_channels);
}

template <class T>
std::shared_ptr<Conv<T>> ViT<T>::pointwise(const std::string& name, Index in, Index out) {
  auto conv = make_pointwise_conv<T>(comm_, options_.dims, in, out,
                                     impl::layer_seed(options_.seed, name), name_ + "." + name);
  this->register_module(name, conv);
  return conv;
}

template <class T>
Variable<T> ViT<T>::forward(const Variable<T>& input) {
  Variable<T> x = (*position_)((*patch_embed_)(input));
  for (Block& b : blocks_) {
    x = add(x, (*b.attention)((*b.norm_a)(x)));
    x = add(x, (*b.mlp_out)(activate((*b.mlp_in)((*b.norm_b)(x)), options_.activation)));
  }
  if (head_norm_) x = (*head_norm_)(x);
  Variable<T> y = head_->forward(x, input.value().decomposition());
  return skip_ ? add(y, (*skip_)(input)) : y;
}

template class ViT<float>;
template class ViT<double>;

}  // namespace shardtensor::models
