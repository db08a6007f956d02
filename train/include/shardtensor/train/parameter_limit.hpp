#pragma once
// The memory a model's parameters may take, checked while the model is built and before each
// parameter is allocated (see ScopedParameterLimit).

#include <cstdint>
#include <memory>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/memory_limits.hpp"
#include "shardtensor/train/run_config.hpp"

namespace shardtensor {

/// A limit for building `config.model`, agreed over `comm`: memory.budget_mib (if set) and the
/// least free memory of the ranks' nodes; `training`: parameters, gradients and the
/// optimizer's state count (x4 for adam), else the parameters alone. Collective.
std::unique_ptr<ScopedParameterLimit> parameter_limit(const Communicator& comm,
                                                      const RunConfig& config, bool training);

}  // namespace shardtensor
