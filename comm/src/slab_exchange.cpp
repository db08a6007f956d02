#include "shardtensor/comm/slab_exchange.hpp"

#include <string>
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

/// to's values = the bfloat16 values of the first to.span() of `bits` (a leased buffer's).
void widen_bfloat16(const ExecutionSpace& space, const std::uint16_t* bits,
                    const FieldView<float>& to) {
  if (to.span() == 0) return;
  float* out = to.data();
  Kokkos::parallel_for(
      "SlabExchange::widen", kernel_range(space, Index(to.span())),
      KOKKOS_LAMBDA(const Index i) { out[i] = bfloat16_value(bits[i]); });
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
  // A missing neighbour's slab is an empty field: no View (Kokkos allocates one even empty).
  const auto slab = [&](int neighbor, Index planes, const char* label) {
    const MemoryCategoryScope memory(MemoryCategory::comm_buffers);
    return neighbor == no_neighbor
               ? FieldView<T>(static_cast<T*>(nullptr), n, c, 0, ny, nz)
               : FieldView<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                              n, c, planes, ny, nz);
  };
  lower_ = slab(below, lower, "slab_exchange.lower");
  upper_ = slab(above, upper, "slab_exchange.upper");
  const Index plane = ny * nz;
  const std::size_t sent_values = std::size_t(n * c * (down + up) * plane);
  bfloat16_ = wire == HaloWire::bfloat16;
  if (bfloat16_) {
    if constexpr (std::is_same<T, float>::value) {
      // A bfloat16 value takes half of a leased float.
      sent_ = impl::BufferLease<T>((sent_values + 1) / 2);
      lower_bits_ = impl::BufferLease<T>((lower_.span() + 1) / 2);
      upper_bits_ = impl::BufferLease<T>((upper_.span() + 1) / 2);
      pack_planes(f, down, up, bits_of(sent_), AsBfloat16Bits{});
    }
  } else {
    sent_ = impl::BufferLease<T>(sent_values);
    pack_planes(f, down, up, sent_.view(), AsIs<T>{});
  }
  // Where the values travel: the float buffers, or the bfloat16 bits.
  const std::size_t value_bytes = bfloat16_ ? sizeof(std::uint16_t) : sizeof(T);
  const char* sent = reinterpret_cast<const char*>(sent_.view().data());
  void* into_upper = bfloat16_ ? static_cast<void*>(upper_bits_.view().data()) : upper_.data();
  void* into_lower = bfloat16_ ? static_cast<void*>(lower_bits_.view().data()) : lower_.data();
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
      sends, receives, bfloat16_ ? impl::WireType::bfloat16 : impl::wire_type<T>()));
}

template <class T>
typename SlabExchange<T>::Bits SlabExchange<T>::bits_of(const impl::BufferLease<T>& lease) {
  return Bits(reinterpret_cast<std::uint16_t*>(lease.view().data()),
              lease.view().extent(0) * sizeof(T) / sizeof(std::uint16_t));
}

template <class T>
void SlabExchange<T>::wait() {
  pending_.wait();
  if constexpr (std::is_same<T, float>::value) {
    if (bfloat16_) {  // widen the bfloat16 slabs
      const ExecutionSpace space;
      widen_bfloat16(space, bits_of(lower_bits_).data(), lower_);
      widen_bfloat16(space, bits_of(upper_bits_).data(), upper_);
      space.fence();  // before the bit buffers go back to the pool
    }
  }
  sent_ = impl::BufferLease<T>();
  lower_bits_ = impl::BufferLease<T>();
  upper_bits_ = impl::BufferLease<T>();
}

template class SlabExchange<float>;
template class SlabExchange<double>;

}  // namespace shardtensor
