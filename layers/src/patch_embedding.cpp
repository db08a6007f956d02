#include "shardtensor/layers/patch_embedding.hpp"

#include "shardtensor/layers/pointwise.hpp"
#include "shardtensor/layers/redistribute_field.hpp"

namespace shardtensor {
namespace {

/// One patch size of at least 1 per spatial dim (1-3 of them); returns the dims.
int check_patch(const std::vector<int>& patch, const std::string& where) {
  const int dims = static_cast<int>(patch.size());
  SHARDTENSOR_REQUIRE(dims >= 1 && dims <= max_spatial_dims, where,
                      "patch has " << dims << " entries: give one size per spatial dim (1-3)");
  for (int d = 0; d < dims; ++d)
    SHARDTENSOR_REQUIRE(patch[d] >= 1, where,
                        "patch size " << patch[d] << " in dim " << d << " must be at least 1");
  return dims;
}

}  // namespace

template <class T>
PatchEmbedding<T>::PatchEmbedding(const Communicator& comm, PatchEmbeddingOptions options,
                                  const std::string& name)
    : options_(std::move(options)), name_(name) {
  PatchEmbeddingOptions& o = options_;
  const std::string where = "PatchEmbedding '" + name_ + "'";
  const int dims = check_patch(o.patch, where);
  if (o.overlap.empty()) o.overlap.assign(dims, 0);
  SHARDTENSOR_REQUIRE(
      int(o.overlap.size()) == dims, where,
      "overlap has " << o.overlap.size() << " entries for " << dims << " patch sizes");
  for (int d = 0; d < dims; ++d)
    SHARDTENSOR_REQUIRE(o.overlap[d] >= 0, where,
                        "overlap " << o.overlap[d] << " in dim " << d << " must not be negative");
  ConvOptions c;
  c.in_channels = o.in_channels;
  c.out_channels = o.embed_dim;
  c.stride = o.patch;
  c.padding = o.overlap;
  for (int d = 0; d < dims; ++d) c.kernel.push_back(o.patch[d] + 2 * o.overlap[d]);
  c.padding_mode = o.padding_mode;
  c.seed = o.seed;
  conv_ = std::make_shared<Conv<T>>(comm, c, name_);
  this->register_module("proj", conv_);
}

template <class T>
void PatchEmbedding<T>::check_field(const Decomposition& field) const {
  const int dims = static_cast<int>(options_.patch.size());
  SHARDTENSOR_REQUIRE(field.ndims() == dims, "PatchEmbedding '" + name_ + "'",
                      "a " << field.ndims() << "-D field for " << dims << "-D patches");
  for (int d = 0; d < dims; ++d)
    SHARDTENSOR_REQUIRE(
        field.global_extent(d) % options_.patch[d] == 0, "PatchEmbedding '" + name_ + "'",
        "field extent " << field.global_extent(d) << " along dim " << d
                        << " is not a multiple of the patch size " << options_.patch[d]);
}

template <class T>
Decomposition PatchEmbedding<T>::token_decomposition(const Decomposition& field) const {
  check_field(field);
  return conv_->geometry().output_decomposition(field, "PatchEmbedding '" + name_ + "'");
}

template <class T>
Variable<T> PatchEmbedding<T>::forward(const Variable<T>& input) {
  impl::require_field(input, "PatchEmbedding");
  check_field(input.value().decomposition());
  return conv_->forward(input);
}

template <class T>
PatchUnembedding<T>::PatchUnembedding(const Communicator& comm, PatchUnembeddingOptions options,
                                      const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  check_patch(options_.patch, "PatchUnembedding '" + name_ + "'");
  ConvTransposeOptions c;
  c.in_channels = options_.embed_dim;
  c.out_channels = options_.out_channels;
  c.kernel = options_.patch;
  c.stride = options_.patch;
  c.seed = options_.seed;
  conv_ = std::make_shared<ConvTranspose<T>>(comm, c, name_);
  this->register_module("proj", conv_);
}

template <class T>
Variable<T> PatchUnembedding<T>::forward(const Variable<T>& tokens) {
  return conv_->forward(tokens);
}

template <class T>
Variable<T> PatchUnembedding<T>::forward(const Variable<T>& tokens, const Decomposition& field) {
  impl::require_field(tokens, "PatchUnembedding");
  const Decomposition& grid = tokens.value().decomposition();
  bool same_shape = grid.ndims() == field.ndims();
  for (int d = 0; same_shape && d < field.ndims(); ++d)
    same_shape = grid.global_extent(d) * options_.patch[d] == field.global_extent(d);
  SHARDTENSOR_REQUIRE(
      same_shape, "PatchUnembedding '" + name_ + "'",
      "tokens " << grid.describe() << " times patches do not make the field " << field.describe());
  return redistribute_field(comm_, conv_->forward(tokens), field);
}

template class PatchEmbedding<float>;
template class PatchEmbedding<double>;
template class PatchUnembedding<float>;
template class PatchUnembedding<double>;

}  // namespace shardtensor
