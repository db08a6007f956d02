#pragma once
// The training data as a run sees it: the shapes of a file's datasets, checked against each
// other, against a checkpoint and against the memory one batch needs, and the rank mesh and
// domain split they give.

#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/run_config.hpp"

namespace shardtensor::impl {

/// Shapes of a file's input and target datasets, checked against each other.
struct FieldData {
  int dims = 0;
  std::vector<Index> extents;
  Index samples = 0, input_channels = 0, target_channels = 0;
  bool has_target = false;
};

FieldData inspect(const io::File& file, const std::string& input, const std::string& target,
                  bool target_required);

/// Stops where the data's field is not the kind the checkpoint was trained on (its spatial dims,
/// its input channels and, with `targets`, its target channels): the cause, before any
/// parameter sizes are compared. Every rank reads the same values: every rank stops.
void require_trained_on(const TrainingState& trained, const std::string& checkpoint,
                        const FieldData& data, const std::string& data_path, bool targets,
                        const char* where);

/// Refuses, on every rank and before anything is allocated, data whose one batch alone (the
/// input and target values of the largest shard: a lower bound of a step's memory) exceeds
/// memory.budget_mib or the memory the node has free: a small file that declares a huge
/// dataset, or too few ranks for the field.
void require_batch_fits(const Communicator& world, const io::File& file, const FieldData& data,
                        const Decomposition& domain, Index batch, std::size_t value_bytes,
                        double budget_mib);

/// The split of one sample's field over a data group's ranks (data.periodic, parallel.grid).
Decomposition domain_decomposition(const FieldData& data, const RunConfig& config,
                                   int domain_ranks);

/// The (data x domain) mesh of parallel.data_groups.
RankMesh make_mesh(const Communicator& world, int data_groups);

/// Sum over `comm` of a double on every rank.
double sum_over(const Communicator& comm, double value);

}  // namespace shardtensor::impl
