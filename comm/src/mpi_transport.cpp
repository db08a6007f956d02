// The MPI transport (transport.hpp): host memory in place, device memory on its own pointers
// (a device-aware MPI) or through host staging copies, one staging type for every operation.

#include <algorithm>
#include <array>
#include <limits>
#include <map>

#include "shardtensor/comm/transport.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::impl {

std::size_t wire_size(WireType type) {
  switch (type) {
    case WireType::int8:
    case WireType::uint8:
      return 1;
    case WireType::bfloat16:
      return 2;
    case WireType::int32:
    case WireType::uint32:
    case WireType::float32:
      return 4;
    default:
      return 8;
  }
}

void require_reducible(WireType type, const char* where) {
  SHARDTENSOR_REQUIRE(type != WireType::bfloat16, where,
                      "bfloat16 values are moved, not reduced: reduce them as float");
}

namespace {

MPI_Datatype mpi_datatype(WireType type) {
  switch (type) {
    case WireType::int8:
      return MPI_INT8_T;
    case WireType::uint8:
      return MPI_UINT8_T;
    case WireType::int32:
      return MPI_INT32_T;
    case WireType::uint32:
      return MPI_UINT32_T;
    case WireType::int64:
      return MPI_INT64_T;
    case WireType::uint64:
      return MPI_UINT64_T;
    case WireType::float32:
      return MPI_FLOAT;
    case WireType::bfloat16:  // MPI has no bfloat16: moved as bits, never reduced
      return MPI_UINT16_T;
    default:
      return MPI_DOUBLE;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}

/// MPI counts are ints; the collectives have refused larger counts before they get here.
int to_int(std::size_t count) {
  SHARDTENSOR_REQUIRE(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), "MPI",
                      "message of " << count << " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

std::vector<int> to_ints(const std::vector<std::size_t>& counts) {
  std::vector<int> out;
  for (std::size_t c : counts) out.push_back(to_int(c));
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> displs(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
  return displs;
}

/// The memory MPI reads (a send) or writes (a receive) for one buffer: the buffer itself, or,
/// when staging, a host copy of it. The one staging type of every MPI operation.
class Staged {
 public:
  using HostBytes = Kokkos::View<unsigned char*, Kokkos::HostSpace>;
  using DeviceBytes =
      Kokkos::View<unsigned char*, DefaultMemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  Staged() = default;
  /// `send`: MPI reads the buffer's values (copied to the host copy now).
  Staged(bool stage, const void* data, std::size_t bytes, bool send)
      : buffer_(const_cast<void*>(data)), bytes_(bytes) {
    if (!stage || bytes == 0) return;
    host_ = HostBytes(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mpi_staging"), bytes);
    if (send) Kokkos::deep_copy(host_, device());
  }
  void* data() const { return host_.data() ? static_cast<void*>(host_.data()) : buffer_; }
  /// After a receive: the host copy's values into the buffer.
  void copy_back() const {
    if (host_.data()) Kokkos::deep_copy(device(), host_);
  }

 private:
  DeviceBytes device() const { return DeviceBytes(static_cast<unsigned char*>(buffer_), bytes_); }
  void* buffer_ = nullptr;
  std::size_t bytes_ = 0;
  HostBytes host_;
};

/// An exchange in flight over MPI.
class MpiTransfers final : public Transfers::State {
 public:
  MpiTransfers(std::vector<MPI_Request> receive_requests, std::vector<Staged> received,
               std::vector<MPI_Request> send_requests, std::vector<Staged> sent)
      : receive_requests_(std::move(receive_requests)),
        received_(std::move(received)),
        copied_back_(received_.size(), false),
        returned_(received_.size(), false),
        send_requests_(std::move(send_requests)),
        sent_(std::move(sent)) {}

  ~MpiTransfers() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Request& r : receive_requests_)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
    wait_all(send_requests_);
  }

  bool test() override {
    int received = 0, sent = 0;
    MPI_Testall(static_cast<int>(receive_requests_.size()), receive_requests_.data(), &received,
                MPI_STATUSES_IGNORE);
    MPI_Testall(static_cast<int>(send_requests_.size()), send_requests_.data(), &sent,
                MPI_STATUSES_IGNORE);
    if (received) copy_back_all();
    return received && sent;
  }

  void wait() override {
    wait_all(receive_requests_);
    copy_back_all();
    wait_all(send_requests_);
  }

  int next_received() override {
    int index = MPI_UNDEFINED;
    MPI_Waitany(static_cast<int>(receive_requests_.size()), receive_requests_.data(), &index,
                MPI_STATUS_IGNORE);
    if (index == MPI_UNDEFINED) {  // all complete: the first one not returned yet
      const auto first = std::find(returned_.begin(), returned_.end(), false);
      if (first == returned_.end()) return -1;
      index = static_cast<int>(first - returned_.begin());
    }
    if (!copied_back_[index]) received_[index].copy_back();
    copied_back_[index] = returned_[index] = true;
    return index;
  }

 private:
  static void wait_all(std::vector<MPI_Request>& requests) {
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  }
  void copy_back_all() {
    for (std::size_t i = 0; i < received_.size(); ++i)
      if (!copied_back_[i]) {
        received_[i].copy_back();
        copied_back_[i] = true;
      }
  }

  std::vector<MPI_Request> receive_requests_;
  std::vector<Staged> received_;
  std::vector<bool> copied_back_;
  std::vector<bool> returned_;  // by next_received()
  std::vector<MPI_Request> send_requests_;
  std::vector<Staged> sent_;  // host copies of the sends, alive until they are sent
};

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, MpiMemory memory) : comm_(comm), memory_(memory) {
    MPI_Comm_rank(comm, &rank_);
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& [key, type] : box_types_) MPI_Type_free(&type);
  }
  const char* name() const override {
    return memory_ == MpiMemory::host     ? "mpi"
           : memory_ == MpiMemory::device ? "mpi (device-aware)"
                                          : "mpi (staged)";
  }
  bool moves_boxes() const override { return memory_ == MpiMemory::host; }

  void allreduce(void* data, std::size_t count, WireType type, ReduceOp op) override {
    require_reducible(type, "allreduce");
    Kokkos::fence();
    const Staged buffer = stage(data, count, type, true);
    MPI_Allreduce(MPI_IN_PLACE, buffer.data(), to_int(count), mpi_datatype(type), mpi_op(op),
                  comm_);
    buffer.copy_back();
  }

  void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts,
                  WireType type) override {
    Kokkos::fence();
    const Staged in = stage(send, counts[rank_], type, true);
    const Staged out = stage(recv, sum(counts), type, false);
    const std::vector<int> c = to_ints(counts);
    const std::vector<int> displs = displacements(c);
    const MPI_Datatype t = mpi_datatype(type);
    if (std::all_of(c.begin(), c.end(), [&](int n) { return n == c[0]; }))
      MPI_Allgather(in.data(), c[rank_], t, out.data(), c[0], t, comm_);
    else
      MPI_Allgatherv(in.data(), c[rank_], t, out.data(), c.data(), displs.data(), t, comm_);
    out.copy_back();
  }

  void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts,
                      WireType type, ReduceOp op) override {
    require_reducible(type, "reduce_scatter");
    Kokkos::fence();
    const Staged in = stage(send, sum(counts), type, true);
    const Staged out = stage(recv, counts[rank_], type, false);
    const std::vector<int> c = to_ints(counts);
    MPI_Reduce_scatter(in.data(), out.data(), c.data(), mpi_datatype(type), mpi_op(op), comm_);
    out.copy_back();
  }

  void alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                 const std::vector<std::size_t>& recv_counts, WireType type) override {
    Kokkos::fence();
    const Staged in = stage(send, sum(send_counts), type, true);
    const Staged out = stage(recv, sum(recv_counts), type, false);
    const std::vector<int> sc = to_ints(send_counts), rc = to_ints(recv_counts);
    const std::vector<int> sd = displacements(sc), rd = displacements(rc);
    const MPI_Datatype t = mpi_datatype(type);
    MPI_Alltoallv(in.data(), sc.data(), sd.data(), t, out.data(), rc.data(), rd.data(), t, comm_);
    out.copy_back();
  }

  void gatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, int root,
               WireType type) override {
    Kokkos::fence();
    const Staged in = stage(send, counts[rank_], type, true);
    const Staged out = stage(recv, rank_ == root ? sum(counts) : 0, type, false);
    const std::vector<int> c = to_ints(counts);
    const std::vector<int> displs = displacements(c);
    const MPI_Datatype t = mpi_datatype(type);
    MPI_Gatherv(in.data(), c[rank_], t, out.data(), c.data(), displs.data(), t, root, comm_);
    out.copy_back();
  }

  void scatterv(const void* send, const std::vector<std::size_t>& counts, void* recv, int root,
                WireType type) override {
    Kokkos::fence();
    const Staged in = stage(send, rank_ == root ? sum(counts) : 0, type, true);
    const Staged out = stage(recv, counts[rank_], type, false);
    const std::vector<int> c = to_ints(counts);
    const std::vector<int> displs = displacements(c);
    const MPI_Datatype t = mpi_datatype(type);
    MPI_Scatterv(in.data(), c.data(), displs.data(), t, out.data(), c[rank_], t, root, comm_);
    out.copy_back();
  }

  Transfers exchange(const std::vector<Send>& sends, const std::vector<Receive>& receives,
                     WireType type) override {
    Kokkos::fence();
    const MPI_Datatype t = mpi_datatype(type);
    std::vector<MPI_Request> receive_requests(receives.size(), MPI_REQUEST_NULL);
    std::vector<Staged> received;
    for (std::size_t i = 0; i < receives.size(); ++i) {
      const Receive& r = receives[i];
      if (r.box) {
        SHARDTENSOR_REQUIRE(moves_boxes(), "MPI transport",
                            "a receive into a box needs host memory (" << name() << ")");
        received.emplace_back();
        MPI_Irecv(r.data, 1, box_type(*r.box, type), r.peer, r.tag, comm_, &receive_requests[i]);
        continue;
      }
      received.push_back(stage(r.data, r.count, type, false));
      MPI_Irecv(received.back().data(), to_int(r.count), t, r.peer, r.tag, comm_,
                &receive_requests[i]);
    }
    std::vector<MPI_Request> send_requests(sends.size(), MPI_REQUEST_NULL);
    std::vector<Staged> sent;
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const Send& s = sends[i];
      if (s.box) {
        SHARDTENSOR_REQUIRE(moves_boxes(), "MPI transport",
                            "a send from a box needs host memory (" << name() << ")");
        sent.emplace_back();
        MPI_Isend(s.data, 1, box_type(*s.box, type), s.peer, s.tag, comm_, &send_requests[i]);
        continue;
      }
      sent.push_back(stage(s.data, s.count, type, true));
      MPI_Isend(sent.back().data(), to_int(s.count), t, s.peer, s.tag, comm_, &send_requests[i]);
    }
    return Transfers(std::make_unique<MpiTransfers>(std::move(receive_requests),
                                                    std::move(received), std::move(send_requests),
                                                    std::move(sent)));
  }

 private:
  Staged stage(const void* data, std::size_t count, WireType type, bool send) const {
    return Staged(memory_ == MpiMemory::staged, data, count * wire_size(type), send);
  }

  /// The committed subarray datatype of a box, made at its first use and kept: a halo plan
  /// receives into the same boxes at every exchange.
  MPI_Datatype box_type(const BoxLayout& box, WireType type) {
    std::array<int, 16> key;
    std::copy(box.shape, box.shape + 5, key.begin());
    std::copy(box.lower, box.lower + 5, key.begin() + 5);
    std::copy(box.extent, box.extent + 5, key.begin() + 10);
    key[15] = static_cast<int>(type);
    auto [it, made] = box_types_.try_emplace(key, MPI_DATATYPE_NULL);
    if (made) {
      MPI_Type_create_subarray(5, box.shape, box.extent, box.lower, MPI_ORDER_C, mpi_datatype(type),
                               &it->second);
      MPI_Type_commit(&it->second);
    }
    return it->second;
  }

  MPI_Comm comm_;  // the Communicator's own duplicate, which outlives its transports
  MpiMemory memory_;
  int rank_ = 0;
  std::map<std::array<int, 16>, MPI_Datatype> box_types_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, MpiMemory memory) {
  return std::make_unique<MpiTransport>(comm, memory);
}

}  // namespace shardtensor::impl
