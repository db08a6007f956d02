#include "shardtensor/comm/slab_exchange.hpp"

#include <utility>
#include <vector>

#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/core/bfloat16.hpp"
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

/// A plane's values as they are sent: as they are, or as bfloat16 bits.
template <class T>
struct AsIs {
  KOKKOS_INLINE_FUNCTION T operator()(T value) const { return value; }
};
struct AsBfloat16Bits {
  KOKKOS_INLINE_FUNCTION std::uint16_t operator()(float value) const {
    return bfloat16_bits(value);
  }
};

/// One message each way, packed into `sent`: [(n, c), its first `down` planes] for the shard
/// below, then [(n, c), its last `up` planes] for the one above.
template <class T, class Sent, class Convert>
void pack_planes(const FieldView<T>& f, Index down, Index up, const Sent& sent, Convert convert) {
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
        auto* to = sent.data() + to_plane * plane;
        for (Index i = 0; i < plane; ++i) to[i] = convert(from[i]);
      });
  space.fence();
}

/// to's values = the bfloat16 values of `bits` (a slab's, its span long).
void widen_bfloat16(const ExecutionSpace& space,
                    const Kokkos::View<std::uint16_t*, DefaultMemorySpace>& bits,
                    const FieldView<float>& to) {
  if (bits.extent(0) == 0) return;
  float* out = to.data();
  Kokkos::parallel_for(
      "SlabExchange::widen", kernel_range(space, Index(bits.extent(0))),
      KOKKOS_LAMBDA(const Index i) { out[i] = bfloat16_value(bits(i)); });
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
                              Index upper, bool periodic, HaloWire wire) {
  const Decomposition& decomposition = field.decomposition();
  SHARDTENSOR_REQUIRE(field.ghosts() == GhostWidths{} && covers(decomposition, lower, upper) &&
                          comm.size() == decomposition.nranks(),
                      "SlabExchange",
                      "needs a field without ghost cells split only along x into shards of at "
                      "least "
                          << std::max(lower, upper) << " planes, over the communicator's "
                          << comm.size() << " ranks; got " << decomposition.nranks() << " shards");
  SHARDTENSOR_REQUIRE(
      wire == HaloWire::native || (std::is_same<T, float>::value), "SlabExchange",
      "the bfloat16 wire moves float fields, this one has " << sizeof(T) << "-byte values");
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
  const Index plane = ny * nz;
  const bool bfloat16 = wire == HaloWire::bfloat16;
  if (bfloat16) {
    if constexpr (std::is_same<T, float>::value) {
      sent_bits_ =
          Bits(Kokkos::view_alloc(no_init, "slab_exchange.sent"), n * c * (down + up) * plane);
      lower_bits_ = Bits(Kokkos::view_alloc(no_init, "slab_exchange.lower"), lower_.span());
      upper_bits_ = Bits(Kokkos::view_alloc(no_init, "slab_exchange.upper"), upper_.span());
      pack_planes(f, down, up, sent_bits_, AsBfloat16Bits{});
    }
  } else {
    sent_ = Kokkos::View<T*, DefaultMemorySpace>(Kokkos::view_alloc(no_init, "slab_exchange.sent"),
                                                 n * c * (down + up) * plane);
    pack_planes(f, down, up, sent_, AsIs<T>{});
  }
  // Where the values travel: the float buffers, or the bfloat16 bits.
  const std::size_t value_bytes = bfloat16 ? sizeof(std::uint16_t) : sizeof(T);
  const char* sent = bfloat16 ? reinterpret_cast<const char*>(sent_bits_.data())
                              : reinterpret_cast<const char*>(sent_.data());
  void* into_upper = bfloat16 ? static_cast<void*>(upper_bits_.data()) : upper_.data();
  void* into_lower = bfloat16 ? static_cast<void*>(lower_bits_.data()) : lower_.data();
  std::vector<impl::Send> sends;
  std::vector<impl::Receive> receives;
  const int tag = comm.operation_tags("slab_exchange", 2);  // +0: travelling down, +1: up
  const std::size_t down_count = std::size_t(n * c * down * plane);
  const std::size_t up_count = std::size_t(n * c * up * plane);
  impl::mpi_count(down_count, "SlabExchange");
  impl::mpi_count(up_count, "SlabExchange");
  if (down > 0) sends.push_back({below, sent, down_count, tag});
  if (up > 0) sends.push_back({above, sent + down_count * value_bytes, up_count, tag + 1});
  // Receives in the opposite order of the sends: where both neighbours are one rank (two
  // shards, periodic), a transport without tags (NCCL) matches them in order.
  if (upper_.extent(2) > 0) receives.push_back({above, into_upper, upper_.span(), tag});
  if (lower_.extent(2) > 0) receives.push_back({below, into_lower, lower_.span(), tag + 1});
  for (const impl::Send& s : sends)
    if (s.peer != rank) impl::count_bytes_sent(CommKind::halo, s.count * value_bytes);
  pending_ = PendingExchange(impl::transport_for<DefaultMemorySpace>(comm).exchange(
      sends, receives, bfloat16 ? impl::WireType::bfloat16 : impl::wire_type<T>()));
}

template <class T>
void SlabExchange<T>::wait() {
  pending_.wait();
  if constexpr (std::is_same<T, float>::value) {
    if (sent_bits_.extent(0) == 0 && lower_bits_.extent(0) == 0 && upper_bits_.extent(0) == 0)
      return;
    // Widen the bfloat16 slabs; the bit buffers go.
    const ExecutionSpace space;
    widen_bfloat16(space, lower_bits_, lower_);
    widen_bfloat16(space, upper_bits_, upper_);
    sent_bits_ = lower_bits_ = upper_bits_ = Bits();
  }
}

template class SlabExchange<float>;
template class SlabExchange<double>;

}  // namespace shardtensor
