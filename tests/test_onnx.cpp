// ONNX import: networks written in PyTorch (tools/onnx_test_models.py exports them when the
// suite runs, into $SHARDTENSOR_ONNX_MODELS) run sharded, on balanced and uneven splits, equal
// to PyTorch's output (float, 1e-5 of the largest) and, in training mode, to the same graph on
// one rank (outputs, input and parameter gradients). Files that cannot be imported fail on
// every rank with the node and the reason.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "equivalence.hpp"
#include "shardtensor/comm.hpp"
#include "shardtensor/models/onnx_import.hpp"
#include "test_support.hpp"

using namespace shardtensor;

namespace {

/// A network exported by tools/onnx_test_models.py: its file, input and PyTorch's output.
struct Exported {
  std::string path;
  std::vector<Index> input_shape, output_shape;
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

}  // namespace

TEST_CASE("ONNX networks from PyTorch run sharded as PyTorch computes them", "[onnx]") {
  REQUIRE(models::onnx_available());
  const Communicator world;
  for (const std::string name : {"unet2d", "resnet1d", "net3d"}) {
    DYNAMIC_SECTION(name) {
      const Exported e = load(name);
      for (const Decomposition& d :
           test::test_decompositions(e.extents(), world.size(), {}, /*min_cells=*/4)) {
        INFO(name << " on " << d.describe());
        const auto model = models::import_onnx<float>(e.path, world, model_shape(e));
        model->eval();  // as exported: batch norm with its running statistics
        ShardTensor<float> x(d, world.rank(), e.input_shape[0], e.input_shape[1]);
        test::fill(x, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
          return double(e.input[linear(e.input_shape, n, c, g)]);
        });
        const NoGradGuard no_grad;
        const Variable<float> y = model->forward(Variable<float>::field(x));
        const auto whole = all_gather(world, y.value());
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole);
        REQUIRE(host.span() == e.output.size());
        double diff = 0, scale = 0;
        for (std::size_t i = 0; i < e.output.size(); ++i) {
          diff = std::max(diff, std::abs(double(host.data()[i]) - double(e.output[i])));
          scale = std::max(scale, std::abs(double(e.output[i])));
        }
        INFO("max |ShardTensor - PyTorch| = " << diff << ", max |PyTorch| = " << scale);
        CHECK(diff <= 1e-5 * scale);
        CHECK(y.value().decomposition() == d);  // back on the input's split
      }
    }
  }
}

TEST_CASE("an imported graph trains sharded as on one rank", "[onnx]") {
  const Communicator world;
  for (const std::string name : {"unet2d", "resnet1d", "net3d"}) {
    DYNAMIC_SECTION(name) {
      const Exported e = load(name);
      const test::ModuleFactory<float> make = [&](const Communicator& comm) {
        return std::shared_ptr<Module<float>>(
            models::import_onnx<float>(e.path, comm, model_shape(e)));
      };
      // Training mode: batch norm on the batch's statistics, global over the ranks.
      for (const Decomposition& d :
           test::test_decompositions(e.extents(), world.size(), {}, /*min_cells=*/4))
        test::check_equivalence(make, d, e.input_shape[0], e.input_shape[1]);
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
}
