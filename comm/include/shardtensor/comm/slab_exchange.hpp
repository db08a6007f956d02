#pragma once
// SlabExchange: the x-planes past both ends of a shard that its neighbours along x own, received
// into buffers of their own: for a field split only along x (a slab decomposition), these are
// all the ghost cells a window op reads from other ranks, and a kernel that reads them from
// here needs no halo-padded copy of the field (the convolutions' vector kernels).
//
//   SlabExchange<float> slabs(comm, field, 1, 1, periodic);  // posts the messages
//   ... compute what reads no slab ...
//   slabs.wait();  // slabs.lower() and slabs.upper() hold the neighbours' planes

#include <cstdint>
#include <type_traits>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/comm/impl/buffer_pool.hpp"
#include "shardtensor/comm/point_to_point.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

template <class T>
class SlabExchange {
 public:
  SlabExchange() = default;
  /// Posts the exchange: `lower` planes from the neighbour below along x (its last ones) and
  /// `upper` from the one above (its first), and this shard's own planes to them. Past an
  /// open boundary (not `periodic`) nothing moves and that slab is empty. Collective over the
  /// field's ranks, with the same widths on each; every neighbour must own at least the planes
  /// it sends. The field has no ghost cells, and is read until wait(). With `wire` bfloat16
  /// (float fields), the planes travel as bfloat16 bits and arrive rounded (half the bytes;
  /// for a reader that rounds anyway, the same values), widened by wait().
  SlabExchange(const Communicator& comm, const ShardTensor<T>& field, Index lower, Index upper,
               bool periodic, HaloWire wire = HaloWire::native);
  /// Not copied or moved: MPI writes into the buffers until wait(), and a defaulted move
  /// assignment would free them (the members in order) before the pending exchange waited.
  SlabExchange(const SlabExchange&) = delete;
  SlabExchange& operator=(const SlabExchange&) = delete;

  /// Blocks until the slabs are in place.
  void wait();

  /// The wire for a float field read by a kernel that rounds it to bfloat16 (a bf16 layer's
  /// operand), as the communicator's options say: bfloat16 only with `bf16_wire: on` (MPI
  /// receives float slabs in place; bfloat16 ones need a pass to widen them).
  static HaloWire wire_for_bfloat16_readers(const Communicator& comm) {
    return std::is_same<T, float>::value &&
                   bfloat16_on_the_wire(comm.options().bf16_wire, /*pays=*/false)
               ? HaloWire::bfloat16
               : HaloWire::native;
  }

  /// The neighbours' planes as fields (batch, channels, planes, y, z): lower() ends where the
  /// shard begins, upper() begins where it ends. Empty past an open boundary.
  const FieldView<T>& lower() const { return lower_; }
  const FieldView<T>& upper() const { return upper_; }

  /// Whether a shard of `decomposition` gets every ghost cell that windows reaching `lower`
  /// and `upper` cells past its ends along x read from this exchange: split only along x,
  /// and every shard at least as wide as the planes it sends. The same on every rank.
  static bool covers(const Decomposition& decomposition, Index lower, Index upper);

 private:
  using Bits = Kokkos::View<std::uint16_t*, DefaultMemorySpace, Kokkos::MemoryUnmanaged>;
  /// A leased buffer as the bfloat16 wire fills it: twice as many 16-bit values.
  static Bits bits_of(const impl::BufferLease<T>& lease);
  FieldView<T> lower_, upper_;
  // Leased from the communication buffers' pool until wait() (no allocation per exchange):
  // the planes sent, and the bfloat16 wire's received bits.
  impl::BufferLease<T> sent_, lower_bits_, upper_bits_;
  bool bfloat16_ = false;
  PendingExchange pending_;
};

extern template class SlabExchange<float>;
extern template class SlabExchange<double>;

}  // namespace shardtensor
