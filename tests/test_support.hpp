#pragma once
// Shared helpers of the MPI tests: world rank/size, process grids to try, and fields whose
// values are a function of the global index (so any decomposition can be checked).

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtensor/comm.hpp"
#include "shardtensor/core.hpp"

namespace shardtensor::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// `d` with every inner split point along x moved up by one cell: another layout of the same
/// field (a 3-D one: split_points of x, y and z), for redistributions between uneven splits.
inline Decomposition x_splits_moved(const Decomposition& d) {
  std::vector<std::vector<Index>> points{d.split_points(0), d.split_points(1), d.split_points(2)};
  for (std::size_t k = 1; k + 1 < points[0].size(); ++k) points[0][k] += 1;
  return Decomposition::from_split_points(points);
}

/// Every way to write `nranks` as a product of `ndims` ordered factors.
inline std::vector<std::vector<int>> process_grids(int nranks, int ndims) {
  std::vector<std::vector<int>> out;
  std::vector<int> grid(ndims, 1);
  std::function<void(int, int)> visit = [&](int dim, int remaining) {
    if (dim == ndims - 1) {
      grid[dim] = remaining;
      out.push_back(grid);
      return;
    }
    for (int p = 1; p <= remaining; ++p)
      if (remaining % p == 0) {
        grid[dim] = p;
        visit(dim + 1, remaining / p);
      }
  };
  visit(0, nranks);
  return out;
}

/// Linear index of (n, c, global cell) in the whole field.
inline std::uint64_t global_linear_index(const Decomposition& d, Index channels, Index n, Index c,
                                         const SpatialIndex& g) {
  const SpatialIndex e = d.global_extents();
  return static_cast<std::uint64_t>((((n * channels + c) * e[0] + g[0]) * e[1] + g[1]) * e[2] +
                                    g[2]);
}

/// cell(n, c, local) for every allocated cell (ghosts included) of `tensor`, in C order.
template <class T, class F>
void for_each_allocated_cell(const ShardTensor<T>& tensor, F cell) {
  for (Index n = 0; n < tensor.batch(); ++n)
    for (Index c = 0; c < tensor.channels(); ++c)
      for (Index x = 0; x < tensor.allocated_extent(0); ++x)
        for (Index y = 0; y < tensor.allocated_extent(1); ++y)
          for (Index z = 0; z < tensor.allocated_extent(2); ++z) cell(n, c, SpatialIndex{x, y, z});
}

/// Sets every allocated cell (ghosts included) of `tensor` with value(n, c, local, global).
template <class T, class F>
void fill(const ShardTensor<T>& tensor, F value) {
  auto host = Kokkos::create_mirror_view(tensor.view());
  for_each_allocated_cell(tensor, [&](Index n, Index c, const SpatialIndex& l) {
    host(n, c, l[0], l[1], l[2]) = static_cast<T>(value(n, c, l, tensor.to_global(l)));
  });
  Kokkos::deep_copy(tensor.view(), host);
}

/// The allocated cells (ghosts included) of `tensor` for which
/// counts(n, c, local, global, value) is true: fill()'s reading counterpart.
template <class T, class F>
long long count_cells(const ShardTensor<T>& tensor, F counts) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tensor.view());
  long long count = 0;
  for_each_allocated_cell(tensor, [&](Index n, Index c, const SpatialIndex& l) {
    count += counts(n, c, l, tensor.to_global(l), double(host(n, c, l[0], l[1], l[2])));
  });
  return count;
}

/// True if the local cell is a ghost cell (not owned).
template <class T>
bool is_ghost(const ShardTensor<T>& tensor, const SpatialIndex& local) {
  return !tensor.interior_box().contains(local);
}

/// Global index wrapped into the field along periodic axes; false if it lies past an open
/// boundary (then no rank owns it).
inline bool wrap_global(const Decomposition& d, SpatialIndex& g) {
  for (int k = 0; k < max_spatial_dims; ++k) {
    const Index e = d.global_extents()[k];
    if (g[k] >= 0 && g[k] < e) continue;
    if (!d.periodic(k)) return false;
    g[k] = ((g[k] % e) + e) % e;
  }
  return true;
}

/// Sum over all ranks of a local double.
inline double sum_over_ranks(double local) {
  MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return local;
}

/// Runs `body` on every rank and returns the message of the shardtensor::Error it threw
/// ("" if none). Each rank reports whether it threw, so a test can require that all did.
template <class F>
std::string error_message_of(F body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// Number of ranks on which `message` is non-empty.
inline int ranks_with_error(const std::string& message) {
  int n = message.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return n;
}

/// The ways this build moves device memory, each one to test: MPI (staged through host
/// buffers on a GPU); MPI handed device pointers, where the MPI can take them; NCCL, where
/// built and every rank of the node has a GPU of its own (NCCL refuses to share one).
inline std::vector<CommOptions> comm_backends() {
  std::vector<CommOptions> backends{CommOptions{}};
  if (mpi_reads_device_memory()) backends.push_back({CommBackend::mpi, true});
  if (nccl_available()) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int ranks_here = 1;
    MPI_Comm_size(node, &ranks_here);
    MPI_Comm_free(&node);
    int gpus = 0;
#if KOKKOS_VERSION >= 40000
    gpus = Kokkos::num_devices();
#endif
    int own_gpu = ranks_here <= gpus;
    MPI_Allreduce(MPI_IN_PLACE, &own_gpu, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (own_gpu) backends.push_back({CommBackend::nccl, false});
  }
  return backends;
}

inline std::string describe(const CommOptions& options) {
  return std::string(to_string(options.backend)) +
         (options.backend == CommBackend::mpi && options.device_aware_mpi ? " (device-aware)" : "");
}

/// A fresh directory under /tmp for one test (rank 0 names it, every rank uses it), removed
/// at the end.
class TempDir {
 public:
  explicit TempDir(const Communicator& comm) : comm_(comm) {
    char name[] = "/tmp/shardtensor_test_XXXXXX";
    int length = 0;
    if (comm.rank() == 0) {
      if (mkdtemp(name) == nullptr) throw std::runtime_error("TempDir: mkdtemp failed");
      dir_ = name;
      length = static_cast<int>(dir_.size());
    }
    MPI_Bcast(&length, 1, MPI_INT, 0, comm.get());
    dir_.resize(length);
    MPI_Bcast(&dir_[0], length, MPI_CHAR, 0, comm.get());
  }
  /// Kept for inspection when SHARDTENSOR_KEEP_TEST_FILES is set.
  ~TempDir() {
    comm_.barrier();
    if (comm_.rank() == 0 && std::getenv("SHARDTENSOR_KEEP_TEST_FILES") == nullptr)
      std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

 private:
  Communicator comm_;
  std::string dir_;
};

}  // namespace shardtensor::test
