#include "shardtensor/comm/halo_exchange.hpp"

#include <algorithm>
#include <type_traits>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/comm/transport.hpp"
#include "shardtensor/core/box_copy.hpp"

namespace shardtensor {

namespace {

constexpr int directions_per_plan = 27;

/// 0..26, one per direction.
int direction_index(const Direction& d) {
  return (d[0] + 1) * 9 + (d[1] + 1) * 3 + (d[2] + 1);
}

Direction opposite(const Direction& d) {
  return {-d[0], -d[1], -d[2]};
}

/// Owned cells a neighbour at `d` needs for its ghost region at -d.
Box send_box_towards(const Direction& d, const SpatialIndex& extent, const GhostWidths& g) {
  Box b;
  for (int k = 0; k < max_spatial_dims; ++k) {
    if (d[k] > 0) {
      b.lower[k] = g.lower[k] + (extent[k] - g.lower[k]);  // the last g.lower[k] owned cells
      b.extent[k] = g.lower[k];
    } else if (d[k] < 0) {
      b.lower[k] = g.lower[k];  // the first g.upper[k] owned cells
      b.extent[k] = g.upper[k];
    } else {
      b.lower[k] = g.lower[k];
      b.extent[k] = extent[k];
    }
  }
  return b;
}

/// This shard's ghost region towards `d`.
Box ghost_box_towards(const Direction& d, const SpatialIndex& extent, const GhostWidths& g) {
  Box b;
  for (int k = 0; k < max_spatial_dims; ++k) {
    if (d[k] > 0) {
      b.lower[k] = g.lower[k] + extent[k];
      b.extent[k] = g.upper[k];
    } else if (d[k] < 0) {
      b.lower[k] = 0;
      b.extent[k] = g.lower[k];
    } else {
      b.lower[k] = g.lower[k];
      b.extent[k] = extent[k];
    }
  }
  return b;
}

/// A ghost region may only reach one shard deep: every shard that has a neighbour on a side
/// must own at least as many cells as that neighbour's ghost region facing it. Every rank
/// checks every rank, so all ranks throw the same error together.
void check_widths_fit(const Decomposition& decomposition, const GhostWidths& g) {
  for (int r = 0; r < decomposition.nranks(); ++r) {
    for (int k = 0; k < decomposition.ndims(); ++k) {
      Direction up{0, 0, 0}, down{0, 0, 0};
      up[k] = 1;
      down[k] = -1;
      const Index extent = decomposition.extent(r, k);
      SHARDTENSOR_REQUIRE(decomposition.neighbor(r, up) == no_neighbor || g.lower[k] <= extent,
                          "HaloExchange",
                          "halo width " << g.lower[k] << " exceeds local extent " << extent
                                        << " on rank " << r << " (dim " << k << ")");
      SHARDTENSOR_REQUIRE(decomposition.neighbor(r, down) == no_neighbor || g.upper[k] <= extent,
                          "HaloExchange",
                          "halo width " << g.upper[k] << " exceeds local extent " << extent
                                        << " on rank " << r << " (dim " << k << ")");
    }
  }
}

/// `box` (all batches and channels) of a field View, as a transport names it.
template <class T>
impl::BoxLayout layout_of(const FieldView<T>& field, const Box& box) {
  impl::BoxLayout layout;
  for (int a = 0; a < 5; ++a) {
    layout.shape[a] = static_cast<int>(field.extent(a));
    layout.extent[a] = a < 2 ? layout.shape[a] : static_cast<int>(box.extent[a - 2]);
    layout.lower[a] = a < 2 ? 0 : static_cast<int>(box.lower[a - 2]);
  }
  return layout;
}

}  // namespace

template <class T>
HaloExchange<T>::HaloExchange(const Communicator& comm, const ShardTensor<T>& like)
    : comm_(comm),
      space_(independent_instance()),
      decomposition_(like.decomposition()),
      ghosts_(like.ghosts()),
      batch_(like.batch()),
      channels_(like.channels()) {
  impl::check_layout_on_all_ranks(comm_, like, "HaloExchange");
  check_widths_fit(decomposition_, ghosts_);
  tag_base_ = comm_.reserve_tags(2 * directions_per_plan);

  const int rank = comm.rank();
  const SpatialIndex extent = decomposition_.box(rank).extent;
  const Index values_per_cell = batch_ * channels_;
  std::size_t send_total = 0, recv_total = 0;
  const int ndims = decomposition_.ndims();
  int message_of_direction[directions_per_plan];
  std::fill(message_of_direction, message_of_direction + directions_per_plan, -1);
  for (int dx = -1; dx <= 1; ++dx) {
    for (int dy = -1; dy <= 1; ++dy) {
      for (int dz = -1; dz <= 1; ++dz) {
        const Direction d{dx, dy, dz};
        if ((ndims < 2 && dy != 0) || (ndims < 3 && dz != 0) || d == Direction{0, 0, 0}) continue;
        const int neighbor = decomposition_.neighbor(rank, d);
        if (neighbor == no_neighbor) continue;
        Message m{neighbor,
                  d,
                  send_box_towards(d, extent, ghosts_),
                  ghost_box_towards(d, extent, ghosts_),
                  0,
                  0,
                  0,
                  0};
        m.send_count = static_cast<std::size_t>(m.send_box.size() * values_per_cell);
        m.recv_count = static_cast<std::size_t>(m.recv_box.size() * values_per_cell);
        if (m.send_count == 0 && m.recv_count == 0) continue;
        m.send_offset = send_total;
        m.recv_offset = recv_total;
        send_total += m.send_count;
        recv_total += m.recv_count;
        message_of_direction[direction_index(d)] = static_cast<int>(messages_.size());
        messages_.push_back(m);
      }
    }
  }
  // On a periodic axis with one process, the neighbour in both directions is this rank.
  for (Message& m : messages_)
    if (m.neighbor == rank)
      m.self_partner = message_of_direction[direction_index(opposite(m.direction))];

  send_total_ = send_total;
  recv_total_ = recv_total;
  receive_message_.reserve(messages_.size());
  // Where the transport can, messages go straight out of and into the field's boxes.
  if (impl::transport_for<DefaultMemorySpace>(comm_).moves_boxes())
    for (const Message& m : messages_) {
      ghost_layouts_.push_back(layout_of(like.view(), m.recv_box));
      owned_layouts_.push_back(layout_of(like.view(), m.send_box));
    }
}

template <class T>
HaloWire HaloExchange<T>::wire_for_bfloat16_values() const {
  // It pays where every message is unpacked anyway (no receiving into the ghost cells).
  return std::is_same_v<T, float> &&
                 bfloat16_on_the_wire(comm_.options().bf16_wire, ghost_layouts_.empty())
             ? HaloWire::bfloat16
             : HaloWire::native;
}

template <class T>
int HaloExchange<T>::forward_tag(const Direction& d) const {
  return tag_base_ + direction_index(d);
}

template <class T>
int HaloExchange<T>::reverse_tag(const Direction& d) const {
  return tag_base_ + directions_per_plan + direction_index(d);
}

template <class T>
void HaloExchange<T>::check_field(const ShardTensor<T>& field, Phase expected,
                                  const char* where) const {
  SHARDTENSOR_REQUIRE(
      phase_ == expected, where,
      (phase_ == Phase::idle ? "no exchange in progress" : "an exchange is already in progress")
          << " on rank " << comm_.rank());
  SHARDTENSOR_REQUIRE(
      field.rank() == comm_.rank() && field.batch() == batch_ && field.channels() == channels_ &&
          field.ghosts() == ghosts_ && field.decomposition() == decomposition_,
      where,
      "field (batch " << field.batch() << ", channels " << field.channels() << ", ghosts "
                      << field.ghosts() << ", " << field.decomposition().describe()
                      << ") does not match the plan (batch " << batch_ << ", channels " << channels_
                      << ", ghosts " << ghosts_ << ", " << decomposition_.describe() << ") on rank "
                      << comm_.rank());
  SHARDTENSOR_REQUIRE(
      expected == Phase::idle || field.view().data() == in_flight_, where,
      "called with another field than the one its start() was given, on rank " << comm_.rank());
}

template <class T>
void HaloExchange<T>::begin_phase(Phase phase, const ShardTensor<T>& field, HaloWire wire,
                                  OwnedCells owned) {
  ExecutionSpace().fence();  // the kernels that wrote the field, before the plan's own instance
  wire_ = wire;
  sends_in_place_ = in_place() && (phase == Phase::reverse || owned == OwnedCells::unchanged);
  // A bfloat16 value takes half of a leased float.
  const auto values = [&](std::size_t count) {
    return wire == HaloWire::bfloat16 ? (count + 1) / 2 : count;
  };
  // MPI in host memory receives forward messages into the ghost cells and sends the adjoint's
  // out of them, and sends forward ones out of unchanged owned cells: then only the adjoint's
  // contributions, which are added, need a buffer (the send buffer's).
  const bool forward = phase == Phase::forward;
  send_lease_ = impl::BufferLease<T>(forward && sends_in_place_ ? 0 : values(send_total_));
  recv_lease_ = impl::BufferLease<T>(in_place() ? 0 : values(recv_total_));
  in_flight_ = field.view().data();
  receive_message_.clear();
  phase_ = phase;
}

template <class T>
Kokkos::View<std::uint16_t*, DefaultMemorySpace, Kokkos::MemoryUnmanaged>
HaloExchange<T>::bfloat16_view(const impl::BufferLease<T>& lease) {
  using Bits = Kokkos::View<std::uint16_t*, DefaultMemorySpace, Kokkos::MemoryUnmanaged>;
  return Bits(reinterpret_cast<std::uint16_t*>(lease.view().data()),
              lease.view().extent(0) * sizeof(T) / sizeof(std::uint16_t));
}

template <class T>
void HaloExchange<T>::post_transfers(const ShardTensor<T>& field, bool reverse) {
  // Forward, owned cells go out of the send buffer and ghosts come into the receive buffer;
  // in reverse the roles swap. Transfers between two ranks also match in the order they are
  // listed (transport.hpp): a rank sends towards d in the plan's order (directions ascending);
  // the neighbour receives that message as its message towards -d, so receives are listed in
  // the opposite order (opposite directions ascending) and the two lists agree on every pair.
  const Buffer& out_values = reverse ? recv_lease_.view() : send_lease_.view();
  const Buffer& in_values = reverse ? send_lease_.view() : recv_lease_.view();
  // Offsets count values of the wire: the buffers' own, or bfloat16 bits inside them.
  const bool bfloat16 = wire_ == HaloWire::bfloat16;
  const std::size_t wire_bytes = value_bytes(wire_);
  const auto out = [&](std::size_t offset) -> const void* {
    return reinterpret_cast<const char*>(out_values.data()) + offset * wire_bytes;
  };
  const auto in = [&](std::size_t offset) -> void* {
    return reinterpret_cast<char*>(in_values.data()) + offset * wire_bytes;
  };
  std::vector<impl::Send> sends;
  std::vector<impl::Receive> receives;
  for (std::size_t i = 0; i < messages_.size(); ++i) {
    const Message& m = messages_[i];
    const std::size_t count = reverse ? m.recv_count : m.send_count;
    if (count == 0 || m.self_partner >= 0) continue;
    const int tag = reverse ? reverse_tag(m.direction) : forward_tag(m.direction);
    if (sends_in_place_)  // forward the owned cells, in reverse the ghost cells
      sends.push_back({m.neighbor, field.view().data(), count, tag,
                       reverse ? &ghost_layouts_[i] : &owned_layouts_[i]});
    else
      sends.push_back({m.neighbor, out(reverse ? m.recv_offset : m.send_offset), count, tag});
  }
  for (std::size_t i = messages_.size(); i-- > 0;) {
    const Message& m = messages_[i];
    const std::size_t count = reverse ? m.send_count : m.recv_count;
    if (count == 0 || m.self_partner >= 0) continue;
    const Direction from = opposite(m.direction);
    const int tag = reverse ? reverse_tag(from) : forward_tag(from);
    if (!reverse && in_place())
      receives.push_back({m.neighbor, field.view().data(), count, tag, &ghost_layouts_[i]});
    else
      receives.push_back({m.neighbor, in(reverse ? m.send_offset : m.recv_offset), count, tag});
    receive_message_.push_back(static_cast<int>(i));
  }
  std::uint64_t bytes = 0;
  for (const impl::Send& send : sends) bytes += send.count * wire_bytes;
  impl::count_bytes_sent(CommKind::halo, bytes);
  transfers_ = impl::transport_for<DefaultMemorySpace>(comm_).exchange(
      sends, receives, bfloat16 ? impl::WireType::bfloat16 : impl::wire_type<T>());
}

template <class T>
void HaloExchange<T>::start(const ShardTensor<T>& field, HaloWire wire, OwnedCells owned) {
  CommTimerScope timer(CommKind::halo);
  check_field(field, Phase::idle, "HaloExchange::start");
  SHARDTENSOR_REQUIRE(
      wire == HaloWire::native || (std::is_same_v<T, float>), "HaloExchange::start",
      "the bfloat16 wire moves float fields, this one has " << sizeof(T) << "-byte values");
  begin_phase(Phase::forward, field, wire, owned);
  for (const Message& m : messages_) {
    if (m.send_count == 0) continue;
    const Box own_ghosts = m.self_partner >= 0 ? messages_[m.self_partner].recv_box : Box{};
    if constexpr (std::is_same_v<T, float>) {
      if (wire == HaloWire::bfloat16) {
        if (m.self_partner >= 0)
          copy_box_bfloat16(space_, field.view(), m.send_box, own_ghosts);
        else
          pack_box_bfloat16(space_, field.view(), m.send_box, bfloat16_view(send_lease_),
                            m.send_offset);
        continue;
      }
    }
    if (m.self_partner >= 0)  // to itself (periodic on one rank): owned cells to ghosts
      copy_box(space_, field.view(), m.send_box, own_ghosts);
    else if (!sends_in_place_)
      pack_box(space_, field.view(), m.send_box, send_lease_.view(), m.send_offset);
  }
  post_transfers(field, /*reverse=*/false);
}

template <class T>
void HaloExchange<T>::finish(const ShardTensor<T>& field) {
  CommTimerScope timer(CommKind::halo);
  check_field(field, Phase::forward, "HaloExchange::finish");
  wait_and_unpack(field, /*reverse=*/false);
}

template <class T>
void HaloExchange<T>::reverse_start(const ShardTensor<T>& field) {
  CommTimerScope timer(CommKind::halo);
  check_field(field, Phase::idle, "HaloExchange::reverse_start");
  begin_phase(Phase::reverse, field, HaloWire::native, OwnedCells::unchanged);
  // Roles swap: ghosts go out of the receive buffer, owned cells' contributions come back
  // into the send buffer.
  for (const Message& m : messages_) {
    if (m.recv_count == 0) continue;
    if (m.self_partner >= 0)  // to itself: its ghosts added into the owned cells they copy
      copy_box(space_, field.view(), m.recv_box, messages_[m.self_partner].send_box,
               UnpackMode::add);
    else if (!in_place())
      pack_box(space_, field.view(), m.recv_box, recv_lease_.view(), m.recv_offset);
  }
  post_transfers(field, /*reverse=*/true);
  // The ghost values are consumed: set to zero once sent (reverse_finish; sent from the
  // field itself, they must stay until then).
}

template <class T>
void HaloExchange<T>::reverse_finish(const ShardTensor<T>& field) {
  CommTimerScope timer(CommKind::halo);
  check_field(field, Phase::reverse, "HaloExchange::reverse_finish");
  wait_and_unpack(field, /*reverse=*/true);
}

template <class T>
void HaloExchange<T>::wait_and_unpack(const ShardTensor<T>& field, bool reverse) {
  const auto unpack = [&](int message) {
    const Message& m = messages_[message];
    if (reverse) {
      unpack_box(space_, send_lease_.view(), field.view(), m.send_box, UnpackMode::add,
                 m.send_offset);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (wire_ == HaloWire::bfloat16) {
        unpack_box_bfloat16(space_, bfloat16_view(recv_lease_), field.view(), m.recv_box,
                            m.recv_offset);
        return;
      }
    }
    unpack_box(space_, recv_lease_.view(), field.view(), m.recv_box, UnpackMode::assign,
               m.recv_offset);
  };
  if (reverse) {
    // Several messages may add into the same owned cell (a corner gets face, edge and corner
    // contributions): they are added in the plan's fixed order, never in arrival order, so
    // the float sums are the same in every run.
    transfers_.wait();
    std::vector<int> in_plan_order = receive_message_;
    std::sort(in_plan_order.begin(), in_plan_order.end());
    for (int message : in_plan_order) unpack(message);
  } else {
    // Forward messages fill disjoint ghost boxes: each is unpacked as it arrives (or is in
    // place already).
    for (int i = transfers_.next_received(); i >= 0; i = transfers_.next_received())
      if (!in_place()) unpack(receive_message_[i]);
  }
  transfers_.wait();  // the sends, before the buffers are packed again (or the field written)
  if (reverse)        // the adjoint's ghost values, sent and added where they came from
    for (const Message& m : messages_) fill_box(space_, field.view(), m.recv_box, T(0));
  space_.fence();  // the unpacked ghosts, before the kernels of the default instance read them
  send_lease_.release();  // idle: another plan's exchange may take them
  recv_lease_.release();
  receive_message_.clear();
  phase_ = Phase::idle;
  wire_ = HaloWire::native;
}

template class HaloExchange<float>;
template class HaloExchange<double>;

}  // namespace shardtensor
