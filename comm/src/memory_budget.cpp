#include "shardtensor/comm/memory_budget.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

int world_rank() {
  int initialized = 0, finalized = 0, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// What ranks agree on: the worst overflow (bytes; 0: none) and who had it.
struct Agreement {
  double bytes = 0;
  int rank = 0;  // world rank
  int category = int(MemoryCategory::other);
  char label[120] = {};
};

/// The worst overflow over `comm`: one MAXLOC allreduce; the details travel (a broadcast
/// from the rank that had it) only when some rank went over.
void agree(Agreement& a, MPI_Comm comm) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  if (size == 1) return;
  struct {
    double value;
    int rank;
  } in{a.bytes, rank}, out{0, 0};
  MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, comm);
  if (out.value <= 0) return;
  struct {
    int rank, category;
    char label[sizeof a.label];
  } details{a.rank, a.category, {}};
  std::memcpy(details.label, a.label, sizeof a.label);
  MPI_Bcast(&details, int(sizeof details), MPI_BYTE, out.rank, comm);
  a.bytes = out.value;
  a.rank = details.rank;
  a.category = details.category;
  std::memcpy(a.label, details.label, sizeof a.label);
}

void check_collectively(std::initializer_list<const Communicator*> comms) {
  const std::uint64_t budget = memory_budget();
  if (budget == 0) return;
  const MemoryOverflow o = take_memory_overflow();
  Agreement a;
  a.rank = world_rank();
  if (o.active) {
    a.bytes = double(o.bytes);
    a.category = int(o.category);
    std::snprintf(a.label, sizeof a.label, "%s", o.label.c_str());
  }
  for (const Communicator* comm : comms) agree(a, comm->get());
  if (a.bytes > 0)
    throw Error(memory_overflow_message(budget, std::uint64_t(a.bytes), MemoryCategory(a.category),
                                        a.label, a.rank));
}

}  // namespace

MemorySnapshot memory_report(const Communicator& comm) {
  const MemorySnapshot local = memory_snapshot();
  std::vector<std::uint64_t> values;
  for (const MemoryUsage& usage : local.categories) {
    values.push_back(usage.current);
    values.push_back(usage.peak);
  }
  values.insert(values.end(),
                {local.total.current, local.total.peak, local.live_allocations, local.allocations,
                 local.budget_bytes, local.heap_free_bytes, std::uint64_t(local.enabled)});
  MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_UINT64_T, MPI_MAX, comm.get());
  MemorySnapshot s;
  std::size_t i = 0;
  for (MemoryUsage& usage : s.categories) {
    usage.current = values[i++];
    usage.peak = values[i++];
  }
  s.total.current = values[i++];
  s.total.peak = values[i++];
  s.live_allocations = values[i++];
  s.allocations = values[i++];
  s.budget_bytes = values[i++];
  s.heap_free_bytes = values[i++];
  s.enabled = values[i++] != 0;
  s.ranks = comm.size();
  return s;
}

void check_memory_budget(const Communicator& comm) {
  check_collectively({&comm});
}

void check_memory_budget(const Communicator& domain, const Communicator& data_parallel) {
  check_collectively({&domain, &data_parallel});
}

}  // namespace shardtensor
