#include "shardtensor/models/builder.hpp"

#include <limits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "shardtensor/config/config_node.hpp"
#include "shardtensor/models/fno.hpp"
#include "shardtensor/models/onnx_import.hpp"
#include "shardtensor/models/impl/layer_seed.hpp"
#include "shardtensor/models/sequential.hpp"
#include "shardtensor/models/vit.hpp"
#include "shardtensor/layers.hpp"

namespace shardtensor::models {

namespace {

/// The reader of every model map: errors name "build_model: <key path> (line L)".
ConfigNode model_node(const YAML::Node& model, const std::string& key) {
  return ConfigNode(model, key, "build_model");
}

const std::vector<std::pair<std::string, Activation>> activations{
    {"relu", Activation::relu}, {"leaky_relu", Activation::leaky_relu},
    {"gelu", Activation::gelu}, {"silu", Activation::silu},
    {"tanh", Activation::tanh}, {"sigmoid", Activation::sigmoid}};
const std::vector<std::pair<std::string, PaddingMode>> padding_modes{
    {"zeros", PaddingMode::zeros},
    {"periodic", PaddingMode::periodic},
    {"replicate", PaddingMode::replicate},
    {"reflect", PaddingMode::reflect}};
const std::vector<std::pair<std::string, NormKind>> norms{{"group", NormKind::group},
                                                          {"batch", NormKind::batch},
                                                          {"layer", NormKind::layer},
                                                          {"none", NormKind::none}};
const std::vector<std::pair<std::string, DownMode>> down_modes{
    {"maxpool", DownMode::maxpool}, {"avgpool", DownMode::avgpool}, {"conv", DownMode::conv}};
const std::vector<std::pair<std::string, UpMode>> up_modes{
    {"transpose", UpMode::transpose}, {"nearest", UpMode::nearest}, {"linear", UpMode::linear}};

enum class ModelType { unet, sequential, fno, vit, onnx };
const std::vector<std::pair<std::string, ModelType>> model_types{
    {"unet", ModelType::unet},
    {"sequential", ModelType::sequential},
    {"fno", ModelType::fno},
    {"vit", ModelType::vit},
    {"onnx", ModelType::onnx}};
const std::vector<std::pair<std::string, AttentionKind>> attention_kinds{
    {"global", AttentionKind::global}, {"neighborhood", AttentionKind::neighborhood}};
const std::vector<std::pair<std::string, PositionKind>> position_kinds{
    {"sincos", PositionKind::sincos},
    {"learned", PositionKind::learned},
    {"none", PositionKind::none}};

enum class LayerType {
  conv,
  conv_transpose,
  pool,
  upsample,
  group_norm,
  layer_norm,
  batch_norm,
  activation,
  dropout,
  residual
};
const std::vector<std::pair<std::string, LayerType>> layer_types{
    {"conv", LayerType::conv},
    {"conv_transpose", LayerType::conv_transpose},
    {"pool", LayerType::pool},
    {"upsample", LayerType::upsample},
    {"group_norm", LayerType::group_norm},
    {"layer_norm", LayerType::layer_norm},
    {"batch_norm", LayerType::batch_norm},
    {"activation", LayerType::activation},
    {"dropout", LayerType::dropout},
    {"residual", LayerType::residual}};

/// Accepted keys per layer type (besides `type`).
std::vector<std::string> layer_keys(LayerType type) {
  switch (type) {
    case LayerType::conv:
      return {"type",    "out_channels", "kernel", "stride", "dilation",
              "padding", "padding_mode", "groups", "bias",   "seed"};
    case LayerType::conv_transpose:
      return {"type",    "out_channels",   "kernel", "stride", "dilation",
              "padding", "output_padding", "groups", "bias",   "seed"};
    case LayerType::pool:
      return {"type", "kind", "kernel", "stride", "padding", "padding_mode"};
    case LayerType::upsample:
      return {"type", "scale", "mode"};
    case LayerType::group_norm:
      return {"type", "groups", "eps", "affine"};
    case LayerType::layer_norm:
      return {"type", "eps", "affine"};
    case LayerType::batch_norm:
      return {"type", "momentum", "eps", "affine"};
    case LayerType::activation:
      return {"type", "function", "slope"};
    case LayerType::dropout:
      return {"type", "p", "seed"};
    default:
      return {"type", "layers"};
  }
}

/// Builds sequential models: tracks the channel count through the layers.
template <class T>
class SequentialBuilder {
 public:
  SequentialBuilder(const Communicator& comm, const ModelShape& shape, std::uint64_t seed)
      : comm_(comm), shape_(shape), seed_(seed) {}

  /// The layers of `list` (at `path`) applied to `channels` channels; updates `channels`.
  /// `top_level`: the last conv-like layer's out_channels defaults to the model's.
  std::shared_ptr<Sequential<T>> build_list(const ConfigNode& map, const std::string& key,
                                            Index& channels, bool top_level) {
    const ConfigNode list = map.required(key);
    list.check(list.yaml().IsSequence() && list.yaml().size() > 0,
               "expects a non-empty list of layer maps, got '" + list.text() + "'");
    const std::vector<ConfigNode> layers = map.sequence(key);
    // Where an omitted out_channels means the model's out_channels.
    std::size_t last_conv = layers.size();
    if (top_level)
      for (std::size_t i = 0; i < layers.size(); ++i) {
        const YAML::Node type = layers[i].yaml().IsMap() ? layers[i].yaml()["type"] : YAML::Node();
        if (type && type.IsScalar() &&
            (type.Scalar() == "conv" || type.Scalar() == "conv_transpose"))
          last_conv = i;
      }
    auto sequence = std::make_shared<Sequential<T>>();
    sequence->restore_input_layout(comm_);
    for (std::size_t i = 0; i < layers.size(); ++i)
      sequence->add(std::to_string(i), build_layer(layers[i], channels, i == last_conv));
    return sequence;
  }

 private:
  std::shared_ptr<Module<T>> build_layer(const ConfigNode& map, Index& channels,
                                         bool defaults_to_out) {
    map.check(map.yaml().IsMap(), "expects a layer map, got '" + map.text() + "'");
    const LayerType type = map.required_named("type", layer_types);
    map.require_map(layer_keys(type));
    try {
      return make(type, map, channels, defaults_to_out);
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& e) {  // a layer refused its options: say which config entry
      map.fail(e.what());
    }
  }

  /// out_channels: an integer, or `out` for the model's out_channels.
  Index out_channels(const ConfigNode& map, Index channels, bool defaults_to_out) const {
    if (!map.has("out_channels")) return defaults_to_out ? shape_.out_channels : channels;
    const ConfigNode value = map["out_channels"];
    if (value.yaml().IsScalar() && value.yaml().Scalar() == "out") return shape_.out_channels;
    long long x = 0;
    value.check(value.yaml().IsScalar() && YAML::convert<long long>::decode(value.yaml(), x) &&
                    x >= 1 && x <= std::numeric_limits<int>::max(),
                "expects a positive integer or 'out' (the model's out_channels), got '" +
                    value.text() + "'");
    return x;
  }

  std::uint64_t seed_of(const ConfigNode& map) const {
    return map.seed("seed", impl::layer_seed(seed_, map.path()));
  }

  std::shared_ptr<Module<T>> make(LayerType type, const ConfigNode& map, Index& channels,
                                  bool defaults_to_out) {
    const int dims = shape_.dims;
    const std::string& name = map.path();
    switch (type) {
      case LayerType::conv: {
        ConvOptions o;
        o.in_channels = int(channels);
        o.out_channels = int(out_channels(map, channels, defaults_to_out));
        o.kernel = map.required_sizes("kernel", dims, 1);
        o.stride = map.sizes("stride", dims, 1, 1);
        o.dilation = map.sizes("dilation", dims, 1, 1);
        if (map.has("padding") && map["padding"].yaml().IsScalar() &&
            map["padding"].yaml().Scalar() == "same") {
          for (int d = 0; d < dims; ++d) {
            map["padding"].check(o.kernel[d] % 2 == 1, "'same' padding needs an odd kernel, got " +
                                                           std::to_string(o.kernel[d]) +
                                                           " along dim " + std::to_string(d));
            o.padding.push_back(o.dilation[d] * (o.kernel[d] - 1) / 2);
          }
        } else {
          o.padding = map.sizes("padding", dims, 0, 0);
        }
        o.padding_mode = map.named("padding_mode", PaddingMode::zeros, padding_modes);
        o.groups = int(map.integer("groups", 1, 1));
        o.bias = map.get<bool>("bias", true);
        o.seed = seed_of(map);
        channels = o.out_channels;
        return std::make_shared<Conv<T>>(comm_, o, name);
      }
      case LayerType::conv_transpose: {
        ConvTransposeOptions o;
        o.in_channels = int(channels);
        o.out_channels = int(out_channels(map, channels, defaults_to_out));
        o.kernel = map.required_sizes("kernel", dims, 1);
        o.stride = map.sizes("stride", dims, 1, 1);
        o.dilation = map.sizes("dilation", dims, 1, 1);
        o.padding = map.sizes("padding", dims, 0, 0);
        o.output_padding = map.sizes("output_padding", dims, 0, 0);
        o.groups = int(map.integer("groups", 1, 1));
        o.bias = map.get<bool>("bias", true);
        o.seed = seed_of(map);
        channels = o.out_channels;
        return std::make_shared<ConvTranspose<T>>(comm_, o, name);
      }
      case LayerType::pool: {
        PoolOptions o;
        o.kind = map.named<PoolKind>("kind", PoolKind::max,
                                     {{"max", PoolKind::max}, {"average", PoolKind::average}});
        o.window = map.required_sizes("kernel", dims, 1);
        o.stride = map.has("stride") ? map.sizes("stride", dims, 1, 1) : o.window;
        o.padding = map.sizes("padding", dims, 0, 0);
        o.padding_mode = map.named<PaddingMode>(
            "padding_mode", PaddingMode::zeros,
            {{"zeros", PaddingMode::zeros}, {"periodic", PaddingMode::periodic}});
        return std::make_shared<Pool<T>>(comm_, o, name);
      }
      case LayerType::upsample:
        return std::make_shared<Upsample<T>>(
            comm_, map.sizes("scale", dims, 2, 1),
            map.named<UpsampleMode>(
                "mode", UpsampleMode::nearest,
                {{"nearest", UpsampleMode::nearest}, {"linear", UpsampleMode::linear}}),
            name);
      case LayerType::group_norm:
        return std::make_shared<GroupNorm<T>>(comm_, int(map.required_integer("groups", 1)),
                                              int(channels), map.number("eps", 1e-5, 0, 1),
                                              map.get<bool>("affine", true), name);
      case LayerType::layer_norm:
        return std::make_shared<LayerNorm<T>>(comm_, int(channels), map.number("eps", 1e-5, 0, 1),
                                              map.get<bool>("affine", true), name);
      case LayerType::batch_norm:
        return std::make_shared<BatchNorm<T>>(
            comm_, int(channels), map.number("momentum", 0.1, 0, 1), map.number("eps", 1e-5, 0, 1),
            map.get<bool>("affine", true), name);
      case LayerType::activation:
        return std::make_shared<ActivationLayer<T>>(map.required_named("function", activations),
                                                    map.number("slope", 0.01, -1e30, 1e30));
      case LayerType::dropout:
        return std::make_shared<Dropout<T>>(map.number("p", 0.5, 0, 0.999999), seed_of(map));
      default: {  // residual
        const Index in = channels;
        auto layers = build_list(map, "layers", channels, false);
        std::shared_ptr<Module<T>> projection;
        if (channels != in) {  // the skip path needs the body's channel count
          ConvOptions o;
          o.in_channels = int(in);
          o.out_channels = int(channels);
          o.kernel.assign(dims, 1);
          o.seed = impl::layer_seed(seed_, name + ".projection");
          projection = std::make_shared<Conv<T>>(comm_, o, name + ".projection");
        }
        return std::make_shared<Residual<T>>(layers, projection, name);
      }
    }
  }

  Communicator comm_;
  ModelShape shape_;
  std::uint64_t seed_;
};

const std::vector<std::string> unet_keys{
    "type", "depth",   "base_channels", "norm", "norm_groups", "activation", "down",
    "up",   "padding", "blocks",        "seed", "input_skip",  "recompute"};
const std::vector<std::string> sequential_keys{"type", "layers", "seed"};
const std::vector<std::string> fno_keys{
    "type", "width", "modes", "layers", "activation", "projection_channels", "seed"};

const std::vector<std::string> vit_keys{"type",       "patch",      "overlap",    "padding",
                                        "embed_dim",  "depth",      "heads",      "mlp_channels",
                                        "attention",  "window",     "dilation",   "position",
                                        "activation", "input_skip", "final_norm", "seed"};

void check_shape(const ModelShape& shape) {
  SHARDTENSOR_REQUIRE(shape.dims >= 1 && shape.dims <= 3, "build_model",
                      "dims " << shape.dims << " outside [1, 3]");
  SHARDTENSOR_REQUIRE(shape.in_channels >= 1 && shape.out_channels >= 1, "build_model",
                      "in_channels " << shape.in_channels << " and out_channels "
                                     << shape.out_channels << " must be at least 1");
}

ModelType model_type(const ConfigNode& model) {
  model.check(model.yaml().IsMap(), "expects a map of keys, got '" + model.text() + "'");
  return model.required_named("type", model_types);
}

/// The options of a `type: fno` map.
FNOOptions fno_options(const ConfigNode& map, const ModelShape& shape) {
  map.require_map(fno_keys);
  map["type"].check(
      shape.dims == 2 || shape.dims == 3,
      "the fno model runs on 2-D and 3-D fields, the data is " + std::to_string(shape.dims) + "-D");
  FNOOptions o;
  o.dims = shape.dims;
  o.in_channels = shape.in_channels;
  o.out_channels = shape.out_channels;
  o.width = map.integer("width", o.width, 1);
  o.modes = map.sizes("modes", shape.dims, o.modes[0], 1);
  o.layers = int(map.integer("layers", o.layers, 1));
  o.activation = map.named("activation", o.activation, activations);
  o.projection_channels = map.integer("projection_channels", o.projection_channels, 1);
  o.seed = map.seed("seed", o.seed);
  return o;
}

/// The options of a `type: vit` map.
ViTOptions vit_options(const ConfigNode& map, const ModelShape& shape) {
  map.require_map(vit_keys);
  ViTOptions o;
  o.dims = shape.dims;
  o.in_channels = shape.in_channels;
  o.out_channels = shape.out_channels;
  o.extents = shape.extents;
  o.patch = map.sizes("patch", shape.dims, o.patch[0], 1);
  o.overlap = map.sizes("overlap", shape.dims, 0, 0);
  o.padding = map.named("padding", o.padding, padding_modes);
  o.embed_dim = map.integer("embed_dim", o.embed_dim, 1);
  o.depth = int(map.integer("depth", o.depth, 0));
  o.heads = int(map.integer("heads", o.heads, 1));
  o.mlp_channels = map.integer("mlp_channels", o.mlp_channels, 0);
  o.attention = map.named("attention", o.attention, attention_kinds);
  const std::vector<int> window = map.sizes("window", shape.dims, int(o.window[0]), 1);
  const std::vector<int> dilation = map.sizes("dilation", shape.dims, int(o.dilation[0]), 1);
  o.window.assign(window.begin(), window.end());
  o.dilation.assign(dilation.begin(), dilation.end());
  o.position = map.named("position", o.position, position_kinds);
  o.activation = map.named("activation", o.activation, activations);
  o.input_skip = map.get<bool>("input_skip", o.input_skip);
  o.final_norm = map.get<bool>("final_norm", o.final_norm);
  o.seed = map.seed("seed", o.seed);
  map["heads"].check(o.embed_dim % o.heads == 0, "heads " + std::to_string(o.heads) +
                                                     " does not divide embed_dim " +
                                                     std::to_string(o.embed_dim));
  map[map.has("window") ? "window" : "dilation"].check(
      o.attention != AttentionKind::global || !(map.has("window") || map.has("dilation")),
      "window and dilation apply to attention: neighborhood, not global");
  map["position"].check(o.position != PositionKind::learned || !o.extents.empty(),
                        "position: learned needs the field extents, which this caller does not "
                        "know; use sincos");
  return o;
}

}  // namespace

UNetOptions unet_options(const YAML::Node& model, const ModelShape& shape, const std::string& key) {
  check_shape(shape);
  const ConfigNode map = model_node(model, key);
  map["type"].check(model_type(map) == ModelType::unet,
                    "expects 'unet', got '" + map["type"].text() + "'");
  map.require_map(unet_keys);
  UNetOptions o;
  o.dims = shape.dims;
  o.in_channels = shape.in_channels;
  o.out_channels = shape.out_channels;
  o.depth = int(map.integer("depth", o.depth, 0));
  o.base_channels = map.integer("base_channels", o.base_channels, 1);
  o.norm = map.named("norm", o.norm, norms);
  o.norm_groups = int(map.integer("norm_groups", o.norm_groups, 1));
  o.activation = map.named("activation", o.activation, activations);
  o.down = map.named("down", o.down, down_modes);
  o.up = map.named("up", o.up, up_modes);
  o.padding = map.named("padding", o.padding, padding_modes);
  o.blocks = int(map.integer("blocks", o.blocks, 1));
  o.seed = map.seed("seed", o.seed);
  o.input_skip = map.get<bool>("input_skip", o.input_skip);
  o.recompute = map.get<bool>("recompute", o.recompute);
  map["depth"].check(o.depth <= 16, "must lie in [0, 16], got " + std::to_string(o.depth));
  map[map.has("norm_groups") ? "norm_groups" : "base_channels"].check(
      o.norm != NormKind::group || o.base_channels % o.norm_groups == 0,
      "norm_groups " + std::to_string(o.norm_groups) + " does not divide base_channels " +
          std::to_string(o.base_channels) + " (every level has a multiple of base_channels)");
  return o;
}

template <class T>
std::shared_ptr<Module<T>> build_model(const YAML::Node& model, const Communicator& comm,
                                       const ModelShape& shape, const std::string& key) {
  check_shape(shape);
  const ConfigNode map = model_node(model, key);
  const ModelType type = model_type(map);
  if (type == ModelType::unet)
    return std::make_shared<UNet<T>>(comm, unet_options(model, shape, key), key);
  if (type == ModelType::fno) return std::make_shared<FNO<T>>(comm, fno_options(map, shape), key);
  if (type == ModelType::vit) return std::make_shared<ViT<T>>(comm, vit_options(map, shape), key);
  if (type == ModelType::onnx) {
    map.require_map({"type", "path", "train_initializers"});
    std::vector<std::string> trained;
    for (const ConfigNode& name : map.sequence("train_initializers"))
      trained.push_back(name.as<std::string>());
    return import_onnx<T>(map.require<std::string>("path"), comm, shape, key, trained);
  }
  map.require_map(sequential_keys);
  SequentialBuilder<T> builder(comm, shape, map.seed("seed", 1));
  Index channels = shape.in_channels;
  auto sequence = builder.build_list(map, "layers", channels, true);
  map["layers"].check(channels == shape.out_channels,
                      "the layers end with " + std::to_string(channels) +
                          " channels, but the model's out_channels is " +
                          std::to_string(shape.out_channels) +
                          "; end with a conv whose out_channels is omitted or 'out'");
  return sequence;
}

template std::shared_ptr<Module<float>> build_model<float>(const YAML::Node&, const Communicator&,
                                                           const ModelShape&, const std::string&);
template std::shared_ptr<Module<double>> build_model<double>(const YAML::Node&, const Communicator&,
                                                             const ModelShape&, const std::string&);

}  // namespace shardtensor::models
