#include "shardtensor/models/onnx_import.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fnmatch.h>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "shardtensor/core/error.hpp"
#include "shardtensor/layers.hpp"

#ifdef SHARDTENSOR_HAVE_ONNX
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

namespace shardtensor::models {

#ifndef SHARDTENSOR_HAVE_ONNX

bool onnx_available() { return false; }

OnnxSignature onnx_signature(const std::string& path, const Communicator&) {
  SHARDTENSOR_FAIL("import_onnx", path << ": this build reads no ONNX files (it was configured "
                                          "without libonnx-dev)");
}

template <class T>
void export_onnx(const std::string& source, const Graph<T>&, const std::string&,
                 const Communicator&) {
  SHARDTENSOR_FAIL("export_onnx", source << ": this build writes no ONNX files (it was "
                                            "configured without libonnx-dev)");
}

template <class T>
std::shared_ptr<Graph<T>> import_onnx(const std::string& path, const Communicator&,
                                      const ModelShape&, const std::string& key,
                                      const std::vector<std::string>&) {
  SHARDTENSOR_FAIL("import_onnx", key << ": " << path
                                      << ": this build reads no ONNX files (it was configured "
                                         "without libonnx-dev; scripts/install-deps.sh installs "
                                         "it, then configure again)");
}

#else

bool onnx_available() { return true; }

namespace {

constexpr const char* where = "import_onnx";

/// A constant tensor (an initializer or a Constant node's value), its values as doubles.
struct Tensor {
  std::vector<std::int64_t> dims;
  std::vector<double> values;
  std::size_t size() const { return values.size(); }
};

/// The directory of `path` ("" for the current one), where external data files lie.
std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

std::string read_bytes(const std::string& path, std::int64_t offset = 0,
                       std::int64_t length = -1) {
  std::ifstream in(path, std::ios::binary);
  SHARDTENSOR_REQUIRE(in, where, "cannot open '" << path << "': " << std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::int64_t size = in.tellg();
  if (length < 0) length = size - offset;
  SHARDTENSOR_REQUIRE(offset >= 0 && offset + length <= size, where,
                      "'" << path << "' holds " << size << " bytes; the model asks for "
                          << length << " from offset " << offset);
  std::string bytes(std::size_t(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  SHARDTENSOR_REQUIRE(in, where, "cannot read '" << path << "'");
  return bytes;
}

template <class S>
void append_raw(const std::string& raw, std::size_t count, std::vector<double>& out,
                const std::string& name) {
  SHARDTENSOR_REQUIRE(raw.size() == count * sizeof(S), where,
                      "tensor '" << name << "' has " << raw.size() << " bytes of data for "
                                 << count << " values of " << sizeof(S) << " bytes");
  std::vector<S> values(count);
  std::memcpy(values.data(), raw.data(), raw.size());
  out.assign(values.begin(), values.end());
}

Tensor tensor_of(const onnx::TensorProto& t, const std::string& directory) {
  Tensor out;
  std::size_t count = 1;
  for (const auto d : t.dims()) {
    SHARDTENSOR_REQUIRE(d >= 0 && d < (std::int64_t(1) << 40), where,
                        "tensor '" << t.name() << "' has a dimension of " << d);
    out.dims.push_back(d);
    count *= std::size_t(d);
  }
  SHARDTENSOR_REQUIRE(count < (std::size_t(1) << 34), where,
                      "tensor '" << t.name() << "' declares " << count << " values");
  std::string raw = t.raw_data();
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    std::int64_t offset = 0, length = -1;
    for (const auto& entry : t.external_data()) {
      if (entry.key() == "location") location = entry.value();
      if (entry.key() == "offset") offset = std::stoll(entry.value());
      if (entry.key() == "length") length = std::stoll(entry.value());
    }
    SHARDTENSOR_REQUIRE(!location.empty() && location.find("..") == std::string::npos &&
                            location.front() != '/',
                        where,
                        "tensor '" << t.name() << "' names external data '" << location
                                   << "': a file beside the model is expected");
    raw = read_bytes(directory + location, offset, length);
  }
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (!raw.empty() || count == 0)
        append_raw<float>(raw, count, out.values, t.name());
      else
        out.values.assign(t.float_data().begin(), t.float_data().end());
      break;
    case onnx::TensorProto::DOUBLE:
      if (!raw.empty() || count == 0)
        append_raw<double>(raw, count, out.values, t.name());
      else
        out.values.assign(t.double_data().begin(), t.double_data().end());
      break;
    case onnx::TensorProto::INT64:
      if (!raw.empty() || count == 0)
        append_raw<std::int64_t>(raw, count, out.values, t.name());
      else
        out.values.assign(t.int64_data().begin(), t.int64_data().end());
      break;
    case onnx::TensorProto::INT32:
      if (!raw.empty() || count == 0)
        append_raw<std::int32_t>(raw, count, out.values, t.name());
      else
        out.values.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::BOOL:  // a training export's training_mode
      if (!raw.empty() || count == 0)
        append_raw<std::uint8_t>(raw, count, out.values, t.name());
      else
        out.values.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    default:
      SHARDTENSOR_FAIL(where, "tensor '" << t.name() << "' has ONNX data type "
                                         << t.data_type()
                                         << "; float, double, int64, int32 and bool are read");
  }
  SHARDTENSOR_REQUIRE(out.values.size() == count, where,
                      "tensor '" << t.name() << "' holds " << out.values.size()
                                 << " values for dims of " << count);
  return out;
}

/// The model in the file at `path`, parsed and checked by ONNX's checker. Collective: a file
/// one rank cannot open is an error on every rank; the rest fails alike everywhere.
onnx::ModelProto read_model(const std::string& path, const Communicator& comm,
                            const std::string& key) {
  std::string bytes, problem;
  try {
    bytes = read_bytes(path);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  comm.agree(problem.empty() ? "" : key + ": " + problem);  // no rank reads alone
  onnx::ModelProto model;
  google::protobuf::io::ArrayInputStream stream(bytes.data(), int(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&stream);
  coded.SetTotalBytesLimit(int(std::min<std::size_t>(bytes.size() + 1, INT32_MAX)));
  SHARDTENSOR_REQUIRE(model.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage(), where,
                      key << ": '" << path << "' (" << bytes.size()
                          << " bytes) is not an ONNX model: the protobuf does not parse "
                             "(truncated or corrupt)");
  try {
    // By path: external data is then looked for beside the model, not in the working directory.
    onnx::checker::check_model(path);
  } catch (const std::exception& e) {
    SHARDTENSOR_FAIL(where, key << ": '" << path << "' fails ONNX's checker: " << e.what());
  }
  return model;
}

const onnx::AttributeProto* find_attribute(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

std::vector<std::int64_t> ints(const onnx::NodeProto& n, const std::string& name,
                               std::vector<std::int64_t> fallback = {}) {
  const auto* a = find_attribute(n, name);
  return a ? std::vector<std::int64_t>(a->ints().begin(), a->ints().end()) : fallback;
}
std::int64_t integer(const onnx::NodeProto& n, const std::string& name, std::int64_t fallback) {
  const auto* a = find_attribute(n, name);
  return a ? a->i() : fallback;
}
double real(const onnx::NodeProto& n, const std::string& name, double fallback) {
  const auto* a = find_attribute(n, name);
  return a ? double(a->f()) : fallback;
}
std::string text(const onnx::NodeProto& n, const std::string& name, const std::string& fallback) {
  const auto* a = find_attribute(n, name);
  return a ? a->s() : fallback;
}

std::vector<int> as_ints(const std::vector<std::int64_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}

/// A padded field that only the next layer reads: PyTorch's circular padding (Slices and a
/// Concat per axis), or a Pad node before a Conv or an average pooling. The value it pads,
/// the cells added before and after the field along each spatial axis, how they are filled.
struct PaddedField {
  std::string source;
  std::vector<int> before, after;  // per spatial axis
  PaddingMode mode = PaddingMode::zeros;
};

/// A conv's or pool's pads, ONNX's [begin..., end...], per spatial axis.
struct WindowPads {
  std::vector<int> before, after;
};

/// One entry of a shape computation's value: a number, or an axis of a field's shape
/// (`field` names it), known only when the field is there.
struct Dim {
  Dim() = default;
  Dim(std::int64_t v, std::string f, int a) : value(v), field(std::move(f)), axis(a) {}

  std::int64_t value = 0;
  std::string field;
  int axis = 0;
  /// Integer arithmetic on the field's extent, in order ('+', '-', '*', '/': x.size(1) // 2 as
  /// torch.chunk writes it); empty for the extent itself.
  std::vector<std::pair<char, std::int64_t>> ops;

  static std::int64_t apply(char op, std::int64_t a, std::int64_t b) {
    return op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
  }
  /// The value, for a field whose extent along `axis` is `extent`.
  std::int64_t resolve(std::int64_t extent) const {
    std::int64_t v = field.empty() ? value : extent;
    for (const auto& [op, k] : ops) v = apply(op, v, k);
    return v;
  }
  /// An extent of `f` along `a` itself, no arithmetic.
  bool is_extent(const std::string& f, int a) const { return field == f && axis == a && ops.empty(); }
};

/// The exporter's decompositions recognised as one layer.
struct GeluPattern {
  std::string input;
};
struct GroupNormPattern {
  std::string input, weight, bias;  // weight and bias: constants ("" if absent)
  int groups = 1;
  double eps = 1e-5;
};
/// Reshape-Transpose-Reshape that shuffles each cell's channels (ShuffleNet's channel_shuffle).
struct ShufflePattern {
  std::string input;
  std::int64_t groups = 1;
  std::int64_t per_group = 0;  // C / groups where the file fixed it, else 0
};
/// ReduceMean-Sub-Pow-ReduceMean-Add-Sqrt-Div-Mul-Add: PyTorch's LayerNorm below opset 17
/// (over the last axis of a channels-last value) or its channels-first form (axis 1).
struct LayerNormPattern {
  std::string input, weight, bias;
  std::vector<int> axes;  // as written (normalized to the rank)
  double eps = 1e-5;
};

template <class T>
class Importer {
 public:
  Importer(const std::string& path, const Communicator& comm, const ModelShape& shape,
           const std::string& key, const std::vector<std::string>& trained_initializers)
      : path_(path),
        comm_(comm),
        shape_(shape),
        key_(key),
        trained_patterns_(trained_initializers) {}

  std::shared_ptr<Graph<T>> run() {
    read();
    const onnx::GraphProto& g = model_.graph();
    for (const auto& t : g.initializer()) {
      constants_[t.name()] = tensor_of(t, directory_of(path_));
      initializers_.insert(t.name());
    }
    std::string input;
    for (const auto& i : g.input())
      if (!constants_.count(i.name())) {
        SHARDTENSOR_REQUIRE(input.empty(), where,
                            path_ << ": the graph has inputs '" << input << "' and '" << i.name()
                                  << "'; one input field is supported");
        input = i.name();
        check_input(i);
      }
    SHARDTENSOR_REQUIRE(!input.empty(), where, path_ << ": the graph has no input");
    SHARDTENSOR_REQUIRE(g.output_size() == 1, where,
                        path_ << ": the graph has " << g.output_size()
                              << " outputs; one output field is supported");
    for (int i = 0; i < g.node_size(); ++i) {
      for (const auto& o : g.node(i).output()) producer_[o] = i;
      for (const auto& in : g.node(i).input()) ++uses_[in];
    }
    ++uses_[g.output(0).name()];
    absorbed_.assign(g.node_size(), false);
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      if (n.op_type() == "Constant") constant_node(n), absorbed_[i] = true;
      // The exporter passes shared weights through Identity, and, without constant folding
      // (a training export), reshapes them (w[:, None, None]): the same values.
      Tensor folded;
      if (reshaped_constant(n, folded)) constants_[n.output(0)] = folded, absorbed_[i] = true;
    }
    fold_shapes(input);
    find_patterns();

    graph_ = std::make_shared<Graph<T>>(input);
    fields_.insert(input);
    for (int i = 0; i < g.node_size(); ++i)
      if (!absorbed_[i]) convert(i);
    const std::string& output = g.output(0).name();
    SHARDTENSOR_REQUIRE(fields_.count(output) || vectors_.count(output), where,
                        path_ << ": the output '" << output
                              << "' is not a field (a constant, or a value of a pattern that "
                                 "no layer ends)");
    graph_->set_output(output);
    graph_->restore_input_layout(comm_);
    for (const std::string& pattern : trained_patterns_) {
      bool matched = false;
      for (const auto& [name, p] : trained_) matched = matched || listed(name, {pattern});
      SHARDTENSOR_REQUIRE(matched, where,
                          key_ << ": '" << path_ << "': train_initializers: '" << pattern
                               << "' matches no initializer that multiplies or offsets a "
                                  "field per channel (a Mul or Add of a field)");
    }
    return graph_;
  }

 private:
  // ---- reading ---------------------------------------------------------------------------

  void read() {
    model_ = read_model(path_, comm_, key_);
    for (const auto& o : model_.opset_import())
      if (o.domain().empty() || o.domain() == "ai.onnx") opset_ = o.version();
    SHARDTENSOR_REQUIRE(opset_ >= 11 && opset_ <= 18, where,
                        key_ << ": '" << path_ << "' uses opset " << opset_
                             << "; opsets 11 to 18 are read");
  }

  void check_input(const onnx::ValueInfoProto& i) {
    const auto& type = i.type().tensor_type();
    const auto& dims = type.shape().dim();
    SHARDTENSOR_REQUIRE(dims.size() == shape_.dims + 2, where,
                        key_ << ": '" << path_ << "' takes input '" << i.name() << "' of rank "
                             << dims.size() << "; the data's fields have " << shape_.dims
                             << " spatial axes (rank " << shape_.dims + 2
                             << ": batch, channels, space)");
    if (dims.size() > 1 && dims[1].has_dim_value())
      SHARDTENSOR_REQUIRE(dims[1].dim_value() == shape_.in_channels, where,
                          key_ << ": '" << path_ << "' takes " << dims[1].dim_value()
                               << " input channel(s); the data has " << shape_.in_channels);
  }

  void constant_node(const onnx::NodeProto& n) {
    const auto* value = find_attribute(n, "value");
    if (value && value->has_t()) {
      constants_[n.output(0)] = tensor_of(value->t(), directory_of(path_));
      return;
    }
    const auto* f = find_attribute(n, "value_float");
    const auto* i = find_attribute(n, "value_int");
    const auto* is = find_attribute(n, "value_ints");
    const auto* fs = find_attribute(n, "value_floats");
    Tensor t;
    if (f) t.values = {double(f->f())};
    else if (i) t.values = {double(i->i())};
    else if (is) t.values.assign(is->ints().begin(), is->ints().end()), t.dims = {is->ints_size()};
    else if (fs) t.values.assign(fs->floats().begin(), fs->floats().end()), t.dims = {fs->floats_size()};
    else refuse(n, "a Constant without a tensor, float or int value");
    constants_[n.output(0)] = t;
  }

  /// Whether a Dropout node drops in training (its training_mode input a constant true, as a
  /// training export writes it); otherwise ONNX's Dropout is the identity.
  bool dropout_trains(const onnx::NodeProto& n) const {
    if (n.input_size() < 3 || n.input(2).empty()) return false;
    double on = 0;
    if (!scalar(n.input(2), on)) refuse(n, "training_mode is not a constant");
    return on != 0;
  }

  /// Identity, Cast, Unsqueeze, Squeeze or Reshape of a constant: the same values, new dims.
  bool reshaped_constant(const onnx::NodeProto& n, Tensor& out) const {
    if (n.op_type() == "ConstantOfShape") {  // F.pad's pads, written out: zeros to fill
      const Tensor* shape = constant(n.input(0));
      if (!shape) return false;
      const auto* value = find_attribute(n, "value");
      const double fill =
          value && value->has_t() ? tensor_of(value->t(), directory_of(path_)).values.at(0) : 0.0;
      out = Tensor{};
      std::int64_t size = 1;
      for (const double d : shape->values) out.dims.push_back(std::int64_t(d)), size *= std::int64_t(d);
      if (size < 0 || size > (std::int64_t(1) << 20)) return false;
      out.values.assign(std::size_t(size), fill);
      return true;
    }
    if (n.op_type() == "Slice") return sliced_constant(n, out);
    // An export without constant folding computes F.pad's pads from shapes of constants.
    if (n.op_type() == "Shape") {
      const Tensor* t = constant(n.input(0));
      if (!t || find_attribute(n, "start") || find_attribute(n, "end")) return false;
      out = Tensor{{std::int64_t(t->dims.size())}, {t->dims.begin(), t->dims.end()}};
      return true;
    }
    if (n.op_type() == "Gather") {  // of a 1-D constant
      const Tensor *t = constant(n.input(0)), *indices = constant(n.input(1));
      if (!t || !indices || t->dims.size() != 1 || integer(n, "axis", 0) != 0) return false;
      out = Tensor{indices->dims, {}};
      for (const double v : indices->values) {
        std::int64_t i = std::int64_t(v);
        if (i < 0) i += std::int64_t(t->size());
        if (i < 0 || i >= std::int64_t(t->size())) return false;
        out.values.push_back(t->values[std::size_t(i)]);
      }
      return true;
    }
    if (n.op_type() == "Add" || n.op_type() == "Sub" || n.op_type() == "Mul") {
      // Of two small constants that no initializer holds (shape arithmetic; a weight's
      // product stays a node, so that `export` finds the initializer behind a parameter), of
      // one shape or one a single value. No Div: the values are held as doubles, not their
      // type (an integer division truncates).
      const Tensor *a = n.input_size() == 2 ? constant(n.input(0)) : nullptr,
                   *b = n.input_size() == 2 ? constant(n.input(1)) : nullptr;
      if (!a || !b || !(a->dims == b->dims || a->size() == 1 || b->size() == 1)) return false;
      if (a->size() > 16 || b->size() > 16 || initializers_.count(n.input(0)) ||
          initializers_.count(n.input(1)))
        return false;
      const bool a_spreads = a->size() == 1 && (b->size() != 1 || b->dims.size() > a->dims.size());
      out = Tensor{a_spreads ? b->dims : a->dims, {}};
      const std::size_t size = std::max(a->size(), b->size());
      for (std::size_t i = 0; i < size; ++i) {
        const double x = a->values[a->size() == 1 ? 0 : i], y = b->values[b->size() == 1 ? 0 : i];
        out.values.push_back(n.op_type() == "Add" ? x + y : n.op_type() == "Sub" ? x - y : x * y);
      }
      return true;
    }
    if (n.op_type() == "Concat") {  // of 1-D constants (a shape written out, unfolded)
      out = Tensor{};
      for (const auto& in : n.input()) {
        const Tensor* t = constant(in);
        if (!t || t->dims.size() != 1) return false;
        out.values.insert(out.values.end(), t->values.begin(), t->values.end());
      }
      out.dims = {std::int64_t(out.values.size())};
      return n.input_size() > 0;
    }
    if (n.op_type() == "Transpose") {  // of a matrix (a Linear's weight before its MatMul)
      const Tensor* t = n.input_size() == 1 ? constant(n.input(0)) : nullptr;
      const std::vector<std::int64_t> perm = ints(n, "perm", {1, 0});
      if (!t || t->dims.size() != 2 || perm != std::vector<std::int64_t>{1, 0}) return false;
      const std::int64_t rows = t->dims[0], columns = t->dims[1];
      out = Tensor{{columns, rows}, std::vector<double>(t->size())};
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < columns; ++j)
          out.values[std::size_t(j * rows + i)] = t->values[std::size_t(i * columns + j)];
      return true;
    }
    static const std::set<std::string> ops{"Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape"};
    if (!ops.count(n.op_type()) || n.input_size() < 1 || !constant(n.input(0))) return false;
    out = *constant(n.input(0));
    std::vector<std::int64_t> axes = ints(n, "axes");  // Unsqueeze, Squeeze below opset 13
    if (n.input_size() > 1 && !n.input(1).empty()) {
      const Tensor* second = constant(n.input(1));
      if (!second) return false;
      axes.assign(second->values.begin(), second->values.end());
    }
    if (n.op_type() == "Unsqueeze") {
      const std::int64_t rank = std::int64_t(out.dims.size() + axes.size());
      for (auto& a : axes) a = a < 0 ? a + rank : a;
      std::sort(axes.begin(), axes.end());
      for (const auto a : axes) {
        if (a < 0 || a > std::int64_t(out.dims.size())) return false;
        out.dims.insert(out.dims.begin() + a, 1);
      }
    } else if (n.op_type() == "Squeeze") {
      std::vector<std::int64_t> dims;
      for (std::size_t a = 0; a < out.dims.size(); ++a) {
        const bool listed = axes.empty() ? out.dims[a] == 1
                                         : std::count(axes.begin(), axes.end(), std::int64_t(a)) ||
                                               std::count(axes.begin(), axes.end(),
                                                          std::int64_t(a) - std::int64_t(out.dims.size()));
        if (!listed) dims.push_back(out.dims[a]);
      }
      out.dims = dims;
    } else if (n.op_type() == "Reshape") {
      std::int64_t known = 1, unknown = -1;
      for (std::size_t a = 0; a < axes.size(); ++a) {
        if (axes[a] == 0 && a < out.dims.size()) axes[a] = out.dims[a];
        if (axes[a] == -1) unknown = std::int64_t(a);
        else known *= axes[a];
      }
      if (unknown >= 0 && known > 0) axes[std::size_t(unknown)] = std::int64_t(out.size()) / known;
      out.dims = axes;
    }
    return true;
  }

  /// Slice of a constant, any axes and steps (F.pad's pads are reversed by a step of -1).
  bool sliced_constant(const onnx::NodeProto& n, Tensor& out) const {
    if (n.input_size() < 3) return false;
    const auto optional = [&](int i) {
      return i < n.input_size() && !n.input(i).empty() ? constant(n.input(i)) : nullptr;
    };
    const Tensor *t = constant(n.input(0)), *starts = constant(n.input(1)),
                 *ends = constant(n.input(2)), *axes = optional(3), *steps = optional(4);
    if (!t || !starts || !ends || starts->size() != ends->size() ||
        (n.input_size() > 3 && !n.input(3).empty() && !axes) ||
        (n.input_size() > 4 && !n.input(4).empty() && !steps))
      return false;
    const std::int64_t rank = std::int64_t(t->dims.size());
    std::vector<std::int64_t> first(t->dims.size(), 0), step(t->dims.size(), 1),
        count(t->dims.begin(), t->dims.end());
    // INT64_MAX and INT64_MIN ("to the end") as doubles: clamped before the cast.
    const auto index = [](double v) { return std::int64_t(std::max(-4e18, std::min(4e18, v))); };
    for (std::size_t i = 0; i < starts->size(); ++i) {
      std::int64_t axis = axes ? index(axes->values.at(i)) : std::int64_t(i);
      if (axis < 0) axis += rank;
      const std::int64_t s = steps ? index(steps->values.at(i)) : 1;
      if (axis < 0 || axis >= rank || s == 0) return false;
      const std::int64_t dim = t->dims[std::size_t(axis)];
      std::int64_t b = index(starts->values[i]), e = index(ends->values[i]);
      if (b < 0) b += dim;
      if (e < 0) e += dim;
      if (s > 0) {
        b = std::clamp<std::int64_t>(b, 0, dim), e = std::clamp<std::int64_t>(e, 0, dim);
        count[std::size_t(axis)] = std::max<std::int64_t>(0, (e - b + s - 1) / s);
      } else {
        b = std::clamp<std::int64_t>(b, 0, dim - 1), e = std::clamp<std::int64_t>(e, -1, dim - 1);
        count[std::size_t(axis)] = std::max<std::int64_t>(0, (b - e - s - 1) / -s);
      }
      first[std::size_t(axis)] = b, step[std::size_t(axis)] = s;
    }
    out = Tensor{count, {}};
    std::int64_t cells = 1;
    for (const std::int64_t c : count) cells *= c;
    std::vector<std::int64_t> at(t->dims.size(), 0);  // the output index, row-major
    for (std::int64_t k = 0; k < cells; ++k) {
      std::int64_t source = 0;
      for (std::size_t a = 0; a < at.size(); ++a)
        source = source * t->dims[a] + first[a] + at[a] * step[a];
      out.values.push_back(t->values[std::size_t(source)]);
      for (std::size_t a = at.size(); a-- > 0;)
        if (++at[a] < count[a]) break;
        else at[a] = 0;
    }
    return true;
  }

  // ---- helpers -----------------------------------------------------------------------------

  [[noreturn]] void refuse(const onnx::NodeProto& n, const std::string& why) const {
    SHARDTENSOR_FAIL(where, key_ << ": '" << path_ << "': node '" << n.name() << "' ("
                                 << n.op_type() << "): " << why);
  }

  const onnx::NodeProto* producer(const std::string& value) const {
    const auto found = producer_.find(value);
    return found == producer_.end() ? nullptr : &model_.graph().node(found->second);
  }
  int producer_index(const std::string& value) const {
    const auto found = producer_.find(value);
    return found == producer_.end() ? -1 : found->second;
  }
  int uses(const std::string& value) const {
    const auto found = uses_.find(value);
    return found == uses_.end() ? 0 : found->second;
  }
  const Tensor* constant(const std::string& name) const {
    const auto found = constants_.find(name);
    return found == constants_.end() ? nullptr : &found->second;
  }
  /// The scalar constant `name` holds, if it is one.
  bool scalar(const std::string& name, double& value) const {
    const Tensor* t = constant(name);
    if (!t || t->size() != 1) return false;
    value = t->values[0];
    return true;
  }
  /// The producer of `value` if it has op type `op` and `value` has `max_uses` readers at most.
  const onnx::NodeProto* made_by(const std::string& value, const std::string& op,
                                 int max_uses = 1) const {
    const onnx::NodeProto* p = producer(value);
    return p && p->op_type() == op && uses(value) <= max_uses ? p : nullptr;
  }
  /// The field input of node `n` (its first input), which an earlier step must have made.
  /// `channels_last_ok`: a channels-last value (after a Transpose) is read too.
  const std::string& field_input(const onnx::NodeProto& n, int i = 0,
                                 bool channels_last_ok = false) const {
    if (i >= n.input_size() || n.input(i).empty()) refuse(n, "input " + std::to_string(i) + " is missing");
    const std::string& name = n.input(i);
    if (padded_.count(name))
      refuse(n, "reads a padded field (a Pad node or circular padding); only a Conv or an "
                "average pooling may (as its padding)");
    if (channels_last_.count(name) && !channels_last_ok)
      refuse(n, "input '" + name + "' has its channels last (after a Transpose); on such "
                "values the elementwise ops, LayerNorm over the channels, MatMul with a "
                "constant and the Transpose back are supported");
    if (vectors_.count(name))
      refuse(n, "input '" + name + "' is a pooled vector (after a global pooling), not a field; "
                "on vectors 1x1 Conv, Gemm, Flatten, Reshape to (N, -1), Squeeze, the "
                "elementwise functions and products with fields are supported");
    if (!fields_.count(name))
      refuse(n, "input '" + name + "' is not a field: " +
                    (constant(name) ? "a constant (ops between constants and fields other than "
                                      "those listed in docs/onnx.md are not supported)"
                                    : "a value of a shape computation (Shape, Gather, ...), "
                                      "which is not supported here"));
    return name;
  }
  int spatial_axis(const onnx::NodeProto& n, std::int64_t axis) const {
    const std::int64_t rank = shape_.dims + 2;
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) refuse(n, "axis " + std::to_string(axis) + " is out of range");
    return int(axis);
  }
  /// The pads of a conv or pool, before and after the field along each spatial axis.
  WindowPads window_pads(const onnx::NodeProto& n) const {
    const std::string auto_pad = text(n, "auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "VALID")
      refuse(n, "auto_pad " + auto_pad + " is not supported (export with explicit pads)");
    const std::vector<std::int64_t> pads = ints(n, "pads", std::vector<std::int64_t>(2 * shape_.dims, 0));
    if (int(pads.size()) != 2 * shape_.dims) refuse(n, "pads has " + std::to_string(pads.size()) + " entries");
    WindowPads out;
    for (int d = 0; d < shape_.dims; ++d) {
      if (pads[d] < 0 || pads[d + shape_.dims] < 0) refuse(n, "negative pads");
      out.before.push_back(int(pads[d]));
      out.after.push_back(int(pads[d + shape_.dims]));
    }
    return out;
  }
  /// The pads of a node whose layer pads both sides alike (a ConvTranspose).
  std::vector<int> symmetric_pads(const onnx::NodeProto& n) const {
    const WindowPads pads = window_pads(n);
    for (int d = 0; d < shape_.dims; ++d)
      if (pads.before[d] != pads.after[d])
        refuse(n, "asymmetric pads along spatial axis " + std::to_string(d) + " (" +
                      std::to_string(pads.before[d]) + " before, " +
                      std::to_string(pads.after[d]) + " after) are not supported");
    return pads.before;
  }
  /// The name of the layer a node is part of, from the exporter's scope ("/layer1/layer1.0/
  /// conv1/Conv" -> "layer1.0.conv1") or its weight ("c2.weight" -> "c2"); unique.
  std::string module_name(const onnx::NodeProto& n, const std::string& weight = "") {
    std::string name;
    const auto dot = weight.rfind(".weight");
    if (!weight.empty() && weight.rfind("onnx::", 0) != 0 && dot != std::string::npos &&
        dot + 7 == weight.size())
      name = weight.substr(0, dot);
    if (name.empty()) {
      std::vector<std::string> parts;
      std::stringstream scope(n.name());
      std::string part;
      while (std::getline(scope, part, '/'))
        if (!part.empty()) parts.push_back(part);
      if (!parts.empty()) parts.pop_back();  // the op itself
      std::vector<std::string> path;
      for (const std::string& p : parts)
        if (!path.empty() && p.rfind(path.back() + ".", 0) == 0)
          path.back() = p;
        else
          path.push_back(p);
      for (const std::string& p : path) name += (name.empty() ? "" : ".") + p;
    }
    for (char& c : name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_')) c = '_';
    if (name.empty()) name = n.op_type();
    std::string unique = name;
    for (int i = 2; module_names_.count(unique); ++i) unique = name + "_" + std::to_string(i);
    module_names_.insert(unique);
    return unique;
  }
  /// Copies a constant into a module's parameter or buffer (its size must match).
  void assign(const onnx::NodeProto& n, const ReplicatedView<T>& view, const std::string& what,
              const Tensor& values) const {
    if (Index(values.size()) != Index(view.extent(0)))
      refuse(n, what + " has " + std::to_string(values.size()) + " values; the layer expects " +
                    std::to_string(view.extent(0)));
    auto host = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < values.size(); ++i) host(i) = T(values.values[i]);
    Kokkos::deep_copy(view, host);
  }
  /// The layer `module` (registered as `module_name`) gets its parameter `name` from the
  /// constant `value`, which export_onnx writes back to.
  void assign_parameter(const onnx::NodeProto& n, Module<T>& module, const std::string& module_name,
                        const std::string& name, const std::string& value) {
    const Tensor* values = constant(value);
    if (!values) refuse(n, name + " '" + value + "' is not a constant (an initializer)");
    for (const auto& [p_name, p] : module.named_parameters())
      if (p_name == name) {
        assign(n, p.data(), name, *values);
        graph_->set_source(module_name + "." + name, value);
        return;
      }
    refuse(n, "the layer has no parameter '" + name + "'");
  }
  void assign_buffer(const onnx::NodeProto& n, const ReplicatedView<T>& view,
                     const std::string& buffer_name, const std::string& value) {
    const Tensor* values = constant(value);
    if (!values) refuse(n, buffer_name + " '" + value + "' is not a constant (an initializer)");
    assign(n, view, buffer_name, *values);
    graph_->set_source(buffer_name, value);
  }
  const Tensor& required_constant(const onnx::NodeProto& n, int i, const std::string& what) const {
    if (i >= n.input_size() || n.input(i).empty()) refuse(n, what + " is missing");
    const Tensor* t = constant(n.input(i));
    if (!t) refuse(n, what + " '" + n.input(i) + "' is not a constant (an initializer)");
    return *t;
  }
  void add_step(const onnx::NodeProto& n, const std::vector<std::string>& inputs,
                typename Graph<T>::Operation operation) {
    graph_->add_step(n.name(), n.op_type(), inputs, n.output(0), std::move(operation));
    fields_.insert(n.output(0));
  }

  // ---- shape computations ------------------------------------------------------------------

  /// The Shape, Gather, Slice, Concat, Unsqueeze, Squeeze and Cast nodes that compute sizes
  /// from fields' shapes (what torch.onnx.export writes for x.shape[-2:] and the like), folded
  /// into vectors of Dims: numbers, or axes of fields read when the graph runs.
  void fold_shapes(const std::string& graph_input) {
    graph_input_ = graph_input;
    const onnx::GraphProto& g = model_.graph();
    for (int i = 0; i < g.node_size(); ++i) {
      if (absorbed_[i]) continue;
      const onnx::NodeProto& n = g.node(i);
      std::vector<Dim> out;
      if (fold(n, out)) {
        shapes_[n.output(0)] = out;
        absorbed_[i] = true;
      }
    }
  }

  /// `name` as a shape vector: a folded value, or an integer constant.
  bool shape_value(const std::string& name, std::vector<Dim>& out) const {
    const auto found = shapes_.find(name);
    if (found != shapes_.end()) return out = found->second, true;
    const Tensor* t = constant(name);
    if (!t) return false;
    out.clear();
    for (const double v : t->values) out.push_back(Dim{std::int64_t(v), "", 0});
    return true;
  }

  bool fold(const onnx::NodeProto& n, std::vector<Dim>& out) const {
    const std::string& op = n.op_type();
    const int rank = shape_.dims + 2;
    std::vector<Dim> a, b;
    if (op == "Shape") {
      if (constant(n.input(0)) || shapes_.count(n.input(0)) || find_attribute(n, "start") ||
          find_attribute(n, "end"))
        return false;
      for (int axis = 0; axis < rank; ++axis) out.push_back(Dim{0, n.input(0), axis});
      return true;
    }
    if (op == "Cast" || op == "Identity" || op == "Squeeze" || op == "Unsqueeze")
      return shapes_.count(n.input(0)) && shape_value(n.input(0), out);  // 0-D, 1-D alike
    if (op == "Gather") {
      if (integer(n, "axis", 0) != 0 || !shape_value(n.input(0), a) || !constant(n.input(1)))
        return false;
      for (const double v : constant(n.input(1))->values) {
        std::int64_t i = std::int64_t(v);
        if (i < 0) i += std::int64_t(a.size());
        if (i < 0 || i >= std::int64_t(a.size())) return false;
        out.push_back(a[std::size_t(i)]);
      }
      return true;
    }
    if (op == "Concat") {
      if (integer(n, "axis", 0) != 0) return false;
      for (const auto& in : n.input()) {
        if (!shape_value(in, b) || (!shapes_.count(in) && constant(in)->dims.size() > 1))
          return false;
        out.insert(out.end(), b.begin(), b.end());
      }
      // Only a vector made of shapes (not one of constants alone, which stays a constant).
      for (const auto& in : n.input())
        if (shapes_.count(in)) return true;
      return false;
    }
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
      // Integer arithmetic of a shape and a constant (torch.chunk's x.size(1) // 2).
      const bool shape_first = shapes_.count(n.input(0)) > 0;
      const std::string& other = n.input(shape_first ? 1 : 0);
      if (n.input_size() != 2 || (!shape_first && !shapes_.count(n.input(1)))) return false;
      if (!shape_first && (op == "Sub" || op == "Div")) return false;
      const Tensor* c = constant(other);
      if (!c || c->size() != 1 || c->values[0] != std::floor(c->values[0])) return false;
      const std::int64_t k = std::int64_t(c->values[0]);
      if (op == "Div" && k == 0) return false;
      const char symbol = op == "Add" ? '+' : op == "Sub" ? '-' : op == "Mul" ? '*' : '/';
      shape_value(n.input(shape_first ? 0 : 1), out);
      for (Dim& d : out) {
        if (d.field.empty()) d.value = Dim::apply(symbol, d.value, k);
        else d.ops.emplace_back(symbol, k);
      }
      return true;
    }
    if (op == "Slice") {
      if (!shapes_.count(n.input(0)) || !shape_value(n.input(0), a) || n.input_size() < 3)
        return false;
      const Tensor *starts = constant(n.input(1)), *ends = constant(n.input(2));
      if (!starts || !ends || starts->size() != 1 || ends->size() != 1) return false;
      if (n.input_size() > 4 && !n.input(4).empty()) {
        double step = 0;
        if (!scalar(n.input(4), step) || step != 1) return false;
      }
      const std::int64_t size = std::int64_t(a.size());
      const auto clamp = [&](double v) {
        std::int64_t i = v > 1e18 ? size : v < -1e18 ? -size - 1 : std::int64_t(v);
        if (i < 0) i += size;
        return std::max<std::int64_t>(0, std::min(i, size));
      };
      for (std::int64_t i = clamp(starts->values[0]); i < clamp(ends->values[0]); ++i)
        out.push_back(a[std::size_t(i)]);
      return true;
    }
    return false;
  }

  // ---- patterns ------------------------------------------------------------------------------

  void find_patterns() {
    const onnx::GraphProto& g = model_.graph();
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      if (n.op_type() == "Concat") circular_pad(i);
      if (n.op_type() == "Erf") gelu(i);
      if (n.op_type() == "InstanceNormalization") group_norm(i);
      if (n.op_type() == "ReduceMean") layer_norm(i);
      if (n.op_type() == "Transpose") channel_shuffle_pattern(i);
    }
  }

  /// x.view(N, g, C / g, spatial...).transpose(1, 2).reshape(N, -1, spatial...): ShuffleNet's
  /// channel_shuffle, a permutation of each cell's channels (no spatial axis moves). The
  /// split's shape may hold C / g as a computation the folding leaves (a Div of x's shape):
  /// the other entries fix it, ONNX's Reshape keeping the count of values.
  void channel_shuffle_pattern(int index) {
    const onnx::NodeProto& t = model_.graph().node(index);
    const int rank = shape_.dims + 2;
    std::vector<std::int64_t> perm{0, 2, 1};
    for (int a = 3; a <= rank; ++a) perm.push_back(a);
    if (ints(t, "perm") != perm) return;
    const onnx::NodeProto* split = made_by(t.input(0), "Reshape");
    const onnx::NodeProto* merge = reader(t.output(0), "Reshape");
    if (!split || !merge || uses(t.output(0)) != 1 || merge->input(0) != t.output(0)) return;
    const std::string& x = split->input(0);
    const auto axis_of_x = [&](const Dim& d, int axis) { return d.is_extent(x, axis); };
    std::vector<Dim> to, back;
    if (!shape_value(split->input(1), to)) {
      const onnx::NodeProto* pieces = made_by(split->input(1), "Concat");
      if (!pieces || pieces->input_size() != rank + 1) return;
      to.clear();
      for (int k = 0; k <= rank; ++k) {
        std::vector<Dim> piece;
        if (shape_value(pieces->input(k), piece) && piece.size() == 1) to.push_back(piece[0]);
        else if (k == 2) to.push_back(Dim{-1, "", 0});  // C / g, computed
        else return;
      }
    }
    if (int(to.size()) != rank + 1 || !shape_value(merge->input(1), back) || int(back.size()) != rank)
      return;
    // C / g: a number, C's arithmetic, or computed beyond folding.
    if (!(axis_of_x(to[0], 0) || (to[0].field.empty() && to[0].value == 0)) || !to[1].field.empty() ||
        to[1].value < 1 || !(to[2].field.empty() || (to[2].field == x && to[2].axis == 1)))
      return;
    if (!(axis_of_x(back[0], 0) || (back[0].field.empty() && back[0].value == 0))) return;
    if (!(axis_of_x(back[1], 1) || back[1].field.empty())) return;
    for (int a = 2; a < rank; ++a)
      if (!axis_of_x(to[a + 1], a) || !axis_of_x(back[a], a)) return;
    shuffles_[producer_index(merge->output(0))] =
        ShufflePattern{x, to[1].value, to[2].field.empty() && to[2].value > 0 ? to[2].value : 0};
    absorbed_[producer_index(t.input(0))] = true;
    absorbed_[index] = true;
    absorb_shape_computation(split->input(1));
    absorb_shape_computation(merge->input(1));
  }

  /// The nodes that compute the shape `value` and nothing else (what the folding left, e.g. a
  /// Div of a field's shape), absorbed with the pattern that read it. Stops at Shape nodes
  /// (their input is a field) and at values read elsewhere.
  void absorb_shape_computation(const std::string& value) {
    static const std::set<std::string> shape_ops{"Concat", "Unsqueeze", "Squeeze", "Cast", "Div",
                                                 "Mul", "Add", "Sub", "Gather", "Slice",
                                                 "Shape", "Constant", "Identity"};
    const int i = producer_index(value);
    if (i < 0 || absorbed_[i] || uses(value) != 1) return;
    const onnx::NodeProto& p = model_.graph().node(i);
    if (!shape_ops.count(p.op_type())) return;
    absorbed_[i] = true;
    if (p.op_type() != "Shape")
      for (const auto& in : p.input()) absorb_shape_computation(in);
  }

  /// The reader of `value` with op type `op` (the first), if any.
  const onnx::NodeProto* reader(const std::string& value, const std::string& op) const {
    for (const auto& node : model_.graph().node())
      if (node.op_type() == op)
        for (const auto& in : node.input())
          if (in == value) return &node;
    return nullptr;
  }
  /// The constant among the two inputs of `n` other than `value`, if one is.
  std::string other_constant(const onnx::NodeProto& n, const std::string& value) const {
    if (n.input_size() != 2) return "";
    const std::string& other = n.input(0) == value ? n.input(1) : n.input(0);
    return constant(other) && (n.input(0) == value || n.input(1) == value) ? other : "";
  }

  /// m = ReduceMean(x), d = x - m, v = ReduceMean(d^2), y = d / sqrt(v + eps), y * w + b:
  /// a LayerNorm over the reduced axis, as torch.onnx.export writes nn.LayerNorm below opset 17
  /// (and as ConvNeXt's channels-first LayerNorm is written by hand).
  void layer_norm(int index) {
    const onnx::NodeProto& mean = model_.graph().node(index);
    if (integer(mean, "keepdims", 1) != 1 || mean.input_size() != 1) return;
    const std::string& x = mean.input(0);
    const std::vector<std::int64_t> axes = ints(mean, "axes");
    const onnx::NodeProto* sub = reader(mean.output(0), "Sub");
    if (!sub || uses(mean.output(0)) != 1 || sub->input(0) != x || sub->input(1) != mean.output(0))
      return;
    const std::string& d = sub->output(0);
    const onnx::NodeProto* pow = reader(d, "Pow");
    const onnx::NodeProto* div = reader(d, "Div");
    double c = 0;
    if (uses(d) != 2 || !pow || !div || pow->input(0) != d || !scalar(pow->input(1), c) || c != 2 ||
        div->input(0) != d || uses(pow->output(0)) != 1)
      return;
    const onnx::NodeProto* variance = reader(pow->output(0), "ReduceMean");
    if (!variance || ints(*variance, "axes") != axes || integer(*variance, "keepdims", 1) != 1 ||
        uses(variance->output(0)) != 1)
      return;
    const onnx::NodeProto* add = reader(variance->output(0), "Add");
    double eps = 0;
    if (!add || !scalar(other_constant(*add, variance->output(0)), eps) || uses(add->output(0)) != 1)
      return;
    const onnx::NodeProto* root = reader(add->output(0), "Sqrt");
    if (!root || uses(root->output(0)) != 1 || div->input(1) != root->output(0) ||
        uses(div->output(0)) != 1)
      return;
    const onnx::NodeProto* mul = reader(div->output(0), "Mul");
    if (!mul || uses(mul->output(0)) != 1) return;
    const std::string weight = other_constant(*mul, div->output(0));
    const onnx::NodeProto* shift = reader(mul->output(0), "Add");
    if (weight.empty() || !shift) return;
    const std::string bias = other_constant(*shift, mul->output(0));
    if (bias.empty()) return;
    LayerNormPattern p{x, weight, bias, {}, eps};
    for (const auto a : axes) p.axes.push_back(int(a < 0 ? a + shape_.dims + 2 : a));
    for (const auto* node : {&mean, sub, pow, variance, add, root, div, mul})
      absorbed_[producer_index(node->output(0))] = true;
    layer_norms_[producer_index(shift->output(0))] = p;
  }

  /// Concat(Slice(x, -p:), x, Slice(x, :p)) along a spatial axis: x padded periodically.
  void circular_pad(int index) {
    const onnx::NodeProto& n = model_.graph().node(index);
    if (n.input_size() != 3) return;
    const int axis = int(integer(n, "axis", 0) < 0 ? integer(n, "axis", 0) + shape_.dims + 2
                                                    : integer(n, "axis", 0));
    if (axis < 2 || axis >= shape_.dims + 2) return;
    const std::string& x = n.input(1);
    const onnx::NodeProto* before = made_by(n.input(0), "Slice");
    const onnx::NodeProto* after = made_by(n.input(2), "Slice");
    if (!before || !after || before->input(0) != x || after->input(0) != x) return;
    const auto slice_range = [&](const onnx::NodeProto& s, std::int64_t& start,
                                 std::int64_t& end) {
      if (s.input_size() < 4) return false;
      const Tensor *starts = constant(s.input(1)), *ends = constant(s.input(2)),
                   *axes = constant(s.input(3));
      if (!starts || !ends || !axes || starts->size() != 1 || axes->size() != 1) return false;
      if (s.input_size() > 4 && !s.input(4).empty()) {
        double step = 0;
        if (!scalar(s.input(4), step) || step != 1) return false;
      }
      std::int64_t a = std::int64_t(axes->values[0]);
      if (a < 0) a += shape_.dims + 2;
      if (a != axis) return false;
      start = std::int64_t(starts->values[0]), end = std::int64_t(ends->values[0]);
      return true;
    };
    std::int64_t s0 = 0, e0 = 0, s1 = 0, e1 = 0;
    if (!slice_range(*before, s0, e0) || !slice_range(*after, s1, e1)) return;
    // [0, p) after; before, [-p, end of axis), or [-p - 1, -1) as PyTorch 1.13's exporter
    // writes it: off by one in ONNX's terms (pytorch/pytorch#86690, fixed in 2.0), while
    // PyTorch itself wraps around. The network is PyTorch's, so both mean periodic padding.
    const std::int64_t p = e1;
    const bool exact = s0 == -p && e0 >= std::int64_t(1) << 30;
    const bool pytorch_1_13 = s0 == -p - 1 && e0 == -1;
    if (s1 != 0 || p < 1 || !(exact || pytorch_1_13)) return;
    PaddedField pad{x, std::vector<int>(shape_.dims, 0), std::vector<int>(shape_.dims, 0),
                    PaddingMode::periodic};
    const auto inner = padded_.find(x);
    if (inner != padded_.end()) {
      if (inner->second.mode != PaddingMode::periodic) return;
      if (uses(x) != 3) return;  // the inner pad's result is read by this pattern alone
      pad = inner->second;
    }
    pad.before[axis - 2] = pad.after[axis - 2] = int(p);
    padded_[n.output(0)] = pad;
    absorbed_[index] = true;
    absorbed_[producer_index(n.input(0))] = true;
    absorbed_[producer_index(n.input(2))] = true;
  }

  /// Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5): GELU, as torch.onnx.export writes it.
  void gelu(int index) {
    const onnx::NodeProto& erf = model_.graph().node(index);
    const onnx::NodeProto* div = made_by(erf.input(0), "Div");
    double c = 0;
    if (!div || !scalar(div->input(1), c) || std::abs(c - std::sqrt(2.0)) > 1e-6) return;
    const std::string& x = div->input(0);
    // The Add of 1 reading erf's output, the Mul by x reading that, the Mul by 0.5 last.
    const onnx::NodeProto *add = nullptr, *mul = nullptr, *half = nullptr;
    for (const auto& node : model_.graph().node()) {
      if (node.op_type() == "Add" && node.input_size() == 2 && node.input(0) == erf.output(0) &&
          scalar(node.input(1), c) && c == 1.0 && uses(erf.output(0)) == 1)
        add = &node;
    }
    if (!add || uses(add->output(0)) != 1) return;
    for (const auto& node : model_.graph().node())
      if (node.op_type() == "Mul" && node.input_size() == 2 &&
          ((node.input(0) == x && node.input(1) == add->output(0)) ||
           (node.input(1) == x && node.input(0) == add->output(0))))
        mul = &node;
    if (!mul || uses(mul->output(0)) != 1) return;
    for (const auto& node : model_.graph().node())
      if (node.op_type() == "Mul" && node.input_size() == 2 && node.input(0) == mul->output(0) &&
          scalar(node.input(1), c) && c == 0.5)
        half = &node;
    if (!half) return;
    for (const auto* node : {div, &erf, add, mul}) absorbed_[producer_index(node->output(0))] = true;
    gelus_[producer_index(half->output(0))] = GeluPattern{x};
  }

  /// Add(Mul(Reshape(InstanceNormalization(Reshape(x, [0, G, -1])), Shape(x)), w), b):
  /// GroupNorm(G), as torch.onnx.export writes it (without Mul and Add: no affine).
  void group_norm(int index) {
    const onnx::NodeProto& in = model_.graph().node(index);
    const onnx::NodeProto* flatten = made_by(in.input(0), "Reshape");
    if (!flatten) return;
    const Tensor* target = constant(flatten->input(1));
    if (!target || target->size() != 3 || target->values[0] != 0 || target->values[2] != -1)
      return;
    const int groups = int(target->values[1]);
    const Tensor *scale = constant(in.input(1)), *shift = constant(in.input(2));
    if (!scale || !shift) return;
    for (const double v : scale->values)
      if (v != 1) return;
    for (const double v : shift->values)
      if (v != 0) return;
    const std::string& x = flatten->input(0);
    const onnx::NodeProto* restore = nullptr;
    for (const auto& node : model_.graph().node())
      if (node.op_type() == "Reshape" && node.input(0) == in.output(0)) restore = &node;
    if (!restore || uses(in.output(0)) != 1) return;
    const onnx::NodeProto* shape_of = made_by(restore->input(1), "Shape");
    if (!shape_of || shape_of->input(0) != x) return;
    GroupNormPattern p{x, "", "", groups, real(in, "epsilon", 1e-5)};
    std::vector<int> parts{producer_index(in.input(0)), index, producer_index(restore->input(1))};
    std::string out = restore->output(0);
    int anchor = producer_index(out);
    const onnx::NodeProto *mul = nullptr, *add = nullptr;
    for (const auto& node : model_.graph().node())
      if (node.op_type() == "Mul" && node.input_size() == 2 && node.input(0) == out &&
          constant(node.input(1)) && uses(out) == 1)
        mul = &node;
    if (mul) {
      for (const auto& node : model_.graph().node())
        if (node.op_type() == "Add" && node.input_size() == 2 && node.input(0) == mul->output(0) &&
            constant(node.input(1)) && uses(mul->output(0)) == 1)
          add = &node;
    }
    if (mul && add) {
      // F.group_norm without weights is exported with a Mul by 1 and an Add of 0.
      const Tensor &w = *constant(mul->input(1)), &b = *constant(add->input(1));
      if (!(w.size() == 1 && b.size() == 1 && w.values[0] == 1 && b.values[0] == 0))
        p.weight = mul->input(1), p.bias = add->input(1);
      parts.push_back(anchor);
      parts.push_back(producer_index(mul->output(0)));
      anchor = producer_index(add->output(0));
    }
    for (const int i : parts) absorbed_[i] = true;
    group_norms_[anchor] = p;
  }

  // ---- operators -------------------------------------------------------------------------

  void emit_channel_shuffle(const onnx::NodeProto& n, const ShufflePattern& p) {
    if (!fields_.count(p.input) || channels_last_.count(p.input))
      refuse(n, "the channel shuffle of '" + p.input + "', which is not a field with its channels first");
    const std::string what = key_ + ": '" + path_ + "': node '" + n.name() + "' (Reshape)";
    add_step(n, {p.input}, [p, what](const std::vector<Variable<T>>& v) {
      const Index channels = v[0].value().channels();
      SHARDTENSOR_REQUIRE(channels % p.groups == 0 &&
                              (p.per_group == 0 || p.per_group * p.groups == channels),
                          where,
                          what << ": shuffles " << channels << " channels as " << p.groups
                               << " groups" << (p.per_group ? " of " + std::to_string(p.per_group) : "")
                               << " (sizes fixed at export)");
      return channel_shuffle(v[0], Index(p.groups));
    });
  }

  void convert(int index) {
    const onnx::NodeProto& n = model_.graph().node(index);
    const std::string& op = n.op_type();
    if (gelus_.count(index)) return activation(n, gelus_.at(index).input, Activation::gelu);
    if (group_norms_.count(index)) return emit_group_norm(n, group_norms_.at(index));
    if (shuffles_.count(index)) return emit_channel_shuffle(n, shuffles_.at(index));
    if (layer_norms_.count(index)) {
      const LayerNormPattern& p = layer_norms_.at(index);
      return emit_layer_norm(n, p.input, p.axes, p.weight, p.bias, p.eps);
    }
    if (op == "LayerNormalization") return layer_norm_op(n);
    if (op == "Transpose") return transpose(n);
    if (op == "MatMul") return matmul(n);
    if (op == "Conv") return conv(n);
    if (op == "ConvTranspose") return conv_transpose(n);
    if (op == "MaxPool" || op == "AveragePool") return pool(n);
    // Elementwise functions, on fields and pooled vectors alike.
    static const std::map<std::string, Activation> functions{
        {"Relu", Activation::relu},       {"Sigmoid", Activation::sigmoid},
        {"Tanh", Activation::tanh},       {"Softplus", Activation::softplus},
        {"HardSwish", Activation::hardswish}, {"Mish", Activation::mish},
        {"Erf", Activation::erf},         {"Exp", Activation::exp},
        {"Log", Activation::log},         {"Sqrt", Activation::sqrt},
        {"Abs", Activation::abs},         {"Neg", Activation::neg},
        {"Reciprocal", Activation::reciprocal}};
    if (functions.count(op)) return activation(n, n.input(0), functions.at(op));
    if (op == "LeakyRelu")
      return activation(n, n.input(0), Activation::leaky_relu, real(n, "alpha", 0.01));
    if (op == "Elu") return activation(n, n.input(0), Activation::elu, real(n, "alpha", 1.0));
    if (op == "Celu") return activation(n, n.input(0), Activation::celu, real(n, "alpha", 1.0));
    if (op == "Selu") {
      if (std::abs(real(n, "alpha", 1.67326) - 1.6732632) > 1e-5 ||
          std::abs(real(n, "gamma", 1.0507) - 1.0507010) > 1e-5)
        refuse(n, "alpha and gamma other than SELU's constants");
      return activation(n, n.input(0), Activation::selu);
    }
    if (op == "HardSigmoid") {
      if (std::abs(real(n, "alpha", 0.2) - 1.0 / 6) > 1e-6 || std::abs(real(n, "beta", 0.5) - 0.5) > 1e-6)
        refuse(n, "alpha and beta other than PyTorch's (1/6, 1/2)");
      return activation(n, n.input(0), Activation::hardsigmoid);
    }
    if (op == "Clip") return clip(n);
    if (op == "PRelu") return prelu(n);
    if (op == "Add" || op == "Mul" || op == "Sub" || op == "Div" || op == "Min" || op == "Max" ||
        op == "Pow")
      return binary(n);
    if (op == "Softmax" || op == "LogSoftmax") return softmax(n);
    if (op == "ReduceMean" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceSum")
      return reduce(n);
    if (op == "Split") return split(n);
    if (op == "Slice") return slice(n);
    if (op == "Concat") return concat(n);
    if (op == "Resize" || op == "Upsample") return resize(n);
    if (op == "BatchNormalization") return batch_norm(n);
    if (op == "InstanceNormalization") return instance_norm(n);
    if (op == "Pad") return pad(n);
    if (op == "GlobalAveragePool") return global_pool(n, false);
    if (op == "GlobalMaxPool") return global_pool(n, true);
    if (op == "Flatten" || op == "Reshape" || op == "Squeeze") return flatten_vector(n);
    if (op == "Gemm") return gemm(n);
    if (op == "Dropout" && dropout_trains(n)) {  // a training export's: a Dropout layer
      const std::string x = field_input(n);
      double ratio = real(n, "ratio", 0.5);
      if (n.input_size() > 1 && !n.input(1).empty() && !scalar(n.input(1), ratio))
        refuse(n, "the ratio is not a constant");
      const std::string name = module_name(n);
      auto layer = graph_->add_module(name, std::make_shared<Dropout<T>>(ratio));
      return add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
    }
    if (op == "Identity" || op == "Dropout") {
      if (n.output_size() > 1 && !n.output(1).empty()) refuse(n, "the mask output is not supported");
      const std::string x = value_input(n);
      graph_->add_step(n.name(), op, {x}, n.output(0),
                       [](const std::vector<Variable<T>>& v) { return v[0]; });
      return mark_like(n.output(0), x);
    }
    refuse(n, "the operator is not supported (docs/onnx.md lists those that are)");
  }

  void conv(const onnx::NodeProto& n) {
    std::string x = n.input(0);
    if (vectors_.count(x)) return vector_conv(n);
    PaddedField padded;
    const bool pads_before = padded_.count(x) > 0;
    if (pads_before) {
      padded = padded_.at(x);
      if (uses(x) != 1) refuse(n, "its padded input is read elsewhere too");
      x = padded.source;
    }
    if (!fields_.count(x)) field_input(n);  // says why
    const Tensor& w = required_constant(n, 1, "the weight");
    if (int(w.dims.size()) != shape_.dims + 2)
      refuse(n, "a weight of rank " + std::to_string(w.dims.size()) + " for " +
                    std::to_string(shape_.dims) + " spatial axes");
    ConvOptions o;
    o.groups = int(integer(n, "group", 1));
    o.out_channels = int(w.dims[0]);
    o.in_channels = int(w.dims[1]) * o.groups;
    o.kernel.assign(w.dims.begin() + 2, w.dims.end());
    o.stride = as_ints(ints(n, "strides", std::vector<std::int64_t>(shape_.dims, 1)));
    o.dilation = as_ints(ints(n, "dilations", std::vector<std::int64_t>(shape_.dims, 1)));
    const WindowPads pads = window_pads(n);
    o.padding = pads.before;
    o.padding_after = pads.after;
    o.bias = n.input_size() > 2 && !n.input(2).empty();
    if (pads_before) {
      // PyTorch's circular, reflect and replicate padding, F.pad: the nodes before pad; a
      // zeros Pad adds to the Conv's own pads.
      for (int d = 0; d < shape_.dims; ++d) {
        if (padded.mode != PaddingMode::zeros && (o.padding[d] != 0 || o.padding_after[d] != 0))
          refuse(n, std::string("its own pads on top of a ") + to_string(padded.mode) +
                        "-padded input along spatial axis " + std::to_string(d));
        o.padding[d] += padded.before[d];
        o.padding_after[d] += padded.after[d];
      }
      o.padding_mode = padded.mode;
    }
    const std::string name = module_name(n, n.input(1));
    auto layer = graph_->add_module(name, std::make_shared<Conv<T>>(comm_, o, name));
    assign_parameter(n, *layer, name, "weight", n.input(1));
    if (o.bias) assign_parameter(n, *layer, name, "bias", n.input(2));
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  /// A 1x1 Conv of a pooled (N, C, 1...) vector (a squeeze-and-excitation gate's): a Linear
  /// layer, the conv's weight (out, in, 1...) being the Linear's (out, in).
  void vector_conv(const onnx::NodeProto& n) {
    const std::string& x = n.input(0);
    if (!vectors_.at(x)) refuse(n, "a Conv of a flattened (N, C) vector");
    const Tensor& w = required_constant(n, 1, "the weight");
    if (int(w.dims.size()) != shape_.dims + 2)
      refuse(n, "a weight of rank " + std::to_string(w.dims.size()));
    for (std::size_t d = 2; d < w.dims.size(); ++d)
      if (w.dims[d] != 1) refuse(n, "a kernel larger than 1 on a pooled (N, C, 1...) vector");
    if (integer(n, "group", 1) != 1) refuse(n, "groups on a pooled vector");
    const WindowPads pads = window_pads(n);
    for (int d = 0; d < shape_.dims; ++d)
      if (pads.before[d] != 0 || pads.after[d] != 0) refuse(n, "pads on a pooled vector");
    linear_on_vector(n, x, w, true);
  }

  /// A Linear layer on the pooled vector `x` from the weight `w` (out, in, 1...) and the
  /// node's bias (input 2, if any); `keeps_dims` as vectors_ says of its output.
  void linear_on_vector(const onnx::NodeProto& n, const std::string& x, const Tensor& w,
                        bool keeps_dims) {
    const bool bias = n.input_size() > 2 && !n.input(2).empty();
    const std::string name = module_name(n, n.input(1));
    auto layer = graph_->add_module(
        name, std::make_shared<Linear<T>>(Index(w.dims[1]), Index(w.dims[0]), bias, 0, name));
    assign_parameter(n, *layer, name, "weight", n.input(1));
    if (bias) assign_parameter(n, *layer, name, "bias", n.input(2));
    graph_->add_step(n.name(), n.op_type(), {x}, n.output(0),
                     [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
    vectors_[n.output(0)] = keeps_dims;
  }

  /// The mean or largest value over the whole field per (sample, channel): a replicated
  /// (N, C) vector (`keeps_dims`: ONNX's (N, C, 1...), else (N, C)).
  void global_pool(const onnx::NodeProto& n, bool max, bool keeps_dims = true) {
    const std::string x = field_input(n);
    const Communicator comm = comm_;
    graph_->add_step(n.name(), n.op_type(), {x}, n.output(0),
                     [comm, max](const std::vector<Variable<T>>& v) {
                       return max ? global_max_pool(comm, v[0]) : global_average_pool(comm, v[0]);
                     });
    vectors_[n.output(0)] = keeps_dims;
  }

  /// Flatten (axis 1), Reshape to (N, -1) or Squeeze of the unit spatial axes of a pooled
  /// vector: the vector as it is (it is kept as (N, C) already).
  void flatten_vector(const onnx::NodeProto& n) {
    const std::string& x = n.input(0);
    if (!vectors_.count(x))
      refuse(n, "reshapes a field (a sharded spatial axis cannot be flattened); only a pooled "
                "vector may be flattened");
    if (n.op_type() == "Flatten" && integer(n, "axis", 1) != 1)
      refuse(n, "axis " + std::to_string(integer(n, "axis", 1)) + "; Flatten(axis 1) is supported");
    if (n.op_type() == "Reshape") {
      const Tensor* shape = n.input_size() > 1 ? constant(n.input(1)) : nullptr;
      if (!shape || shape->size() != 2 || shape->values[1] != -1 ||
          (shape->values[0] != 0 && shape->values[0] != -1 && shape->values[0] < 1))
        refuse(n, "a reshape of a pooled vector other than to (N, -1)");
    }
    graph_->add_step(n.name(), n.op_type(), {x}, n.output(0),
                     [](const std::vector<Variable<T>>& v) { return v[0]; });
    vectors_[n.output(0)] = false;
  }

  /// Y = A B^T + C on a pooled vector (PyTorch's nn.Linear): a Linear layer.
  void gemm(const onnx::NodeProto& n) {
    const std::string& a = n.input(0);
    if (!vectors_.count(a)) refuse(n, "input '" + a + "' is not a pooled vector");
    if (real(n, "alpha", 1) != 1 || real(n, "beta", 1) != 1 || integer(n, "transA", 0) != 0 ||
        integer(n, "transB", 0) != 1)
      refuse(n, "alpha, beta, transA, transB other than PyTorch's Linear (1, 1, 0, 1)");
    const Tensor& w = required_constant(n, 1, "the weight");
    if (w.dims.size() != 2) refuse(n, "a weight of rank " + std::to_string(w.dims.size()));
    linear_on_vector(n, a, w, false);
  }

  /// A Pad of the spatial axes, kept for the Conv or average pooling that reads it.
  void pad(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    const std::string mode = text(n, "mode", "constant");
    const Tensor& pads = required_constant(n, 1, "pads");
    const int rank = shape_.dims + 2;
    if (int(pads.size()) != 2 * rank) refuse(n, "pads has " + std::to_string(pads.size()) + " entries");
    if (n.input_size() > 2 && !n.input(2).empty()) {
      double value = 0;
      if (!scalar(n.input(2), value) || value != 0)
        refuse(n, "a constant pad value other than 0 is not supported");
    }
    if (n.input_size() > 3 && !n.input(3).empty()) refuse(n, "the axes input is not supported");
    PaddedField padded{x, {}, {}, PaddingMode::zeros};
    if (mode == "reflect") padded.mode = PaddingMode::reflect;
    else if (mode == "edge") padded.mode = PaddingMode::replicate;
    else if (mode != "constant") refuse(n, "mode " + mode + " is not supported");
    for (int a = 0; a < rank; ++a) {
      const double before = pads.values[a], after = pads.values[a + rank];
      if (a < 2 && (before != 0 || after != 0)) refuse(n, "pads the batch or channel axis");
      if (a >= 2 && (before < 0 || after < 0)) refuse(n, "negative pads (a crop)");
      if (a >= 2) padded.before.push_back(int(before));
      if (a >= 2) padded.after.push_back(int(after));
    }
    padded_[n.output(0)] = padded;
  }

  void conv_transpose(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    const Tensor& w = required_constant(n, 1, "the weight");
    if (int(w.dims.size()) != shape_.dims + 2)
      refuse(n, "a weight of rank " + std::to_string(w.dims.size()));
    if (!ints(n, "output_shape").empty())
      refuse(n, "output_shape is not supported (export with output_padding)");
    ConvTransposeOptions o;
    o.groups = int(integer(n, "group", 1));
    o.in_channels = int(w.dims[0]);
    o.out_channels = int(w.dims[1]) * o.groups;
    o.kernel.assign(w.dims.begin() + 2, w.dims.end());
    o.stride = as_ints(ints(n, "strides", std::vector<std::int64_t>(shape_.dims, 1)));
    o.dilation = as_ints(ints(n, "dilations", std::vector<std::int64_t>(shape_.dims, 1)));
    o.padding = symmetric_pads(n);
    o.output_padding = as_ints(ints(n, "output_padding", std::vector<std::int64_t>(shape_.dims, 0)));
    o.bias = n.input_size() > 2 && !n.input(2).empty();
    const std::string name = module_name(n, n.input(1));
    auto layer = graph_->add_module(name, std::make_shared<ConvTranspose<T>>(comm_, o, name));
    assign_parameter(n, *layer, name, "weight", n.input(1));
    if (o.bias) assign_parameter(n, *layer, name, "bias", n.input(2));
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  void pool(const onnx::NodeProto& n) {
    std::string x = n.input(0);
    const bool pads_before = padded_.count(x) > 0;
    PaddedField padded;
    if (pads_before) {
      padded = padded_.at(x);
      if (n.op_type() != "AveragePool" || padded.mode != PaddingMode::zeros || uses(x) != 1)
        refuse(n, "a padded input is fused into an average pooling only (zeros, read once)");
      x = padded.source;
    }
    if (!fields_.count(x)) field_input(n);
    if (n.output_size() > 1 && !n.output(1).empty()) refuse(n, "the Indices output is not supported");
    PoolOptions o;
    o.kind = n.op_type() == "MaxPool" ? PoolKind::max : PoolKind::average;
    o.window = as_ints(ints(n, "kernel_shape"));
    if (int(o.window.size()) != shape_.dims) refuse(n, "kernel_shape does not match the spatial axes");
    o.stride = as_ints(ints(n, "strides", std::vector<std::int64_t>(shape_.dims, 1)));
    const WindowPads pads = window_pads(n);
    o.padding = pads.before;
    o.padding_after = pads.after;
    o.ceil_mode = integer(n, "ceil_mode", 0) != 0;
    if (o.kind == PoolKind::max)
      o.dilation = as_ints(ints(n, "dilations", std::vector<std::int64_t>(shape_.dims, 1)));
    else
      o.count_include_pad = integer(n, "count_include_pad", 0) != 0;
    if (pads_before) {  // avg_pool with count_include_pad: a Pad of zeros, then the pooling
      for (int d = 0; d < shape_.dims; ++d) {
        if (o.padding[d] != 0 || o.padding_after[d] != 0)
          refuse(n, "its own pads on top of a padded input");
        o.padding[d] = padded.before[d];
        o.padding_after[d] = padded.after[d];
      }
      o.count_include_pad = true;
    }
    auto layer = std::make_shared<Pool<T>>(comm_, o, n.name());
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  /// An elementwise function of a field or a pooled vector (`slope`, `upper`: its parameters,
  /// kernels/activation.hpp).
  void activation(const onnx::NodeProto& n, const std::string& x, Activation kind,
                  double slope = 0.01, double upper = 0) {
    if (!fields_.count(x) && !vectors_.count(x)) field_input(n);  // says why
    graph_->add_step(n.name(), n.op_type(), {x}, n.output(0),
                     [kind, slope, upper](const std::vector<Variable<T>>& v) {
                       return activate(v[0], kind, slope, upper);
                     });
    mark_like(n.output(0), x);
  }

  /// Input `i` of `n`: a field or a pooled vector.
  const std::string& value_input(const onnx::NodeProto& n, int i = 0,
                                 bool channels_last_ok = false) const {
    if (i < n.input_size() && vectors_.count(n.input(i)) &&
        (channels_last_ok || !channels_last_.count(n.input(i))))
      return n.input(i);
    return field_input(n, i, channels_last_ok);
  }
  /// `output` is a field or a vector, channels last or not, as `input` is.
  void mark_like(const std::string& output, const std::string& input) {
    if (vectors_.count(input))
      vectors_[output] = vectors_.at(input);
    else
      fields_.insert(output);
    if (channels_last_.count(input)) channels_last_.insert(output);
  }

  /// The fields of `v` on the first one's split: layers that pool or upsample on split points
  /// that are not multiples of their factor move them, and the branches of a graph meet again.
  static std::vector<Variable<T>> aligned(const Communicator& comm,
                                          const std::vector<Variable<T>>& v) {
    const Variable<T>* first = nullptr;  // the first field; pooled vectors are left as they are
    for (const auto& x : v)
      if (!first && x.is_field()) first = &x;
    std::vector<Variable<T>> out;
    for (const auto& x : v)
      out.push_back(!x.is_field() || &x == first
                        ? x
                        : resplit_like(comm, x, first->value().decomposition()));
    return out;
  }

  /// The per-channel (or scalar) values of constant `name` broadcast against an (N, C,
  /// spatial...) field: shape [], [1], [C], [1, C, 1...] or [C, 1...]; false otherwise.
  /// `channels_last`: against a channels-last value, whose channel axis is the last one.
  bool channel_constant(const std::string& name, std::vector<double>& values,
                        bool channels_last = false) const {
    const Tensor* t = constant(name);
    if (!t) return false;
    if (t->size() == 1) return values = t->values, true;
    // The channel axis: the one dim above 1, at position 1 of an (N, C, ...) broadcast or 0 of
    // a (C, spatial...) one.
    const std::size_t rank = t->dims.size();
    int channel_axis = -1;
    for (std::size_t a = 0; a < rank; ++a)
      if (t->dims[a] != 1) {
        if (channel_axis >= 0) return false;
        channel_axis = int(a);
      }
    // Broadcasting aligns the right ends: C is the axis just before the spatial ones (a 1-D
    // constant of C values would meet the last spatial axis instead).
    const int expected = channels_last ? int(rank) - 1 : int(rank) - 1 - shape_.dims;
    if (channel_axis != expected || expected < 0) return false;
    values = t->values;
    return true;
  }

  /// Whether `name` matches one of `patterns` (shell wildcards: "*.layer_scale").
  static bool listed(const std::string& name, const std::vector<std::string>& patterns) {
    for (const std::string& p : patterns)
      if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
    return false;
  }

  /// x * w or x + w for an initializer w listed in train_initializers (ConvNeXt's layer
  /// scale): a parameter of the graph named as the initializer, one value per channel or one
  /// for all, written back into it by `export`.
  void trained_channel_parameter(const onnx::NodeProto& n, const std::string& x,
                                 const std::string& initializer, const std::vector<double>& values) {
    const std::string& op = n.op_type();
    if (op != "Mul" && op != "Add")
      refuse(n, "initializer '" + initializer + "' is listed in train_initializers; a trained "
                "initializer multiplies (Mul) or offsets (Add) a field");
    if (!fields_.count(x) || channels_last_.count(x))
      refuse(n, "initializer '" + initializer + "' is listed in train_initializers; it meets '" +
                    x + "', which is not a field with its channels first");
    auto found = trained_.find(initializer);
    if (found == trained_.end()) {
      Variable<T> w = graph_->add_parameter(initializer, {Index(values.size())});
      assign(n, w.data(), initializer, Tensor{{std::int64_t(values.size())}, values});
      graph_->set_source(initializer, initializer);
      found = trained_.emplace(initializer, w).first;
    }
    const Variable<T> w = found->second;
    const Communicator comm = comm_;
    const ChannelOp kind = op == "Mul" ? ChannelOp::multiply : ChannelOp::add;
    add_step(n, {x}, [comm, kind, w](const std::vector<Variable<T>>& v) {
      return channel_parameter(comm, kind, v[0], w);
    });
  }

  /// Clip to [0, 6] (ReLU6) or [0, inf) (ReLU): the bounds as inputs (opset 11+) or attributes.
  void clip(const onnx::NodeProto& n) {
    constexpr double unbounded = std::numeric_limits<double>::infinity();
    double low = real(n, "min", -unbounded), high = real(n, "max", unbounded);
    if (n.input_size() > 1 && !n.input(1).empty() && !scalar(n.input(1), low))
      refuse(n, "min is not a constant");
    if (n.input_size() > 2 && !n.input(2).empty() && !scalar(n.input(2), high))
      refuse(n, "max is not a constant");
    if (low > high) refuse(n, "bounds [" + std::to_string(low) + ", " + std::to_string(high) + "]");
    if (low == 0 && high == 6) return activation(n, n.input(0), Activation::relu6);
    if (low == 0 && high > 1e30) return activation(n, n.input(0), Activation::relu);
    return activation(n, n.input(0), Activation::clip, low, high);
  }

  /// Add, Sub, Mul, Div, Min, Max, Pow: between a field or vector and a scalar or
  /// per-channel constant, or between two values that broadcast (layers/broadcast_binary.hpp).
  void binary(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    if (n.input_size() != 2)
      refuse(n, std::to_string(n.input_size()) + " inputs; two are supported");
    std::vector<double> c;
    for (int side = 0; side < 2; ++side) {
      const std::string& x = n.input(1 - side);
      // The channels are the last axis of a channels-last value and of a flattened vector.
      const bool last = channels_last_.count(x) || (vectors_.count(x) && !vectors_.at(x));
      if (!channel_constant(n.input(side), c, last)) continue;
      if (initializers_.count(n.input(side)) && listed(n.input(side), trained_patterns_))
        return trained_channel_parameter(n, x, n.input(side), c);
      if (op == "Pow" || op == "Min" || op == "Max") {
        // x^p, max(x, c), min(x, c): elementwise functions of a constant scalar.
        if (c.size() != 1) refuse(n, "a per-channel constant; a scalar is supported");
        if (op == "Pow" && side == 0) refuse(n, "a constant raised to a field is not supported");
        constexpr double unbounded = std::numeric_limits<double>::infinity();
        if (op == "Pow") return activation(n, x, Activation::pow, c[0]);
        if (op == "Max") return activation(n, x, Activation::clip, c[0], unbounded);
        return activation(n, x, Activation::clip, -unbounded, c[0]);
      }
      value_input(n, 1 - side, true);  // a field or a vector (says why otherwise)
      std::vector<double> scale(c.size(), 1.0), shift(c.size(), 0.0);
      if (op == "Add") shift = c;
      if (op == "Sub" && side == 1) for (std::size_t i = 0; i < c.size(); ++i) shift[i] = -c[i];
      if (op == "Sub" && side == 0) shift = c, scale.assign(c.size(), -1.0);
      if (op == "Mul") scale = c;
      if (op == "Div" && side == 0) refuse(n, "a constant divided by a field is not supported (Reciprocal is)");
      if (op == "Div") for (std::size_t i = 0; i < c.size(); ++i) scale[i] = 1.0 / c[i];
      graph_->add_step(n.name(), op, {x}, n.output(0),
                       [scale, shift](const std::vector<Variable<T>>& v) {
                         return channel_affine(v[0], scale, shift);
                       });
      return mark_like(n.output(0), x);
    }
    if (op == "Pow") refuse(n, "an exponent other than a constant scalar is not supported");
    const std::string a = value_input(n, 0, true), b = value_input(n, 1, true);
    if (channels_last_.count(a) != channels_last_.count(b))
      refuse(n, "'" + (channels_last_.count(a) ? a : b) +
                    "' has its channels last (after a Transpose), the other operand not");
    const bool a_field = fields_.count(a) > 0, b_field = fields_.count(b) > 0;
    for (const std::string* v : {&a, &b})
      if ((a_field || b_field) && vectors_.count(*v) && !vectors_.at(*v))
        refuse(n, "'" + *v + "' is a flattened (N, C) vector; only a pooled vector that keeps "
                  "its spatial axes (N, C, 1...) broadcasts against a field");
    if (!a_field && !b_field && vectors_.at(a) != vectors_.at(b))
      refuse(n, "a flattened (N, C) vector meets a pooled (N, C, 1...) one");
    const BinaryOp kind = op == "Add"   ? BinaryOp::add
                          : op == "Sub" ? BinaryOp::subtract
                          : op == "Mul" ? BinaryOp::multiply
                          : op == "Div" ? BinaryOp::divide
                          : op == "Min" ? BinaryOp::minimum
                                        : BinaryOp::maximum;
    const Communicator comm = comm_;
    graph_->add_step(n.name(), op, {a, b}, n.output(0),
                     [comm, kind](const std::vector<Variable<T>>& v) {
                       const auto w = aligned(comm, v);
                       // Two fields of one layout: the plain kernels of layers/pointwise.hpp.
                       if (w[0].is_field() && w[1].is_field() &&
                           w[0].value().same_layout(w[1].value())) {
                         if (kind == BinaryOp::add) return add(w[0], w[1]);
                         if (kind == BinaryOp::multiply) return multiply(w[0], w[1]);
                       }
                       return broadcast_binary(comm, kind, w[0], w[1]);
                     });
    mark_like(n.output(0), a_field || !b_field ? a : b);
  }

  void prelu(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    std::vector<double> slopes;
    if (n.input_size() < 2 || !channel_constant(n.input(1), slopes))
      refuse(n, "the slope must be a constant of one value or one per channel");
    const std::string name = module_name(n, n.input(1));
    auto layer = graph_->add_module(name, std::make_shared<PRelu<T>>(comm_, Index(slopes.size()), name));
    assign_parameter(n, *layer, name, "weight", n.input(1));
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  void softmax(const onnx::NodeProto& n) {
    if (opset_ < 13)
      refuse(n, "opset " + std::to_string(opset_) + "'s softmax flattens the axes from `axis` on; "
                "export with opset 13 or later (softmax over the channels is supported)");
    const int axis = spatial_axis(n, integer(n, "axis", -1));
    if (axis != 1)
      refuse(n, "a softmax along axis " + std::to_string(axis) +
                    "; over the channels (axis 1) is supported (a spatial axis is sharded)");
    const std::string x = field_input(n);
    const bool log = n.op_type() == "LogSoftmax";
    add_step(n, {x}, [log](const std::vector<Variable<T>>& v) { return softmax_channels(v[0], log); });
  }

  /// ReduceMean/Max/Min/Sum over the channels (keepdims: a one-channel field) or over all
  /// spatial axes (mean and max: a global pooling).
  void reduce(const onnx::NodeProto& n) {
    const std::string& op = n.op_type();
    std::vector<std::int64_t> axes = ints(n, "axes");
    if (n.input_size() > 1 && !n.input(1).empty()) {  // axes as an input: opset 18 (ReduceSum 13)
      const Tensor* t = constant(n.input(1));
      if (!t) refuse(n, "axes must be a constant");
      axes.assign(t->values.begin(), t->values.end());
    }
    if (axes.empty()) refuse(n, "a reduction over every axis (the batch too) is not supported");
    std::vector<int> sorted;
    for (const auto a : axes) sorted.push_back(spatial_axis(n, a));
    std::sort(sorted.begin(), sorted.end());
    const bool keeps_dims = integer(n, "keepdims", 1) != 0;
    std::vector<int> spatial;
    for (int a = 2; a < shape_.dims + 2; ++a) spatial.push_back(a);
    const bool last = channels_last_.count(n.input(0)) > 0;
    if (sorted == std::vector<int>{last ? shape_.dims + 1 : 1}) {
      if (!keeps_dims) refuse(n, "keepdims 0 over the channels (the field would lose its channel axis)");
      const std::string x = field_input(n, 0, true);
      if (last) channels_last_.insert(n.output(0));
      const ChannelReduction kind = op == "ReduceMean"  ? ChannelReduction::mean
                                    : op == "ReduceSum" ? ChannelReduction::sum
                                    : op == "ReduceMax" ? ChannelReduction::max
                                                        : ChannelReduction::min;
      return add_step(n, {x}, [kind](const std::vector<Variable<T>>& v) {
        return reduce_channels(v[0], kind);
      });
    }
    if (sorted == spatial && (op == "ReduceMean" || op == "ReduceMax"))
      return global_pool(n, op == "ReduceMax", keeps_dims);
    std::string listed;
    for (const int a : sorted) listed += (listed.empty() ? "" : ", ") + std::to_string(a);
    refuse(n, "a reduction over axes [" + listed +
                  "]; over the channels (axis 1), or the mean or max over all spatial axes, is "
                  "supported");
  }

  /// A Slice of the channels (x[:, a:b]), step 1; the batch axis, if named, whole.
  void slice(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    if (n.input_size() < 3) refuse(n, "starts and ends are missing (opset 10 or later is read)");
    const Tensor* axes = n.input_size() > 3 && !n.input(3).empty() ? constant(n.input(3)) : nullptr;
    const Tensor* steps = n.input_size() > 4 && !n.input(4).empty() ? constant(n.input(4)) : nullptr;
    // Starts and ends: constants, or computed from the sliced field's channel count (torch.chunk
    // writes x.size(1) // 2 and its multiples).
    const auto bounds = [&](int i) {
      std::vector<Dim> out;
      if (const Tensor* t = constant(n.input(i))) {
        constexpr double whole = double(std::int64_t(1) << 40);  // "to the end", as exporters write it
        for (const double v : t->values)
          out.push_back(Dim{v >= whole ? std::numeric_limits<std::int64_t>::max()
                                       : std::int64_t(std::max(v, -whole)),
                            "", 0});
      } else if (!shape_value(n.input(i), out)) {
        refuse(n, "starts and ends must be constants or computed from the channel count");
      }
      for (const Dim& d : out)
        if (!d.field.empty() && !(d.field == x && d.axis == 1))
          refuse(n, "starts or ends computed from the shape of '" + d.field + "' (axis " +
                        std::to_string(d.axis) + "); the sliced field's channel count is read");
      return out;
    };
    if ((n.input_size() > 3 && !n.input(3).empty() && !axes) ||
        (n.input_size() > 4 && !n.input(4).empty() && !steps))
      refuse(n, "axes and steps must be constants");
    const std::vector<Dim> starts = bounds(1), ends = bounds(2);
    if (starts.size() != ends.size()) refuse(n, "starts and ends differ in length");
    Dim begin{0, "", 0}, end{std::numeric_limits<std::int64_t>::max(), "", 0};
    for (std::size_t k = 0; k < starts.size(); ++k) {
      const int axis = spatial_axis(n, axes ? std::int64_t(axes->values[k]) : std::int64_t(k));
      if (steps && steps->values[k] != 1) refuse(n, "a step other than 1");
      if (axis == 1) {
        begin = starts[k], end = ends[k];
        continue;
      }
      if (starts[k].field.empty() && starts[k].value == 0 && ends[k].field.empty() &&
          ends[k].value == std::numeric_limits<std::int64_t>::max())
        continue;  // the whole axis
      refuse(n, axis == 0 ? std::string("a slice of the batch")
                          : "a slice of spatial axis " + std::to_string(axis - 2) +
                                " (a crop of a sharded axis) is not supported");
    }
    const std::string where_text = key_ + ": '" + path_ + "': node '" + n.name() + "' (Slice)";
    add_step(n, {x}, [begin, end, where_text](const std::vector<Variable<T>>& v) {
      const std::int64_t channels = v[0].value().channels();
      const auto clamp = [&](std::int64_t i) {
        if (i < 0) i += channels;
        return std::max<std::int64_t>(0, std::min(i, channels));
      };
      const std::int64_t from = clamp(begin.resolve(channels)), to = clamp(end.resolve(channels));
      SHARDTENSOR_REQUIRE(to > from, where,
                          where_text << ": keeps no channel of " << channels << " (from "
                                     << begin.resolve(channels) << " to " << end.resolve(channels)
                                     << ")");
      return slice_channels(v[0], Index(from), Index(to - from));
    });
  }

  /// Split over the channels: one step per output, each a range of channels.
  void split(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    if (spatial_axis(n, integer(n, "axis", 0)) != 1)
      refuse(n, "a split along axis " + std::to_string(integer(n, "axis", 0)) +
                    "; only channels (axis 1) are split (a spatial axis is sharded)");
    std::vector<std::int64_t> sizes = ints(n, "split");  // opset < 13
    if (n.input_size() > 1 && !n.input(1).empty()) {
      const Tensor* t = constant(n.input(1));
      if (!t) refuse(n, "the split sizes must be a constant");
      sizes.assign(t->values.begin(), t->values.end());
    }
    const int parts = n.output_size();
    if (!sizes.empty() && int(sizes.size()) != parts)
      refuse(n, std::to_string(sizes.size()) + " sizes for " + std::to_string(parts) + " outputs");
    const std::string where_text = key_ + ": '" + path_ + "': node '" + n.name() + "' (Split)";
    for (int i = 0; i < parts; ++i) {
      graph_->add_step(n.name() + ":" + std::to_string(i), "Split", {x}, n.output(i),
                       [sizes, parts, i, where_text](const std::vector<Variable<T>>& v) {
                         const Index channels = v[0].value().channels();
                         Index begin = 0, count = 0;
                         if (sizes.empty()) {  // equal parts
                           SHARDTENSOR_REQUIRE(channels % parts == 0, where,
                                               where_text << ": splits " << channels
                                                          << " channels into " << parts
                                                          << " equal parts");
                           count = channels / parts, begin = i * count;
                         } else {
                           for (int k = 0; k < i; ++k) begin += Index(sizes[k]);
                           count = Index(sizes[i]);
                           Index total = 0;
                           for (const auto s : sizes) total += Index(s);
                           SHARDTENSOR_REQUIRE(total == channels, where,
                                               where_text << ": splits " << channels
                                                          << " channels into parts of " << total);
                         }
                         return slice_channels(v[0], begin, count);
                       });
      fields_.insert(n.output(i));
    }
  }

  void concat(const onnx::NodeProto& n) {
    if (spatial_axis(n, integer(n, "axis", 0)) != 1)
      refuse(n, "a concatenation along axis " + std::to_string(integer(n, "axis", 0)) +
                    "; only channels (axis 1) are concatenated (a spatial axis is sharded)");
    std::vector<std::string> inputs;
    for (int i = 0; i < n.input_size(); ++i) inputs.push_back(field_input(n, i));
    const Communicator comm = comm_;
    add_step(n, inputs, [comm](const std::vector<Variable<T>>& v) {
      return concat_channels(aligned(comm, v));
    });
  }

  void resize(const onnx::NodeProto& n) {
    if (vectors_.count(n.input(0))) return resize_vector(n);
    const std::string x = field_input(n);
    const std::string mode = text(n, "mode", "nearest");
    std::vector<Dim> sizes;
    const bool to_sizes = n.op_type() == "Resize" && n.input_size() > 3 && !n.input(3).empty() &&
                          shape_value(n.input(3), sizes);
    // Opset >= 11: X, roi, scales[, sizes]; Upsample: X, scales.
    const int scales_input = n.op_type() == "Upsample" ? 1 : 2;
    const Tensor* scales = scales_input < n.input_size() ? constant(n.input(scales_input)) : nullptr;
    std::vector<int> factors;
    if (!to_sizes) {
      if (!scales || scales->size() == 0)
        refuse(n, "scales must be a constant (sizes, or scales computed from shapes, are not "
                  "supported: export with scale_factor, or size= from the input's shape)");
      if (int(scales->size()) != shape_.dims + 2 || scales->values[0] != 1 ||
          scales->values[1] != 1)
        refuse(n, "scales must be [1, 1, s...] (batch and channels unscaled)");
      for (int d = 0; d < shape_.dims; ++d) {
        const double s = scales->values[d + 2];
        if (s < 1 || s != std::floor(s))
          refuse(n, "scale " + std::to_string(s) + " along spatial axis " + std::to_string(d) +
                        "; integer upsampling factors are supported");
        factors.push_back(int(s));
      }
    }
    UpsampleMode kind = UpsampleMode::nearest;
    LinearCoordinates coordinates = LinearCoordinates::half_pixel;
    // The Upsample op (opsets 7 to 9) has no such attribute: its linear mode is asymmetric.
    const std::string transform = n.op_type() == "Upsample"
                                      ? "asymmetric"
                                      : text(n, "coordinate_transformation_mode", "half_pixel");
    if (mode == "nearest") {
      // Output o of an integer factor s: (o + 0.5) / s - 0.5 lies within (s - 1) / 2s of
      // floor(o / s), so half-pixel coordinates round to PyTorch's nearest source whatever
      // the rounding ('nearest' and 'nearest-exact' alike); asymmetric ones only when floored.
      const std::string rounding = text(n, "nearest_mode", "round_prefer_floor");
      const bool half_pixel = transform == "half_pixel" || transform == "pytorch_half_pixel";
      if (n.op_type() == "Resize" && !half_pixel && !(transform == "asymmetric" && rounding == "floor"))
        refuse(n, "nearest with coordinate_transformation_mode " + transform + " and nearest_mode " +
                      rounding + "; half_pixel or pytorch_half_pixel (any rounding) and asymmetric "
                      "with floor are supported");
    } else if (mode == "linear") {
      kind = UpsampleMode::linear;
      if (transform == "align_corners") coordinates = LinearCoordinates::align_corners;
      else if (transform == "asymmetric") coordinates = LinearCoordinates::asymmetric;
      else if (transform != "half_pixel" && transform != "pytorch_half_pixel")
        refuse(n, "linear with coordinate_transformation_mode " + transform +
                      "; half_pixel, pytorch_half_pixel (align_corners=False), align_corners and "
                      "asymmetric are supported");
    } else {
      refuse(n, "mode " + mode + "; nearest and linear are supported");
    }
    if (to_sizes) {
      // Sizes from shapes (x.shape[-2:] of the graph's input or of another field, folded) or
      // fixed at export: the factor follows from the fields that arrive and must be an integer.
      if (int(sizes.size()) != shape_.dims + 2)
        refuse(n, "sizes has " + std::to_string(sizes.size()) + " entries");
      for (const Dim& size : sizes)
        if (!size.ops.empty())
          refuse(n, "sizes computed by arithmetic on a shape are not supported (x.shape[-2:] or "
                    "numbers are)");
      for (int a = 0; a < 2; ++a)
        if (!sizes[a].field.empty() && sizes[a].axis != a)
          refuse(n, "sizes must keep the batch and channel axes");
      std::string follows = graph_input_;  // the field whose extents the sizes are
      for (int a = 2; a < shape_.dims + 2; ++a)
        if (!sizes[a].field.empty()) follows = sizes[a].field;
      for (int a = 2; a < shape_.dims + 2; ++a)
        if (!sizes[a].field.empty() && (sizes[a].field != follows || sizes[a].axis != a))
          refuse(n, "sizes follow the shapes of '" + sizes[a].field + "' and '" + follows +
                        "' or other axes; one field's spatial extents or numbers are supported");
      if (!fields_.count(follows))
        refuse(n, "sizes follow the shape of '" + follows + "', which is not a field made before");
      const Communicator comm = comm_;
      const std::string node = n.name(), where_text = key_ + ": '" + path_ + "': node '" +
                                                      n.name() + "' (Resize)";
      auto layer = std::make_shared<std::shared_ptr<Upsample<T>>>();
      auto made_for = std::make_shared<std::vector<int>>();
      add_step(n, {x, follows}, [=](const std::vector<Variable<T>>& v) {
        const Decomposition& d = v[0].value().decomposition();
        const Decomposition& whole = v[1].value().decomposition();
        const Index kept[2] = {v[0].value().batch(), v[0].value().channels()};
        for (int a = 0; a < 2; ++a)
          SHARDTENSOR_REQUIRE(!sizes[a].field.empty() || Index(sizes[a].value) == kept[a], where,
                              where_text << ": resizes " << (a ? "channels " : "the batch ")
                                         << kept[a] << " to " << sizes[a].value
                                         << " (a size fixed at export); the batch and channels "
                                            "are kept");
        std::vector<int> f;
        for (int a = 0; a < d.ndims(); ++a) {
          const Dim& size = sizes[a + 2];
          const Index target = size.field.empty() ? Index(size.value) : whole.global_extent(size.axis - 2);
          const Index extent = d.global_extent(a);
          SHARDTENSOR_REQUIRE(target >= extent && target % extent == 0, where,
                              where_text << ": resizes " << extent << " cells to " << target
                                         << " along spatial axis " << a
                                         << (size.field.empty()
                                                 ? " (a size fixed at export for the traced "
                                                   "input: export with this resolution or "
                                                   "with scale_factor)"
                                                 : "")
                                         << "; integer factors are supported");
          f.push_back(int(target / extent));
        }
        if (!*layer || *made_for != f) {
          *layer = std::make_shared<Upsample<T>>(comm, f, kind, node, coordinates);
          *made_for = f;
        }
        return (*layer)->forward(v[0]);
      });
      return;
    }
    auto layer = std::make_shared<Upsample<T>>(comm_, factors, kind, n.name(), coordinates);
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  /// A pooled (N, C, 1...) vector resized to the size of a field (DeepLab's image pooling,
  /// size=x.shape[-2:]): every cell holds the vector's value, whatever the mode. The field is
  /// the one the sizes follow; where the export fixed them as numbers, the field the result
  /// meets in its one reader (a Concat, an Add), made earlier, whose extents must be those.
  void resize_vector(const onnx::NodeProto& n) {
    const std::string& x = n.input(0);
    std::vector<Dim> sizes;
    if (!vectors_.at(x) || n.op_type() != "Resize" || n.input_size() < 4 ||
        !shape_value(n.input(3), sizes) || int(sizes.size()) != shape_.dims + 2)
      refuse(n, "resizes a pooled vector other than to a field's sizes (size=x.shape[-2:])");
    std::string field = sizes[2].field;
    std::vector<Index> fixed;  // sizes fixed at export
    for (int a = 2; a < shape_.dims + 2; ++a) {
      if (sizes[a].field.empty()) {
        fixed.push_back(Index(sizes[a].value));
        continue;
      }
      if (!sizes[a].is_extent(field, a))
        refuse(n, "resizes a pooled vector to sizes that are not one field's spatial extents");
    }
    if (!fixed.empty()) {
      if (int(fixed.size()) != shape_.dims)
        refuse(n, "resizes a pooled vector to sizes partly fixed at export");
      field.clear();
      for (const auto& reader : model_.graph().node())
        for (const auto& in : reader.input())
          if (in == n.output(0) && uses(in) == 1)
            for (const auto& other : reader.input())
              if (field.empty() && fields_.count(other)) field = other;
    }
    if (!fields_.count(field))
      refuse(n, "resizes a pooled vector to " +
                    (fixed.empty() ? "the sizes of '" + field + "', which is not a field"
                                   : std::string("sizes fixed at export, and its reader meets no "
                                                 "field made before it to take the layout of")));
    const Communicator comm = comm_;
    const std::string where_text = key_ + ": '" + path_ + "': node '" + n.name() + "' (Resize)";
    graph_->add_step(n.name(), n.op_type(), {x, field}, n.output(0),
                     [comm, fixed, where_text](const std::vector<Variable<T>>& v) {
                       const Decomposition& d = v[1].value().decomposition();
                       for (std::size_t a = 0; a < fixed.size(); ++a)
                         SHARDTENSOR_REQUIRE(
                             d.global_extent(int(a)) == fixed[a], where,
                             where_text << ": resizes to " << fixed[a] << " cells along spatial axis "
                                        << a << " (a size fixed at export for the traced input), "
                                        << "where the field it meets has " << d.global_extent(int(a))
                                        << ": export at this resolution");
                       return spread_over_field(comm, v[0], v[1].value());
                     });
    fields_.insert(n.output(0));
  }

  /// A LayerNorm over the channels (TokenLayerNorm: per cell, or per row of a pooled vector):
  /// `axes` must be the channel axis, the last one of a channels-last value or axis 1.
  void emit_layer_norm(const onnx::NodeProto& n, const std::string& x, const std::vector<int>& axes,
                       const std::string& weight, const std::string& bias, double eps) {
    if (!fields_.count(x) && !vectors_.count(x)) refuse(n, "'" + x + "' is not a field or a pooled vector");
    const bool last = channels_last_.count(x) > 0;
    const int channel_axis = last ? shape_.dims + 1 : 1;
    if (axes != std::vector<int>{channel_axis})
      refuse(n, "a LayerNorm over other axes than the channels (axis " +
                    std::to_string(channel_axis) + (last ? ", channels last" : "") +
                    "): a spatial axis is sharded");
    const Tensor* w = constant(weight);
    const Tensor* b = constant(bias);
    if (!w || !b || w->size() != b->size() || w->size() < 2)
      refuse(n, "the LayerNorm's weight and bias are not one value per channel");
    const std::string name = module_name(n, weight);
    auto layer = graph_->add_module(
        name, std::make_shared<TokenLayerNorm<T>>(comm_, int(w->size()), eps, name));
    assign_parameter(n, *layer, name, "weight", weight);
    assign_parameter(n, *layer, name, "bias", bias);
    graph_->add_step(n.name(), "LayerNorm", {x}, n.output(0),
                     [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
    mark_like(n.output(0), x);
  }

  /// LayerNormalization (opset 17): over the last axis of a channels-last value.
  void layer_norm_op(const onnx::NodeProto& n) {
    for (int o = 1; o < n.output_size(); ++o)
      if (!n.output(o).empty()) refuse(n, "the Mean and InvStdDev outputs are not supported");
    if (n.input_size() < 3 || n.input(2).empty()) refuse(n, "a LayerNormalization without a bias");
    emit_layer_norm(n, n.input(0), {spatial_axis(n, integer(n, "axis", -1))}, n.input(1),
                    n.input(2), real(n, "epsilon", 1e-5));
  }

  /// Transpose moving the channels last (x.permute(0, 2, 3, 1)) or back: the values stay in
  /// (N, C, spatial...), the ops between read them as channels-last ONNX values.
  void transpose(const onnx::NodeProto& n) {
    const std::string& x = n.input(0);
    value_input(n, 0, true);
    const int rank = shape_.dims + 2;
    std::vector<std::int64_t> to_last{0}, to_first{0, rank - 1};
    for (int a = 2; a < rank; ++a) to_last.push_back(a);
    to_last.push_back(1);
    for (int a = 1; a < rank - 1; ++a) to_first.push_back(a);
    const std::vector<std::int64_t> perm = ints(n, "perm");
    const bool last = channels_last_.count(x) > 0;
    if (perm != (last ? to_first : to_last)) {
      std::string listed;
      for (const auto a : perm) listed += (listed.empty() ? "" : ", ") + std::to_string(a);
      refuse(n, "perm [" + listed + "] moves a sharded spatial axis; moving the channels last "
                "and back (x.permute(0, 2, ..., 1) and its inverse) is supported");
    }
    graph_->add_step(n.name(), n.op_type(), {x}, n.output(0),
                     [](const std::vector<Variable<T>>& v) { return v[0]; });
    mark_like(n.output(0), x);
    if (last)
      channels_last_.erase(n.output(0));
    else
      channels_last_.insert(n.output(0));
  }

  /// MatMul with a constant (in, out) matrix on a channels-last value (nn.Linear over the
  /// channels: a 1x1 Conv) or a flattened vector (a Linear); an Add of a constant of `out`
  /// values after it is the layer's bias. The matrix is held transposed, as (out, in).
  void matmul(const onnx::NodeProto& n) {
    const std::string& x = n.input(0);
    const bool last = channels_last_.count(x) > 0;
    if (!last && !(vectors_.count(x) && !vectors_.at(x)))
      refuse(n, "a MatMul of '" + x + "'; with a constant matrix, of a value whose channels "
                "are last (after a Transpose) or of a flattened pooled vector, is supported");
    const std::string input = value_input(n, 0, true);
    const Tensor& w = required_constant(n, 1, "the weight");
    if (w.dims.size() != 2) refuse(n, "a weight of rank " + std::to_string(w.dims.size()));
    std::string output = n.output(0), bias;
    const onnx::NodeProto* add = reader(n.output(0), "Add");
    if (add && uses(n.output(0)) == 1) {
      bias = other_constant(*add, n.output(0));
      const Tensor* b = bias.empty() ? nullptr : constant(bias);
      if (b && b->dims.size() == 1 && std::int64_t(b->size()) == w.dims[1]) {
        output = add->output(0);
        absorbed_[producer_index(output)] = true;
      } else {
        bias.clear();
      }
    }
    const std::string name = module_name(n, bias.empty() ? "" : bias.substr(0, bias.rfind('.')) + ".weight");
    std::shared_ptr<Module<T>> layer;
    if (fields_.count(input)) {
      ConvOptions o;
      o.in_channels = int(w.dims[0]);
      o.out_channels = int(w.dims[1]);
      o.kernel.assign(shape_.dims, 1);
      o.stride.assign(shape_.dims, 1);
      o.dilation.assign(shape_.dims, 1);
      o.padding.assign(shape_.dims, 0);
      o.bias = !bias.empty();
      layer = graph_->add_module(name, std::make_shared<Conv<T>>(comm_, o, name));
    } else {
      layer = graph_->add_module(
          name, std::make_shared<Linear<T>>(Index(w.dims[0]), Index(w.dims[1]), !bias.empty(), 0, name));
    }
    assign_transposed(n, *layer, name, n.input(1), w);
    if (!bias.empty()) assign_parameter(n, *layer, name, "bias", bias);
    graph_->add_step(n.name(), n.op_type(), {input}, output,
                     [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
    mark_like(output, input);
  }

  /// The layer's "weight" (out, in, ...) from the (in, out) matrix `value` holds.
  void assign_transposed(const onnx::NodeProto& n, Module<T>& module, const std::string& module_name,
                         const std::string& value, const Tensor& w) {
    const std::int64_t rows = w.dims[0], columns = w.dims[1];
    Tensor transposed{{columns, rows}, std::vector<double>(w.size())};
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t o = 0; o < columns; ++o)
        transposed.values[std::size_t(o * rows + i)] = w.values[std::size_t(i * columns + o)];
    // The matrix may be a Transpose of the layer's own (out, in) weight (a training export).
    const onnx::NodeProto* flip = producer(value);
    const bool of_weight = flip && flip->op_type() == "Transpose" && constant(flip->input(0));
    for (const auto& [p_name, p] : module.named_parameters())
      if (p_name == "weight") {
        assign(n, p.data(), "the weight", transposed);
        graph_->set_source(module_name + ".weight", of_weight ? flip->input(0) : value, !of_weight);
        return;
      }
    refuse(n, "the layer has no weight");
  }

  void batch_norm(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    // A training export's running-statistics outputs: the layer keeps its own; nothing may read them.
    for (int o = 1; o < n.output_size(); ++o)
      if (!n.output(o).empty() && uses(n.output(o)) > 0)
        refuse(n, "output " + std::to_string(o) + " (the running statistics) is read by another node");
    const int channels = int(required_constant(n, 1, "the scale").size());
    // ONNX's momentum weighs the old running value (0.9), PyTorch's the new one (0.1).
    const double momentum = 1 - real(n, "momentum", 0.9);
    const std::string name = module_name(n, n.input(1));
    auto layer = graph_->add_module(
        name, std::make_shared<BatchNorm<T>>(comm_, channels, momentum, real(n, "epsilon", 1e-5),
                                             true, name));
    assign_parameter(n, *layer, name, "weight", n.input(1));
    assign_parameter(n, *layer, name, "bias", n.input(2));
    assign_buffer(n, layer->running_mean(), name + ".running_mean", n.input(3));
    assign_buffer(n, layer->running_var(), name + ".running_var", n.input(4));
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  void instance_norm(const onnx::NodeProto& n) {
    const std::string x = field_input(n);
    const int channels = int(required_constant(n, 1, "the scale").size());
    const std::string name = module_name(n, n.input(1));
    auto layer = graph_->add_module(
        name, std::make_shared<GroupNorm<T>>(comm_, channels, channels, real(n, "epsilon", 1e-5),
                                             true, name));
    assign_parameter(n, *layer, name, "weight", n.input(1));
    assign_parameter(n, *layer, name, "bias", n.input(2));
    add_step(n, {x}, [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  void emit_group_norm(const onnx::NodeProto& n, const GroupNormPattern& p) {
    if (!fields_.count(p.input)) field_input(n);
    const bool affine = !p.weight.empty();
    if (!affine) {
      // No weights to tell the channels: the layer (it has no parameters) is made for the
      // field that arrives.
      const Communicator comm = comm_;
      const std::string name = module_name(n);
      auto layer = std::make_shared<std::shared_ptr<GroupNorm<T>>>();
      const int groups = p.groups;
      const double eps = p.eps;
      add_step(n, {p.input}, [=](const std::vector<Variable<T>>& v) {
        const int channels = int(v[0].value().channels());
        if (!*layer || (*layer)->channels() != channels)
          *layer = std::make_shared<GroupNorm<T>>(comm, groups, channels, eps, false, name);
        return (*layer)->forward(v[0]);
      });
      return;
    }
    const int channels = int(constant(p.weight)->size());
    if (constant(p.bias)->size() != std::size_t(channels) || channels == 1)
      refuse(n, "the GroupNorm's weight and bias are not one value per channel");
    const std::string name = module_name(n, p.weight);
    auto layer = graph_->add_module(
        name, std::make_shared<GroupNorm<T>>(comm_, p.groups, channels, p.eps, affine, name));
    assign_parameter(n, *layer, name, "weight", p.weight);
    assign_parameter(n, *layer, name, "bias", p.bias);
    add_step(n, {p.input},
             [layer](const std::vector<Variable<T>>& v) { return layer->forward(v[0]); });
  }

  std::string path_;
  Communicator comm_;
  ModelShape shape_;
  std::string key_;
  onnx::ModelProto model_;
  std::int64_t opset_ = 0;
  std::map<std::string, Tensor> constants_;
  std::map<std::string, int> producer_, uses_;
  std::vector<bool> absorbed_;
  std::map<std::string, PaddedField> padded_;
  std::set<std::string> initializers_;  // the graph's initializers' names
  std::vector<std::string> trained_patterns_;        // train_initializers
  std::map<std::string, Variable<T>> trained_;        // initializer -> the parameter it became
  std::map<int, GeluPattern> gelus_;
  std::map<int, GroupNormPattern> group_norms_;
  std::map<int, ShufflePattern> shuffles_;
  std::map<int, LayerNormPattern> layer_norms_;
  /// Values ONNX sees as (N, spatial..., C) (after a Transpose moved the channels last),
  /// computed as (N, C, spatial...) fields or pooled vectors as usual.
  std::set<std::string> channels_last_;
  std::map<std::string, std::vector<Dim>> shapes_;  // values of shape computations
  std::set<std::string> fields_, module_names_;
  /// Replicated (N, C) values (after a global pooling): true where ONNX sees (N, C, 1...)
  /// (the spatial axes kept, so it broadcasts against fields), false for a flat (N, C).
  std::map<std::string, bool> vectors_;
  std::string graph_input_;
  std::shared_ptr<Graph<T>> graph_;
};

}  // namespace

OnnxSignature onnx_signature(const std::string& path, const Communicator& comm) {
  const onnx::ModelProto model = read_model(path, comm, "--model");
  const onnx::GraphProto& g = model.graph();
  std::set<std::string> initializers;
  for (const auto& t : g.initializer()) initializers.insert(t.name());
  OnnxSignature s;
  const auto describe = [](const onnx::ValueInfoProto& v, int& rank, Index& channels) {
    const auto& dims = v.type().tensor_type().shape().dim();
    rank = dims.size();
    channels = dims.size() > 1 && dims[1].has_dim_value() ? dims[1].dim_value() : 0;
  };
  for (const auto& i : g.input())
    if (!initializers.count(i.name())) {
      describe(i, s.input_rank, s.input_channels);
      break;
    }
  SHARDTENSOR_REQUIRE(g.output_size() == 1, where,
                      path << ": the graph has " << g.output_size()
                           << " outputs; one output field is supported");
  describe(g.output(0), s.output_rank, s.output_channels);
  return s;
}

template <class T>
std::shared_ptr<Graph<T>> import_onnx(const std::string& path, const Communicator& comm,
                                      const ModelShape& shape, const std::string& key,
                                      const std::vector<std::string>& trained_initializers) {
  return Importer<T>(path, comm, shape, key, trained_initializers).run();
}

namespace {

/// `tensor` holding `values` in its own data type, inline (external data is brought in).
void overwrite(onnx::TensorProto& tensor, const std::vector<double>& values) {
  std::string raw;
  const auto append = [&](auto v) {
    raw.append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  for (const double v : values) switch (tensor.data_type()) {
      case onnx::TensorProto::FLOAT: append(float(v)); break;
      case onnx::TensorProto::DOUBLE: append(v); break;
      default:
        SHARDTENSOR_FAIL(where, "tensor '" << tensor.name() << "' of ONNX data type "
                                           << tensor.data_type() << " cannot take trained values");
    }
  tensor.clear_float_data();
  tensor.clear_double_data();
  tensor.clear_external_data();
  tensor.set_data_location(onnx::TensorProto::DEFAULT);
  tensor.set_raw_data(raw);
}

/// The tensor in `model` that holds the value `name`: an initializer, a Constant node's value,
/// or what an Identity passes on.
onnx::TensorProto* tensor_named(onnx::ModelProto& model, std::string name) {
  onnx::GraphProto& g = *model.mutable_graph();
  for (int guard = 0; guard < g.node_size() + 1; ++guard) {
    for (auto& t : *g.mutable_initializer())
      if (t.name() == name) return &t;
    bool followed = false;
    for (auto& n : *g.mutable_node()) {
      if (n.output_size() == 0 || n.output(0) != name) continue;
      if (n.op_type() == "Constant")
        for (auto& a : *n.mutable_attribute())
          if (a.name() == "value" && a.has_t()) return a.mutable_t();
      // What a reshape of a constant read (a training export's w[:, None, None]).
      static const std::set<std::string> same_values{"Identity", "Cast", "Unsqueeze", "Squeeze",
                                                     "Reshape"};
      if (same_values.count(n.op_type())) name = n.input(0), followed = true;
      break;
    }
    if (!followed) break;
  }
  return nullptr;
}

}  // namespace

template <class T>
void export_onnx(const std::string& source, const Graph<T>& graph, const std::string& output,
                 const Communicator& comm) {
  onnx::ModelProto model = read_model(source, comm, "export");
  std::map<std::string, ReplicatedView<T>> values;
  for (const auto& [name, p] : graph.named_parameters()) values[name] = p.data();
  for (const auto& [name, b] : graph.named_buffers()) values[name] = b;
  std::string problem;
  if (comm.rank() == 0) {
    try {
      for (const auto& [name, value] : graph.sources()) {
        onnx::TensorProto* tensor = tensor_named(model, value);
        SHARDTENSOR_REQUIRE(tensor && values.count(name), where,
                            source << ": '" << value << "' (" << name << ") is not in the file");
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values.at(name));
        std::vector<double> trained(host.data(), host.data() + host.extent(0));
        if (graph.source_transposed(name)) {  // ours (out, in); the file's (in, out)
          SHARDTENSOR_REQUIRE(tensor->dims_size() == 2, where,
                              source << ": '" << value << "' is not a matrix");
          const std::int64_t rows = tensor->dims(0), columns = tensor->dims(1);
          std::vector<double> file(trained.size());
          for (std::int64_t i = 0; i < rows; ++i)
            for (std::int64_t o = 0; o < columns; ++o)
              file[std::size_t(i * columns + o)] = trained[std::size_t(o * rows + i)];
          trained.swap(file);
        }
        overwrite(*tensor, trained);
      }
      const std::string temporary = output + ".tmp-export";
      {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        SHARDTENSOR_REQUIRE(out && model.SerializeToOstream(&out), where,
                            "cannot write '" << temporary << "': " << std::strerror(errno));
      }
      SHARDTENSOR_REQUIRE(std::rename(temporary.c_str(), output.c_str()) == 0, where,
                          "cannot rename '" << temporary << "' to '" << output
                                            << "': " << std::strerror(errno));
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  comm.agree(problem);
}

#endif  // SHARDTENSOR_HAVE_ONNX

template void export_onnx<float>(const std::string&, const Graph<float>&, const std::string&,
                                 const Communicator&);
template void export_onnx<double>(const std::string&, const Graph<double>&, const std::string&,
                                  const Communicator&);
template std::shared_ptr<Graph<float>> import_onnx<float>(
    const std::string&, const Communicator&, const ModelShape&, const std::string&,
    const std::vector<std::string>&);
template std::shared_ptr<Graph<double>> import_onnx<double>(
    const std::string&, const Communicator&, const ModelShape&, const std::string&,
    const std::vector<std::string>&);

}  // namespace shardtensor::models
