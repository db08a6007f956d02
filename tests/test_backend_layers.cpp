// Every layer gives the same numbers on every run and on every backend. Each case is a small
// model of the builder's layer types (convolutions of every padding mode, stride, dilation and
// groups, transposed convolutions, pooling, upsampling, norms, activations, dropout, residual
// blocks, U-Net, FNO, ViT with ring and neighbourhood attention), in float and double, run on
// one rank: forward, backward of a weighted sum, one AdamW step. Recorded: the loss, the
// output, the input gradient, every parameter gradient and every parameter after the step.
// A third column runs the float models in bf16 (Module::compute_in_bf16).
//
//  - Every case runs twice in the process: the two runs must agree bit for bit (no sum whose
//    order depends on threads or scheduling).
//  - With SHARDTENSOR_BACKEND_RESULTS set, the results go to that HDF5 file.
//  - With SHARDTENSOR_BACKEND_REFERENCE set (the file another build wrote: CI compares the
//    OpenMP build with the Serial build's; a GPU run compares the CUDA build with it), every
//    array must match the reference within 1e-5 (float) or 1e-12 (double) of its largest
//    value, bf16 within bf16_backends. A missing file, case or array fails.
//  - bf16 against float: every array within bf16_of_float (per case) of its largest float
//    value, and not equal.

#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "equivalence.hpp"
#include "shardtensor/io/array_io.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/models.hpp"
#include "shardtensor/optim/optimizer.hpp"

using namespace shardtensor;

namespace {

struct Case {
  std::string name;
  std::vector<Index> extents;
  Index in_channels, out_channels;
  bool periodic;
  std::string model;  // the `model:` map, YAML
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all{
      {"conv_2d", {12, 10}, 3, 2, true, R"(
type: sequential
seed: 5
layers:
  - {type: conv, out_channels: 8, kernel: 3, padding: same}
  - {type: conv, out_channels: 8, kernel: 3, padding: same, padding_mode: periodic, groups: 2}
  - {type: conv, out_channels: 8, kernel: 3, dilation: 2, padding: 2, padding_mode: replicate}
  - {type: conv, out_channels: 6, kernel: [3, 1], padding: [1, 0], padding_mode: reflect}
  - {type: conv, kernel: 3, stride: 2, padding: 1, bias: false})"},
      {"conv_3d", {6, 5, 4}, 2, 3, false, R"(
type: sequential
seed: 6
layers:
  - {type: conv, out_channels: 5, kernel: 3, padding: same}
  - {type: conv, out_channels: 4, kernel: [1, 3, 3], padding: [0, 1, 1], padding_mode: reflect}
  - {type: conv, kernel: 2, stride: 2})"},
      {"conv_transpose", {8, 6}, 3, 2, false, R"(
type: sequential
seed: 7
layers:
  - {type: conv_transpose, out_channels: 4, kernel: 3, stride: 2, padding: 1, output_padding: 1}
  - {type: conv_transpose, kernel: 2, stride: 2, groups: 2})"},
      {"conv_transpose_3d", {4, 4, 3}, 2, 2, false, R"(
type: sequential
seed: 8
layers:
  - {type: conv_transpose, out_channels: 4, kernel: 3, stride: 2, dilation: 1, padding: 1}
  - {type: conv_transpose, kernel: 1})"},
      {"pool_upsample", {12, 10}, 3, 2, true, R"(
type: sequential
seed: 9
layers:
  - {type: pool, kind: max, kernel: 2}
  - {type: upsample, scale: 2, mode: linear}
  - {type: pool, kind: average, kernel: 3, stride: 1, padding: 1, padding_mode: periodic}
  - {type: pool, kind: max, kernel: 3, stride: 1, padding: 1}
  - {type: upsample, scale: [2, 1], mode: nearest}
  - {type: conv, kernel: 1})"},
      {"pool_upsample_3d", {8, 6, 4}, 2, 2, false, R"(
type: sequential
seed: 10
layers:
  - {type: pool, kind: average, kernel: 2}
  - {type: upsample, scale: 2, mode: linear}
  - {type: pool, kind: max, kernel: 2}
  - {type: upsample, scale: 2, mode: nearest}
  - {type: conv, kernel: 1})"},
      {"norms", {12, 10}, 3, 2, false, R"(
type: sequential
seed: 11
layers:
  - {type: conv, out_channels: 6, kernel: 3, padding: same}
  - {type: group_norm, groups: 3}
  - {type: layer_norm}
  - {type: batch_norm}
  - {type: conv, kernel: 1})"},
      {"activations", {12, 10}, 3, 2, false, R"(
type: sequential
seed: 12
layers:
  - {type: conv, out_channels: 6, kernel: 3, padding: same}
  - {type: activation, function: relu}
  - {type: conv, out_channels: 6, kernel: 1}
  - {type: activation, function: leaky_relu, slope: 0.2}
  - {type: activation, function: gelu}
  - {type: activation, function: silu}
  - {type: activation, function: tanh}
  - {type: activation, function: sigmoid}
  - {type: conv, kernel: 1})"},
      {"residual_dropout", {12, 10}, 3, 2, false, R"(
type: sequential
seed: 13
layers:
  - type: residual
    layers:
      - {type: conv, out_channels: 8, kernel: 3, padding: same}
      - {type: batch_norm}
      - {type: activation, function: silu}
  - {type: dropout, p: 0.25}
  - {type: conv, kernel: 1})"},
      {"unet", {16, 16}, 2, 1, false, R"(
type: unet
depth: 2
base_channels: 4
norm: group
norm_groups: 2
activation: gelu
down: maxpool
up: transpose
seed: 14)"},
      {"unet_3d", {8, 8, 8}, 1, 2, true, R"(
type: unet
depth: 1
base_channels: 4
norm: batch
activation: relu
down: conv
up: linear
padding: periodic
input_skip: true
seed: 15)"},
      {"fno", {12, 10}, 2, 1, true, R"(
type: fno
width: 4
modes: 3
layers: 2
projection_channels: 8
seed: 16)"},
      {"vit_global", {12, 10}, 2, 1, false, R"(
type: vit
patch: 2
embed_dim: 8
depth: 1
heads: 2
attention: global
input_skip: true
seed: 17)"},
      {"vit_neighborhood", {12, 10}, 2, 1, false, R"(
type: vit
patch: 2
overlap: 1
padding: periodic
embed_dim: 8
depth: 1
heads: 2
attention: neighborhood
window: 3
position: learned
seed: 18)"},
  };
  return all;
}

/// Named arrays of one run of a case, in double.
using Arrays = std::map<std::string, std::vector<double>>;

template <class View>
std::vector<double> to_doubles(const View& v) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(host.data(), host.data() + host.span());
}

/// bf16 runs on two backends: an output that lands on the other side of a rounding boundary
/// moves by one bf16 step (2^-7 of its binade), and the layers after it by a few.
constexpr double bf16_backends = 4.0 / 128;
/// bf16 against float, per case (operands rounded to 8 significant bits, sums in float).
/// Measured largest: 4.3e-2 (activations' input gradient), 1.4e-2 (FNO), under 1.2e-2 for
/// the convolutions, pooling, norms and ViTs; the U-Nets 0.19 (2-D input gradient) and 0.15
/// (3-D first conv's weight gradient): at their few cells per group, a normalization's
/// backward subtracts nearly equal terms, and bf16 operands before it show through.
double bf16_of_float(const std::string& case_name) {
  return case_name.rfind("unet", 0) == 0 ? 0.25 : 5e-2;
}

template <class T>
Arrays run_case(const Case& c, bool bf16 = false) {
  const Communicator comm;
  std::vector<std::vector<Index>> points;
  for (Index e : c.extents) points.push_back({0, e});
  const Decomposition d =
      Decomposition::from_split_points(points, std::vector<bool>(c.extents.size(), c.periodic));
  const models::ModelShape shape{static_cast<int>(c.extents.size()), c.in_channels, c.out_channels,
                                 c.extents};
  const auto make = [&](const Communicator& on) {
    auto model = models::build_model<T>(YAML::Load(c.model), on, shape);
    model->compute_in_bf16(bf16);
    return model;
  };
  const test::Run<T> run =
      test::run_module<T>(make, comm, d, /*batch=*/2, c.in_channels, test::weighted_sum<T>);
  Arrays arrays{{"loss", {run.loss}},
                {"output", to_doubles(run.output.value().view())},
                {"input_grad", to_doubles(run.input.grad().view())}};
  const auto parameters = run.module->named_parameters();
  for (const auto& [name, p] : parameters) arrays["grad/" + name] = to_doubles(p.data_grad());
  OptimizerOptions adamw;
  adamw.type = "adamw";
  adamw.lr = 1e-2;
  adamw.weight_decay = 0.1;
  // Adam's first step is lr * g / (|g| + eps): its slope in g, up to lr / (4 eps), scales a
  // backend's rounding of g into the step. With the default eps (1e-8) a mathematically zero
  // gradient (the bias of a convolution that a normalization follows: rounding noise on every
  // backend) moved the step by 1e-7 of the parameters in double; with 1e-3, float steps still
  // differed by 4.5e-5 on an H100. With 0.1 the slope is at most 0.025: the step compares like
  // the gradients, and is still Adam's normalised update wherever |g| is not small.
  adamw.eps = 0.1;
  make_optimizer<T>(adamw, parameters)->step();
  for (const auto& [name, p] : parameters) arrays["step/" + name] = to_doubles(p.data());
  return arrays;
}

template <class T>
const char* type_name() {
  return std::is_same<T, float>::value ? "float" : "double";
}

/// max |a - b| / max |b| (b the reference); infinite when the sizes differ.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

/// The results of every case in T (float models in bf16 if `bf16`), each computed twice and
/// required to agree bit for bit.
template <class T>
std::map<std::string, Arrays> run_all_twice(bool bf16 = false) {
  std::map<std::string, Arrays> results;
  const std::string type = bf16 ? "bf16" : type_name<T>();
  for (const Case& c : cases()) {
    INFO("case " << c.name << " in " << type);
    const Arrays first = run_case<T>(c, bf16), second = run_case<T>(c, bf16);
    for (const auto& [name, values] : first) {
      INFO("array " << name);
      CHECK(values == second.at(name));
    }
    results[c.name + "/" + type] = first;
  }
  return results;
}

const char* environment(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

/// The largest |value| of an array.
double largest(const std::vector<double>& values) {
  double m = 0;
  for (double v : values) m = std::max(m, std::abs(v));
  return m;
}

/// The error of each array of `arrays` against `reference` (same names): max |a - b| over
/// the reference's largest value, or, for a parameter gradient (a stepped parameter), at least
/// the largest among the case's gradients (parameters): a gradient that is mathematically zero
/// (a bias before a normalization) is rounding noise on every backend and in every precision,
/// and noise against noise is no test.
std::map<std::string, double> scaled_errors(const Arrays& arrays, const Arrays& reference) {
  std::map<std::string, double> kind_scale;  // "grad/", "step/": the case's largest
  for (const auto& [name, values] : reference) {
    const std::string kind = name.substr(0, name.find('/') + 1);
    kind_scale[kind] = std::max(kind_scale[kind], largest(values));
  }
  std::map<std::string, double> errors;
  for (const auto& [name, values] : arrays) {
    const std::vector<double>& b = reference.at(name);
    const std::string kind = name.substr(0, name.find('/') + 1);
    const double floor = kind.empty() ? 0 : kind_scale[kind];
    const double scale = std::max(largest(b), floor);
    errors[name] =  // max |a - b| / scale
        relative_error(values, b) * (largest(b) > 0 ? largest(b) : 1) / (scale > 0 ? scale : 1);
  }
  return errors;
}

/// Compares `results` with the reference file's arrays (scaled_errors within `tolerance`);
/// returns how many arrays it compared.
std::size_t compare_with_reference(const io::File& file,
                                   const std::map<std::string, Arrays>& results,
                                   double tolerance) {
  std::size_t compared = 0;
  for (const auto& [key, arrays] : results) {
    Arrays reference;
    for (const auto& [name, values] : arrays) {
      const std::string dataset = key + "/" + name;
      INFO("reference dataset " << dataset);
      REQUIRE(io::has_dataset(file, dataset));
      reference[name] = io::read_array<double>(file, dataset);
    }
    for (const auto& [name, error] : scaled_errors(arrays, reference)) {
      INFO("reference dataset " << key << "/" << name);
      CHECK(error <= tolerance);
      ++compared;
    }
  }
  return compared;
}

}  // namespace

TEST_CASE("every layer: the same numbers on every run and on every backend", "[backend]") {
  REQUIRE(test::world_size() == 1);
  std::map<std::string, Arrays> results_float = run_all_twice<float>();
  std::map<std::string, Arrays> results_double = run_all_twice<double>();
  std::map<std::string, Arrays> results_bf16 = run_all_twice<float>(/*bf16=*/true);
  REQUIRE(results_float.size() == cases().size());

  // bf16 against float, case by case: near, and not the same.
  for (const Case& c : cases()) {
    const Arrays& low = results_bf16.at(c.name + "/bf16");
    const Arrays& full = results_float.at(c.name + "/float");
    double worst = 0;
    for (const auto& [name, error] : scaled_errors(low, full)) {
      INFO("case " << c.name << ", array " << name << " in bf16 against float");
      CHECK(error <= bf16_of_float(c.name));
      worst = std::max(worst, error);
    }
    INFO("case " << c.name);
    CHECK(worst > 0);
  }

  const Communicator comm;
  if (const char* path = environment("SHARDTENSOR_BACKEND_RESULTS")) {
    std::filesystem::remove(path);
    io::File file = io::File::create(comm, path);
    for (const auto* results : {&results_float, &results_double, &results_bf16})
      for (const auto& [key, arrays] : *results)
        for (const auto& [name, values] : arrays) io::write_array(file, key + "/" + name, values);
    file.close();
  }

  if (const char* path = environment("SHARDTENSOR_BACKEND_REFERENCE")) {
    INFO("reference " << path);
    REQUIRE(std::filesystem::exists(path));
    const io::File file = io::File::open(comm, path);
    const std::size_t compared = compare_with_reference(file, results_float, 1e-5) +
                                 compare_with_reference(file, results_double, 1e-12) +
                                 compare_with_reference(file, results_bf16, bf16_backends);
    WARN("compared " << compared << " arrays with " << path);
  }

  // The comparison can fail: a value moved by 1e-4 of the array's largest is caught in float.
  std::vector<double> moved = results_float.begin()->second.at("output");
  double largest = 0;
  for (double v : moved) largest = std::max(largest, std::abs(v));
  moved[moved.size() / 2] += 1e-4 * largest;
  CHECK(relative_error(moved, results_float.begin()->second.at("output")) > 1e-5);
}
