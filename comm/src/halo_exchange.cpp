#include "shardtensor/comm/halo_exchange.hpp"

#include <algorithm>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/core/box_copy.hpp"
#include "shardtensor/core/memory_tracker.hpp"

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

/// MPI datatype selecting `box` (all batches and channels) of a field View in C order.
template <class T>
MPI_Datatype subarray_type(const FieldView<T>& layout, const Box& box) {
  int sizes[5], subsizes[5], starts[5];
  for (int a = 0; a < 5; ++a) {
    sizes[a] = static_cast<int>(layout.extent(a));
    subsizes[a] = a < 2 ? sizes[a] : static_cast<int>(box.extent[a - 2]);
    starts[a] = a < 2 ? 0 : static_cast<int>(box.lower[a - 2]);
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Type_create_subarray(5, sizes, subsizes, starts, MPI_ORDER_C, impl::mpi_type<T>(), &type);
  MPI_Type_commit(&type);
  return type;
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

  MemoryCategoryScope memory(MemoryCategory::comm_buffers);
  send_buffer_ = Buffer("halo_send", send_total);
  recv_buffer_ = Buffer("halo_recv", recv_total);
  nccl_ = impl::on_nccl<Buffer>(comm_);
  if (!nccl_ && impl::mpi_stages<DefaultMemorySpace>(comm_)) {
    send_staging_ = HostBuffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "halo_send_staging"),
                               send_total);
    recv_staging_ = HostBuffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "halo_recv_staging"),
                               recv_total);
  }
  ghost_types_.assign(messages_.size(), MPI_DATATYPE_NULL);
  if (receives_in_place)
    for (std::size_t i = 0; i < messages_.size(); ++i)
      if (messages_[i].recv_count > 0 && messages_[i].self_partner < 0)
        ghost_types_[i] = subarray_type(like.view(), messages_[i].recv_box);
  recv_requests_.reserve(messages_.size());
  send_requests_.reserve(messages_.size());
  recv_message_.reserve(messages_.size());
}

template <class T>
HaloExchange<T>::~HaloExchange() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A plan destroyed mid-exchange (e.g. while an exception unwinds) must not leave MPI or
  // NCCL writing into freed buffers.
  try {
    nccl_transfers_.wait();
  } catch (...) {  // a failed transfer is reported where it is waited for, not here
  }
  for (MPI_Request& r : recv_requests_)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
  if (!send_requests_.empty())
    MPI_Waitall(static_cast<int>(send_requests_.size()), send_requests_.data(),
                MPI_STATUSES_IGNORE);
  for (MPI_Datatype& type : ghost_types_)
    if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
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
void HaloExchange<T>::begin_phase(Phase phase, const ShardTensor<T>& field) {
  ExecutionSpace().fence();  // the kernels that wrote the field, before the plan's own instance
  in_flight_ = field.view().data();
  recv_requests_.clear();
  send_requests_.clear();
  recv_message_.clear();
  phase_ = phase;
}

template <class T>
void HaloExchange<T>::post_receive(T* data, std::size_t count, MPI_Datatype type, int neighbor,
                                   int tag, int message) {
  recv_requests_.emplace_back();
  recv_message_.push_back(message);
  MPI_Irecv(data, static_cast<int>(count), type, neighbor, tag, comm_.get(),
            &recv_requests_.back());
}

template <class T>
void HaloExchange<T>::post_send(const Buffer& buffer, const HostBuffer& staging, std::size_t offset,
                                std::size_t count, int neighbor, int tag) {
  space_.fence();  // the packing kernel is done: send while the next message packs
  if (staging.data()) {
    const Kokkos::pair<std::size_t, std::size_t> range(offset, offset + count);
    Kokkos::deep_copy(space_, Kokkos::subview(staging, range), Kokkos::subview(buffer, range));
    space_.fence();
  }
  send_requests_.emplace_back();
  MPI_Isend(mpi_memory(buffer, staging) + offset, static_cast<int>(count), impl::mpi_type<T>(),
            neighbor, tag, comm_.get(), &send_requests_.back());
}

template <class T>
void HaloExchange<T>::start_nccl(const Buffer& out, bool reverse, const Buffer& in) {
  // Transfers between two ranks match in the order they are listed. A rank sends towards d in
  // the plan's order (directions ascending); the neighbour receives that message as its
  // message towards -d, so receives are listed in the opposite order (opposite directions
  // ascending) and the two lists agree on every pair of ranks.
  std::vector<impl::nccl::Send> sends;
  std::vector<impl::nccl::Receive> receives;
  for (const Message& m : messages_) {
    if (m.self_partner >= 0) continue;
    const std::size_t offset = reverse ? m.recv_offset : m.send_offset;
    const std::size_t count = reverse ? m.recv_count : m.send_count;
    if (count > 0) sends.push_back({m.neighbor, out.data() + offset, count});
  }
  for (std::size_t i = messages_.size(); i-- > 0;) {
    const Message& m = messages_[i];
    if (m.self_partner >= 0) continue;
    const std::size_t offset = reverse ? m.send_offset : m.recv_offset;
    const std::size_t count = reverse ? m.send_count : m.recv_count;
    if (count == 0) continue;
    receives.push_back({m.neighbor, in.data() + offset, count});
    recv_message_.push_back(static_cast<int>(i));
  }
  nccl_transfers_ =
      impl::nccl::exchange(*comm_.nccl(), sends, receives, impl::nccl::element_type<T>());
}

template <class T>
void HaloExchange<T>::start(const ShardTensor<T>& field) {
  CommTimerScope timer(CommKind::halo);
  check_field(field, Phase::idle, "HaloExchange::start");
  begin_phase(Phase::forward, field);
  if (nccl_) {
    for (const Message& m : messages_) {
      if (m.send_count == 0) continue;
      if (m.self_partner >= 0)
        copy_box(space_, field.view(), m.send_box, messages_[m.self_partner].recv_box);
      else
        pack_box(space_, field.view(), m.send_box, send_buffer_, m.send_offset);
    }
    start_nccl(send_buffer_, /*reverse=*/false, recv_buffer_);
    return;
  }
  for (std::size_t i = 0; i < messages_.size(); ++i) {
    const Message& m = messages_[i];
    if (m.recv_count == 0 || m.self_partner >= 0) continue;
    const int tag = forward_tag(opposite(m.direction));
    if (receives_in_place)
      post_receive(field.view().data(), 1, ghost_types_[i], m.neighbor, tag, int(i));
    else
      post_receive(mpi_memory(recv_buffer_, recv_staging_) + m.recv_offset, m.recv_count,
                   impl::mpi_type<T>(), m.neighbor, tag, int(i));
  }
  for (const Message& m : messages_) {
    if (m.send_count == 0) continue;
    if (m.self_partner >= 0) {  // to itself (periodic on one rank): owned cells to ghosts
      copy_box(space_, field.view(), m.send_box, messages_[m.self_partner].recv_box);
      continue;
    }
    pack_box(space_, field.view(), m.send_box, send_buffer_, m.send_offset);
    post_send(send_buffer_, send_staging_, m.send_offset, m.send_count, m.neighbor,
              forward_tag(m.direction));
  }
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
  begin_phase(Phase::reverse, field);
  // Roles swap: ghosts go out of the receive buffer, owned cells' contributions come back
  // into the send buffer.
  if (nccl_) {
    for (const Message& m : messages_) {
      if (m.recv_count == 0) continue;
      if (m.self_partner >= 0)
        copy_box(space_, field.view(), m.recv_box, messages_[m.self_partner].send_box,
                 UnpackMode::add);
      else
        pack_box(space_, field.view(), m.recv_box, recv_buffer_, m.recv_offset);
    }
    start_nccl(recv_buffer_, /*reverse=*/true, send_buffer_);
    for (const Message& m : messages_) fill_box(space_, field.view(), m.recv_box, T(0));
    return;
  }
  for (std::size_t i = 0; i < messages_.size(); ++i) {
    const Message& m = messages_[i];
    if (m.send_count == 0 || m.self_partner >= 0) continue;
    post_receive(mpi_memory(send_buffer_, send_staging_) + m.send_offset, m.send_count,
                 impl::mpi_type<T>(), m.neighbor, reverse_tag(opposite(m.direction)), int(i));
  }
  for (const Message& m : messages_) {
    if (m.recv_count == 0) continue;
    if (m.self_partner >= 0) {  // to itself: its ghosts added into the owned cells they copy
      copy_box(space_, field.view(), m.recv_box, messages_[m.self_partner].send_box,
               UnpackMode::add);
      continue;
    }
    pack_box(space_, field.view(), m.recv_box, recv_buffer_, m.recv_offset);
    post_send(recv_buffer_, recv_staging_, m.recv_offset, m.recv_count, m.neighbor,
              reverse_tag(m.direction));
  }
  // The ghost values now live in the buffer; in the adjoint they are consumed.
  for (const Message& m : messages_) fill_box(space_, field.view(), m.recv_box, T(0));
}

template <class T>
void HaloExchange<T>::reverse_finish(const ShardTensor<T>& field) {
  CommTimerScope timer(CommKind::halo);
  check_field(field, Phase::reverse, "HaloExchange::reverse_finish");
  wait_and_unpack(field, /*reverse=*/true);
}

template <class T>
void HaloExchange<T>::wait_and_unpack(const ShardTensor<T>& field, bool reverse) {
  const bool in_place = receives_in_place && !reverse;
  // In reverse several messages may add into the same owned cell (a corner gets face, edge
  // and corner contributions): they are added in the plan's fixed order, never in arrival
  // order, so the float sums are the same in every run. Forward messages fill disjoint
  // ghost boxes and are unpacked as they arrive (over MPI; NCCL's group completes at once).
  const bool fixed_order = in_place || reverse || nccl_;
  if (nccl_) {
    nccl_transfers_.wait();
    std::sort(recv_message_.begin(), recv_message_.end());
  } else if (fixed_order) {
    MPI_Waitall(static_cast<int>(recv_requests_.size()), recv_requests_.data(),
                MPI_STATUSES_IGNORE);
  }
  for (std::size_t done = 0; !in_place && done < recv_message_.size(); ++done) {
    int index = static_cast<int>(done);
    if (!fixed_order)
      MPI_Waitany(static_cast<int>(recv_requests_.size()), recv_requests_.data(), &index,
                  MPI_STATUS_IGNORE);
    const Message& m = messages_[recv_message_[index]];
    const Buffer& buffer = reverse ? send_buffer_ : recv_buffer_;
    const HostBuffer& staging = reverse ? send_staging_ : recv_staging_;
    const std::size_t offset = reverse ? m.send_offset : m.recv_offset;
    const std::size_t count = reverse ? m.send_count : m.recv_count;
    if (staging.data()) {
      const Kokkos::pair<std::size_t, std::size_t> range(offset, offset + count);
      Kokkos::deep_copy(space_, Kokkos::subview(buffer, range), Kokkos::subview(staging, range));
    }
    unpack_box(space_, buffer, field.view(), reverse ? m.send_box : m.recv_box,
               reverse ? UnpackMode::add : UnpackMode::assign, offset);
  }
  space_.fence();  // the unpacked ghosts, before the kernels of the default instance read them
  MPI_Waitall(static_cast<int>(send_requests_.size()), send_requests_.data(), MPI_STATUSES_IGNORE);
  recv_requests_.clear();
  send_requests_.clear();
  recv_message_.clear();
  phase_ = Phase::idle;
}

template class HaloExchange<float>;
template class HaloExchange<double>;

}  // namespace shardtensor
