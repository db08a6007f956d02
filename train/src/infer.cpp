// Inference: a trained model (checkpoint) over every sample of a file, predictions written to
// a new HDF5 file (and its XDMF sidecar), with the relative L2 error where targets exist.

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>

#include "run_data.hpp"
#include "run_setup.hpp"
#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/io/array_io.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/field_io.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/io/output_paths.hpp"
#include "shardtensor/io/xdmf.hpp"
#include "shardtensor/models/onnx_import.hpp"
#include "shardtensor/train/batch_reader.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/trainer.hpp"

namespace shardtensor {

namespace {

namespace fs = std::filesystem;
using impl::inspect;
using impl::require_trained_on;
using impl::set_up;
using impl::Setup;
using impl::squared_errors;
using impl::sum_over;

template <class T>
InferResult infer_as(const Communicator& world, const RunConfig& config,
                     const InferOptions& options) {
  const auto start_time = std::chrono::steady_clock::now();
  // Checked after every forward pass, on every rank together.
  const ScopedMemoryBudget budget(config.memory.budget_mib);
  const std::string input =
      options.input_dataset.empty() ? config.data.input : options.input_dataset;
  const std::string target =
      options.target_dataset.empty() ? config.data.target : options.target_dataset;
  io::File file = io::File::open(world, options.input_path);
  // A target asked for by name must be there: without it no error would be reported, and a
  // typo would pass for a file without targets.
  if (!options.target_dataset.empty())
    io::dataset_info(file, target);  // throws, naming those there
  // A checkpoint brings its statistics and parameters; an ONNX file its own weights and none.
  const bool from_onnx = options.checkpoint.empty();
  TrainingState stored;
  bool vectors = false;  // the model ends in a pooled vector (a classifier): [samples, features]
  if (from_onnx) {
    const impl::FieldData data = inspect(file, input, "", false);
    const models::OnnxSignature onnx = models::onnx_signature(options.onnx_model, world);
    vectors = onnx.output_rank == 2;
    SHARDTENSOR_REQUIRE(onnx.output_channels > 0 && (vectors || onnx.output_rank == data.dims + 2),
                        "infer",
                        options.onnx_model
                            << ": its output is of rank " << onnx.output_rank << " with "
                            << (onnx.output_channels > 0 ? std::to_string(onnx.output_channels)
                                                         : std::string("symbolic"))
                            << " channels; a field of the data's " << data.dims
                            << " spatial axes, or a vector (rank 2), with fixed channels is "
                               "expected");
    stored.input_statistics = ChannelStatistics::identity(data.input_channels);
    stored.target_statistics = ChannelStatistics::identity(onnx.output_channels);
  } else {
    stored = read_checkpoint_state(world, options.checkpoint);
    require_trained_on(stored, options.checkpoint, inspect(file, input, "", false),
                       options.input_path + " dataset '" + input + "'", false, "infer");
  }
  // A vector model's predictions are not fields: no target is read or compared.
  Setup<T> s = set_up<T>(world, config, file, input, vectors ? std::string() : target, false,
                         stored.target_statistics.channels());
  const TrainingState state =
      from_onnx ? stored : load_checkpoint<T>(world, options.checkpoint, *s.model, nullptr);
  const Index out_channels = state.target_statistics.channels();
  s.model->eval();
  const NoGradGuard no_grad;  // inference: keep no graph

  io::AtomicOutput output(world, options.output_path);
  io::File out = io::File::create(world, output.temporary_path());
  if (!vectors)
    io::create_field_dataset(
        out, options.output_dataset, s.data.samples, out_channels, s.data.extents,
        std::is_same<T, float>::value ? io::DataType::float32 : io::DataType::float64);
  // Pooled vectors: every sample's row, from the group that computed it, summed over groups.
  Kokkos::View<double**, Kokkos::HostSpace> rows("infer.vectors", vectors ? s.data.samples : 0,
                                                 out_channels);
  std::vector<std::string> names{input};
  std::vector<Index> channels{s.data.input_channels};
  if (s.data.has_target) names.push_back(target), channels.push_back(s.data.target_channels);
  BatchReader<T> reader(file, names, channels, s.domain, s.mesh.domain.rank(), false);
  reader.allow_non_finite(target);  // a non-finite target gives a NaN error, printed as such

  const int groups = s.mesh.data.size();
  const Index rounds = (s.data.samples + groups - 1) / groups;
  double relative_sum = 0, relative_max = 0;
  Index nan_samples = 0;
  for (Index r = 0; r < rounds; ++r) {
    const Index index = r * groups + s.mesh.data_group;
    const bool counted = index < s.data.samples;
    const Index sample = counted ? index : 0;
    reader.start({sample});
    std::vector<ShardTensor<T>> batch = reader.finish();
    normalize(batch[0], state.input_statistics);
    MemoryCategoryScope graph_memory(MemoryCategory::activations);
    const Variable<T> prediction = s.model->forward(Variable<T>::field(batch[0]));
    check_memory_budget(s.mesh.domain, s.mesh.data);
    if (vectors) {
      SHARDTENSOR_REQUIRE(!prediction.is_field() && prediction.data().extent(0) ==
                                                        std::size_t(out_channels),
                          "infer", options.onnx_model << ": the graph's output is not the "
                                                      << out_channels << " values its signature says");
      const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), prediction.data());
      if (counted && s.mesh.domain.rank() == 0)
        for (Index f = 0; f < out_channels; ++f) rows(sample, f) = double(host(f));
      continue;
    }
    denormalize(prediction.value(), state.target_statistics);
    // Groups past the end rewrite sample 0 with the same values: every rank joins the write.
    io::write_field(out, options.output_dataset, sample, prediction.value());
    if (s.data.has_target) {
      const auto sums = squared_errors(s.mesh.domain, prediction.value(), batch[1])[0];
      const double relative = std::sqrt(sum_over(s.mesh.domain, sums.first) /
                                        std::max(sum_over(s.mesh.domain, sums.second), 1e-300));
      if (counted) {
        relative_sum += relative;
        if (std::isnan(relative)) ++nan_samples;
        relative_max = std::max(relative_max, relative);  // NaN counted above
      }
    }
  }
  if (vectors) {
    allreduce(world, rows);  // each row from one rank: the sum is the row
    std::vector<T> values(rows.size());
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = T(rows.data()[i]);
    io::write_array(out, options.output_dataset, {s.data.samples, out_channels}, values.data());
  }
  out.close();
  output.commit();
  if (s.data.dims >= 2 && !vectors) {  // XDMF describes 2-D and 3-D grids; 1-D fields get no sidecar
    const std::string xdmf = fs::path(options.output_path).replace_extension(".xdmf").string();
    io::write_xdmf(world, options.output_path, xdmf, {options.output_dataset});
  }

  InferResult result;
  result.samples = s.data.samples;
  if (s.data.has_target && !vectors) {
    Kokkos::View<double*, Kokkos::HostSpace> v("max", 1);
    v(0) = relative_max;
    allreduce(s.mesh.data, v, ReduceOp::max);
    result.has_target = true;
    result.relative_l2 = sum_over(s.mesh.data, relative_sum) / double(s.data.samples);
    // MPI's max of a NaN is undefined: the NaN samples are counted instead.
    const bool any_nan = sum_over(s.mesh.data, double(nan_samples)) > 0;
    result.max_relative_l2 = any_nan ? std::numeric_limits<double>::quiet_NaN() : v(0);
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  result.memory = memory_report(world);  // before the model goes
  return result;
}

}  // namespace

InferResult infer(const Communicator& world, const RunConfig& config, const InferOptions& options) {
  SHARDTENSOR_REQUIRE(options.checkpoint.empty() != options.onnx_model.empty(), "infer",
                      "give a checkpoint or an ONNX model (--model), one of them");
  // Before anything is opened for writing: the outputs replace none of the files read.
  const std::string sidecar = fs::path(options.output_path).replace_extension(".xdmf").string();
  io::require_outputs_apart(
      world, "infer", {{"--output", options.output_path}, {"XDMF sidecar of --output", sidecar}},
      {{"--input", options.input_path},
       {"--checkpoint", options.checkpoint},
       {"--model", options.onnx_model},
       {"--config", options.config_path}});
  return config.training.precision == "double" ? infer_as<double>(world, config, options)
                                               : infer_as<float>(world, config, options);
}

}  // namespace shardtensor
