#pragma once
// Communicator: ShardTensor's own duplicate of the caller's MPI communicator.

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/comm_options.hpp"

namespace shardtensor {

struct RankMesh;
namespace impl {
class Transport;
}

/// A duplicate of an MPI communicator, so that ShardTensor's messages never match a
/// solver's own. Copies share the duplicate; the last copy frees it (unless MPI has
/// already been finalized). Its options say how device memory moves (comm_options.hpp); the
/// communicators derived from it (reordered, mesh) inherit them.
class Communicator {
 public:
  /// Duplicates `comm` (collective over `comm`).
  explicit Communicator(MPI_Comm comm = MPI_COMM_WORLD, const CommOptions& options = {});

  /// A duplicate of this communicator that moves device memory as `options` say. Collective.
  Communicator with_options(const CommOptions& options) const;

  MPI_Comm get() const;
  const CommOptions& options() const;
  /// How buffers in host memory and in device memory move between the ranks (transport.hpp):
  /// chosen once, when the duplicate is made, from the options.
  impl::Transport& host_transport() const;
  impl::Transport& device_transport() const;
  /// Identifies the duplicate (shared by copies) while any copy lives: a key for caches of
  /// plans, which hold a copy and so keep the id from being reused.
  std::uintptr_t id() const { return reinterpret_cast<std::uintptr_t>(handle_.get()); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  void barrier() const;

  /// Collective error agreement: every rank passes its own error message (empty when it
  /// found none). If any rank found one, every rank throws shardtensor::Error with the
  /// lowest failing rank's message, so no rank is left waiting in a later collective.
  void agree(const std::string& local_error) const;

  /// Collective check that `values` are the same on every rank; otherwise every rank
  /// throws "<where>: <what> differs between ranks: rank r has (...), rank s has (...)".
  void require_same(const std::vector<long long>& values, const std::string& where,
                    const std::string& what) const;

  /// Collective check that `text` is rank 0's on every rank; otherwise every rank throws
  /// "<where>: <what> differs between ranks", naming the first rank that differs and its first
  /// differing line against rank 0's.
  void require_same_text(const std::string& text, const std::string& where,
                         const std::string& what) const;

  /// Rank `root`'s contents on every rank (resized to root's length). Collective.
  void broadcast(std::string& text, int root = 0) const;
  void broadcast(std::vector<unsigned char>& bytes, int root = 0) const;
  void broadcast(std::vector<std::int64_t>& values, int root = 0) const;

  /// Every rank's `mine` (the same length on every rank), concatenated in rank order.
  std::vector<long long> allgather(const std::vector<long long>& mine) const;

  /// A communicator of the same ranks numbered by `key` (ties: by rank). Collective.
  Communicator reordered(int key) const;

  /// Reserves `count` consecutive message tags for a persistent plan and returns the first.
  /// Plans are built collectively, in the same order on every rank, so every rank gets the
  /// same tags, and plans in flight at the same time never match each other's messages.
  /// Tags below first_plan_tag are left for one-off point-to-point calls (ring_shift).
  int reserve_tags(int count) const;
  static constexpr int first_plan_tag = 64;

  /// The tags of an operation that sends point-to-point messages on every call (ring
  /// attention's blocks): `count` tags reserved on its first call, the same ones after.
  /// Collective in the same sense as reserve_tags (first calls in the same order on every rank).
  int operation_tags(const std::string& operation, int count) const;

  /// Splits the ranks into a (data x domain) mesh: `data_groups` groups of size()/data_groups
  /// consecutive ranks each share one sample (domain parallelism inside a group); ranks at
  /// the same position in different groups form the data-parallel communicator.
  RankMesh mesh(int data_groups) const;

 private:
  struct adopt_tag {};
  Communicator(adopt_tag, MPI_Comm comm, const CommOptions& options);
  struct Handle;
  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

/// A two-level (data x domain) Cartesian rank mesh.
struct RankMesh {
  Communicator world;   ///< all ranks of the mesh
  Communicator domain;  ///< the ranks that share one sample (spatially split)
  Communicator data;    ///< one rank from each data group, at the same domain position
  int data_group = 0;   ///< which data group this rank belongs to (= data.rank())
};

}  // namespace shardtensor
