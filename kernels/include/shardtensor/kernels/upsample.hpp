#pragma once
// The upsampling kernels (layers/upsample.hpp) on the execution space of their Views: nearest and
// (multi)linear interpolation (PyTorch's align_corners=False or True) from an input buffer whose
// ghosts the halo padding filled (or, for linear interpolation of a field held whole, the
// input itself, its end cells read past its ends), and the backward, where each input cell
// gathers from the outputs that read it (no scatter).

#include <Kokkos_Core.hpp>
#include <memory>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

/// Nearest-neighbour or (multi)linear upsampling.
enum class UpsampleMode { nearest, linear };

/// Where linear interpolation reads output cell o of an axis of n input cells scaled by s, as
/// ONNX's Resize names it: half_pixel, (o + 0.5) / s - 0.5 (PyTorch's align_corners=False);
/// align_corners, o (n - 1) / (n s - 1); asymmetric, o / s (TensorFlow's).
enum class LinearCoordinates { half_pixel, align_corners, asymmetric };

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
  Index global_in[3];   // global input extents (align_corners's coordinates)
  LinearCoordinates coordinates = LinearCoordinates::half_pixel;
  /// Linear mode: the buffer is the whole field along every axis, without ghost cells, and
  /// sources past its ends read its end cells: replicate padding with no padded copy (one
  /// rank: nothing to exchange). Else the buffer's ghosts hold the padding.
  bool clamped = false;

  /// Linear interpolation along an axis: buffer indices of the lower source, which gets
  /// `weight`, and of the upper, which gets 1 - weight (the next cell; the same one along an
  /// unused axis, and clamped to the buffer where `clamped`).
  template <class T>
  KOKKOS_INLINE_FUNCTION void linear_source(int axis, Index o, Index& lower, Index& upper,
                                            T& weight) const {
    const Index at = out_offset[axis] + o;
    const Index outputs = global_in[axis] * scale[axis];
    const double source =
        coordinates == LinearCoordinates::half_pixel ? (double(at) + 0.5) / double(scale[axis]) - 0.5
        : coordinates == LinearCoordinates::asymmetric ? double(at) / double(scale[axis])
        : outputs > 1 ? double(at * (global_in[axis] - 1)) / double(outputs - 1)
                      : 0.0;
    const double floor_source = math::floor(source);
    lower = static_cast<Index>(floor_source) - in_offset[axis] + ghost[axis];
    upper = in[axis] > 1 ? lower + 1 : lower;
    if (clamped) {
      lower = math::min<Index>(math::max<Index>(lower, 0), in[axis] - 1);
      upper = math::min<Index>(math::max<Index>(upper, 0), in[axis] - 1);
    }
    weight = static_cast<T>(1.0 - (source - floor_source));
  }
};

inline bool operator==(const UpsampleShape& a, const UpsampleShape& b) {
  bool same = a.channels == b.channels && a.coordinates == b.coordinates;
  for (int d = 0; d < 3; ++d)
    same = same && a.scale[d] == b.scale[d] && a.out_offset[d] == b.out_offset[d] &&
           a.in_offset[d] == b.in_offset[d] && a.out[d] == b.out[d] && a.in[d] == b.in[d] &&
           a.ghost[d] == b.ghost[d] && a.global_in[d] == b.global_in[d];
  return same && a.clamped == b.clamped;
}

/// The tables of one shape and mode, made once (three to five small Views and two kernels)
/// and read by every forward and backward of that shape: per axis and output index its
/// sources and weights, per input index the outputs it feeds. A layer keeps its plan from call
/// to call, so a step makes no tables (on a GPU each table was a cudaMalloc, a kernel and a
/// cudaFree per call). Copies share the tables. Charged to workspaces.
template <class T>
class UpsamplePlan {
 public:
  UpsamplePlan(const ExecutionSpace& space, const UpsampleShape& g, UpsampleMode mode);

  const UpsampleShape& shape() const { return shape_; }
  UpsampleMode mode() const { return mode_; }

  struct Tables;  // the kernels'
  const Tables& tables() const { return *tables_; }

 private:
  UpsampleShape shape_;
  UpsampleMode mode_;
  std::shared_ptr<const Tables> tables_;
};

/// y = x upsampled as the plan says (x: the input buffer, owned cells plus ghosts; the input
/// itself for a clamped plan).
template <class T>
void upsample_forward(const ExecutionSpace& space, const UpsamplePlan<T>& plan,
                      const FieldView<T>& x, const FieldView<T>& y);

/// gx += the input-buffer gradient of output gradient gy.
template <class T>
void upsample_backward(const ExecutionSpace& space, const UpsamplePlan<T>& plan,
                       const FieldView<T>& gy, const FieldView<T>& gx);

}  // namespace kernels
}  // namespace shardtensor
