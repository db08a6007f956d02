#pragma once
// The upsampling kernels (nn/upsample.hpp) on the execution space of their Views: nearest and
// (multi)linear interpolation (align_corners=False, as in PyTorch) from an input buffer whose
// ghosts the halo padding filled, and the backward, where each input cell gathers from the
// outputs that read it (no scatter).

#include <Kokkos_Core.hpp>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// Nearest-neighbour or (multi)linear upsampling.
enum class UpsampleMode { nearest, linear };

namespace kernels {

/// Per-axis data of the upsampling kernels.
struct UpsampleShape {
  Index channels;
  Index scale[3];
  Index out_offset[3];  // global index of the first local output
  Index in_offset[3];   // global index of the first owned input
  Index out[3];         // local output extents
  Index in[3];          // extents of the input buffer (owned cells plus ghosts)
  Index ghost[3];       // ghost cells below the owned ones in the input buffer

  /// Linear interpolation along an axis: buffer index of the lower source and its weight
  /// (the upper source, index + 1, gets 1 - weight).
  template <class T>
  KOKKOS_INLINE_FUNCTION void linear_source(int axis, Index o, Index& lower, T& weight) const {
    const double source = (double(out_offset[axis] + o) + 0.5) / double(scale[axis]) - 0.5;
    const double floor_source = math::floor(source);
    lower = static_cast<Index>(floor_source) - in_offset[axis] + ghost[axis];
    weight = static_cast<T>(1.0 - (source - floor_source));
  }
};

/// y = x upsampled by g (x: the input buffer, owned cells plus ghosts).
template <class T>
void upsample_forward(const ExecutionSpace& space, const UpsampleShape& g, UpsampleMode mode,
                      const FieldView<T>& x, const FieldView<T>& y);

/// gx += the input-buffer gradient of output gradient gy.
template <class T>
void upsample_backward(const ExecutionSpace& space, const UpsampleShape& g, UpsampleMode mode,
                       const FieldView<T>& gy, const FieldView<T>& gx);

}  // namespace kernels
}  // namespace shardtensor
