#pragma once
// Copies between a box of a field View and a contiguous buffer: the pack and unpack
// kernels behind halo exchange, gather, scatter and redistribution. Like every kernel they
// take first the execution space instance they run on (core/execution.hpp), which must be
// able to read the View's memory; they do not fence it.

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/core/box.hpp"
#include "shardtensor/core/cell_index.hpp"

namespace shardtensor {

/// How unpack_box combines buffer values with the field.
enum class UnpackMode { assign, add };

namespace impl {

/// Calls cell_op(i, field(n, c, x, y, z)) for every cell of the box and every batch n and
/// channel c, where i counts the cells in C order (n, c, x, y, z). In parallel over lines
/// along the box's innermost axis longer than one cell (z for a thick box; y for an x face of
/// a 2-D field, whose z lines are single cells), in order along each line: one index
/// decomposition per line, and every launch does a line's worth of work per item.
template <class Space, class FieldView, class CellOp>
void for_each_box_cell(const Space& space, const char* label, const FieldView& field,
                       const Box& box, CellOp cell_op) {
  static_assert(Kokkos::SpaceAccessibility<Space, typename FieldView::memory_space>::accessible,
                "box copies run on an execution space that can read the field's memory");
  if (box.empty()) return;
  const Index nc = field.extent(1);
  const Index e[3] = {box.extent[0], box.extent[1], box.extent[2]};
  const Lines lines(field.extent(0), nc, e);
  const Index lower[3] = {box.lower[0], box.lower[1], box.lower[2]};
  const Index length = lines.length, step = field.stride(2 + lines.axis);
  const Index i_step = lines.axis == 2   ? 1
                       : lines.axis == 1 ? e[2]
                                         : e[1] * e[2];  // i along a line
  // Short lines (a face's) several to a host work item: Lines::lines_per_item.
  const Index per_item = lines.lines_per_item(), count = lines.count;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Space>(space, 0, (count + per_item - 1) / per_item),
      KOKKOS_LAMBDA(const Index item) {
        const Index end = (item + 1) * per_item, last = end < count ? end : count;
        CellIndex c = lines.start(item * per_item);
        for (Index line = item * per_item; line < last; ++line, lines.advance(c)) {
          auto* cell = &field(c.n, c.c, lower[0] + c.x, lower[1] + c.y, lower[2] + c.z);
          const Index first = (((c.n * nc + c.c) * e[0] + c.x) * e[1] + c.y) * e[2] + c.z;
          for (Index k = 0; k < length; ++k) cell_op(first + k * i_step, cell[k * step]);
        }
      });
}

/// How far `from`'s cells lie from `to`'s in one field (same extents), in values.
template <class FieldView>
std::ptrdiff_t box_shift(const FieldView& field, const Box& from, const Box& to) {
  return (from.lower[0] - to.lower[0]) * field.stride(2) +
         (from.lower[1] - to.lower[1]) * field.stride(3) + (from.lower[2] - to.lower[2]);
}

// The cell operations are functors, not lambdas: a CUDA __host__ __device__ lambda defined in
// a header template and handed to another template (for_each_box_cell) is lowered by nvcc to a
// wrapper whose host-side function table is local to one translation unit; when the linker
// keeps another unit's copy of the instantiation, the host calls through a null pointer
// (seen on an H200: halo exchanges at 2 ranks crashed at address 0).
template <class T>
struct StoreInto {  // out[i] = cell
  T* out;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, const T& cell) const { out[i] = cell; }
};
template <class T>
struct AssignFrom {  // cell = in[i]
  const T* in;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, T& cell) const { cell = in[i]; }
};
template <class T>
struct AddFrom {  // cell += in[i]
  const T* in;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, T& cell) const { cell += in[i]; }
};
template <class T, bool add>
struct CopyShifted {  // cell = (or +=) the cell `shift` values away
  std::ptrdiff_t shift;
  KOKKOS_INLINE_FUNCTION void operator()(Index, T& cell) const {
    if (add)
      cell += *(&cell + shift);
    else
      cell = *(&cell + shift);
  }
};
template <class ToView, class FromView, bool add>
struct CopyBetween {  // to(n, c, to_lower + xyz) = (or +=) from(n, c, from_lower + xyz)
  ToView to;
  FromView from;
  Index to_lower[3], from_lower[3];
  KOKKOS_INLINE_FUNCTION void operator()(Index n, Index c, Index x, Index y, Index z) const {
    auto& cell = to(n, c, to_lower[0] + x, to_lower[1] + y, to_lower[2] + z);
    const auto value = from(n, c, from_lower[0] + x, from_lower[1] + y, from_lower[2] + z);
    if (add)
      cell += value;
    else
      cell = value;
  }
};
// The bfloat16 wire of a float field (pack_box_bfloat16): half the bytes, and the same values
// where the field holds bfloat16 values (the operand of a bf16 layer).
struct StoreBfloat16Into {  // out[i] = cell's bfloat16 bits (rounded to nearest even)
  std::uint16_t* out;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, const float& cell) const {
    out[i] = bfloat16_bits(cell);
  }
};
struct AssignFromBfloat16 {  // cell = the bfloat16 value in[i]
  const std::uint16_t* in;
  KOKKOS_INLINE_FUNCTION void operator()(Index i, float& cell) const {
    cell = bfloat16_value(in[i]);
  }
};
struct CopyShiftedBfloat16 {  // cell = the cell `shift` values away, rounded to bfloat16
  std::ptrdiff_t shift;
  KOKKOS_INLINE_FUNCTION void operator()(Index, float& cell) const {
    cell = round_to_bfloat16(*(&cell + shift));
  }
};
template <class T>
struct Fill {  // cell = value
  T value;
  KOKKOS_INLINE_FUNCTION void operator()(Index, T& cell) const { cell = value; }
};

}  // namespace impl

/// Copies field(n, c, box) for every batch n and channel c into `buffer` starting at
/// `offset`, in C order (n, c, x, y, z). `box` is in the View's local indices.
template <class Space, class FieldView, class BufferView>
void pack_box(const Space& space, const FieldView& field, const Box& box, const BufferView& buffer,
              std::size_t offset = 0) {
  using T = typename FieldView::non_const_value_type;
  impl::for_each_box_cell(space, "shardtensor::pack_box", field, box,
                          impl::StoreInto<T>{buffer.data() + offset});
}

/// Inverse of pack_box: writes (or adds) the buffer into field(n, c, box).
template <class Space, class FieldView, class BufferView>
void unpack_box(const Space& space, const BufferView& buffer, const FieldView& field,
                const Box& box, UnpackMode mode = UnpackMode::assign, std::size_t offset = 0) {
  using T = typename FieldView::non_const_value_type;
  const T* in = buffer.data() + offset;
  if (mode == UnpackMode::add)
    impl::for_each_box_cell(space, "shardtensor::unpack_box_add", field, box, impl::AddFrom<T>{in});
  else
    impl::for_each_box_cell(space, "shardtensor::unpack_box", field, box, impl::AssignFrom<T>{in});
}

/// pack_box of a float field into bfloat16 bits (rounded to nearest even): half the bytes of
/// pack_box, and the same values where the field holds bfloat16 values.
template <class Space, class FieldView, class BufferView>
void pack_box_bfloat16(const Space& space, const FieldView& field, const Box& box,
                       const BufferView& buffer, std::size_t offset = 0) {
  static_assert(std::is_same_v<typename FieldView::non_const_value_type, float> &&
                    std::is_same_v<typename BufferView::non_const_value_type, std::uint16_t>,
                "a float field into a buffer of bfloat16 bits");
  impl::for_each_box_cell(space, "shardtensor::pack_box_bfloat16", field, box,
                          impl::StoreBfloat16Into{buffer.data() + offset});
}

/// Inverse of pack_box_bfloat16: field(n, c, box) = the buffer's bfloat16 values (exact).
template <class Space, class BufferView, class FieldView>
void unpack_box_bfloat16(const Space& space, const BufferView& buffer, const FieldView& field,
                         const Box& box, std::size_t offset = 0) {
  static_assert(std::is_same_v<typename FieldView::non_const_value_type, float> &&
                    std::is_same_v<typename BufferView::non_const_value_type, std::uint16_t>,
                "a buffer of bfloat16 bits into a float field");
  impl::for_each_box_cell(space, "shardtensor::unpack_box_bfloat16", field, box,
                          impl::AssignFromBfloat16{buffer.data() + offset});
}

/// field(n, c, to) = field(n, c, from) rounded to bfloat16, cell by cell: copy_box as the
/// bfloat16 wire moves it (a message a rank sends to itself).
template <class Space, class FieldView>
void copy_box_bfloat16(const Space& space, const FieldView& field, const Box& from, const Box& to) {
  static_assert(std::is_same_v<typename FieldView::non_const_value_type, float>,
                "rounds a float field");
  const std::ptrdiff_t shift = impl::box_shift(field, from, to);
  impl::for_each_box_cell(space, "shardtensor::copy_box_bfloat16", field, to,
                          impl::CopyShiftedBfloat16{shift});
}

/// field(n, c, to) = (or +=) field(n, c, from) cell by cell, for two boxes of the same extents
/// in one field: a message a rank sends to itself (periodic ghosts on one rank), without a
/// buffer in between. The boxes must not overlap.
template <class Space, class FieldView>
void copy_box(const Space& space, const FieldView& field, const Box& from, const Box& to,
              UnpackMode mode = UnpackMode::assign) {
  const std::ptrdiff_t shift = impl::box_shift(field, from, to);
  using T = typename FieldView::non_const_value_type;
  if (mode == UnpackMode::add)
    impl::for_each_box_cell(space, "shardtensor::copy_box_add", field, to,
                            impl::CopyShifted<T, true>{shift});
  else
    impl::for_each_box_cell(space, "shardtensor::copy_box", field, to,
                            impl::CopyShifted<T, false>{shift});
}

/// to(n, c, to_box) = (or +=) from(n, c, from_box) for two boxes of the same extents in two
/// fields of the same batch and channels (either may be a channel range of a larger field): a
/// rank's own part of a redistribution, without a buffer in between. Runs on the default
/// execution space.
template <class ToView, class FromView>
void copy_box_between(const FromView& from, const Box& from_box, const ToView& to,
                      const Box& to_box, UnpackMode mode = UnpackMode::assign) {
  if (to_box.empty()) return;
  const Index extents[3] = {to_box.extent[0], to_box.extent[1], to_box.extent[2]};
  const Index to_lower[3] = {to_box.lower[0], to_box.lower[1], to_box.lower[2]};
  const Index from_lower[3] = {from_box.lower[0], from_box.lower[1], from_box.lower[2]};
  const auto copy = [&](auto op) {
    for (int a = 0; a < 3; ++a) {
      op.to_lower[a] = to_lower[a];
      op.from_lower[a] = from_lower[a];
    }
    for_each_cell_by_lines(ExecutionSpace(), "shardtensor::copy_box_between", to.extent(0),
                           to.extent(1), extents, op);
  };
  if (mode == UnpackMode::add)
    copy(impl::CopyBetween<ToView, FromView, true>{to, from, {}, {}});
  else
    copy(impl::CopyBetween<ToView, FromView, false>{to, from, {}, {}});
}

/// Sets field(n, c, box) to `value` for every batch and channel.
template <class Space, class FieldView>
void fill_box(const Space& space, const FieldView& field, const Box& box,
              typename FieldView::value_type value) {
  using T = typename FieldView::non_const_value_type;
  impl::for_each_box_cell(space, "shardtensor::fill_box", field, box, impl::Fill<T>{value});
}

}  // namespace shardtensor
