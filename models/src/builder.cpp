#include "shardtensor/models/builder.hpp"

#include "shardtensor/config/config_node.hpp"

#include <limits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "shardtensor/config/config_node.hpp"
#include "shardtensor/models/fno.hpp"
#include "shardtensor/models/impl/layer_seed.hpp"
#include "shardtensor/models/sequential.hpp"
#include "shardtensor/models/vit.hpp"
#include "shardtensor/nn.hpp"

namespace shardtensor::models {

namespace {

/// A config error: already names its key and line, so it passes through unchanged where
/// errors of the layers (a bad group count, ...) get the layer's key and line added.
class ConfigError : public Error {
 public:
  using Error::Error;
};

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

/// 1-based line of a node, or 0 when it has none (a missing key).
int line_of(const YAML::Node& node) {
  return node.IsDefined() && node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
}

[[noreturn]] void fail(const std::string& path, const YAML::Node& node,
                       const std::string& message) {
  std::ostringstream out;
  out << "build_model: " << path;
  if (const int line = line_of(node)) out << " (line " << line << ")";
  out << ": " << message;
  throw ConfigError(out.str());
}

/// The node as written, for messages.
std::string shown(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "nothing";
}

/// A config map whose keys must all be in `accepted`: reads values with their key paths.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, std::vector<std::string> accepted)
      : node_(node), path_(std::move(path)), accepted_(std::move(accepted)) {
    if (!node_.IsMap()) fail(path_, node_, "expected a map of keys, got " + shown(node_));
    try {
      ConfigNode::check_keys(node_, path_, "build_model", accepted_);
    } catch (const Error& e) {
      throw ConfigError(e.what());  // names its key and line already
    }
  }

  const std::string& path() const { return path_; }
  const YAML::Node& node() const { return node_; }
  std::string path(const std::string& key) const { return path_ + "." + key; }
  bool has(const std::string& key) const { return bool(node_[key]); }

  YAML::Node required(const std::string& key, const std::string& hint = "") const {
    const YAML::Node value = node_[key];
    if (!value) fail(path_, node_, "missing required key '" + key + "'" + hint);
    return value;
  }

  long long integer(const std::string& key, long long fallback, long long min) const {
    return has(key) ? integer_value(node_[key], path(key), min) : fallback;
  }
  long long required_integer(const std::string& key, long long min) const {
    return integer_value(required(key), path(key), min);
  }

  double real(const std::string& key, double fallback, double min, double max) const {
    if (!has(key)) return fallback;
    const YAML::Node value = node_[key];
    double x = 0;
    if (!value.IsScalar() || !YAML::convert<double>::decode(value, x))
      fail(path(key), value, "expected a number, got " + shown(value));
    if (!(x >= min && x <= max)) {
      std::ostringstream range;
      range << "value " << x << " outside [" << min << ", " << max << "]";
      fail(path(key), value, range.str());
    }
    return x;
  }

  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const YAML::Node value = node_[key];
    bool b = false;
    if (!value.IsScalar() || !YAML::convert<bool>::decode(value, b))
      fail(path(key), value, "expected true or false, got " + shown(value));
    return b;
  }

  std::uint64_t seed(const std::string& key, std::uint64_t fallback) const {
    if (!has(key)) return fallback;
    const YAML::Node value = node_[key];
    unsigned long long s = 0;
    if (!value.IsScalar() || value.Scalar().find('-') != std::string::npos ||
        !YAML::convert<unsigned long long>::decode(value, s))
      fail(path(key), value, "expected a non-negative integer, got " + shown(value));
    return s;
  }

  /// One of the names in `choices`.
  template <class E>
  E choice(const std::string& key, E fallback,
           const std::vector<std::pair<std::string, E>>& choices) const {
    return has(key) ? choice_value(node_[key], path(key), choices) : fallback;
  }
  template <class E>
  E required_choice(const std::string& key,
                    const std::vector<std::pair<std::string, E>>& choices) const {
    std::vector<std::string> names;
    for (const auto& c : choices) names.push_back(c.first);
    return choice_value(required(key, "; accepted values: " + join(names)), path(key), choices);
  }

  /// One size per spatial dim: a single integer (the same along every dim) or a list.
  std::vector<int> sizes(const std::string& key, int dims, int fallback, int min) const {
    if (!has(key)) return std::vector<int>(dims, fallback);
    return sizes_value(node_[key], path(key), dims, min);
  }
  std::vector<int> required_sizes(const std::string& key, int dims, int min) const {
    return sizes_value(required(key), path(key), dims, min);
  }

  static long long integer_value(const YAML::Node& value, const std::string& path, long long min) {
    long long x = 0;
    if (!value.IsScalar() || !YAML::convert<long long>::decode(value, x))
      fail(path, value, "expected an integer, got " + shown(value));
    if (x < min)
      fail(path, value, "value " + std::to_string(x) + " must be at least " + std::to_string(min));
    if (x > std::numeric_limits<int>::max())
      fail(path, value, "value " + std::to_string(x) + " is too large");
    return x;
  }

  template <class E>
  static E choice_value(const YAML::Node& value, const std::string& path,
                        const std::vector<std::pair<std::string, E>>& choices) {
    std::vector<std::string> names;
    for (const auto& c : choices) names.push_back(c.first);
    if (!value.IsScalar())
      fail(path, value, "expected one of " + join(names) + ", got " + shown(value));
    for (const auto& c : choices)
      if (c.first == value.Scalar()) return c.second;
    fail(path, value, "unknown value " + shown(value) + "; accepted values: " + join(names));
  }

  static std::vector<int> sizes_value(const YAML::Node& value, const std::string& path, int dims,
                                      int min) {
    if (value.IsSequence()) {
      if (int(value.size()) != dims)
        fail(path, value,
             "expected " + std::to_string(dims) + " sizes (one per spatial dim), got " +
                 std::to_string(value.size()));
      std::vector<int> out;
      for (std::size_t i = 0; i < value.size(); ++i)
        out.push_back(int(integer_value(value[i], path + "[" + std::to_string(i) + "]", min)));
      return out;
    }
    return std::vector<int>(dims, int(integer_value(value, path, min)));
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::vector<std::string> accepted_;
};

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

enum class ModelType { unet, sequential, fno, vit };
const std::vector<std::pair<std::string, ModelType>> model_types{
    {"unet", ModelType::unet},
    {"sequential", ModelType::sequential},
    {"fno", ModelType::fno},
    {"vit", ModelType::vit}};
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
  std::shared_ptr<Sequential<T>> build_list(const YAML::Node& list, const std::string& path,
                                            Index& channels, bool top_level) {
    if (!list.IsSequence() || list.size() == 0)
      fail(path, list, "expected a non-empty list of layer maps, got " + shown(list));
    // Where an omitted out_channels means the model's out_channels.
    std::size_t last_conv = list.size();
    if (top_level)
      for (std::size_t i = 0; i < list.size(); ++i)
        if (list[i].IsMap() && list[i]["type"] && list[i]["type"].IsScalar() &&
            (list[i]["type"].Scalar() == "conv" || list[i]["type"].Scalar() == "conv_transpose"))
          last_conv = i;
    auto sequence = std::make_shared<Sequential<T>>();
    sequence->restore_input_layout(comm_);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string item = path + "[" + std::to_string(i) + "]";
      sequence->add(std::to_string(i), build_layer(list[i], item, channels, i == last_conv));
    }
    return sequence;
  }

 private:
  std::shared_ptr<Module<T>> build_layer(const YAML::Node& node, const std::string& path,
                                         Index& channels, bool defaults_to_out) {
    if (!node.IsMap()) fail(path, node, "expected a layer map, got " + shown(node));
    if (!node["type"]) {
      std::vector<std::string> names;
      for (const auto& t : layer_types) names.push_back(t.first);
      fail(path, node, "missing required key 'type'; accepted values: " + join(names));
    }
    const LayerType type = MapReader::choice_value(node["type"], path + ".type", layer_types);
    const MapReader map(node, path, layer_keys(type));
    try {
      return make(type, map, channels, defaults_to_out);
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& e) {  // a layer refused its options: say which config entry
      fail(path, node, e.what());
    }
  }

  /// out_channels: an integer, or `out` for the model's out_channels.
  Index out_channels(const MapReader& map, Index channels, bool defaults_to_out) const {
    if (!map.has("out_channels")) return defaults_to_out ? shape_.out_channels : channels;
    const YAML::Node value = map.node()["out_channels"];
    if (value.IsScalar() && value.Scalar() == "out") return shape_.out_channels;
    long long x = 0;
    if (!value.IsScalar() || !YAML::convert<long long>::decode(value, x) || x < 1 ||
        x > std::numeric_limits<int>::max())
      fail(map.path("out_channels"), value,
           "expected a positive integer or 'out' (the model's out_channels), got " + shown(value));
    return x;
  }

  std::uint64_t seed_of(const MapReader& map) const {
    return map.seed("seed", impl::layer_seed(seed_, map.path()));
  }

  std::shared_ptr<Module<T>> make(LayerType type, const MapReader& map, Index& channels,
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
        if (map.has("padding") && map.node()["padding"].IsScalar() &&
            map.node()["padding"].Scalar() == "same") {
          for (int d = 0; d < dims; ++d) {
            if (o.kernel[d] % 2 == 0)
              fail(map.path("padding"), map.node()["padding"],
                   "'same' padding needs an odd kernel, got " + std::to_string(o.kernel[d]) +
                       " along dim " + std::to_string(d));
            o.padding.push_back(o.dilation[d] * (o.kernel[d] - 1) / 2);
          }
        } else {
          o.padding = map.sizes("padding", dims, 0, 0);
        }
        o.padding_mode = map.choice("padding_mode", PaddingMode::zeros, padding_modes);
        o.groups = int(map.integer("groups", 1, 1));
        o.bias = map.boolean("bias", true);
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
        o.bias = map.boolean("bias", true);
        o.seed = seed_of(map);
        channels = o.out_channels;
        return std::make_shared<ConvTranspose<T>>(comm_, o, name);
      }
      case LayerType::pool: {
        PoolOptions o;
        o.kind = map.choice<PoolKind>("kind", PoolKind::max,
                                      {{"max", PoolKind::max}, {"average", PoolKind::average}});
        o.window = map.required_sizes("kernel", dims, 1);
        o.stride = map.has("stride") ? map.sizes("stride", dims, 1, 1) : o.window;
        o.padding = map.sizes("padding", dims, 0, 0);
        o.padding_mode = map.choice<PaddingMode>(
            "padding_mode", PaddingMode::zeros,
            {{"zeros", PaddingMode::zeros}, {"periodic", PaddingMode::periodic}});
        return std::make_shared<Pool<T>>(comm_, o, name);
      }
      case LayerType::upsample:
        return std::make_shared<Upsample<T>>(
            comm_, map.sizes("scale", dims, 2, 1),
            map.choice<UpsampleMode>(
                "mode", UpsampleMode::nearest,
                {{"nearest", UpsampleMode::nearest}, {"linear", UpsampleMode::linear}}),
            name);
      case LayerType::group_norm:
        return std::make_shared<GroupNorm<T>>(comm_, int(map.required_integer("groups", 1)),
                                              int(channels), map.real("eps", 1e-5, 0, 1),
                                              map.boolean("affine", true), name);
      case LayerType::layer_norm:
        return std::make_shared<LayerNorm<T>>(comm_, int(channels), map.real("eps", 1e-5, 0, 1),
                                              map.boolean("affine", true), name);
      case LayerType::batch_norm:
        return std::make_shared<BatchNorm<T>>(comm_, int(channels), map.real("momentum", 0.1, 0, 1),
                                              map.real("eps", 1e-5, 0, 1),
                                              map.boolean("affine", true), name);
      case LayerType::activation:
        return std::make_shared<ActivationLayer<T>>(map.required_choice("function", activations),
                                                    map.real("slope", 0.01, -1e30, 1e30));
      case LayerType::dropout:
        return std::make_shared<Dropout<T>>(map.real("p", 0.5, 0, 0.999999), seed_of(map));
      default: {  // residual
        const Index in = channels;
        auto layers = build_list(map.required("layers"), map.path("layers"), channels, false);
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
    "type", "depth", "base_channels", "norm",   "norm_groups", "activation",
    "down", "up",    "padding",       "blocks", "seed",        "input_skip", "recompute"};
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

ModelType model_type(const YAML::Node& model, const std::string& key) {
  if (!model.IsMap()) fail(key, model, "expected a map of keys, got " + shown(model));
  if (!model["type"])
    fail(key, model, "missing required key 'type'; accepted values: unet, sequential, fno, vit");
  return MapReader::choice_value(model["type"], key + ".type", model_types);
}

/// The options of a `type: fno` map.
FNOOptions fno_options(const YAML::Node& model, const ModelShape& shape, const std::string& key) {
  const MapReader map(model, key, fno_keys);
  if (shape.dims != 2 && shape.dims != 3)
    fail(key + ".type", model["type"],
         "the fno model runs on 2-D and 3-D fields, the data is " + std::to_string(shape.dims) +
             "-D");
  FNOOptions o;
  o.dims = shape.dims;
  o.in_channels = shape.in_channels;
  o.out_channels = shape.out_channels;
  o.width = map.integer("width", o.width, 1);
  o.modes = map.sizes("modes", shape.dims, o.modes[0], 1);
  o.layers = int(map.integer("layers", o.layers, 1));
  o.activation = map.choice("activation", o.activation, activations);
  o.projection_channels = map.integer("projection_channels", o.projection_channels, 1);
  o.seed = map.seed("seed", o.seed);
  return o;
}

/// The options of a `type: vit` map.
ViTOptions vit_options(const YAML::Node& model, const ModelShape& shape, const std::string& key) {
  const MapReader map(model, key, vit_keys);
  ViTOptions o;
  o.dims = shape.dims;
  o.in_channels = shape.in_channels;
  o.out_channels = shape.out_channels;
  o.extents = shape.extents;
  o.patch = map.sizes("patch", shape.dims, o.patch[0], 1);
  o.overlap = map.sizes("overlap", shape.dims, 0, 0);
  o.padding = map.choice("padding", o.padding, padding_modes);
  o.embed_dim = map.integer("embed_dim", o.embed_dim, 1);
  o.depth = int(map.integer("depth", o.depth, 0));
  o.heads = int(map.integer("heads", o.heads, 1));
  o.mlp_channels = map.integer("mlp_channels", o.mlp_channels, 0);
  o.attention = map.choice("attention", o.attention, attention_kinds);
  const std::vector<int> window = map.sizes("window", shape.dims, int(o.window[0]), 1);
  const std::vector<int> dilation = map.sizes("dilation", shape.dims, int(o.dilation[0]), 1);
  o.window.assign(window.begin(), window.end());
  o.dilation.assign(dilation.begin(), dilation.end());
  o.position = map.choice("position", o.position, position_kinds);
  o.activation = map.choice("activation", o.activation, activations);
  o.input_skip = map.boolean("input_skip", o.input_skip);
  o.final_norm = map.boolean("final_norm", o.final_norm);
  o.seed = map.seed("seed", o.seed);
  if (o.embed_dim % o.heads != 0)
    fail(map.path("heads"), model["heads"],
         "heads " + std::to_string(o.heads) + " does not divide embed_dim " +
             std::to_string(o.embed_dim));
  if (o.attention == AttentionKind::global && (map.has("window") || map.has("dilation")))
    fail(map.path(map.has("window") ? "window" : "dilation"),
         model[map.has("window") ? "window" : "dilation"],
         "window and dilation apply to attention: neighborhood, not global");
  if (o.position == PositionKind::learned && o.extents.empty())
    fail(map.path("position"), model["position"],
         "position: learned needs the field extents, which this caller does not know; use "
         "sincos");
  return o;
}

}  // namespace

UNetOptions unet_options(const YAML::Node& model, const ModelShape& shape, const std::string& key) {
  check_shape(shape);
  if (model_type(model, key) != ModelType::unet)
    fail(key + ".type", model["type"], "expected 'unet', got " + shown(model["type"]));
  const MapReader map(model, key, unet_keys);
  UNetOptions o;
  o.dims = shape.dims;
  o.in_channels = shape.in_channels;
  o.out_channels = shape.out_channels;
  o.depth = int(map.integer("depth", o.depth, 0));
  o.base_channels = map.integer("base_channels", o.base_channels, 1);
  o.norm = map.choice("norm", o.norm, norms);
  o.norm_groups = int(map.integer("norm_groups", o.norm_groups, 1));
  o.activation = map.choice("activation", o.activation, activations);
  o.down = map.choice("down", o.down, down_modes);
  o.up = map.choice("up", o.up, up_modes);
  o.padding = map.choice("padding", o.padding, padding_modes);
  o.blocks = int(map.integer("blocks", o.blocks, 1));
  o.seed = map.seed("seed", o.seed);
  o.input_skip = map.boolean("input_skip", o.input_skip);
  o.recompute = map.boolean("recompute", o.recompute);
  if (o.depth > 16)
    fail(map.path("depth"), model["depth"],
         "depth " + std::to_string(o.depth) + " outside [0, 16]");
  if (o.norm == NormKind::group && o.base_channels % o.norm_groups != 0)
    fail(map.path(map.has("norm_groups") ? "norm_groups" : "base_channels"),
         model[map.has("norm_groups") ? "norm_groups" : "base_channels"],
         "norm_groups " + std::to_string(o.norm_groups) + " does not divide base_channels " +
             std::to_string(o.base_channels) + " (every level has a multiple of base_channels)");
  return o;
}

template <class T>
std::shared_ptr<Module<T>> build_model(const YAML::Node& model, const Communicator& comm,
                                       const ModelShape& shape, const std::string& key) {
  check_shape(shape);
  if (model_type(model, key) == ModelType::unet)
    return std::make_shared<UNet<T>>(comm, unet_options(model, shape, key), key);
  if (model_type(model, key) == ModelType::fno)
    return std::make_shared<FNO<T>>(comm, fno_options(model, shape, key), key);
  if (model_type(model, key) == ModelType::vit)
    return std::make_shared<ViT<T>>(comm, vit_options(model, shape, key), key);
  const MapReader map(model, key, sequential_keys);
  SequentialBuilder<T> builder(comm, shape, map.seed("seed", 1));
  Index channels = shape.in_channels;
  auto sequence = builder.build_list(map.required("layers"), map.path("layers"), channels, true);
  if (channels != shape.out_channels)
    fail(map.path("layers"), model["layers"],
         "the layers end with " + std::to_string(channels) +
             " channels, but the model's out_channels is " + std::to_string(shape.out_channels) +
             "; end with a conv whose out_channels is omitted or 'out'");
  return sequence;
}

template std::shared_ptr<Module<float>> build_model<float>(const YAML::Node&, const Communicator&,
                                                           const ModelShape&, const std::string&);
template std::shared_ptr<Module<double>> build_model<double>(const YAML::Node&, const Communicator&,
                                                             const ModelShape&, const std::string&);

}  // namespace shardtensor::models
