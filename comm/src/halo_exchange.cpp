#include "shardtensor/comm/halo_exchange.hpp"

#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/core/box_copy.hpp"

namespace shardtensor {

namespace {

constexpr int directions_per_plan = 27;

/// Message tag of a direction: 0..26. Reverse messages use tags 27..53.
int direction_tag(const Direction& d) { return (d[0] + 1) * 9 + (d[1] + 1) * 3 + (d[2] + 1); }

Direction opposite(const Direction& d) { return {-d[0], -d[1], -d[2]}; }

/// Owned cells a neighbour at `d` needs for its ghost region at -d.
Box send_box_towards(const Direction& d, const SpatialIndex& extent, const GhostWidths& g) {
  Box b;
  for (int k = 0; k < max_spatial_dims; ++k) {
    if (d[k] > 0) {
      b.lower[k] = g.lower[k] + (extent[k] - g.lower[k]);  // the last g.lower[k] owned cells
      b.extent[k] = g.lower[k];
    } else if (d[k] < 0) {
      b.lower[k] = g.lower[k];
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
                          "HaloExchange", "halo width " << g.lower[k] << " exceeds local extent "
                                                        << extent << " on rank " << r << " (dim "
                                                        << k << ")");
      SHARDTENSOR_REQUIRE(decomposition.neighbor(r, down) == no_neighbor || g.upper[k] <= extent,
                          "HaloExchange", "halo width " << g.upper[k] << " exceeds local extent "
                                                        << extent << " on rank " << r << " (dim "
                                                        << k << ")");
    }
  }
}

}  // namespace

template <class T>
HaloExchange<T>::HaloExchange(const Communicator& comm, const ShardTensor<T>& like)
    : comm_(comm.get()),
      decomposition_(like.decomposition()),
      ghosts_(like.ghosts()),
      batch_(like.batch()),
      channels_(like.channels()) {
  impl::check_layout_on_all_ranks(comm_, like, "HaloExchange");
  check_widths_fit(decomposition_, ghosts_);

  const int rank = comm.rank();
  const SpatialIndex extent = decomposition_.box(rank).extent;
  const Index values_per_cell = batch_ * channels_;
  std::size_t send_total = 0, recv_total = 0;
  const int ndims = decomposition_.ndims();
  for (int dx = -1; dx <= 1; ++dx) {
    for (int dy = -1; dy <= 1; ++dy) {
      for (int dz = -1; dz <= 1; ++dz) {
        const Direction d{dx, ndims > 1 ? dy : 0, ndims > 2 ? dz : 0};
        if ((ndims < 2 && dy != 0) || (ndims < 3 && dz != 0) || d == Direction{0, 0, 0})
          continue;
        const int neighbor = decomposition_.neighbor(rank, d);
        if (neighbor == no_neighbor) continue;
        Message m{neighbor, d, send_box_towards(d, extent, ghosts_),
                  ghost_box_towards(d, extent, ghosts_), 0, 0, 0, 0};
        m.send_count = static_cast<std::size_t>(m.send_box.size() * values_per_cell);
        m.recv_count = static_cast<std::size_t>(m.recv_box.size() * values_per_cell);
        if (m.send_count == 0 && m.recv_count == 0) continue;
        m.send_offset = send_total;
        m.recv_offset = recv_total;
        send_total += m.send_count;
        recv_total += m.recv_count;
        messages_.push_back(m);
      }
    }
  }
  send_buffer_ = Kokkos::View<T*, DefaultMemorySpace>("halo_send", send_total);
  recv_buffer_ = Kokkos::View<T*, DefaultMemorySpace>("halo_recv", recv_total);
  recv_requests_.reserve(messages_.size());
  send_requests_.reserve(messages_.size());
  recv_message_.reserve(messages_.size());
}

template <class T>
HaloExchange<T>::~HaloExchange() {
  // A plan destroyed mid-exchange (e.g. while an exception unwinds) must not leave MPI
  // writing into freed buffers.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Request& r : recv_requests_)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
  if (!send_requests_.empty())
    MPI_Waitall(static_cast<int>(send_requests_.size()), send_requests_.data(),
                MPI_STATUSES_IGNORE);
}

template <class T>
void HaloExchange<T>::check_field(const ShardTensor<T>& field, Phase expected,
                                  const char* where) const {
  SHARDTENSOR_REQUIRE(phase_ == expected, where,
                      (phase_ == Phase::idle ? "no exchange in progress"
                                             : "an exchange is already in progress")
                          << " on rank " << comm_.rank());
  SHARDTENSOR_REQUIRE(field.rank() == comm_.rank() && field.batch() == batch_ &&
                          field.channels() == channels_ && field.ghosts() == ghosts_ &&
                          field.decomposition() == decomposition_,
                      where,
                      "field (batch " << field.batch() << ", channels " << field.channels()
                                      << ", ghosts " << field.ghosts() << ", "
                                      << field.decomposition().describe()
                                      << ") does not match the plan (batch " << batch_
                                      << ", channels " << channels_ << ", ghosts " << ghosts_
                                      << ", " << decomposition_.describe() << ") on rank "
                                      << comm_.rank());
}

template <class T>
void HaloExchange<T>::start(const ShardTensor<T>& field) {
  check_field(field, Phase::idle, "HaloExchange::start");
  const MPI_Datatype type = impl::mpi_type<T>();
  recv_requests_.clear();
  send_requests_.clear();
  recv_message_.clear();
  for (std::size_t i = 0; i < messages_.size(); ++i) {
    const Message& m = messages_[i];
    if (m.recv_count == 0) continue;
    recv_requests_.emplace_back();
    recv_message_.push_back(static_cast<int>(i));
    MPI_Irecv(recv_buffer_.data() + m.recv_offset, static_cast<int>(m.recv_count), type,
              m.neighbor, direction_tag(opposite(m.direction)), comm_.get(),
              &recv_requests_.back());
  }
  for (const Message& m : messages_) {
    if (m.send_count == 0) continue;
    pack_box(field.view(), m.send_box, send_buffer_, m.send_offset);
    Kokkos::fence();  // this message is packed: send it while the next one packs
    send_requests_.emplace_back();
    MPI_Isend(send_buffer_.data() + m.send_offset, static_cast<int>(m.send_count), type,
              m.neighbor, direction_tag(m.direction), comm_.get(), &send_requests_.back());
  }
  phase_ = Phase::forward;
}

template <class T>
void HaloExchange<T>::finish(const ShardTensor<T>& field) {
  check_field(field, Phase::forward, "HaloExchange::finish");
  wait_and_unpack(field, /*reverse=*/false);
}

template <class T>
void HaloExchange<T>::reverse_start(const ShardTensor<T>& field) {
  check_field(field, Phase::idle, "HaloExchange::reverse_start");
  const MPI_Datatype type = impl::mpi_type<T>();
  recv_requests_.clear();
  send_requests_.clear();
  recv_message_.clear();
  // Roles swap: what was sent comes back into the send buffer, ghosts go out of the
  // receive buffer.
  for (std::size_t i = 0; i < messages_.size(); ++i) {
    const Message& m = messages_[i];
    if (m.send_count == 0) continue;
    recv_requests_.emplace_back();
    recv_message_.push_back(static_cast<int>(i));
    MPI_Irecv(send_buffer_.data() + m.send_offset, static_cast<int>(m.send_count), type,
              m.neighbor, directions_per_plan + direction_tag(opposite(m.direction)),
              comm_.get(), &recv_requests_.back());
  }
  for (const Message& m : messages_) {
    if (m.recv_count == 0) continue;
    pack_box(field.view(), m.recv_box, recv_buffer_, m.recv_offset);
    Kokkos::fence();
    send_requests_.emplace_back();
    MPI_Isend(recv_buffer_.data() + m.recv_offset, static_cast<int>(m.recv_count), type,
              m.neighbor, directions_per_plan + direction_tag(m.direction), comm_.get(),
              &send_requests_.back());
  }
  // The ghost values now live in the buffer; in the adjoint they are consumed.
  for (const Message& m : messages_) fill_box(field.view(), m.recv_box, T(0));
  phase_ = Phase::reverse;
}

template <class T>
void HaloExchange<T>::reverse_finish(const ShardTensor<T>& field) {
  check_field(field, Phase::reverse, "HaloExchange::reverse_finish");
  wait_and_unpack(field, /*reverse=*/true);
}

template <class T>
void HaloExchange<T>::wait_and_unpack(const ShardTensor<T>& field, bool reverse) {
  // Unpack each message as it arrives. Messages of one exchange touch disjoint cells in the
  // forward direction; in reverse several may add into the same owned cell, so they are
  // unpacked one after another.
  for (std::size_t done = 0; done < recv_requests_.size(); ++done) {
    int index = MPI_UNDEFINED;
    MPI_Waitany(static_cast<int>(recv_requests_.size()), recv_requests_.data(), &index,
                MPI_STATUS_IGNORE);
    const Message& m = messages_[recv_message_[index]];
    if (reverse)
      unpack_box(send_buffer_, field.view(), m.send_box, UnpackMode::add, m.send_offset);
    else
      unpack_box(recv_buffer_, field.view(), m.recv_box, UnpackMode::assign, m.recv_offset);
  }
  Kokkos::fence();
  MPI_Waitall(static_cast<int>(send_requests_.size()), send_requests_.data(),
              MPI_STATUSES_IGNORE);
  recv_requests_.clear();
  send_requests_.clear();
  phase_ = Phase::idle;
}

template class HaloExchange<float>;
template class HaloExchange<double>;

}  // namespace shardtensor
