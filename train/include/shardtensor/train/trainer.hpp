#pragma once
// train() and infer(): what `shardtensor train` and `shardtensor infer` run. Both work on
// any (data x domain) rank mesh and give the same numbers as one rank.

#include <cstdint>
#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/train/run_config.hpp"

namespace shardtensor {

struct TrainOptions {
  std::string resume;  ///< checkpoint to continue from; "latest": the newest in the run dir
  /// Start a new run in a run dir that holds one: the old run is moved to <run_dir>.old
  /// (never deleted). Without it (and without resume) such a run dir is refused.
  bool overwrite = false;
  bool progress = true;  ///< rank 0 prints progress (a bar on a terminal, else a line per epoch)
};

/// Thrown by train() on every rank together when SIGINT or SIGTERM stopped it at a step
/// boundary, after it wrote a checkpoint of that step: not a failure, so a program can
/// finalize normally (the CLI exits with 128 + signal, as a shell reports a signal).
class TrainingStopped : public Error {
 public:
  TrainingStopped(const std::string& message, int signal) : Error(message), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

struct TrainResult {
  std::int64_t steps = 0;       ///< optimizer steps taken in total
  std::int64_t epochs = 0;      ///< epochs completed in total
  double loss = 0;              ///< mean training loss of the last epoch
  double val_loss = -1;         ///< last validation loss (normalized space); -1: none
  double val_relative_l2 = -1;  ///< last mean relative L2 error (physical units); -1: none
  double seconds = 0;
  std::string checkpoint;  ///< the last checkpoint written
  /// Tracked memory at the end of the run (peaks over the whole run), max over ranks;
  /// memory.enabled is false unless memory tracking was on (the CLI turns it on).
  MemorySnapshot memory;
};

/// Trains the model of `config` on its data; writes metrics.csv, config.yaml and
/// checkpoints into config.run_dir. Collective over `world`.
TrainResult train(const Communicator& world, const RunConfig& config,
                  const TrainOptions& options = {});

struct InferOptions {
  std::string checkpoint;      ///< a trained model, or:
  std::string onnx_model;      ///< an ONNX file run as it is (its weights, no normalisation)
  std::string input_path;      ///< HDF5 file with the input dataset
  std::string output_path;     ///< written atomically, with an XDMF sidecar
  std::string input_dataset;   ///< default: config data.input
  std::string target_dataset;  ///< if present in the input file: errors reported;
                               ///< default: config data.target
  std::string output_dataset = "prediction";
  std::string config_path;     ///< the config file read, if any: never an output
  bool progress = true;
};

struct InferResult {
  Index samples = 0;
  bool has_target = false;  ///< the input file had the target: the errors below are set
  /// Mean over samples of |prediction - target| / |target| (NaN when a sample's is NaN);
  /// -1 without a target.
  double relative_l2 = -1;
  double max_relative_l2 = -1;  ///< the largest sample's (NaN when any is NaN)
  double seconds = 0;
  /// Tracked memory at the end (peaks over the run), max over ranks; memory.enabled is false
  /// unless memory tracking was on (the CLI turns it on).
  MemorySnapshot memory;
};

/// Runs the trained model on every sample of an input file and writes the predictions.
InferResult infer(const Communicator& world, const RunConfig& config, const InferOptions& options);

}  // namespace shardtensor
