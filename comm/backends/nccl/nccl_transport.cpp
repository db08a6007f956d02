// The NCCL transport (transport.hpp): every operation on device memory on the communicator's
// own CUDA stream; allreduce, allgather and equal-block reduce-scatter natively, the rest as
// grouped ncclSend / ncclRecv. Built when the CUDA build finds NCCL (SHARDTENSOR_HAVE_NCCL);
// otherwise make_nccl_transport throws, which nothing reaches (the Communicator refuses the
// nccl backend in such a build). The only file that names NCCL.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "shardtensor/comm/transport.hpp"

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

namespace shardtensor::impl {

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

ncclDataType_t nccl_type(WireType type) {
  switch (type) {
    case WireType::int8:
      return ncclInt8;
    case WireType::uint8:
      return ncclUint8;
    case WireType::int32:
      return ncclInt32;
    case WireType::uint32:
      return ncclUint32;
    case WireType::int64:
      return ncclInt64;
    case WireType::uint64:
      return ncclUint64;
    case WireType::float32:
      return ncclFloat32;
    case WireType::bfloat16:
      return ncclBfloat16;
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

/// The NCCL communicator of a Communicator's ranks, with its own CUDA stream.
struct Group {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  ~Group() {
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
};

/// Collective over `comm`: rank 0's unique id broadcast over MPI, then ncclCommInitRank on the
/// GPU the rank's Kokkos runs on.
std::unique_ptr<Group> create_group(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ncclUniqueId id;
  // Rank 0's failure to make an id is every rank's: the id (or its absence) is broadcast.
  int have_id = rank == 0 ? ncclGetUniqueId(&id) == ncclSuccess : 0;
  MPI_Bcast(&have_id, 1, MPI_INT, 0, comm);
  SHARDTENSOR_REQUIRE(have_id, "NCCL", "rank 0 could not create an NCCL unique id");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
  auto group = std::make_unique<Group>();
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

/// An exchange in flight: an event recorded on the group's stream after its transfers.
class NcclTransfers final : public Transfers::State {
 public:
  NcclTransfers(cudaStream_t stream, std::size_t receives) : receives_(receives) {
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(event_, stream), "cudaEventRecord");
  }
  ~NcclTransfers() override {
    cudaEventSynchronize(event_);  // NCCL cannot cancel: the buffers must outlive the transfers
    cudaEventDestroy(event_);
  }
  bool test() override {
    if (done_) return true;
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaErrorNotReady) return false;
    check(state, "cudaEventQuery");
    return done_ = true;
  }
  void wait() override {
    if (done_) return;
    check(cudaEventSynchronize(event_), "cudaEventSynchronize");
    done_ = true;
  }
  /// The group completes as a whole: after it, the receives in their listed order.
  int next_received() override {
    wait();
    return returned_ < receives_ ? static_cast<int>(returned_++) : -1;
  }

 private:
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
  std::size_t receives_, returned_ = 0;
};

class NcclTransport final : public Transport {
 public:
  explicit NcclTransport(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  const char* name() const override { return "nccl"; }

  void allreduce(void* data, std::size_t count, WireType type, ReduceOp op) override {
    require_reducible(type, "allreduce");
    Group& g = group();
    check(ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), g.comm, g.stream),
          "ncclAllReduce");
    synchronize(g);
  }

  void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                  WireType type) override {
    if (equal(counts)) {
      Group& g = group();
      check(ncclAllGather(send, recv, counts[0], nccl_type(type), g.comm, g.stream),
            "ncclAllGather");
      return synchronize(g);
    }
    std::vector<Send> sends;  // the own block to every rank
    std::vector<Receive> receives;
    std::size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      sends.push_back({r, send, counts[rank_], 0});
      receives.push_back({r, at(recv, offset, type), counts[r], 0});
      offset += counts[r];
    }
    exchange(sends, receives, type).wait();
  }

  void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                      WireType type, ReduceOp op) override {
    require_reducible(type, "reduce_scatter");
    Group& g = group();
    if (equal(counts)) {
      check(
          ncclReduceScatter(send, recv, counts[0], nccl_type(type), nccl_op(op), g.comm, g.stream),
          "ncclReduceScatter");
      return synchronize(g);
    }
    // Unequal blocks (NCCL has no reduce-scatter-v): reduce everything, keep the own block.
    const std::size_t size = wire_size(type);
    const std::size_t all = sum(counts);
    const std::size_t first =
        std::accumulate(counts.begin(), counts.begin() + rank_, std::size_t{0});
    void* reduced = nullptr;
    check(cudaMallocAsync(&reduced, all * size, g.stream), "cudaMallocAsync");
    check(cudaMemcpyAsync(reduced, send, all * size, cudaMemcpyDeviceToDevice, g.stream),
          "cudaMemcpyAsync");
    check(ncclAllReduce(reduced, reduced, all, nccl_type(type), nccl_op(op), g.comm, g.stream),
          "ncclAllReduce");
    check(cudaMemcpyAsync(recv, at(reduced, first, type), counts[rank_] * size,
                          cudaMemcpyDeviceToDevice, g.stream),
          "cudaMemcpyAsync");
    check(cudaFreeAsync(reduced, g.stream), "cudaFreeAsync");
    synchronize(g);
  }

  void alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                 const std::vector<std::size_t>& recv_counts, WireType type) override {
    std::vector<Send> sends;
    std::vector<Receive> receives;
    std::size_t sent = 0, received = 0;
    for (int r = 0; r < size_; ++r) {
      sends.push_back({r, at(send, sent, type), send_counts[r], 0});
      receives.push_back({r, at(recv, received, type), recv_counts[r], 0});
      sent += send_counts[r];
      received += recv_counts[r];
    }
    exchange(sends, receives, type).wait();
  }

  void gatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, int root,
               WireType type) override {
    std::vector<Send> sends{{root, send, counts[rank_], 0}};
    std::vector<Receive> receives;
    std::size_t offset = 0;
    for (int r = 0; rank_ == root && r < size_; ++r) {
      receives.push_back({r, at(recv, offset, type), counts[r], 0});
      offset += counts[r];
    }
    exchange(sends, receives, type).wait();
  }

  void scatterv(const void* send, const std::vector<std::size_t>& counts, void* recv, int root,
                WireType type) override {
    std::vector<Send> sends;
    std::size_t offset = 0;
    for (int r = 0; rank_ == root && r < size_; ++r) {
      sends.push_back({r, at(send, offset, type), counts[r], 0});
      offset += counts[r];
    }
    exchange(sends, {{root, recv, counts[rank_], 0}}, type).wait();
  }

  Transfers exchange(const std::vector<Send>& sends, const std::vector<Receive>& receives,
                     WireType type) override {
    Group& g = group();
    const ncclDataType_t t = nccl_type(type);
    check(ncclGroupStart(), "ncclGroupStart");
    for (const Receive& r : receives)
      if (r.count > 0) check(ncclRecv(r.data, r.count, t, r.peer, g.comm, g.stream), "ncclRecv");
    for (const Send& s : sends)
      if (s.count > 0) check(ncclSend(s.data, s.count, t, s.peer, g.comm, g.stream), "ncclSend");
    check(ncclGroupEnd(), "ncclGroupEnd");
    return Transfers(std::make_unique<NcclTransfers>(g.stream, receives.size()));
  }

 private:
  /// The NCCL communicator (made at the first operation: every rank of the communicator calls
  /// the same operations in the same order), after the Kokkos kernels that wrote the inputs.
  Group& group() {
    Kokkos::fence();
    if (!group_) group_ = create_group(comm_);
    return *group_;
  }
  static void synchronize(Group& g) {
    check(cudaStreamSynchronize(g.stream), "cudaStreamSynchronize");
  }
  static bool equal(const std::vector<std::size_t>& counts) {
    return std::all_of(counts.begin(), counts.end(), [&](std::size_t n) { return n == counts[0]; });
  }
  template <class Pointer>
  static Pointer at(Pointer base, std::size_t elements, WireType type) {
    using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>,
                                    const unsigned char*, unsigned char*>;
    return static_cast<Byte>(base) + elements * wire_size(type);
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Group> group_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(MPI_Comm comm) {
  return std::make_unique<NcclTransport>(comm);
}

#else  // no NCCL in this build

std::unique_ptr<Transport> make_nccl_transport(MPI_Comm) {
  throw Error("NCCL: this build has no NCCL backend (a CUDA build with NCCL has one)");
}

#endif

}  // namespace shardtensor::impl
