// ONNX import: networks written in PyTorch (tools/onnx_test_models.py exports them when the
// suite runs, into $SHARDTENSOR_ONNX_MODELS) run sharded, on balanced and uneven splits, equal
// to PyTorch's output (float, 1e-5 of the largest) and, in training mode, to the same graph on
// one rank (outputs, input and parameter gradients). Files that cannot be imported fail on
// every rank with the node and the reason.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "equivalence.hpp"
#include "shardtensor/comm.hpp"
#include "shardtensor/embed.hpp"
#include "shardtensor/models/onnx_import.hpp"
#include "test_support.hpp"

using namespace shardtensor;

namespace {

/// A network exported by tools/onnx_test_models.py: its file, input and PyTorch's output.
struct Exported {
  std::string path;
  std::vector<Index> input_shape, output_shape;
  Index stride = 1;  ///< input cells a part must hold (the coarsest stage's halos)
  std::vector<float> input, output;

  int dims() const { return int(input_shape.size()) - 2; }
  std::vector<Index> extents() const { return {input_shape.begin() + 2, input_shape.end()}; }
};

std::string models_directory() {
  const char* dir = std::getenv("SHARDTENSOR_ONNX_MODELS");
  REQUIRE(dir != nullptr);  // set by ctest (the onnx_test_models fixture)
  return dir;
}

std::vector<float> read_floats(const std::string& path, std::size_t count) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::vector<float> values(count);
  in.read(reinterpret_cast<char*>(values.data()), std::streamsize(count * sizeof(float)));
  REQUIRE(in);
  return values;
}

Exported load(const std::string& name) {
  Exported e;
  const std::string base = models_directory() + "/" + name;
  e.path = base + ".onnx";
  std::ifstream shapes(base + ".shape");
  REQUIRE(shapes);
  std::string line;
  while (std::getline(shapes, line)) {
    std::istringstream words(line);
    std::string which;
    words >> which;
    if (which == "stride") {
      words >> e.stride;
      continue;
    }
    std::vector<Index>& shape = which == "input" ? e.input_shape : e.output_shape;
    for (Index v; words >> v;) shape.push_back(v);
  }
  std::size_t in = 1, out = 1;
  for (const Index v : e.input_shape) in *= std::size_t(v);
  for (const Index v : e.output_shape) out *= std::size_t(v);
  e.input = read_floats(base + ".input.bin", in);
  e.output = read_floats(base + ".output.bin", out);
  return e;
}

/// Index of (n, c, global cell) in a C-order (N, C, spatial...) array of `shape`.
std::size_t linear(const std::vector<Index>& shape, Index n, Index c, const SpatialIndex& g) {
  std::size_t i = std::size_t(n) * shape[1] + c;
  for (std::size_t d = 2; d < shape.size(); ++d) i = i * shape[d] + g[d - 2];
  return i;
}

models::ModelShape model_shape(const Exported& e) {
  return {e.dims(), e.input_shape[1], e.output_shape[1], e.extents()};
}

/// max |ours - PyTorch's| / max |PyTorch's| of the network's output on the exported input,
/// run sharded over `d`: a field (gathered) or a pooled vector (replicated).
double error_against_pytorch(const Exported& e, const Communicator& world, const Decomposition& d) {
  const auto model = models::import_onnx<float>(e.path, world, model_shape(e));
  model->eval();  // as exported: batch norm with its running statistics
  ShardTensor<float> x(d, world.rank(), e.input_shape[0], e.input_shape[1]);
  test::fill(x, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
    return double(e.input[linear(e.input_shape, n, c, g)]);
  });
  const NoGradGuard no_grad;
  const Variable<float> y = model->forward(Variable<float>::field(x));
  std::vector<double> ours;
  if (y.is_field()) {
    if (y.value().decomposition().global_extents() == d.global_extents())
      CHECK(y.value().decomposition() == d);  // back on the input's split
    const auto whole = all_gather(world, y.value());
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole);
    ours.assign(host.data(), host.data() + host.span());
  } else {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.data());
    ours.assign(host.data(), host.data() + host.span());
  }
  REQUIRE(ours.size() == e.output.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < e.output.size(); ++i) {
    diff = std::max(diff, std::abs(ours[i] - double(e.output[i])));
    scale = std::max(scale, std::abs(double(e.output[i])));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("ONNX networks from PyTorch run sharded as PyTorch computes them", "[onnx]") {
  REQUIRE(models::onnx_available());
  const Communicator world;
  for (const std::string name : {"unet2d", "resnet1d", "net3d", "head2d", "affine2d", "acts1d",
                                 "ops2d", "next2d", "next2d_opset17", "pads2d"}) {
    DYNAMIC_SECTION(name) {
      const Exported e = load(name);
      for (const Decomposition& d :
           test::test_decompositions(e.extents(), world.size(), {}, std::max<Index>(4, e.stride))) {
        INFO(name << " on " << d.describe());
        CHECK(error_against_pytorch(e, world, d) <= 1e-5);
      }
    }
  }
}

TEST_CASE("an imported graph's gradients are PyTorch's", "[onnx]") {
  // One backward pass of mean((output - target)^2), sharded, against PyTorch's gradients of
  // the input and of each parameter that is one of PyTorch's (read from the initializer of
  // that name: a conv with a batch norm folded into it has other weights): the network
  // exported for inference in eval mode, and exported for training (NAME.train.onnx: batch
  // norm on the batch's statistics over every rank, weights reshaped by nodes) in train mode.
  const Communicator world;
  for (const std::string network : {"ops2d", "next2d", "next2d_opset17", "unet2d", "resnet1d",
                                    "net3d", "affine2d", "acts1d", "pads2d"})
  for (const bool training : {false, true}) {
    const std::string name = network + (training ? ".train" : "");
    DYNAMIC_SECTION(name) {
      Exported e = load(network);
      const std::string base = models_directory() + "/" + name;
      e.path = base + ".onnx";
      const std::vector<float> target = read_floats(base + ".target.bin", e.output.size());
      const std::vector<float> input_grad = read_floats(base + ".input_grad.bin", e.input.size());
      std::map<std::string, std::vector<float>> pytorch;  // parameter name -> gradient
      {
        std::ifstream list(base + ".grads");
        std::vector<std::pair<std::string, std::size_t>> sizes;
        std::size_t total = 0;
        for (std::string p; list >> p;) {
          std::size_t count = 0;
          list >> count;
          sizes.emplace_back(p, count);
          total += count;
        }
        const std::vector<float> all = read_floats(base + ".param_grads.bin", total);
        std::size_t at = 0;
        for (const auto& [p, count] : sizes) {
          pytorch[p].assign(all.begin() + long(at), all.begin() + long(at + count));
          at += count;
        }
      }
      // max |ours - PyTorch's| / max |PyTorch's| (0 where both are zero everywhere), the scale
      // at least `floor`: a conv's bias before a batch norm in training has a gradient of
      // rounding noise (the norm takes the mean out), which only an absolute bound can judge.
      const auto relative_difference = [](const auto& ours, const std::vector<float>& theirs,
                                           double floor = 0) {
        REQUIRE(std::size_t(ours.size()) == theirs.size());
        double diff = 0, scale = floor;
        for (std::size_t i = 0; i < theirs.size(); ++i) {
          diff = std::max(diff, std::abs(double(ours[i]) - double(theirs[i])));
          scale = std::max(scale, std::abs(double(theirs[i])));
        }
        return diff == 0 ? 0.0 : diff / scale;
      };
      double parameter_scale = 0;  // the largest of PyTorch's parameter gradients
      for (const auto& [p, g] : pytorch)
        for (const float v : g) parameter_scale = std::max(parameter_scale, double(std::abs(v)));
      double input_scale = 0;
      for (const float g : input_grad) input_scale = std::max(input_scale, double(std::abs(g)));
      REQUIRE(input_scale > 0);  // the output depends on the input: a test that can fail
      for (const Decomposition& d :
           test::test_decompositions(e.extents(), world.size(), {}, std::max<Index>(4, e.stride))) {
        INFO(name << " on " << d.describe());
        // ConvNeXt's layer scale: an initializer that only multiplies the field, trained where
        // listed (as ONNX Runtime's training takes it).
        const std::vector<std::string> trained =
            network.rfind("next2d", 0) == 0 ? std::vector<std::string>{"layer_scale"}
                                            : std::vector<std::string>{};
        const auto model =
            models::import_onnx<float>(e.path, world, model_shape(e), "model", trained);
        if (training)
          model->train();
        else
          model->eval();
        const auto field_of = [&](const std::vector<float>& values, Index channels) {
          ShardTensor<float> f(d, world.rank(), e.input_shape[0], channels);
          std::vector<Index> shape = e.input_shape;
          shape[1] = channels;
          test::fill(f, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
            return double(values[linear(shape, n, c, g)]);
          });
          return f;
        };
        const Variable<float> x =
            Variable<float>::field(field_of(e.input, e.input_shape[1]), true, "input");
        const Variable<float> y = model->forward(x);
        const Variable<float> t = Variable<float>::field(field_of(target, e.output_shape[1]));
        backward(mse_loss(world, y, resplit_like(world, t, y.value().decomposition())));
        const auto gathered = all_gather(world, x.grad());
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gathered);
        CHECK(relative_difference(std::vector<double>(host.data(), host.data() + host.span()),
                                  input_grad) <= 1e-4);
        std::size_t compared = 0, compared_trained = 0;
        for (const auto& [p, v] : model->named_parameters()) {
          const auto source = model->sources().find(p);
          if (!pytorch.count(p) || source == model->sources().end() || source->second != p)
            continue;
          INFO("parameter " << p);
          auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v.data_grad());
          CHECK(relative_difference(std::vector<double>(g.data(), g.data() + g.extent(0)),
                                    pytorch.at(p), 1e-4 * parameter_scale) <= 1e-4);
          ++compared;
          if (p == "layer_scale") ++compared_trained;
        }
        CHECK(compared >= 2);
        CHECK(compared_trained == trained.size());
      }
    }
  }
}

TEST_CASE("torchvision's networks run sharded as PyTorch computes them", "[onnx]") {
  // Classification (ResNet-18: global pooling and a linear head; MobileNetV3: squeeze-and-
  // excitation), video (R3D-18) and segmentation (FCN-ResNet50: dilated stages, a resize to
  // the input's size; LR-ASPP: a pooled branch gating the field; SqueezeNet and GoogLeNet:
  // ceil_mode max pooling; ShuffleNetV2: channel splits and shuffles), random weights, split along the last axis into parts that keep a
  // cell at the coarsest stage.
  const Communicator world;
  for (const std::string name :
       {"tv_resnet18", "tv_r3d_18", "tv_fcn_resnet50", "tv_mobilenet_v3_small",
        "tv_lraspp_mobilenet", "tv_convnext_tiny", "tv_squeezenet1_1", "tv_googlenet",
        "tv_shufflenet_v2_x0_5"}) {
    DYNAMIC_SECTION(name) {
      const Exported e = load(name);
      std::vector<int> grid(e.dims(), 1);
      grid.back() = world.size();
      if (e.extents().back() / world.size() < e.stride) continue;  // too small to split so
      const Decomposition d(e.extents(), grid);
      INFO(name << " on " << d.describe());
      const double error = error_against_pytorch(e, world, d);
      INFO("max |ShardTensor - PyTorch| / max |PyTorch| = " << error);
      CHECK(error <= 1e-4);
    }
  }
}

TEST_CASE("an imported graph trains sharded as on one rank", "[onnx]") {
  const Communicator world;
  for (const std::string name :
       {"unet2d", "resnet1d", "net3d", "affine2d", "acts1d", "ops2d", "next2d", "next2d_opset17",
        "pads2d"}) {
    DYNAMIC_SECTION(name) {
      const Exported e = load(name);
      const std::vector<std::string> trained =
          name.rfind("next2d", 0) == 0 ? std::vector<std::string>{"layer_scale"}
                                       : std::vector<std::string>{};
      const test::ModuleFactory<float> make = [&](const Communicator& comm) {
        return std::shared_ptr<Module<float>>(
            models::import_onnx<float>(e.path, comm, model_shape(e), "model", trained));
      };
      // Training mode: batch norm on the batch's statistics, global over the ranks.
      for (const Decomposition& d :
           test::test_decompositions(e.extents(), world.size(), {}, std::max<Index>(4, e.stride)))
        test::check_equivalence(make, d, e.input_shape[0], e.input_shape[1]);
    }
  }
}

TEST_CASE("a pooled head's gradients are one rank's", "[onnx]") {
  // Conv, global average pooling, flatten, linear to one score: backward from the score.
  const Communicator world, self(MPI_COMM_SELF);
  const Exported e = load("head2d");
  REQUIRE(e.output_shape == std::vector<Index>{1, 1});
  const auto run = [&](const Communicator& comm, const Decomposition& d) {
    test::Run<float> r;
    r.module = models::import_onnx<float>(e.path, comm, model_shape(e));
    r.input = Variable<float>::field(test::random_shard<float>(d, comm.rank(), 1, 2, 11), true,
                                     "input");
    r.output = r.module->forward(r.input);
    backward(r.output);
    r.loss = r.output.item();
    return r;
  };
  for (const Decomposition& d :
       test::test_decompositions(e.extents(), world.size(), {}, /*min_cells=*/3)) {
    INFO(d.describe());
    const test::Run<float> reference = run(self, test::unsharded(d)), sharded = run(world, d);
    CHECK(std::abs(sharded.loss - reference.loss) <= 1e-5 * std::abs(reference.loss));
    CHECK(test::relative_error(all_gather(world, sharded.input.grad()),
                               reference.input.grad().view()) <= 1e-5);
    const auto p = sharded.module->named_parameters(), q = reference.module->named_parameters();
    REQUIRE(p.size() == q.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      INFO("parameter " << p[i].first);
      CHECK(test::relative_error(p[i].second.data_grad(), q[i].second.data_grad()) <= 1e-5);
    }
  }
}

TEST_CASE("a solver's session runs an ONNX network on its own arrays", "[onnx]") {
  // The embedding API with model: {type: onnx}: each rank's patch of the exported input's
  // first sample, in the solver's C-order arrays (one per channel), against PyTorch.
  const Communicator world;
  const Exported e = load("unet2d");
  const Decomposition d = Decomposition::automatic(e.extents(), world.size());
  const Box box = d.box(world.rank());
  SolverPatch patch{e.extents(), {box.lower[0], box.lower[1]}, {box.extent[0], box.extent[1]}, {}};
  SessionOptions options;
  options.config_text = "model: {type: onnx, path: '" + e.path +
                        "'}\ntraining: {precision: float}\ndata: {normalize: false}\n";
  options.input_channels = e.input_shape[1];
  options.output_channels = e.output_shape[1];
  Session session(MPI_COMM_WORLD, patch, options);
  const Index cells = box.extent[0] * box.extent[1];
  std::vector<double> inputs(std::size_t(options.input_channels * cells)),
      outputs(std::size_t(options.output_channels * cells), 0.0);
  for (Index c = 0; c < options.input_channels; ++c)
    for (Index i = 0; i < box.extent[0]; ++i)
      for (Index j = 0; j < box.extent[1]; ++j)
        inputs[std::size_t((c * box.extent[0] + i) * box.extent[1] + j)] = e.input[linear(
            e.input_shape, 0, c, SpatialIndex{box.lower[0] + i, box.lower[1] + j, 0})];
  std::vector<const double*> in;
  std::vector<double*> out;
  for (Index c = 0; c < options.input_channels; ++c) in.push_back(inputs.data() + c * cells);
  for (Index c = 0; c < options.output_channels; ++c) out.push_back(outputs.data() + c * cells);
  session.infer(in, out);
  double diff = 0, scale = 0;
  for (Index c = 0; c < options.output_channels; ++c)
    for (Index i = 0; i < box.extent[0]; ++i)
      for (Index j = 0; j < box.extent[1]; ++j) {
        const double theirs = e.output[linear(e.output_shape, 0, c,
                                              SpatialIndex{box.lower[0] + i, box.lower[1] + j, 0})];
        diff = std::max(diff, std::abs(outputs[std::size_t((c * box.extent[0] + i) * box.extent[1] + j)] - theirs));
        scale = std::max(scale, std::abs(theirs));
      }
  MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &scale, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  INFO("max |session - PyTorch| / max |PyTorch| = " << diff / scale);
  CHECK(diff <= 1e-5 * scale);
}

TEST_CASE("a graph exported back holds its parameters and computes what it computed", "[onnx]") {
  // Changed parameters (as training changes them) written back into the file's initializers,
  // the MatMul weights transposed back to (in, out); the file read again is the same model.
  const Communicator world;
  test::TempDir dir(world);
  for (const std::string name : {"next2d", "next2d.train", "ops2d", "pads2d.train"}) {
    DYNAMIC_SECTION(name) {
      Exported e = load(name.substr(0, name.find('.')));
      e.path = models_directory() + "/" + name + ".onnx";  // .train: weights under Transposes
      // With the layer scale trained: a parameter of the graph itself, written back too.
      const std::vector<std::string> trained =
          name.rfind("next2d", 0) == 0 ? std::vector<std::string>{"*layer_scale"}
                                       : std::vector<std::string>{};
      const auto model =
          models::import_onnx<double>(e.path, world, model_shape(e), "model", trained);
      int k = 0;
      for (const auto& [p, v] : model->named_parameters()) {
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v.data());
        for (std::size_t i = 0; i < host.extent(0); ++i) host(i) *= 1.0 + 0.01 * double(++k % 7);
        Kokkos::deep_copy(v.data(), host);
      }
      const std::string path = dir.path(name + ".exported.onnx");
      models::export_onnx(e.path, *model, path, world);
      const auto again =
          models::import_onnx<double>(path, world, model_shape(e), "model", trained);
      const auto p = model->named_parameters(), q = again->named_parameters();
      REQUIRE(p.size() == q.size());
      for (std::size_t i = 0; i < p.size(); ++i) {
        INFO("parameter " << p[i].first);
        CHECK(p[i].first == q[i].first);
        CHECK(test::relative_error(q[i].second.data(), p[i].second.data()) <= 1e-7);  // float file
      }
      const Decomposition d = Decomposition::automatic(e.extents(), world.size());
      const auto x = Variable<double>::field(
          test::random_shard<double>(d, world.rank(), e.input_shape[0], e.input_shape[1], 5));
      const NoGradGuard no_grad;
      CHECK(test::relative_error(all_gather(world, again->forward(x).value()),
                                 all_gather(world, model->forward(x).value())) <= 1e-6);
    }
  }
}

TEST_CASE("the graph's parameters are the file's initializers, named as in PyTorch", "[onnx]") {
  const Communicator world;
  const Exported e = load("resnet1d");
  const auto model = models::import_onnx<double>(e.path, world, model_shape(e));
  std::vector<std::string> names;
  for (const auto& [name, p] : model->named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"inp.weight", "inp.bias", "bn.weight", "bn.bias",
                                          "c1.weight", "c1.bias", "gate.weight", "gate.bias",
                                          "out.weight", "out.bias"});
  std::vector<std::string> buffers;
  for (const auto& [name, b] : model->named_buffers()) buffers.push_back(name);
  CHECK(buffers == std::vector<std::string>{"bn.running_mean", "bn.running_var"});
}

TEST_CASE("a config's train_initializers makes those initializers parameters", "[onnx]") {
  const Communicator world;
  const Exported e = load("next2d");
  const auto names_of = [&](const std::string& extra) {
    const YAML::Node model = YAML::Load("{type: onnx, path: '" + e.path + "'" + extra + "}");
    std::set<std::string> names;
    for (const auto& [name, p] : models::build_model<float>(model, world, model_shape(e))
                                     ->named_parameters())
      names.insert(name);
    return names;
  };
  const std::set<std::string> plain = names_of(""),
                              trained = names_of(", train_initializers: ['layer_*']");
  CHECK(!plain.count("layer_scale"));
  CHECK(trained.count("layer_scale"));
  CHECK(trained.size() == plain.size() + 1);
}

TEST_CASE("ONNX files that cannot be imported fail on every rank", "[onnx]") {
  const Communicator world;
  test::TempDir dir(world);
  const Exported e = load("unet2d");
  const auto fails_everywhere = [&](const std::string& path, const models::ModelShape& shape,
                                    const std::string& text) {
    const std::string message =
        test::error_message_of([&] { models::import_onnx<float>(path, world, shape); });
    INFO(message);
    CHECK(test::ranks_with_error(message) == world.size());
    CHECK_THAT(message, Catch::Contains(text));
  };
  SECTION("a missing file") {
    fails_everywhere(dir.path("missing.onnx"), model_shape(e), "cannot open");
  }
  SECTION("a truncated file") {
    if (world.rank() == 0) {
      std::ifstream in(e.path, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ofstream(dir.path("cut.onnx"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    }
    world.barrier();
    fails_everywhere(dir.path("cut.onnx"), model_shape(e), "is not an ONNX model");
  }
  SECTION("input channels that differ from the data's") {
    models::ModelShape shape = model_shape(e);
    shape.in_channels = 3;
    fails_everywhere(e.path, shape, "takes 2 input channel(s); the data has 3");
  }
  SECTION("fields of other dims than the data's") {
    models::ModelShape shape = model_shape(e);
    shape.dims = 3;
    fails_everywhere(e.path, shape, "of rank 4; the data's fields have 3 spatial axes");
  }
  SECTION("train_initializers naming no per-channel initializer") {
    const Exported next = load("next2d");
    const std::string message = test::error_message_of([&] {
      models::import_onnx<float>(next.path, world, model_shape(next), "model",
                                 {"layer_scale", "stem.weight_scale"});
    });
    INFO(message);
    CHECK(test::ranks_with_error(message) == world.size());
    CHECK_THAT(message, Catch::Contains("train_initializers: 'stem.weight_scale' matches no "
                                        "initializer that multiplies or offsets a field"));
  }
}
