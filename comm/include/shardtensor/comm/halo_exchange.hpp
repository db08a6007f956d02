#pragma once
// HaloExchange: a persistent plan that fills a ShardTensor's ghost cells from its
// neighbours (faces, edges and corners), and its adjoint.

#include <cstdint>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/comm/impl/buffer_pool.hpp"
#include "shardtensor/comm/transport.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// How a forward exchange moves a field's values: as they are (`native`), or, for a float
/// field, as bfloat16 (half the bytes: the operand of a bf16 layer, whose values are bfloat16
/// values already, arrives unchanged; any other value arrives rounded to nearest even). The
/// adjoint moves gradients, which stay float, as they are.
enum class HaloWire { native, bfloat16 };

/// What a caller of HaloExchange::start() does to the field's owned cells until finish():
/// `may_change` (the default: start() packs what it sends, so they may be written meanwhile),
/// or `unchanged` (they are only read, so a transport that moves boxes sends them straight
/// from the field: no send buffer, no packing).
enum class OwnedCells { may_change, unchanged };

/// Built once per (communicator, decomposition, ghost widths, batch, channels). One message
/// per neighbouring rank and direction (up to 26 in 3-D), so corner ghosts arrive in the same
/// single round as faces. An exchange leases the send and receive buffers it needs from the
/// pool that every plan shares (impl::BufferLease) for start()..finish(): a model's many plans
/// hold the buffers of the exchanges in flight, not one pair each, and a steady step allocates
/// none.
///
/// Forward (`start`/`finish`, or `exchange`): ghost cells that lie inside the global field,
/// or across a periodic boundary, receive copies of the owning rank's cells. Ghost cells past
/// an open boundary are left as they are (layers fill them: padding).
///
/// Adjoint (`reverse_start`/`reverse_finish`, or `reverse_accumulate`): the ghost values
/// are sent back and added to the cells they were copied from, and those ghost cells are
/// set to zero. This is the transpose of the forward map: the backward pass of any op that
/// reads ghost cells.
///
/// start() packs and posts non-blocking sends and receives and returns, so interior
/// computation can overlap the communication; finish() waits and unpacks. finish() takes the
/// same field as start(); between the two, owned cells may be read (and written, unless
/// start() was told OwnedCells::unchanged), ghost cells neither read nor written; between
/// reverse_start() and reverse_finish() neither owned nor ghost cells are written.
///
/// How data moves: outgoing boxes are packed by Kokkos kernels into one send buffer, all
/// messages of a phase go to the communicator's transport as one exchange (transport.hpp:
/// MPI, staged or not, or NCCL, as the communicator's options say), and received messages are
/// unpacked by kernels, forward as they arrive. MPI in host memory (Transport::moves_boxes)
/// receives forward messages straight into the ghost cells and sends the adjoint's straight
/// from them, and sends forward messages straight from the owned cells where the caller
/// leaves them unchanged (OwnedCells): then an exchange packs nothing and leases no buffer
/// but the adjoint's receive buffer (its values are added, not written). Interior kernels
/// run while they travel. A message to the rank itself (a periodic axis with one process) is
/// a local copy.
template <class T>
class HaloExchange {
 public:
  /// One message of the plan. Boxes are in the shard's local (allocation) indices.
  struct Message {
    int neighbor;         ///< rank in the communicator
    Direction direction;  ///< where the neighbour lies, each component -1, 0, +1
    Box send_box;         ///< owned cells the neighbour needs (its ghosts at -direction)
    Box recv_box;         ///< this shard's ghost cells towards `direction`
    std::size_t send_offset, send_count;  ///< in the send buffer, elements
    std::size_t recv_offset, recv_count;  ///< in the receive buffer, elements
    /// For a message to this rank itself: index of the message in the opposite direction,
    /// whose ghost box this message's send box fills. -1 otherwise.
    int self_partner = -1;
  };

  /// Collective over `comm`. `like` gives the layout of every field the plan will exchange;
  /// its rank must be comm.rank() and comm.size() must equal its decomposition's rank count.
  /// Throws (on every rank) if the layouts differ between ranks or a ghost region is wider
  /// than the neighbouring shard that must fill it.
  HaloExchange(const Communicator& comm, const ShardTensor<T>& like);
  HaloExchange(const HaloExchange&) = delete;
  HaloExchange& operator=(const HaloExchange&) = delete;

  /// `wire` bfloat16: float fields only. `owned`: whether the caller writes the owned cells
  /// before finish().
  void start(const ShardTensor<T>& field, HaloWire wire = HaloWire::native,
             OwnedCells owned = OwnedCells::may_change);
  void finish(const ShardTensor<T>& field);
  void exchange(const ShardTensor<T>& field, HaloWire wire = HaloWire::native) {
    start(field, wire, OwnedCells::unchanged);
    finish(field);
  }

  void reverse_start(const ShardTensor<T>& field);
  void reverse_finish(const ShardTensor<T>& field);
  void reverse_accumulate(const ShardTensor<T>& field) {
    reverse_start(field);
    reverse_finish(field);
  }

  /// The wire for a float field that holds bfloat16 values (a bf16 layer's operand), as the
  /// communicator's options say (CommOptions::bf16_wire): the same values either way.
  HaloWire wire_for_bfloat16_values() const;

  const std::vector<Message>& messages() const { return messages_; }
  /// Bytes this rank sends in one forward exchange.
  std::size_t bytes_sent(HaloWire wire = HaloWire::native) const {
    return send_total_ * value_bytes(wire);
  }
  /// Bytes this rank receives in one forward exchange.
  std::size_t bytes_received(HaloWire wire = HaloWire::native) const {
    return recv_total_ * value_bytes(wire);
  }

 private:
  using Buffer = Kokkos::View<T*, DefaultMemorySpace>;
  enum class Phase { idle, forward, reverse };

  static std::size_t value_bytes(HaloWire wire) {
    return wire == HaloWire::bfloat16 ? sizeof(std::uint16_t) : sizeof(T);
  }
  void check_field(const ShardTensor<T>& field, Phase expected, const char* where) const;
  void begin_phase(Phase phase, const ShardTensor<T>& field, HaloWire wire, OwnedCells owned);
  /// A leased buffer as the bfloat16 wire fills it: twice as many 16-bit values.
  static Kokkos::View<std::uint16_t*, DefaultMemorySpace, Kokkos::MemoryUnmanaged> bfloat16_view(
      const impl::BufferLease<T>& lease);
  /// Every message of a phase (packed) to the transport as one exchange.
  void post_transfers(const ShardTensor<T>& field, bool reverse);
  /// Forward messages land in, and the adjoint's go out of, the field's ghost cells
  /// (ghost_layouts_), not the buffers: where the transport can and the wire carries the
  /// field's own values. Forward messages go out of its owned cells (owned_layouts_) where,
  /// besides, the caller leaves them unchanged (sends_in_place_).
  bool in_place() const { return !ghost_layouts_.empty() && wire_ == HaloWire::native; }
  void wait_and_unpack(const ShardTensor<T>& field, bool reverse);
  int forward_tag(const Direction& d) const;
  int reverse_tag(const Direction& d) const;

  Communicator comm_;
  ExecutionSpace space_;  // packs, unpacks and staging copies: a stream of its own on a GPU
  int tag_base_ = 0;      // this plan's block of message tags (Communicator::reserve_tags)
  // Layout every exchanged field must have.
  Decomposition decomposition_;
  GhostWidths ghosts_;
  Index batch_, channels_;
  std::vector<Message> messages_;
  std::size_t send_total_ = 0, recv_total_ = 0;  // values in the send and receive buffers
  // Leased for one exchange (begin_phase to the end of wait_and_unpack).
  impl::BufferLease<T> send_lease_, recv_lease_;
  std::vector<int> receive_message_;            // message index of each receive of the exchange
  // Per message, where the transport takes boxes: its ghost box and its send box.
  std::vector<impl::BoxLayout> ghost_layouts_, owned_layouts_;
  Phase phase_ = Phase::idle;
  HaloWire wire_ = HaloWire::native;  // of the exchange in progress
  bool sends_in_place_ = false;       // the exchange in progress sends out of the field
  const T* in_flight_ = nullptr;      // the field of the exchange in progress
  // Last, so destroyed first: a plan destroyed mid-exchange (while an exception unwinds)
  // cancels its transfers before its buffers go.
  impl::Transfers transfers_;
};

extern template class HaloExchange<float>;
extern template class HaloExchange<double>;

}  // namespace shardtensor
