// `shardtensor`: the command-line tool. Run it with mpirun; every subcommand is collective.
//
//   shardtensor generate heat --dims 3 --size 32 --samples 16 --output data.h5
//   shardtensor train --config run.yaml [--set key=value ...] [--resume latest]
//   shardtensor infer --config run.yaml --checkpoint ck.h5 --input in.h5 --output out.h5
//   shardtensor info

#include <hdf5.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/environment.hpp"
#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/closest_name.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/data/heat_equation.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/output_paths.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/models/onnx_import.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/run_config.hpp"
#include "shardtensor/train/trainer.hpp"

using namespace shardtensor;

namespace {

/// Reports an error and ends the job. Rank 0 aborts at once; other ranks wait a moment
/// first, so an error every rank raised is printed once, while an error only some ranks
/// raised is still printed, with its rank.
[[noreturn]] void fail(const std::string& message, int rank, int size) {
  if (rank != 0) sleep(2);
  std::fprintf(stderr, "shardtensor: error%s: %s\n",
               rank == 0 ? "" : (" on rank " + std::to_string(rank)).c_str(), message.c_str());
  std::fflush(stderr);
  if (size > 1) mpi_abort(1);
  if (Kokkos::is_initialized()) Kokkos::finalize();
  mpi_finalize();
  std::exit(1);
}

void print_info(const Communicator& world) {
  if (world.rank() != 0) return;
  const std::string mpi = mpi_library_version();
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
#ifdef H5_HAVE_PARALLEL
  const bool parallel_hdf5 = true;
#else
  const bool parallel_hdf5 = false;
#endif
  std::printf("shardtensor %s\n", SHARDTENSOR_VERSION);
  std::printf("  Kokkos    %d.%d.%d, default execution space %s\n", KOKKOS_VERSION / 10000,
              KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100,
              Kokkos::DefaultExecutionSpace::name());
  std::printf("  MPI       %s, %d rank(s)\n", mpi.c_str(), world.size());
  std::printf("  comm      parallel.backend: mpi%s; device_aware_mpi: %s\n",
              nccl_available() ? " or nccl" : " (this build has no NCCL)",
              !host_reads_default_memory
                  ? (mpi_reads_device_memory() ? "possible" : "not possible with this MPI")
                  : "no effect (host memory)");
  std::printf("  conv      %s\n", kernels::conv_library_available()
                                      ? "cuDNN (training.tf32 lets float use TF32)"
                                      : "portable Kokkos kernels (no convolution library)");
  std::printf("  HDF5      %u.%u.%u, parallel: %s\n", major, minor, release,
              parallel_hdf5 ? "yes" : "no");
  const int blas_threads = host_blas_threads();
  const std::string threads = blas_threads > 0
                                  ? std::to_string(blas_threads) + " thread(s) per call"
                                  : "threads per call unknown";
  std::printf("  BLAS      %s; %s\n", host_blas_description().c_str(), threads.c_str());
  const bool thread_multiple = mpi_thread_multiple();
  std::printf("  threads   MPI_THREAD_MULTIPLE %s (background data prefetch %s)\n",
              thread_multiple ? "yes" : "no", thread_multiple ? "on" : "off");
}

/// A checkpoint file as given, or the newest checkpoint in a run directory or its
/// checkpoints/ folder.
std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return path;
  for (const fs::path dir : {fs::path(path) / "checkpoints", fs::path(path)}) {
    const auto found = list_checkpoints(dir.string());
    if (!found.empty()) return found.back();
  }
  SHARDTENSOR_FAIL("infer --checkpoint", "no checkpoint files in directory '" << path << "'");
}

/// `generate heat`: a new training dataset (never over a file the user has, nor its sidecar).
struct GenerateCommand {
  CLI::App* command = nullptr;
  HeatOptions heat;
  std::string output = "heat.h5";
  bool overwrite = false;

  void add_to(CLI::App& app) {
    auto* generate = app.add_subcommand("generate", "Generate a training dataset");
    generate->require_subcommand(1);
    command = generate->add_subcommand(
        "heat", "Variable-diffusivity heat equation: /input (u0, kappa) -> /target (u at time T)");
    command->add_option("--dims", heat.dims, "Spatial dimensions, 2 or 3")->capture_default_str();
    command->add_option("--size", heat.size, "Cells per dimension")->capture_default_str();
    command->add_option("--samples", heat.samples, "Number of samples")->capture_default_str();
    command->add_option("--steps", heat.steps, "Explicit time steps")->capture_default_str();
    command->add_option("--modes", heat.modes, "Fourier modes per random field")
        ->capture_default_str();
    command->add_option("--contrast", heat.contrast, "Diffusivity varies by +- contrast")
        ->capture_default_str();
    command->add_option("--seed", heat.seed, "Random seed")->capture_default_str();
    command->add_option("-o,--output", output, "Output HDF5 file")->capture_default_str();
    command->add_flag("--overwrite", overwrite, "Replace the output file if it exists");
  }

  void run(const Communicator& world) const {
    const std::string sidecar = std::filesystem::path(output).replace_extension(".xdmf").string();
    for (const std::string& path : {output, sidecar})
      SHARDTENSOR_REQUIRE(overwrite || !std::filesystem::exists(path), "generate",
                          "'" << path << "' exists"
                              << (path == sidecar ? " (the XDMF sidecar of --output)" : "")
                              << ": pass --overwrite to replace it, or choose another "
                                 "--output (nothing was written)");
    io::require_outputs_apart(world, "generate",
                              {{"--output", output}, {"XDMF sidecar of --output", sidecar}}, {});
    generate_heat_dataset(world, heat, output, true);
  }
};

/// `train`: a run from a YAML config, with its summary on rank 0.
struct TrainCommand {
  CLI::App* command = nullptr;
  std::string config_path;
  std::vector<std::string> overrides;
  TrainOptions options;
  bool quiet = false;

  void add_to(CLI::App& app) {
    command = app.add_subcommand("train", "Train a model from a YAML config");
    command->add_option("-c,--config", config_path, "Run config (YAML)")->required();
    command->add_option("--set", overrides, "Override a config key: --set training.epochs=5");
    command->add_option("--resume", options.resume,
                        "Continue from a checkpoint file, or 'latest' in the run dir");
    command->add_flag("--overwrite", options.overwrite,
                      "Start a new run in a run dir that holds one (the old run is moved "
                      "to <run_dir>.old)");
    command->add_flag("-q,--quiet", quiet, "No progress output");
  }

  void run(const Communicator& world) {
    const RunConfig config = RunConfig::load(config_path, overrides);
    // One path, but a node-local file system could hold another file there.
    world.require_same_text(config.text, "train", "the resolved config");
    options.progress = !quiet;
    enable_memory_tracking();  // Kokkos allocation hooks: the report below, memory.budget_mib
    const TrainResult r = train(world, config, options);
    if (world.rank() != 0) return;
    if (r.checkpoint.empty()) {  // a resumed run that had finished already
      std::printf(
          "train: nothing left to train: the run is at step %lld, its %lld epoch(s) "
          "done (training.epochs %lld); raise training.epochs (--set) to go on\n",
          (long long)r.steps, (long long)r.epochs, (long long)config.training.epochs);
      return;
    }
    std::printf("train: %lld steps, %lld epochs in %.1f s; loss %.4e", (long long)r.steps,
                (long long)r.epochs, r.seconds, r.loss);
    if (r.val_relative_l2 >= 0)
      std::printf(", validation relative L2 error %.4f (%.2f%%)", r.val_relative_l2,
                  100 * r.val_relative_l2);
    std::printf("\ntrain: checkpoint %s\n", r.checkpoint.c_str());
    if (r.memory.enabled) std::printf("%s", r.memory.describe().c_str());
  }
};

/// `overrides` with the model set to the ONNX file at `path` (after the user's, so it wins).
std::vector<std::string> with_onnx_model(std::vector<std::string> overrides,
                                         const std::string& path) {
  std::string quoted = "'";  // a YAML single-quoted string: any path, ' doubled
  for (const char c : path) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  overrides.push_back("model.type=onnx");
  overrides.push_back("model.path=" + quoted + "'");
  return overrides;
}

/// `infer`: a trained model over an HDF5 file, with the error against targets on rank 0.
struct InferCommand {
  CLI::App* command = nullptr;
  std::string config_path;
  std::vector<std::string> overrides;
  InferOptions options;

  void add_to(CLI::App& app) {
    command = app.add_subcommand("infer", "Run a trained model on an HDF5 file");
    command->add_option("-c,--config", config_path,
                        "Run config (YAML); default: the config stored in the checkpoint");
    command->add_option("--set", overrides, "Override a config key");
    auto* checkpoint = command->add_option(
        "--checkpoint", options.checkpoint,
        "Checkpoint file, or a run directory (its newest checkpoint)");
    auto* model = command->add_option(
        "--model", options.onnx_model,
        "An ONNX file (e.g. from torch.onnx.export) run as it is, instead of a checkpoint");
    checkpoint->excludes(model);
    model->excludes(checkpoint);
    command->callback([checkpoint, model] {
      if (checkpoint->count() + model->count() == 0)
        throw CLI::RequiredError("--checkpoint or --model");
    });
    command->add_option("-i,--input", options.input_path, "Input HDF5 file")->required();
    command->add_option("-o,--output", options.output_path, "Output HDF5 file")->required();
    command->add_option("--dataset", options.input_dataset,
                        "Input dataset (default: the config's data.input)");
    command->add_option("--target", options.target_dataset,
                        "Target dataset for error reporting (default: data.target, if present)");
    command
        ->add_option("--output-dataset", options.output_dataset, "Name of the predictions' dataset")
        ->capture_default_str();
  }

  void run(const Communicator& world) {
    // Inference reads its input from --input, not data.path: configs of models trained
    // online by an embedding solver have none.
    const auto arrays = RunConfig::DataUse::arrays;
    RunConfig config;
    if (!options.onnx_model.empty()) {
      // The ONNX file is the model (its graph and weights, no normalisation); a --config
      // gives the rest (data names, parallel, memory), its model section is not used.
      std::string text = "data: {normalize: false}\n";
      if (!config_path.empty()) {
        YAML::Node tree = YAML::Load(RunConfig::load(config_path, {}, arrays).text);
        tree.remove("model");
        YAML::Emitter out;
        out << tree;
        text = out.c_str();
      }
      config = RunConfig::parse(text, config_path.empty() ? "--model" : config_path,
                                with_onnx_model(overrides, options.onnx_model), arrays);
    } else {
      options.checkpoint = resolve_checkpoint(options.checkpoint);
      config = config_path.empty()
                   ? RunConfig::parse(read_checkpoint_state(world, options.checkpoint).config,
                                      options.checkpoint + " (stored config)", overrides, arrays)
                   : RunConfig::load(config_path, overrides, arrays);
    }
    options.config_path = config_path;
    enable_memory_tracking();  // the report below, memory.budget_mib
    const InferResult r = infer(world, config, options);
    if (world.rank() != 0) return;
    std::printf("infer: %lld samples -> %s in %.2f s\n", (long long)r.samples,
                options.output_path.c_str(), r.seconds);
    if (r.has_target) {  // always printed, NaN as NaN: a missing line hides a problem
      std::printf("infer: relative L2 error vs target: mean %.4f (%.2f%%), max %.4f\n",
                  r.relative_l2, 100 * r.relative_l2, r.max_relative_l2);
      if (!std::isfinite(r.relative_l2) || !std::isfinite(r.max_relative_l2))
        std::printf(
            "infer: warning: the error is not finite: the prediction or the target holds "
            "NaN or Inf values (or a target sample is all zeros)\n");
    }
    if (r.memory.enabled) std::printf("%s", r.memory.describe().c_str());
  }
};

/// `export`: a trained ONNX graph (model type onnx) back to an ONNX file, its nodes as read,
/// its trained parameters in place of the initializers.
struct ExportCommand {
  CLI::App* command = nullptr;
  std::string checkpoint, output;

  void add_to(CLI::App& app) {
    command = app.add_subcommand(
        "export", "Write a model trained from an ONNX file (model: {type: onnx}) back to ONNX");
    command
        ->add_option("--checkpoint", checkpoint,
                     "Checkpoint file, or a run directory (its newest checkpoint)")
        ->required();
    command->add_option("-o,--output", output, "The ONNX file to write")->required();
  }

  void run(const Communicator& world) {
    checkpoint = resolve_checkpoint(checkpoint);
    const TrainingState state = read_checkpoint_state(world, checkpoint);
    const RunConfig config = RunConfig::parse(state.config, checkpoint + " (stored config)", {},
                                              RunConfig::DataUse::arrays);
    const std::string type = config.model["type"].as<std::string>("");
    SHARDTENSOR_REQUIRE(type == "onnx", "export",
                        checkpoint << " holds a '" << type
                                   << "' model; export writes models trained from an ONNX "
                                      "file (model: {type: onnx})");
    SHARDTENSOR_REQUIRE(state.input_statistics.is_identity() &&
                            state.target_statistics.is_identity(),
                        "export",
                        checkpoint << " was trained on normalized data (data.normalize): the "
                                      "graph alone would expect normalized inputs; train with "
                                      "data.normalize: false to export it");
    const std::string source = config.model["path"].as<std::string>();
    io::require_outputs_apart(world, "export", {{"--output", output}},
                              {{"--checkpoint", checkpoint}, {"the model's ONNX file", source}});
    const models::OnnxSignature signature = models::onnx_signature(source, world);
    const models::ModelShape shape{signature.input_rank - 2, signature.input_channels,
                                   signature.output_channels, {}};
    // The initializers the run trained (model.train_initializers) are parameters again, so
    // that the checkpoint's values reach them.
    std::vector<std::string> trained;
    for (const auto& name : config.model["train_initializers"])
      trained.push_back(name.as<std::string>());
    if (config.training.precision == "double")
      write<double>(world, source, shape, trained);
    else
      write<float>(world, source, shape, trained);
    if (world.rank() == 0)
      std::printf("export: %s (step %lld) -> %s\n", checkpoint.c_str(), (long long)state.step,
                  output.c_str());
  }

  template <class T>
  void write(const Communicator& world, const std::string& source,
             const models::ModelShape& shape, const std::vector<std::string>& trained) {
    const auto graph = models::import_onnx<T>(source, world, shape, "model", trained);
    load_checkpoint<T>(world, checkpoint, *graph, nullptr);
    models::export_onnx<T>(source, *graph, output, world);
  }
};

/// Every rank must run the same command: a rank given other arguments (an MPMD launch, a
/// per-rank wrapper script) would wait in another collective. Agreed before anything else,
/// with an unknown command named (and the closest known one).
void require_same_known_command(int argc, char** argv) {
  std::string command_line;
  for (int i = 1; i < argc; ++i) command_line += std::string(argv[i]) + "\n";
  Communicator(MPI_COMM_WORLD)
      .require_same_text(command_line, "shardtensor", "the command line (one argument per line)");
  const std::vector<std::string> commands{"generate", "train", "infer", "export", "info"};
  if (argc > 1 && argv[1][0] != '-' &&
      std::find(commands.begin(), commands.end(), argv[1]) == commands.end()) {
    const std::string near = closest_name(argv[1], commands);
    SHARDTENSOR_FAIL("shardtensor", "unknown command '"
                                        << argv[1] << "'"
                                        << (near.empty() ? "" : "; did you mean '" + near + "'?")
                                        << " The commands are generate, train, infer, export "
                                           "and info");
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Threads: the data loader reads the next batch on a second thread (MPI-IO) while the
  // main thread computes and exchanges halos.
  MpiEnvironment mpi(argc, argv);
  const int rank = mpi.world_rank(), size = mpi.world_size();
  keep_freed_memory();
  one_blas_thread_per_rank();  // unless OPENBLAS_NUM_THREADS says otherwise

  CLI::App app{
      "ShardTensor: domain-parallel machine learning for scientific fields.\n"
      "Run with mpirun; every rank runs the same command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("shardtensor ") + SHARDTENSOR_VERSION);
  GenerateCommand generate;
  TrainCommand train_command;
  InferCommand infer_command;
  generate.add_to(app);
  train_command.add_to(app);
  infer_command.add_to(app);
  ExportCommand export_command;
  export_command.add_to(app);
  auto* info = app.add_subcommand("info", "Versions of ShardTensor and its libraries");

  try {
    require_same_known_command(argc, argv);
  } catch (const std::exception& e) {
    fail(e.what(), rank, size);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      const Communicator world(MPI_COMM_WORLD);
      // Commands with no step boundary to stop at: a signal removes their unfinished outputs.
      if (generate.command->parsed() || infer_command.command->parsed())
        io::remove_temporaries_on_signal();
      if (generate.command->parsed()) generate.run(world);
      if (train_command.command->parsed()) train_command.run(world);
      if (infer_command.command->parsed()) infer_command.run(world);
      if (export_command.command->parsed()) export_command.run(world);
      if (info->parsed()) print_info(world);
    } catch (const TrainingStopped& e) {  // every rank, after a checkpoint: finalize normally
      if (rank == 0) std::fprintf(stderr, "shardtensor: %s\n", e.what());
      status = 128 + e.signal();
    } catch (const std::exception& e) {
      fail(e.what(), rank, size);
    }
  }
  return status;
}
