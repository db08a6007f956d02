#include "shardtensor/models/unet.hpp"

#include "shardtensor/models/impl/layer_seed.hpp"
#include "shardtensor/models/sequential.hpp"
#include "shardtensor/layers/concat.hpp"
#include "shardtensor/layers/recompute.hpp"

namespace shardtensor::models {

const char* to_string(NormKind kind) {
  switch (kind) {
    case NormKind::group:
      return "group";
    case NormKind::layer:
      return "layer";
    case NormKind::batch:
      return "batch";
    default:
      return "none";
  }
}

const char* to_string(DownMode mode) {
  switch (mode) {
    case DownMode::avgpool:
      return "avgpool";
    case DownMode::conv:
      return "conv";
    default:
      return "maxpool";
  }
}

const char* to_string(UpMode mode) {
  switch (mode) {
    case UpMode::nearest:
      return "nearest";
    case UpMode::linear:
      return "linear";
    default:
      return "transpose";
  }
}

template <class T>
UNet<T>::UNet(const Communicator& comm, UNetOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const UNetOptions& o = options_;
  const std::string where = "UNet '" + name_ + "'";
  SHARDTENSOR_REQUIRE(o.dims >= 1 && o.dims <= 3, where, "dims " << o.dims << " outside [1, 3]");
  SHARDTENSOR_REQUIRE(o.in_channels >= 1 && o.out_channels >= 1, where,
                      "in_channels " << o.in_channels << " and out_channels " << o.out_channels
                                     << " must be at least 1");
  SHARDTENSOR_REQUIRE(o.depth >= 0 && o.depth <= 16, where,
                      "depth " << o.depth << " outside [0, 16]");
  SHARDTENSOR_REQUIRE(o.base_channels >= 1, where,
                      "base_channels " << o.base_channels << " must be at least 1");
  SHARDTENSOR_REQUIRE(o.blocks >= 1, where, "blocks " << o.blocks << " must be at least 1");
  // Every level has a multiple of base_channels, so dividing it is enough.
  SHARDTENSOR_REQUIRE(
      o.norm != NormKind::group || (o.norm_groups >= 1 && o.base_channels % o.norm_groups == 0),
      where,
      "norm_groups " << o.norm_groups << " does not divide base_channels " << o.base_channels);

  for (int l = 0; l < o.depth; ++l) {
    const Index in = l == 0 ? o.in_channels : channels(l - 1);
    down_.push_back(make_block("down" + std::to_string(l), in, channels(l)));
    downsample_.push_back(make_down("downsample" + std::to_string(l), channels(l)));
  }
  bottom_ =
      make_block("bottom", o.depth == 0 ? o.in_channels : channels(o.depth - 1), channels(o.depth));
  upsample_.resize(o.depth);
  up_.resize(o.depth);
  for (int l = o.depth - 1; l >= 0; --l) {  // registration follows the data flow
    upsample_[l] = make_up("upsample" + std::to_string(l), channels(l + 1), channels(l));
    up_[l] = make_block("up" + std::to_string(l), 2 * channels(l), channels(l),
                        recomputes_in_two_units(l));
  }
  head_ = make_conv("head", channels(0), o.out_channels, 1, 1, true);
  this->register_module("head", head_);
  if (o.input_skip) {
    skip_ = make_conv("skip", o.in_channels, o.out_channels, 1, 1, true);
    this->register_module("skip", skip_);
  }
}

template <class T>
std::shared_ptr<Conv<T>> UNet<T>::make_conv(const std::string& name, Index in, Index out,
                                            int kernel, int stride, bool bias) {
  ConvOptions c;
  c.in_channels = int(in);
  c.out_channels = int(out);
  c.kernel.assign(options_.dims, kernel);
  c.stride.assign(options_.dims, stride);
  c.padding.assign(options_.dims, kernel == 3 ? 1 : 0);  // "same" for 3; 1 and 2 need none
  c.padding_mode = kernel == 3 ? options_.padding : PaddingMode::zeros;
  c.bias = bias;
  c.seed = impl::layer_seed(options_.seed, name);
  return std::make_shared<Conv<T>>(comm_, c, name_ + "." + name);
}

template <class T>
std::shared_ptr<Sequential<T>> UNet<T>::make_block(const std::string& name, Index in, Index out,
                                                   bool two_recomputed_units) {
  auto block = std::make_shared<Sequential<T>>();
  const std::string path = name_ + "." + name;
  std::vector<std::shared_ptr<Conv<T>>> convs;
  std::vector<std::function<void(OutputGhosts<T>)>> set_norm_output_ghosts;
  for (int i = 0; i < options_.blocks; ++i) {
    const std::string index = std::to_string(i);
    const bool normalized = options_.norm != NormKind::none;
    // The normalization subtracts the mean per channel (or group): a bias would be wasted.
    std::shared_ptr<Conv<T>> conv =
        make_conv(name + ".conv" + index, i == 0 ? in : out, out, 3, 1, !normalized);
    block->add("conv" + index, conv);
    convs.push_back(conv);
    const std::string norm = "norm" + index;
    // The activation runs inside the normalization (fuse_activation): the normalized field,
    // the activation's input, is never stored, so a block keeps one field less per conv.
    const auto add_fused = [&](const auto& layer) {
      layer->fuse_activation(options_.activation);
      block->add(norm, layer);
      set_norm_output_ghosts.push_back(
          [layer](OutputGhosts<T> ghosts) { layer->set_output_ghosts(std::move(ghosts)); });
    };
    if (options_.norm == NormKind::group)
      add_fused(std::make_shared<GroupNorm<T>>(comm_, options_.norm_groups, int(out), 1e-5, true,
                                               path + "." + norm));
    else if (options_.norm == NormKind::layer)
      add_fused(std::make_shared<LayerNorm<T>>(comm_, int(out), 1e-5, true, path + "." + norm));
    else if (options_.norm == NormKind::batch)
      add_fused(
          std::make_shared<BatchNorm<T>>(comm_, int(out), 0.1, 1e-5, true, path + "." + norm));
    else
      block->add("activation" + index, std::make_shared<ActivationLayer<T>>(options_.activation));
  }
  // A normalization's output, the next conv's input, carries that conv's ghost cells where
  // nothing keeps it to the backward: the conv pads it in place, no copy beside it.
  for (std::size_t i = 0; i + 1 < convs.size() && i < set_norm_output_ghosts.size(); ++i)
    set_norm_output_ghosts[i]([next = convs[i + 1]](const ShardTensor<T>& like) {
      return kept_to_backward() ? GhostWidths{} : next->padded_input_ghosts(like);
    });
  // The first unit (conv0 and norm0, with the upsampling and the concatenation before them)
  // is recomputed by UNet::forward itself.
  if (two_recomputed_units) block->recompute_range(2, block->size());
  this->register_module(name, block);
  return block;
}

template <class T>
std::shared_ptr<Module<T>> UNet<T>::make_down(const std::string& name, Index channels) {
  std::shared_ptr<Module<T>> down;
  if (options_.down == DownMode::conv) {
    down = make_conv(name, channels, channels, 2, 2, true);
  } else {
    PoolOptions p;
    p.kind = options_.down == DownMode::maxpool ? PoolKind::max : PoolKind::average;
    p.window.assign(options_.dims, 2);
    down = std::make_shared<Pool<T>>(comm_, p, name_ + "." + name);
  }
  this->register_module(name, down);
  return down;
}

template <class T>
std::shared_ptr<Module<T>> UNet<T>::make_up(const std::string& name, Index in, Index out) {
  std::shared_ptr<Module<T>> up;
  if (options_.up == UpMode::transpose) {
    ConvTransposeOptions t;
    t.in_channels = int(in);
    t.out_channels = int(out);
    t.kernel.assign(options_.dims, 2);
    t.stride.assign(options_.dims, 2);
    t.seed = impl::layer_seed(options_.seed, name);
    up = std::make_shared<ConvTranspose<T>>(comm_, t, name_ + "." + name);
  } else {
    auto resize = std::make_shared<Sequential<T>>();
    resize->add("resize",
                std::make_shared<Upsample<T>>(
                    comm_, std::vector<int>(options_.dims, 2),
                    options_.up == UpMode::nearest ? UpsampleMode::nearest : UpsampleMode::linear,
                    name_ + "." + name + ".resize"));
    resize->add("conv", make_conv(name + ".conv", in, out, 3, 1, true));
    up = resize;
  }
  this->register_module(name, up);
  return up;
}

template <class T>
void UNet<T>::check_decomposition(const Decomposition& d) const {
  const std::string where = "UNet '" + name_ + "'";
  const int depth = options_.depth;
  SHARDTENSOR_REQUIRE(
      d.ndims() == options_.dims, where,
      "input field has " << d.ndims() << " spatial dims, the model " << options_.dims);
  const Index factor = Index(1) << depth;
  for (int dim = 0; dim < d.ndims(); ++dim) {
    const Index n = d.global_extent(dim);
    SHARDTENSOR_REQUIRE(n % factor == 0, where,
                        "field extent " << n << " along dim " << dim
                                        << " is not divisible by 2^depth = " << factor << " (depth "
                                        << depth << "): every level halves the extent");
    // Split points at each level, as pooling (or a stride-2 conv) computes them.
    const std::vector<Index>& full = d.split_points(dim);
    std::vector<Index> points = full;
    for (int level = 0; level <= depth; ++level) {
      for (std::size_t i = 0; i + 1 < points.size(); ++i) {
        SHARDTENSOR_REQUIRE(
            points[i] < points[i + 1], where,
            "at level " << level << " (extent " << n / (Index(1) << level) << " along dim " << dim
                        << ") the ranks at grid position " << i
                        << " own no cells (full-resolution cells [" << full[i] << ", "
                        << full[i + 1] << ")); with depth " << depth
                        << ", give every rank at least " << factor << " cells along dim " << dim
                        << ", ideally split points that are multiples of " << factor);
        const bool boundary = i == 0 || i + 2 == points.size();
        SHARDTENSOR_REQUIRE(options_.padding != PaddingMode::reflect || d.periodic(dim) ||
                                !boundary || points[i + 1] - points[i] >= 2,
                            where,
                            "reflect padding needs 2 cells on the boundary ranks, but at level "
                                << level << " the ranks at grid position " << i << " along dim "
                                << dim << " own " << points[i + 1] - points[i]);
      }
      for (Index& p : points) p = (p + 1) / 2;
    }
  }
}

template <class T>
Variable<T> UNet<T>::forward(const Variable<T>& input) {
  impl::require_field(input, "UNet");
  check_decomposition(input.value().decomposition());
  // Recomputed blocks keep only their inputs; level 0's upsampling, concatenation and up block
  // are two recomputed units of their own (up_in_two_units). (Every block as one unit per triple
  // kept more at the peak, before the normalizations carried their activation: 103 against 100 MiB
  // for the 64^3 bench U-Net, whose peak is level 0's backward.)
  const auto block = [this](const std::shared_ptr<Module<T>>& b, const Variable<T>& x) {
    return options_.recompute ? recompute(b, x) : b->forward(x);
  };
  std::vector<Variable<T>> skips;
  Variable<T> h = input;
  for (int l = 0; l < options_.depth; ++l) {
    h = block(down_[l], h);
    skips.push_back(h);
    h = downsample_[l]->forward(h);
  }
  h = block(bottom_, h);
  for (int l = options_.depth - 1; l >= 0; --l) {
    if (recomputes_in_two_units(l)) {
      h = up_in_two_units(l, std::move(skips[l]), h);
      continue;
    }
    if (options_.recompute) {
      h = up_as_one_unit(l, std::move(skips[l]), h);
      continue;
    }
    h = block(up_[l], concat_upsampled(l, std::move(skips[l]), h));
  }
  h = head_->forward(h);
  return skip_ ? add(h, skip_->forward(input)) : h;
}

template <class T>
Variable<T> UNet<T>::up_in_two_units(int l, Variable<T>&& skip, const Variable<T>& coarse) {
  // The first unit keeps the skip and the coarser level's output (which the upsampling keeps
  // anyway), not their concatenation: in its run inside backward the skip is copied into the
  // concatenation and let go before the upsampled field is made, so the skip, the upsampled
  // field and the concatenation never exist at once.
  const std::shared_ptr<Sequential<T>> up = up_[l];
  const auto first_unit = [this, l, up](std::vector<Variable<T>> in, bool graph_only) {
    const Variable<T> low = std::move(in[1]);
    return up->forward_layers(0, 2, concat_upsampled(l, std::move(in[0]), low), graph_only);
  };
  std::vector<Variable<T>> inputs;  // (a braced list would copy the skip and hold it)
  inputs.push_back(std::move(skip));
  inputs.push_back(coarse);
  const Variable<T> first =
      recompute<T>(std::move(inputs), {upsample_[l], (*up)[0], (*up)[1]}, first_unit);
  return up->forward_layers(2, up->size(), first);  // the second unit (recompute_range)
}

template <class T>
Variable<T> UNet<T>::up_as_one_unit(int l, Variable<T>&& skip, const Variable<T>& coarse) {
  // Kept to the backward: the skip and the coarser level's output (which the upsampling
  // keeps anyway), not their concatenation (twice the skip), under the finer levels' peak.
  const std::shared_ptr<Sequential<T>> up = up_[l];
  const auto unit = [this, l, up](std::vector<Variable<T>> in, bool graph_only) {
    const Variable<T> low = std::move(in[1]);
    const Variable<T> joined = concat_upsampled(l, std::move(in[0]), low);
    return graph_only ? up->forward_graph_only(joined) : up->forward(joined);
  };
  std::vector<Variable<T>> inputs;  // (a braced list would copy the skip and hold it)
  inputs.push_back(std::move(skip));
  inputs.push_back(coarse);
  return recompute<T>(std::move(inputs), {upsample_[l], up}, unit);
}

template <class T>
Variable<T> UNet<T>::concat_upsampled(int l, Variable<T>&& skip, const Variable<T>& coarse) {
  // No backward reads the skip's or the upsampled field's values (the graph keeps only what
  // the ops saved), so the skip goes once copied, and the two never exist beside the
  // concatenation at once.
  const GhostWidths ghosts = concat_ghosts(l, skip.value());
  const auto transpose = std::dynamic_pointer_cast<ConvTranspose<T>>(upsample_[l]);
  if (transpose && transpose->output_decomposition(coarse.value().decomposition()) ==
                       skip.value().decomposition())
    return concat_channels_written<T>(
        std::move(skip), channels(l),
        [&](const ShardTensor<T>& into, Index first) {
          return transpose->forward_into(coarse, into, first);
        },
        ghosts);
  // On split points that are not multiples of 2^depth the upsampled field is split a cell
  // off the skip's: the concatenation redistributes it straight into its channels.
  return concat_channels<T>(
      comm_, std::move(skip), channels(l), [&] { return upsample_[l]->forward(coarse); }, ghosts);
}

template <class T>
GhostWidths UNet<T>::concat_ghosts(int l, const ShardTensor<T>& skip) const {
  if (kept_to_backward()) return {};
  const auto conv = std::dynamic_pointer_cast<Conv<T>>((*up_[l])[0]);
  return conv ? conv->padded_input_ghosts(skip) : GhostWidths{};
}

template class UNet<float>;
template class UNet<double>;

}  // namespace shardtensor::models
