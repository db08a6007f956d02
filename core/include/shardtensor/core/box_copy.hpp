#pragma once
// Copies between a box of a field View and a contiguous buffer: the pack and unpack
// kernels behind halo exchange, gather, scatter and redistribution.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/box.hpp"

namespace shardtensor {

/// How unpack_box combines buffer values with the field.
enum class UnpackMode { assign, add };

namespace impl {

/// Calls row_op(row, pointer to field(n, c, x, y, box.lower[2])) for every (n, c, x, y) of
/// the box, row counting in C order. A row runs along z, contiguous in field and buffer.
template <class FieldView, class RowOp>
void for_each_box_row(const char* label, const FieldView& field, const Box& box, RowOp row_op) {
  if (box.empty()) return;
  const Index nc = field.extent(1);
  const Index bx = box.extent[0], by = box.extent[1];
  const Index x0 = box.lower[0], y0 = box.lower[1], z0 = box.lower[2];
  const Index rows = static_cast<Index>(field.extent(0)) * nc * bx * by;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<typename FieldView::execution_space>(0, rows),
      KOKKOS_LAMBDA(const Index row) {
        Index r = row;
        const Index y = r % by;
        r /= by;
        const Index x = r % bx;
        r /= bx;
        row_op(row, &field(r / nc, r % nc, x0 + x, y0 + y, z0));
      });
}

}  // namespace impl

/// Copies field(n, c, box) for every batch n and channel c into `buffer` starting at
/// `offset`, in C order (n, c, x, y, z). `box` is in the View's local indices.
template <class FieldView, class BufferView>
void pack_box(const FieldView& field, const Box& box, const BufferView& buffer,
              std::size_t offset = 0) {
  const Index bz = box.extent[2];
  impl::for_each_box_row(
      "shardtensor::pack_box", field, box,
      KOKKOS_LAMBDA(const Index row, const typename FieldView::value_type* in) {
        auto* out = buffer.data() + offset + row * bz;
        for (Index z = 0; z < bz; ++z) out[z] = in[z];
      });
}

/// Inverse of pack_box: writes (or adds) the buffer into field(n, c, box).
template <class FieldView, class BufferView>
void unpack_box(const BufferView& buffer, const FieldView& field, const Box& box,
                UnpackMode mode = UnpackMode::assign, std::size_t offset = 0) {
  const Index bz = box.extent[2];
  const bool add = mode == UnpackMode::add;
  impl::for_each_box_row(
      "shardtensor::unpack_box", field, box,
      KOKKOS_LAMBDA(const Index row, typename FieldView::value_type* out) {
        const auto* in = buffer.data() + offset + row * bz;
        if (add) {
          for (Index z = 0; z < bz; ++z) out[z] += in[z];
        } else {
          for (Index z = 0; z < bz; ++z) out[z] = in[z];
        }
      });
}

/// Sets field(n, c, box) to `value` for every batch and channel.
template <class FieldView>
void fill_box(const FieldView& field, const Box& box, typename FieldView::value_type value) {
  const Index bz = box.extent[2];
  impl::for_each_box_row(
      "shardtensor::fill_box", field, box,
      KOKKOS_LAMBDA(const Index, typename FieldView::value_type* out) {
        for (Index z = 0; z < bz; ++z) out[z] = value;
      });
}

}  // namespace shardtensor
