#pragma once
// The memory tracker's figures and budget over ranks (core/memory_tracker.hpp counts each
// rank's allocations and never communicates; agreeing across ranks is comm's part).

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/memory_tracker.hpp"

namespace shardtensor {

/// Every figure is the maximum over the ranks of `comm` (taken figure by figure: the peak
/// activations and the peak workspaces may come from different ranks). Collective.
MemorySnapshot memory_report(const Communicator& comm);

/// check_memory_budget() collective over `comm`: if any rank went over, every rank throws the
/// same error, naming the rank that went furthest over (its MPI_COMM_WORLD rank). One
/// allreduce of a number and a rank when a budget is set (plus a broadcast of the details on
/// overflow); no communication without a budget.
void check_memory_budget(const Communicator& comm);

/// Collective over a (data x domain) rank mesh given by its two communicators (what
/// training_step has): every rank of the mesh throws together. Two small allreduces.
void check_memory_budget(const Communicator& domain, const Communicator& data_parallel);

}  // namespace shardtensor
