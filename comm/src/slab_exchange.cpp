#include "shardtensor/comm/slab_exchange.hpp"

#include <utility>
#include <vector>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"

namespace shardtensor {

namespace {

/// The x-neighbour of `rank` at `step` (-1 or +1): wrapped where periodic, else none past the
/// ends.
int x_neighbor(const Decomposition& decomposition, int rank, int step, bool periodic) {
  std::array<int, max_spatial_dims> coords = decomposition.coords_of(rank);
  const int parts = decomposition.process_grid(0);
  coords[0] += step;
  if (coords[0] < 0 || coords[0] >= parts) {
    if (!periodic) return no_neighbor;
    coords[0] = (coords[0] + parts) % parts;
  }
  return decomposition.rank_of(coords);
}

/// One message each way, packed into `sent`: [(n, c), its first `down` planes] for the shard
/// below, then [(n, c), its last `up` planes] for the one above.
template <class T>
void pack_planes(const FieldView<T>& f, Index down, Index up,
                 const Kokkos::View<T*, DefaultMemorySpace>& sent) {
  const ExecutionSpace space;
  const Index n = f.extent(0), c = f.extent(1), nx = f.extent(2);
  const Index plane = f.extent(3) * f.extent(4);
  Kokkos::parallel_for(
      "SlabExchange::pack", Kokkos::RangePolicy<ExecutionSpace>(space, 0, n * c * (down + up)),
      KOKKOS_LAMBDA(const Index flat) {
        const Index p = flat % (down + up), nc = flat / (down + up);
        const bool going_down = p < down;
        const Index x = going_down ? p : nx - up + (p - down);
        const Index to_plane = going_down ? nc * down + p : n * c * down + nc * up + (p - down);
        const T* from = &f(nc / c, nc % c, x, 0, 0);
        T* to = sent.data() + to_plane * plane;
        for (Index i = 0; i < plane; ++i) to[i] = from[i];
      });
  space.fence();
}

}  // namespace

template <class T>
bool SlabExchange<T>::covers(const Decomposition& decomposition, Index lower, Index upper) {
  if (decomposition.process_grid(0) < 2) return false;
  for (int d = 1; d < max_spatial_dims; ++d)
    if (decomposition.process_grid(d) != 1) return false;
  for (int r = 0; r < decomposition.nranks(); ++r)
    if (decomposition.extent(r, 0) < std::max(lower, upper)) return false;
  return true;
}

template <class T>
SlabExchange<T>::SlabExchange(const Communicator& comm, const ShardTensor<T>& field, Index lower,
                              Index upper, bool periodic) {
  const Decomposition& decomposition = field.decomposition();
  SHARDTENSOR_REQUIRE(field.ghosts() == GhostWidths{} && covers(decomposition, lower, upper) &&
                          comm.size() == decomposition.nranks(),
                      "SlabExchange",
                      "needs a field without ghost cells split only along x into shards of at "
                      "least "
                          << std::max(lower, upper) << " planes, over the communicator's "
                          << comm.size() << " ranks; got " << decomposition.nranks() << " shards");
  const int rank = field.rank();
  const int below = x_neighbor(decomposition, rank, -1, periodic);
  const int above = x_neighbor(decomposition, rank, +1, periodic);
  const FieldView<T>& f = field.view();
  const Index n = f.extent(0), c = f.extent(1), ny = f.extent(3), nz = f.extent(4);
  const Index down = below == no_neighbor ? 0 : upper;  // planes sent to the shard below
  const Index up = above == no_neighbor ? 0 : lower;    // and above
  const MemoryCategoryScope memory(MemoryCategory::comm_buffers);
  const auto no_init = Kokkos::WithoutInitializing;
  lower_ = FieldView<T>(Kokkos::view_alloc(no_init, "slab_exchange.lower"), n, c,
                        below == no_neighbor ? 0 : lower, ny, nz);
  upper_ = FieldView<T>(Kokkos::view_alloc(no_init, "slab_exchange.upper"), n, c,
                        above == no_neighbor ? 0 : upper, ny, nz);
  sent_ = Kokkos::View<T*, DefaultMemorySpace>(Kokkos::view_alloc(no_init, "slab_exchange.sent"),
                                               n * c * (down + up) * ny * nz);
  pack_planes(f, down, up, sent_);
  const Index plane = ny * nz;
  std::vector<impl::Send> sends;
  std::vector<impl::Receive> receives;
  const int tag = comm.operation_tags("slab_exchange", 2);  // +0: travelling down, +1: up
  const std::size_t down_count = std::size_t(n * c * down * plane);
  const std::size_t up_count = std::size_t(n * c * up * plane);
  impl::mpi_count(down_count, "SlabExchange");
  impl::mpi_count(up_count, "SlabExchange");
  if (down > 0) sends.push_back({below, sent_.data(), down_count, tag});
  if (up > 0) sends.push_back({above, sent_.data() + down_count, up_count, tag + 1});
  // Receives in the opposite order of the sends: where both neighbours are one rank (two
  // shards, periodic), a transport without tags (NCCL) matches them in order.
  if (upper_.extent(2) > 0) receives.push_back({above, upper_.data(), upper_.span(), tag});
  if (lower_.extent(2) > 0) receives.push_back({below, lower_.data(), lower_.span(), tag + 1});
  pending_ = PendingExchange(impl::transport_for<DefaultMemorySpace>(comm).exchange(
      sends, receives, impl::wire_type<T>()));
}

template class SlabExchange<float>;
template class SlabExchange<double>;

}  // namespace shardtensor
