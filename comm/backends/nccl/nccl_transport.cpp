// The NCCL backend (comm/include/shardtensor/comm/impl/nccl_transport.hpp): built when the
// CUDA build finds NCCL (SHARDTENSOR_HAVE_NCCL); otherwise every entry point throws, which
// nothing reaches (comm_backend_named refuses "nccl" in such a build).

#include "shardtensor/comm/impl/nccl_transport.hpp"

#include <Kokkos_Core.hpp>

#include "shardtensor/comm/comm_options.hpp"
#include "shardtensor/core/error.hpp"

#ifdef SHARDTENSOR_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace shardtensor {

bool nccl_available() {
#ifdef SHARDTENSOR_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace shardtensor

namespace shardtensor::impl::nccl {

#ifdef SHARDTENSOR_HAVE_NCCL

namespace {

void check(ncclResult_t result, const char* call) {
  SHARDTENSOR_REQUIRE(result == ncclSuccess, "NCCL",
                      call << " failed: " << ncclGetErrorString(result) << " ("
                           << ncclGetLastError(nullptr) << ")");
}

void check(cudaError_t result, const char* call) {
  SHARDTENSOR_REQUIRE(result == cudaSuccess, "NCCL",
                      call << " failed: " << cudaGetErrorString(result));
}

ncclDataType_t nccl_type(ElementType type) {
  switch (type) {
    case ElementType::int8:
      return ncclInt8;
    case ElementType::uint8:
      return ncclUint8;
    case ElementType::int32:
      return ncclInt32;
    case ElementType::uint32:
      return ncclUint32;
    case ElementType::int64:
      return ncclInt64;
    case ElementType::uint64:
      return ncclUint64;
    case ElementType::float32:
      return ncclFloat32;
    default:
      return ncclFloat64;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
    default:
      return ncclSum;
  }
}

}  // namespace

struct Group {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  ~Group() {
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
};

struct Completion::Event {
  cudaEvent_t event = nullptr;
  ~Event() {
    if (event) cudaEventDestroy(event);
  }
};

std::shared_ptr<Group> create_group(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ncclUniqueId id;
  // Rank 0's failure to make an id is every rank's: the id (or its absence) is broadcast.
  int have_id = rank == 0 ? ncclGetUniqueId(&id) == ncclSuccess : 0;
  MPI_Bcast(&have_id, 1, MPI_INT, 0, comm);
  SHARDTENSOR_REQUIRE(have_id, "NCCL", "rank 0 could not create an NCCL unique id");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
  auto group = std::make_shared<Group>();
  check(cudaStreamCreateWithFlags(&group->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const ncclResult_t init = ncclCommInitRank(&group->comm, size, id, rank);
  // Two ranks on one GPU, say: NCCL refuses on every rank; agree so that all say why.
  int ok = init == ncclSuccess, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) group->comm = init == ncclSuccess ? group->comm : nullptr;
  SHARDTENSOR_REQUIRE(all_ok, "NCCL",
                      "ncclCommInitRank failed on "
                          << (ok ? "another rank" : "rank " + std::to_string(rank)) << ": "
                          << ncclGetErrorString(init)
                          << " (NCCL needs one GPU per rank; with several ranks per GPU use "
                             "parallel.backend: mpi)");
  return group;
}

bool Completion::test() {
  if (!event_) return true;
  const cudaError_t state = cudaEventQuery(event_->event);
  if (state == cudaErrorNotReady) return false;
  check(state, "cudaEventQuery");
  event_.reset();
  return true;
}

void Completion::wait() {
  if (!event_) return;
  check(cudaEventSynchronize(event_->event), "cudaEventSynchronize");
  event_.reset();
}

void allreduce(Group& group, void* data, std::size_t count, ElementType type, ReduceOp op) {
  Kokkos::fence();
  check(ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), group.comm, group.stream),
        "ncclAllReduce");
  check(cudaStreamSynchronize(group.stream), "cudaStreamSynchronize");
}

void allgather(Group& group, const void* send, void* recv, std::size_t count, ElementType type) {
  Kokkos::fence();
  check(ncclAllGather(send, recv, count, nccl_type(type), group.comm, group.stream),
        "ncclAllGather");
  check(cudaStreamSynchronize(group.stream), "cudaStreamSynchronize");
}

void reduce_scatter(Group& group, const void* send, void* recv, std::size_t count, ElementType type,
                    ReduceOp op) {
  Kokkos::fence();
  check(
      ncclReduceScatter(send, recv, count, nccl_type(type), nccl_op(op), group.comm, group.stream),
      "ncclReduceScatter");
  check(cudaStreamSynchronize(group.stream), "cudaStreamSynchronize");
}

Completion exchange(Group& group, const std::vector<Send>& sends,
                    const std::vector<Receive>& receives, ElementType type) {
  Kokkos::fence();
  const ncclDataType_t t = nccl_type(type);
  check(ncclGroupStart(), "ncclGroupStart");
  for (const Receive& r : receives)
    if (r.count > 0)
      check(ncclRecv(r.data, r.count, t, r.peer, group.comm, group.stream), "ncclRecv");
  for (const Send& s : sends)
    if (s.count > 0)
      check(ncclSend(s.data, s.count, t, s.peer, group.comm, group.stream), "ncclSend");
  check(ncclGroupEnd(), "ncclGroupEnd");
  auto done = std::make_shared<Completion::Event>();
  check(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(done->event, group.stream), "cudaEventRecord");
  return Completion(std::move(done));
}

#else  // no NCCL in this build

namespace {
[[noreturn]] void not_built() {
  throw Error("NCCL: this build has no NCCL backend (a CUDA build with NCCL has one)");
}
}  // namespace

struct Group {};
struct Completion::Event {};

std::shared_ptr<Group> create_group(MPI_Comm) {
  not_built();
}
bool Completion::test() {
  return true;
}
void Completion::wait() {}
void allreduce(Group&, void*, std::size_t, ElementType, ReduceOp) {
  not_built();
}
void allgather(Group&, const void*, void*, std::size_t, ElementType) {
  not_built();
}
void reduce_scatter(Group&, const void*, void*, std::size_t, ElementType, ReduceOp) {
  not_built();
}
Completion exchange(Group&, const std::vector<Send>&, const std::vector<Receive>&, ElementType) {
  not_built();
}

#endif

}  // namespace shardtensor::impl::nccl
