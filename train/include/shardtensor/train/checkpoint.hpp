#pragma once
// Checkpoints: one HDF5 file holding everything a run needs to continue exactly where it
// stopped, on any number of ranks: parameters and buffers by name, optimizer state, step,
// epoch, the shuffling seed, the normalisation statistics and the config text.
//
//   /parameters/<name>     model parameters, shape as registered
//   /buffers/<name>        non-trainable state (BatchNorm running statistics)
//   /optimizer/<kind>/<name>  optimizer state; attributes type, step_count
//   /normalization/{input,target}_{mean,std}   float64 per channel
//   attributes on /: format, precision, epoch, step, rng (uint64s), config (YAML text)
//
// Parameters are replicated, so a checkpoint does not depend on the process grid: it loads
// on any rank count. Files are written atomically (temporary name, then rename).

#include <cstdint>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/optim/optimizer.hpp"
#include "shardtensor/train/channel_statistics.hpp"

namespace shardtensor {

/// What a checkpoint holds besides the model and optimizer.
struct TrainingState {
  std::int64_t epoch = 0;  ///< epochs completed
  std::int64_t step = 0;   ///< optimizer steps taken
  std::uint64_t seed = 0;  ///< the shuffling seed (the generators are counter-based, so
                           ///< (seed, epoch, step) is the whole RNG state)
  std::string config;      ///< resolved config text
  ChannelStatistics input_statistics, target_statistics;
  std::int64_t dims = 0;  ///< spatial dims of the field trained on; 0: not recorded (before
                          ///< 2026-11-27, or a session's)
};

/// Writes `path` atomically. Collective over `comm` (all ranks hold the same replicated
/// values; rank 0 writes them). `optimizer` may be null (a model-only checkpoint).
template <class T>
void save_checkpoint(const Communicator& comm, const std::string& path, const Module<T>& model,
                     const Optimizer<T>* optimizer, const TrainingState& state);

/// Loads parameters and buffers into `model` (and the optimizer state if `optimizer` is not
/// null) and returns the rest. Every model parameter must be in the file with the same
/// size: the error names the missing or mismatched ones and the file. Collective.
template <class T>
TrainingState load_checkpoint(const Communicator& comm, const std::string& path,
                              const Module<T>& model, Optimizer<T>* optimizer);

/// Everything but the model and optimizer state (config text, statistics, counters).
/// Collective.
TrainingState read_checkpoint_state(const Communicator& comm, const std::string& path);

/// Checkpoint file names in `directory` ("checkpoint_step<8 digits>.h5"), oldest first.
std::vector<std::string> list_checkpoints(const std::string& directory);
/// The file name for a checkpoint taken after `step` optimizer steps.
std::string checkpoint_name(const std::string& directory, std::int64_t step);

extern template void save_checkpoint(const Communicator&, const std::string&, const Module<float>&,
                                     const Optimizer<float>*, const TrainingState&);
extern template void save_checkpoint(const Communicator&, const std::string&, const Module<double>&,
                                     const Optimizer<double>*, const TrainingState&);
extern template TrainingState load_checkpoint(const Communicator&, const std::string&,
                                              const Module<float>&, Optimizer<float>*);
extern template TrainingState load_checkpoint(const Communicator&, const std::string&,
                                              const Module<double>&, Optimizer<double>*);

}  // namespace shardtensor
