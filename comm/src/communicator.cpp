#include "shardtensor/comm/communicator.hpp"

#include <map>

#include <algorithm>
#include <sstream>

#include "shardtensor/comm/transport.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shard_tensor.hpp"

#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_Query_cuda_support
#endif

namespace shardtensor {

struct Communicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  CommOptions options;
  std::unique_ptr<impl::Transport> host_transport;    // MPI in place
  std::unique_ptr<impl::Transport> device_transport;  // as the options say
  int next_tag = Communicator::first_plan_tag;
  std::map<std::string, int> operation_tags;  // first tag of each operation's reservation
  /// The transports, chosen once from the options (transport.hpp).
  void choose_transports() {
    using impl::MpiMemory;
    host_transport = impl::make_mpi_transport(comm, MpiMemory::host);
    if (host_reads_default_memory)
      device_transport = impl::make_mpi_transport(comm, MpiMemory::host);
    else if (options.backend == CommBackend::nccl)
      device_transport = impl::make_nccl_transport(comm);
    else
      device_transport = impl::make_mpi_transport(
          comm, options.device_aware_mpi ? MpiMemory::device : MpiMemory::staged);
  }
  ~Handle() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    device_transport.reset();  // before the MPI communicator they move messages over
    host_transport.reset();
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

namespace {
void check_mpi_initialized(const char* where) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  SHARDTENSOR_REQUIRE(initialized, where, "MPI_Init has not been called");
}

constexpr const char* nccl_not_built =
    "backend 'nccl' needs a CUDA build with NCCL; this build has none (use mpi)";

void check_device_aware_mpi(const CommOptions& options) {
  const bool hands_mpi_device_memory =
      options.backend == CommBackend::mpi && options.device_aware_mpi;
  SHARDTENSOR_REQUIRE(!hands_mpi_device_memory || mpi_reads_device_memory(), "Communicator",
                      "device_aware_mpi is set, but this MPI cannot read GPU memory "
                      "(MPIX_Query_cuda_support() is 0): set it false to stage messages "
                      "through host buffers, or use a CUDA-aware MPI");
}
}  // namespace

Communicator::Communicator(MPI_Comm comm, const CommOptions& options) {
  check_mpi_initialized("Communicator");
  SHARDTENSOR_REQUIRE(comm != MPI_COMM_NULL, "Communicator", "MPI_COMM_NULL given");
  SHARDTENSOR_REQUIRE(options.backend != CommBackend::nccl || nccl_available(), "Communicator",
                      nccl_not_built);
  check_device_aware_mpi(options);
  handle_ = std::make_shared<Handle>();
  handle_->options = options;
  MPI_Comm_dup(comm, &handle_->comm);
  handle_->choose_transports();
  MPI_Comm_rank(handle_->comm, &rank_);
  MPI_Comm_size(handle_->comm, &size_);
}

Communicator::Communicator(adopt_tag, MPI_Comm comm, const CommOptions& options) {
  handle_ = std::make_shared<Handle>();
  handle_->comm = comm;
  handle_->options = options;
  handle_->choose_transports();
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

Communicator Communicator::with_options(const CommOptions& options) const {
  return Communicator(get(), options);
}

MPI_Comm Communicator::get() const {
  return handle_->comm;
}

const CommOptions& Communicator::options() const {
  return handle_->options;
}

impl::Transport& Communicator::host_transport() const {
  return *handle_->host_transport;
}

impl::Transport& Communicator::device_transport() const {
  return *handle_->device_transport;
}

bool mpi_reads_device_memory() {
  if (host_reads_default_memory) return true;
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#else
  return true;
#endif
}

const char* to_string(CommBackend backend) {
  return backend == CommBackend::nccl ? "nccl" : "mpi";
}

const char* to_string(Bf16Wire halos) {
  return halos == Bf16Wire::always ? "on" : halos == Bf16Wire::never ? "off" : "auto";
}

int Communicator::reserve_tags(int count) const {
  int* tag_upper_bound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(get(), MPI_TAG_UB, &tag_upper_bound, &found);
  const int upper = found ? *tag_upper_bound : 32767;  // MPI guarantees at least 32767
  SHARDTENSOR_REQUIRE(count > 0 && count <= upper - first_plan_tag, "Communicator::reserve_tags",
                      "cannot reserve " << count << " tags below MPI_TAG_UB " << upper);
  if (handle_->next_tag + count > upper) handle_->next_tag = first_plan_tag;  // wrap around
  const int first = handle_->next_tag;
  handle_->next_tag += count;
  return first;
}

int Communicator::operation_tags(const std::string& operation, int count) const {
  const auto found = handle_->operation_tags.find(operation);
  if (found != handle_->operation_tags.end()) return found->second;
  return handle_->operation_tags[operation] = reserve_tags(count);
}

void Communicator::barrier() const {
  MPI_Barrier(get());
}

void Communicator::agree(const std::string& local_error) const {
  int first_failing = local_error.empty() ? size_ : rank_;
  MPI_Allreduce(MPI_IN_PLACE, &first_failing, 1, MPI_INT, MPI_MIN, get());
  if (first_failing == size_) return;
  int length = rank_ == first_failing ? static_cast<int>(local_error.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, first_failing, get());
  std::string message = rank_ == first_failing ? local_error : std::string(length, ' ');
  MPI_Bcast(&message[0], length, MPI_CHAR, first_failing, get());
  if (size_ > 1) message += " (reported by rank " + std::to_string(first_failing) + ")";
  throw Error(message);
}

namespace {

/// Broadcasts `count` items of `type` in pieces below MPI's int count limit.
void broadcast_pieces(void* data, std::size_t count, std::size_t item_size, MPI_Datatype type,
                      int root, MPI_Comm comm) {
  constexpr std::size_t piece = std::size_t(1) << 30;
  for (std::size_t offset = 0; offset < count; offset += piece)
    MPI_Bcast(static_cast<char*>(data) + offset * item_size,
              static_cast<int>(std::min(piece, count - offset)), type, root, comm);
}

template <class Vector>
void broadcast_vector(Vector& v, MPI_Datatype type, int root, MPI_Comm comm) {
  long long size = static_cast<long long>(v.size());
  MPI_Bcast(&size, 1, MPI_LONG_LONG, root, comm);
  v.resize(static_cast<std::size_t>(size));
  broadcast_pieces(v.data(), v.size(), sizeof(typename Vector::value_type), type, root, comm);
}

}  // namespace

void Communicator::broadcast(std::string& text, int root) const {
  broadcast_vector(text, MPI_CHAR, root, get());
}
void Communicator::broadcast(std::vector<unsigned char>& bytes, int root) const {
  broadcast_vector(bytes, MPI_BYTE, root, get());
}
void Communicator::broadcast(std::vector<std::int64_t>& values, int root) const {
  broadcast_vector(values, MPI_INT64_T, root, get());
}

std::vector<long long> Communicator::allgather(const std::vector<long long>& mine) const {
  std::vector<long long> all(mine.size() * static_cast<std::size_t>(size_));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_LONG_LONG, all.data(),
                static_cast<int>(mine.size()), MPI_LONG_LONG, get());
  return all;
}

Communicator Communicator::reordered(int key) const {
  MPI_Comm ordered = MPI_COMM_NULL;
  MPI_Comm_split(get(), 0, key, &ordered);
  Communicator result(ordered, options());  // a duplicate of it
  MPI_Comm_free(&ordered);
  return result;
}

void Communicator::require_same_text(const std::string& text, const std::string& where,
                                     const std::string& what) const {
  std::string reference = text;
  broadcast(reference);
  std::string problem;
  if (text != reference) {
    std::istringstream mine(text), theirs(reference);
    std::string a, b;
    int line = 0;
    while (true) {
      ++line;
      const bool more_a = bool(std::getline(mine, a)), more_b = bool(std::getline(theirs, b));
      if (!more_a) a = "(end)";
      if (!more_b) b = "(end)";
      if (a != b || (!more_a && !more_b)) break;
    }
    problem = where + ": " + what + " differs between ranks: rank " + std::to_string(rank_) +
              " has '" + a + "' at line " + std::to_string(line) + " where rank 0 has '" + b +
              "'; every rank must pass the same";
  }
  agree(problem);
}

void Communicator::require_same(const std::vector<long long>& values, const std::string& where,
                                const std::string& what) const {
  int count = static_cast<int>(values.size());
  int max_count = count;
  MPI_Allreduce(MPI_IN_PLACE, &max_count, 1, MPI_INT, MPI_MAX, get());
  // Pad to a common length so ranks that disagree on the length still take part.
  std::vector<long long> padded(values);
  padded.resize(max_count + 1, -1);
  padded[max_count] = count;
  std::vector<long long> lowest(padded), highest(padded);
  MPI_Allreduce(MPI_IN_PLACE, lowest.data(), max_count + 1, MPI_LONG_LONG, MPI_MIN, get());
  MPI_Allreduce(MPI_IN_PLACE, highest.data(), max_count + 1, MPI_LONG_LONG, MPI_MAX, get());
  if (lowest == highest) return;
  // Everyone learns every rank's values to name the disagreement.
  std::vector<long long> all(static_cast<std::size_t>(max_count + 1) * size_);
  MPI_Allgather(padded.data(), max_count + 1, MPI_LONG_LONG, all.data(), max_count + 1,
                MPI_LONG_LONG, get());
  auto describe = [&](int r) {
    std::ostringstream os;
    const long long* v = &all[static_cast<std::size_t>(r) * (max_count + 1)];
    os << "rank " << r << " has (";
    for (long long i = 0; i < v[max_count]; ++i) os << (i ? "," : "") << v[i];
    os << ")";
    return os.str();
  };
  int other = 1;
  for (; other < size_; ++other)
    if (!std::equal(all.begin(), all.begin() + max_count + 1,
                    all.begin() + static_cast<std::ptrdiff_t>(other) * (max_count + 1)))
      break;
  SHARDTENSOR_FAIL(where,
                   what << " differs between ranks: " << describe(0) << ", " << describe(other));
}

RankMesh Communicator::mesh(int data_groups) const {
  SHARDTENSOR_REQUIRE(data_groups >= 1 && size_ % data_groups == 0, "Communicator::mesh",
                      data_groups << " data-parallel groups do not divide " << size_ << " ranks");
  int dims[2] = {data_groups, size_ / data_groups};
  int periods[2] = {0, 0};
  MPI_Comm cart = MPI_COMM_NULL;
  MPI_Cart_create(get(), 2, dims, periods, /*reorder=*/0, &cart);
  MPI_Comm data_comm = MPI_COMM_NULL, domain_comm = MPI_COMM_NULL;
  int keep_data[2] = {1, 0};
  int keep_domain[2] = {0, 1};
  MPI_Cart_sub(cart, keep_data, &data_comm);
  MPI_Cart_sub(cart, keep_domain, &domain_comm);
  RankMesh mesh{Communicator(adopt_tag{}, cart, options()),
                Communicator(adopt_tag{}, domain_comm, options()),
                Communicator(adopt_tag{}, data_comm, options()), 0};
  mesh.data_group = mesh.data.rank();
  return mesh;
}

}  // namespace shardtensor
