#pragma once
// Channels-last copies of a box of a field: the layout (N, x, y, z, C) that tensor-core
// convolution engines read and write (cuDNN's NDHWC), while ShardTensor's fields are
// (N, C, x, y, z). One kernel each way, fusing the gather of the box (a rank's padded patch,
// the windows' part of it) with the transpose, so a convolution through such an engine costs
// one read and one write of its input and output more, not a pack and a transpose each.
// Every cell's channels are one thread's, contiguous in the buffer. The kernels take the
// execution space instance they run on and do not fence it.

#include <Kokkos_Core.hpp>

#include "shardtensor/core/box.hpp"
#include "shardtensor/core/box_copy.hpp"  // UnpackMode

namespace shardtensor::kernels {

namespace impl {

// Functors, not lambdas: see core/box_copy.hpp on lambdas in header templates under nvcc.
template <class FieldView, class T>
struct ChannelsLastCopy {
  FieldView field;
  T* buffer;
  Index channels, lower[3], extent[3];
  int mode;  // 0: field -> buffer; 1: buffer -> field; 2: buffer added into field

  KOKKOS_INLINE_FUNCTION void operator()(const Index item) const {
    // item = (n, x, y, z) of the box in C order; its channels start at item * channels.
    const Index z = item % extent[2], y = item / extent[2] % extent[1];
    const Index x = item / (extent[2] * extent[1]) % extent[0];
    const Index n = item / (extent[2] * extent[1] * extent[0]);
    T* cell = buffer + item * channels;
    const Index i = lower[0] + x, j = lower[1] + y, k = lower[2] + z;
    for (Index c = 0; c < channels; ++c) {
      if (mode == 0)
        cell[c] = field(n, c, i, j, k);
      else if (mode == 1)
        field(n, c, i, j, k) = cell[c];
      else
        field(n, c, i, j, k) += cell[c];
    }
  }
};

template <class Space, class FieldView, class T>
void channels_last_copy(const Space& space, const char* label, const FieldView& field,
                        const Box& box, T* buffer, int mode) {
  static_assert(Kokkos::SpaceAccessibility<Space, typename FieldView::memory_space>::accessible,
                "channels-last copies run on an execution space that can read the field");
  if (box.empty() || field.extent(0) == 0) return;
  ChannelsLastCopy<FieldView, T> copy{field, buffer, Index(field.extent(1)), {}, {}, mode};
  for (int a = 0; a < 3; ++a) {
    copy.lower[a] = box.lower[a];
    copy.extent[a] = box.extent[a];
  }
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Space>(space, 0, Index(field.extent(0)) * box.size()), copy);
}

}  // namespace impl

/// buffer(n, x, y, z, c) = field(n, c, box.lower + (x, y, z)) for every cell of `box`: the box's
/// values channels-last, contiguous from buffer.data().
template <class Space, class FieldView, class BufferView>
void pack_channels_last(const Space& space, const FieldView& field, const Box& box,
                        const BufferView& buffer) {
  impl::channels_last_copy(space, "shardtensor::pack_channels_last", field, box, buffer.data(), 0);
}

/// The inverse of pack_channels_last: field(n, c, box) = (or +=) buffer(n, x, y, z, c).
template <class Space, class BufferView, class FieldView>
void unpack_channels_last(const Space& space, const BufferView& buffer, const FieldView& field,
                          const Box& box, UnpackMode mode = UnpackMode::assign) {
  impl::channels_last_copy(space, "shardtensor::unpack_channels_last", field, box,
                           const_cast<typename FieldView::non_const_value_type*>(buffer.data()),
                           mode == UnpackMode::add ? 2 : 1);
}

}  // namespace shardtensor::kernels
