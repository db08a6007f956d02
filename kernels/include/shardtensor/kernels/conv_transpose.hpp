#pragma once
// The transposed-convolution kernels (layers/conv_transpose.hpp) on the execution space of their
// Views: forward by output rows, backward data by padded input rows (each gathers from the
// outputs it feeds), backward weights and bias per parameter (each sums its own terms, in
// double). No scatter: every work item writes only what it owns. Where the taps tile the
// output (kernel = stride: upsampling), GEMMs through KokkosBlas (src/conv_transpose_gemm.cpp).

#include <Kokkos_Core.hpp>

#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// a / b and a mod b rounded towards minus infinity (b > 0).
KOKKOS_INLINE_FUNCTION Index floor_div(Index a, Index b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
KOKKOS_INLINE_FUNCTION Index floor_mod(Index a, Index b) {
  return a - floor_div(a, b) * b;
}
KOKKOS_INLINE_FUNCTION Index min_index(Index a, Index b) {
  return a < b ? a : b;
}
KOKKOS_INLINE_FUNCTION Index max_index(Index a, Index b) {
  return a > b ? a : b;
}

/// Index arithmetic shared by the kernels: weights (in, out / groups, kx, ky, kz) in C order;
/// output o (global) receives input i through tap t when o = i * s - p + t * d.
///
/// In local terms, along one dim tap t joins padded input i to local output
/// o = i * s + offset(t), for the inputs i in [first_input(t), end_input(t)): those inside the
/// padded buffer and the global field whose output is owned here. The kernels walk these
/// ranges (and the z rows they give) instead of testing every (cell, tap) pair with divisions.
struct ConvTransposeShape {
  Index batch, in_channels, out_channels, in_per_group, out_per_group;
  Index k[3], s[3], d[3], p[3];
  Index out_first[3];  // global index of the first local output
  Index out[3];        // local output extents
  Index in_first[3];   // global index of padded cell 0 (first owned input minus the ghosts)
  Index in_global[3];  // global input extents
  Index padded[3];     // padded input buffer extents
  /// The input's values rounded to bfloat16 as they are read (float only; the GEMM path,
  /// conv_transpose_gemm_applies): a bf16 layer's operand without a rounded copy of it.
  bool round_source = false;

  KOKKOS_INLINE_FUNCTION Index weight_index(Index ci, Index cog, Index a, Index b, Index c) const {
    return (((ci * out_per_group + cog) * k[0] + a) * k[1] + b) * k[2] + c;
  }
  KOKKOS_INLINE_FUNCTION Index offset(int dim, Index t) const {
    return in_first[dim] * s[dim] - p[dim] + t * d[dim] - out_first[dim];
  }
  KOKKOS_INLINE_FUNCTION Index first_input(int dim, Index t) const {
    const Index first_output = -floor_div(offset(dim, t), s[dim]);  // ceil(-offset / s)
    return max_index(max_index(first_output, -in_first[dim]), 0);
  }
  KOKKOS_INLINE_FUNCTION Index end_input(int dim, Index t) const {
    const Index end_output = floor_div(out[dim] - 1 - offset(dim, t), s[dim]) + 1;
    return min_index(min_index(end_output, in_global[dim] - in_first[dim]), padded[dim]);
  }
  /// Padded input that local output `o` reads through tap `t` along `dim`; -1 if none (the
  /// tap falls between inputs or past the global boundary).
  KOKKOS_INLINE_FUNCTION Index input_of(int dim, Index o, Index t) const {
    const Index shifted = o - offset(dim, t);
    if (floor_mod(shifted, s[dim]) != 0) return -1;
    const Index i = floor_div(shifted, s[dim]);
    return i >= first_input(dim, t) && i < end_input(dim, t) ? i : -1;
  }
  /// Local output that padded cell `i` feeds through tap `t` along `dim`; -1 if none.
  KOKKOS_INLINE_FUNCTION Index output_of(int dim, Index i, Index t) const {
    return i >= first_input(dim, t) && i < end_input(dim, t) ? i * s[dim] + offset(dim, t) : -1;
  }
};

/// Where conv_transpose_forward writes its outputs in y: channels from `channel`, cells from
/// `lower` along each dim (a concatenation's channels, past its ghost cells), each rounded to
/// a bfloat16 value where `bf16` (a bf16 layer's output; the same bits as rounding after).
struct ConvTransposeOutput {
  Index channel = 0;
  Index lower[3] = {0, 0, 0};
  bool bf16 = false;
};

/// Whether the kernels can round the input to bfloat16 as they read it (round_source): the
/// GEMM path, where the kernel is the stride, with no dilation, padding or groups.
bool conv_transpose_rounds_on_read(const ConvTransposeShape& g);

/// y = bias + sum over taps (a, b, c) and input channels of w * x, by output z row: a tap c
/// adds an input row to every s-th output of the row. `at`: where in y (default: all of it).
template <class T>
void conv_transpose_forward(const ExecutionSpace& space, const ConvTransposeShape& g,
                            const FieldView<T>& xp, const ReplicatedView<T>& w,
                            const ReplicatedView<T>& bias, const FieldView<T>& y,
                            const ConvTransposeOutput& at = {});

/// Both directions of backward: the weight and bias gradients' partial sums (gw, gb) and the
/// padded input's gradient (gxp, zero on entry); an empty View is not computed. Where the taps
/// tile the output, the GEMM path (one gather of gy for both); else the two kernels below.
template <class T>
void conv_transpose_backward(const ExecutionSpace& space, const ConvTransposeShape& g,
                             const FieldView<T>& gy, const FieldView<T>& xp,
                             const ReplicatedView<T>& w, const ReplicatedView<T>& gw,
                             const ReplicatedView<T>& gb, const FieldView<T>& gxp);

/// Gradient of the padded input (`gxp`, zero on entry), the direct kernel: each padded row
/// gathers from the owned outputs it feeds.
template <class T>
void conv_transpose_backward_data(const ExecutionSpace& space, const ConvTransposeShape& g,
                                  const FieldView<T>& gy, const ReplicatedView<T>& w,
                                  const FieldView<T>& gxp);

/// This rank's partial sums of the weight and bias gradients (over its own outputs), the
/// direct kernels, in double: they add up every output cell, and float sums in different orders on different
/// decompositions would differ by more than float precision.
template <class T>
void conv_transpose_backward_parameters(const ExecutionSpace& space, const ConvTransposeShape& g,
                                        const FieldView<T>& gy, const FieldView<T>& xp,
                                        const ReplicatedView<T>& gw, const ReplicatedView<T>& gb);

}  // namespace shardtensor::kernels
