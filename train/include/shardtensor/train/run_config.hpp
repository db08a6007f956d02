#pragma once
// RunConfig: everything `shardtensor train` / `infer` read from a run's YAML file, checked
// once with errors that name the key and line. See docs/config.md for the schema.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtensor/comm/comm_options.hpp"
#include "shardtensor/config/config_node.hpp"
#include "shardtensor/core/types.hpp"
#include "shardtensor/optim/lr_schedule.hpp"
#include "shardtensor/optim/optimizer.hpp"

namespace shardtensor {

struct DataConfig {
  std::string path;               ///< HDF5 file with the training fields
  std::string input = "input";    ///< dataset [samples, channels, spatial...]
  std::string target = "target";  ///< dataset [samples, channels, spatial...]
  std::string validation_path;    ///< optional separate file; else the last samples
  Index validation_samples = -1;  ///< from `path`: -1 means validation_fraction
  double validation_fraction = 0.25;
  bool normalize = true;  ///< per-channel mean/std of inputs and targets
  bool shuffle = true;
  bool prefetch = true;        ///< read the next batch while the current one computes
  std::vector<bool> periodic;  ///< per spatial dim (one value: all dims); default open
};

struct ParallelConfig {
  int data_groups = 1;    ///< ranks = data_groups x domain ranks
  std::vector<int> grid;  ///< domain process grid; empty: chosen automatically
  CommOptions comm;       ///< backend (mpi, nccl) and device_aware_mpi: how device memory moves
};

struct TrainingConfig {
  int epochs = 10;
  Index batch_size = 1;             ///< samples per data group per step
  std::string loss = "mse";         ///< mse, l1, relative_l2 (on normalized targets)
  double clip_grad_norm = 0;        ///< 0: no clipping
  int validate_every = 1;           ///< epochs
  int checkpoint_every = 1;         ///< epochs
  int keep_checkpoints = 3;         ///< the last K checkpoint files are kept
  /// float, double, or bf16: float parameters, gradients and optimizer state, with the
  /// convolutions, transposed convolutions and attention products on bf16 operands (autocast)
  std::string precision = "float";
  bool tf32 = false;                ///< float convolutions on a GPU may use TF32 tensor cores
  std::uint64_t seed = 1;           ///< shuffling (model seeds are under `model`)

  /// Sets a model's per-layer math from these options (TF32; bf16 operands).
  template <class Model>
  void set_layer_math(Model& model) const {
    model.allow_tf32(tf32);
    model.compute_in_bf16(precision == "bf16");
  }
};

struct MemoryConfig {
  /// Per-rank budget on tracked Kokkos memory (MiB); 0: none. Exceeding it in a training
  /// step stops the run on every rank with an error naming the category.
  double budget_mib = 0;
  /// Share (0 to 1) of the device's free memory that the convolution library (cuDNN) may take
  /// as workspace (ConvOptions::library_workspace_share); the buffer holds what the chosen
  /// algorithms need, not the share.
  double library_workspace_share = 0.25;
};

struct RunConfig {
  std::string run_dir = "run";
  DataConfig data;
  ParallelConfig parallel;
  YAML::Node model;  ///< checked by models::build_model
  OptimizerOptions optimizer;
  ScheduleOptions schedule;  ///< base_lr comes from optimizer.lr; cosine total_steps defaults
                             ///< to the whole run
  TrainingConfig training;
  MemoryConfig memory;
  std::string text;  ///< the resolved config as YAML (written to the run dir and checkpoints)

  /// Sets a model's per-layer options from this config: the math (training.tf32,
  /// training.precision) and the convolution library's workspace share (memory).
  template <class Model>
  void configure_layers(Model& model) const {
    training.set_layer_math(model);
    model.set_library_workspace_share(memory.library_workspace_share);
  }

  /// Where the training data comes from: a file (`data.path` required) or the caller's
  /// arrays (an embedding solver; `data.path` optional).
  enum class DataUse { file, arrays };

  /// Reads and checks a config; `overrides` are "key=value" from --set, applied first.
  static RunConfig load(const std::string& path, const std::vector<std::string>& overrides = {},
                        DataUse data_use = DataUse::file);
  static RunConfig parse(const std::string& yaml_text, const std::string& source = "config",
                         const std::vector<std::string>& overrides = {},
                         DataUse data_use = DataUse::file);
};

}  // namespace shardtensor
