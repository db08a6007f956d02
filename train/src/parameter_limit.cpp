#include "shardtensor/train/parameter_limit.hpp"

#include <algorithm>
#include <string>

namespace shardtensor {

std::unique_ptr<ScopedParameterLimit> parameter_limit(const Communicator& comm,
                                                      const RunConfig& config, bool training) {
  // Free memory differs between nodes: every rank takes the least, so all stop together.
  const std::vector<long long> available =
      comm.allgather({static_cast<long long>(node_available_bytes())});
  const long long least = *std::min_element(available.begin(), available.end());
  const std::uint64_t budget =
      config.memory.budget_mib > 0 ? std::uint64_t(config.memory.budget_mib * 1048576.0) : 0;
  std::uint64_t limit = 0;
  std::string name;
  if (budget > 0 && (least <= 0 || budget <= std::uint64_t(least))) {
    limit = budget;
    name = "memory.budget_mib (" + describe_bytes(budget) + ")";
  } else if (least > 0) {
    limit = std::uint64_t(least);
    name = "the free memory of this node (" + describe_bytes(limit) + ")";
  }
  const std::string& optimizer = config.optimizer.type;
  const int state = optimizer == "sgd" ? (config.optimizer.momentum > 0 ? 1 : 0) : 2;
  const int copies = training ? 2 + state : 1;
  const std::string reason =
      training ? "gradients and " + optimizer + " state" : "inference: the parameters alone";
  return std::make_unique<ScopedParameterLimit>(limit, name, copies, reason);
}

}  // namespace shardtensor
