// `shardtensor`: the command-line tool. Run it with mpirun; every subcommand is collective.
//
//   shardtensor generate heat --dims 3 --size 32 --samples 16 --output data.h5
//   shardtensor train --config run.yaml [--set key=value ...] [--resume latest]
//   shardtensor infer --config run.yaml --checkpoint ck.h5 --input in.h5 --output out.h5
//   shardtensor info

#include <dlfcn.h>
#include <hdf5.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
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
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/data/heat_equation.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/output_paths.hpp"
#include "shardtensor/kernels/conv_library.hpp"
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
  // OpenBLAS, if that is the BLAS behind Kokkos Kernels, says which kernels it chose.
  using text_function = char* (*)();
  std::string blas = "BLAS (reference or unknown implementation)";
  if (auto config = reinterpret_cast<text_function>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    blas = std::string("OpenBLAS ") + config();
    if (auto core = reinterpret_cast<text_function>(dlsym(RTLD_DEFAULT, "openblas_get_corename")))
      blas += std::string(", kernels ") + core();
  }
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
  std::printf("  BLAS      %s\n", blas.c_str());
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

}  // namespace

int main(int argc, char** argv) {
  // Threads: the data loader reads the next batch on a second thread (MPI-IO) while the
  // main thread computes and exchanges halos.
  MpiEnvironment mpi(argc, argv);
  const int rank = mpi.world_rank(), size = mpi.world_size();
  keep_freed_memory();

  CLI::App app{
      "ShardTensor: domain-parallel machine learning for scientific fields.\n"
      "Run with mpirun; every rank runs the same command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("shardtensor ") + SHARDTENSOR_VERSION);

  // generate heat
  auto* generate = app.add_subcommand("generate", "Generate a training dataset");
  generate->require_subcommand(1);
  auto* heat = generate->add_subcommand(
      "heat", "Variable-diffusivity heat equation: /input (u0, kappa) -> /target (u at time T)");
  HeatOptions heat_options;
  std::string heat_output = "heat.h5";
  bool heat_overwrite = false;
  heat->add_option("--dims", heat_options.dims, "Spatial dimensions, 2 or 3")
      ->capture_default_str();
  heat->add_option("--size", heat_options.size, "Cells per dimension")->capture_default_str();
  heat->add_option("--samples", heat_options.samples, "Number of samples")->capture_default_str();
  heat->add_option("--steps", heat_options.steps, "Explicit time steps")->capture_default_str();
  heat->add_option("--modes", heat_options.modes, "Fourier modes per random field")
      ->capture_default_str();
  heat->add_option("--contrast", heat_options.contrast, "Diffusivity varies by +- contrast")
      ->capture_default_str();
  heat->add_option("--seed", heat_options.seed, "Random seed")->capture_default_str();
  heat->add_option("-o,--output", heat_output, "Output HDF5 file")->capture_default_str();
  heat->add_flag("--overwrite", heat_overwrite, "Replace the output file if it exists");

  // train
  auto* train_command = app.add_subcommand("train", "Train a model from a YAML config");
  std::string config_path;
  std::vector<std::string> overrides;
  TrainOptions train_options;
  train_command->add_option("-c,--config", config_path, "Run config (YAML)")->required();
  train_command->add_option("--set", overrides, "Override a config key: --set training.epochs=5");
  train_command->add_option("--resume", train_options.resume,
                            "Continue from a checkpoint file, or 'latest' in the run dir");
  train_command->add_flag("--overwrite", train_options.overwrite,
                          "Start a new run in a run dir that holds one (the old run is moved "
                          "to <run_dir>.old)");
  bool quiet = false;
  train_command->add_flag("-q,--quiet", quiet, "No progress output");

  // infer
  auto* infer_command = app.add_subcommand("infer", "Run a trained model on an HDF5 file");
  InferOptions infer_options;
  infer_command->add_option("-c,--config", config_path,
                            "Run config (YAML); default: the config stored in the checkpoint");
  infer_command->add_option("--set", overrides, "Override a config key");
  infer_command
      ->add_option("--checkpoint", infer_options.checkpoint,
                   "Checkpoint file, or a run directory (its newest checkpoint)")
      ->required();
  infer_command->add_option("-i,--input", infer_options.input_path, "Input HDF5 file")->required();
  infer_command->add_option("-o,--output", infer_options.output_path, "Output HDF5 file")
      ->required();
  infer_command->add_option("--dataset", infer_options.input_dataset,
                            "Input dataset (default: the config's data.input)");
  infer_command->add_option(
      "--target", infer_options.target_dataset,
      "Target dataset for error reporting (default: data.target, if present)");
  infer_command
      ->add_option("--output-dataset", infer_options.output_dataset,
                   "Name of the predictions' dataset")
      ->capture_default_str();

  auto* info = app.add_subcommand("info", "Versions of ShardTensor and its libraries");

  // Every rank must run the same command: a rank given other arguments (an MPMD launch, a
  // per-rank wrapper script) would wait in another collective. Agreed before anything else.
  try {
    std::string command_line;
    for (int i = 1; i < argc; ++i) command_line += std::string(argv[i]) + "\n";
    Communicator(MPI_COMM_WORLD)
        .require_same_text(command_line, "shardtensor", "the command line (one argument per line)");
    const std::vector<std::string> commands{"generate", "train", "infer", "info"};
    if (argc > 1 && argv[1][0] != '-' &&
        std::find(commands.begin(), commands.end(), argv[1]) == commands.end()) {
      const std::string near = closest_name(argv[1], commands);
      SHARDTENSOR_FAIL("shardtensor", "unknown command '"
                                          << argv[1] << "'"
                                          << (near.empty() ? "" : "; did you mean '" + near + "'?")
                                          << " The commands are generate, train, infer and info");
    }
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
      if (heat->parsed() || infer_command->parsed()) io::remove_temporaries_on_signal();
      if (heat->parsed()) {
        // A new file, or --overwrite: never a data set the user has, nor its own sidecar.
        const std::string sidecar =
            std::filesystem::path(heat_output).replace_extension(".xdmf").string();
        for (const std::string& path : {heat_output, sidecar})
          SHARDTENSOR_REQUIRE(heat_overwrite || !std::filesystem::exists(path), "generate",
                              "'" << path << "' exists"
                                  << (path == sidecar ? " (the XDMF sidecar of --output)" : "")
                                  << ": pass --overwrite to replace it, or choose another "
                                     "--output (nothing was written)");
        io::require_outputs_apart(
            world, "generate",
            {{"--output", heat_output}, {"XDMF sidecar of --output", sidecar}}, {});
        generate_heat_dataset(world, heat_options, heat_output, true);
      } else if (train_command->parsed()) {
        const RunConfig config = RunConfig::load(config_path, overrides);
        // One path, but a node-local file system could hold another file there.
        world.require_same_text(config.text, "train", "the resolved config");
        train_options.progress = !quiet;
        enable_memory_tracking();  // Kokkos allocation hooks: the report below, memory.budget_mib
        const TrainResult r = train(world, config, train_options);
        if (rank == 0 && r.checkpoint.empty()) {  // a resumed run that had finished already
          std::printf("train: nothing left to train: the run is at step %lld, its %lld epoch(s) "
                      "done (training.epochs %lld); raise training.epochs (--set) to go on\n",
                      (long long)r.steps, (long long)r.epochs,
                      (long long)config.training.epochs);
        } else if (rank == 0) {
          std::printf("train: %lld steps, %lld epochs in %.1f s; loss %.4e", (long long)r.steps,
                      (long long)r.epochs, r.seconds, r.loss);
          if (r.val_relative_l2 >= 0)
            std::printf(", validation relative L2 error %.4f (%.2f%%)", r.val_relative_l2,
                        100 * r.val_relative_l2);
          std::printf("\ntrain: checkpoint %s\n", r.checkpoint.c_str());
          if (r.memory.enabled) std::printf("%s", r.memory.describe().c_str());
        }
      } else if (infer_command->parsed()) {
        infer_options.checkpoint = resolve_checkpoint(infer_options.checkpoint);
        // Inference reads its input from --input, not data.path: configs of models trained
        // online by an embedding solver have none.
        const auto arrays = RunConfig::DataUse::arrays;
        const RunConfig config =
            config_path.empty()
                ? RunConfig::parse(read_checkpoint_state(world, infer_options.checkpoint).config,
                                   infer_options.checkpoint + " (stored config)", overrides, arrays)
                : RunConfig::load(config_path, overrides, arrays);
        infer_options.config_path = config_path;
        enable_memory_tracking();  // the report below, memory.budget_mib
        const InferResult r = infer(world, config, infer_options);
        if (rank == 0) {
          std::printf("infer: %lld samples -> %s in %.2f s\n", (long long)r.samples,
                      infer_options.output_path.c_str(), r.seconds);
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
      } else if (info->parsed()) {
        print_info(world);
      }
    } catch (const TrainingStopped& e) {  // every rank, after a checkpoint: finalize normally
      if (rank == 0) std::fprintf(stderr, "shardtensor: %s\n", e.what());
      status = 128 + e.signal();
    } catch (const std::exception& e) {
      fail(e.what(), rank, size);
    }
  }
  return status;
}
