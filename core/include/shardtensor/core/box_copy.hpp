#pragma once
// Copies between a box of a field View and a contiguous buffer: the pack and unpack
// kernels behind halo exchange, gather, scatter and redistribution.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/box.hpp"

namespace shardtensor {

/// How unpack_box combines buffer values with the field.
enum class UnpackMode { assign, add };

namespace impl {

/// Calls cell_op(i, field(n, c, x, y, z)) for every cell of the box and every batch n and
/// channel c, where i counts the cells in C order (n, c, x, y, z). One team per (n, c, x)
/// plane, threads over y, vector lanes over z: no index division per cell, and boxes that
/// are thin in z (z faces, edges, corners) cost no more per cell than thick ones.
template <class FieldView, class CellOp>
void for_each_box_cell(const char* label, const FieldView& field, const Box& box, CellOp cell_op) {
  if (box.empty()) return;
  using Policy = Kokkos::TeamPolicy<typename FieldView::execution_space>;
  const Index nc = field.extent(1);
  const Index bx = box.extent[0], by = box.extent[1], bz = box.extent[2];
  const Index x0 = box.lower[0], y0 = box.lower[1], z0 = box.lower[2];
  const Index planes = static_cast<Index>(field.extent(0)) * nc * bx;
  Kokkos::parallel_for(
      label, Policy(planes, Kokkos::AUTO), KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const Index plane = team.league_rank();
        const Index x = plane % bx, channel_plane = plane / bx;
        const Index n = channel_plane / nc, c = channel_plane % nc;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, by), [&](const Index y) {
          auto* row = &field(n, c, x0 + x, y0 + y, z0);
          const Index first = (plane * by + y) * bz;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, bz),
                               [&](const Index z) { cell_op(first + z, row[z]); });
        });
      });
}

}  // namespace impl

/// Copies field(n, c, box) for every batch n and channel c into `buffer` starting at
/// `offset`, in C order (n, c, x, y, z). `box` is in the View's local indices.
template <class FieldView, class BufferView>
void pack_box(const FieldView& field, const Box& box, const BufferView& buffer,
              std::size_t offset = 0) {
  auto* out = buffer.data() + offset;
  impl::for_each_box_cell(
      "shardtensor::pack_box", field, box,
      KOKKOS_LAMBDA(const Index i, const typename FieldView::value_type& cell) { out[i] = cell; });
}

/// Inverse of pack_box: writes (or adds) the buffer into field(n, c, box).
template <class FieldView, class BufferView>
void unpack_box(const BufferView& buffer, const FieldView& field, const Box& box,
                UnpackMode mode = UnpackMode::assign, std::size_t offset = 0) {
  const auto* in = buffer.data() + offset;
  if (mode == UnpackMode::add) {
    impl::for_each_box_cell(
        "shardtensor::unpack_box_add", field, box,
        KOKKOS_LAMBDA(const Index i, typename FieldView::value_type& cell) { cell += in[i]; });
  } else {
    impl::for_each_box_cell(
        "shardtensor::unpack_box", field, box,
        KOKKOS_LAMBDA(const Index i, typename FieldView::value_type& cell) { cell = in[i]; });
  }
}

/// Sets field(n, c, box) to `value` for every batch and channel.
template <class FieldView>
void fill_box(const FieldView& field, const Box& box, typename FieldView::value_type value) {
  impl::for_each_box_cell(
      "shardtensor::fill_box", field, box,
      KOKKOS_LAMBDA(const Index, typename FieldView::value_type& cell) { cell = value; });
}

}  // namespace shardtensor
