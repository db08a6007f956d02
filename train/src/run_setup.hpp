#pragma once
// What a training or inference run sets up from its config and data file (the mesh, the
// domain split, the model), and the validation pass over held-out samples.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "run_data.hpp"
#include "shardtensor/layers/module.hpp"
#include "shardtensor/train/channel_statistics.hpp"

namespace shardtensor::impl {

/// Everything a training or inference run sets up from the config and the data file.
template <class T>
struct Setup {
  RankMesh mesh;
  FieldData data;
  Decomposition domain;
  std::shared_ptr<Module<T>> model;
};

/// The mesh (moving device memory as parallel.backend says), the data's shapes, the domain
/// split and the model (TF32 as training.tf32 says), after checking that one batch fits.
/// `out_channels` > 0 (inference): the channels the checkpoint predicts.
template <class T>
Setup<T> set_up(const Communicator& world, const RunConfig& config, const io::File& file,
                const std::string& input, const std::string& target, bool target_required,
                Index out_channels = 0);

/// Per sample: sum (p - y)^2 and sum y^2 over this rank's cells of the target. A prediction
/// split elsewhere than the target (same global field) is redistributed onto the target's
/// split first; any other difference is an error naming both layouts: shards of different
/// layouts are never compared cell by cell.
template <class T>
std::vector<std::pair<double, double>> squared_errors(const Communicator& comm,
                                                      const ShardTensor<T>& prediction,
                                                      const ShardTensor<T>& target);

/// Validation: mean loss (normalized space) and mean relative L2 error (physical units)
/// over `samples`, shared round-robin between the data groups.
template <class T>
std::pair<double, double> validate(Setup<T>& s, const RunConfig& config, const io::File& file,
                                   const std::vector<Index>& samples,
                                   const ChannelStatistics& input_statistics,
                                   const ChannelStatistics& target_statistics);

}  // namespace shardtensor::impl
