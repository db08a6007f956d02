#pragma once
// The convolution kernels of Conv<T> (layers/conv.hpp) on Views of one rank's padded field: the
// module computes shapes and plans, these compute. Three families, each in its own source:
//
//   direct (kernels/src/conv_direct.cpp)   one loop nest per output; any shape; the reference
//   im2col + GEMM (conv_gemm.cpp)          chunks of z rows expanded into a bounded workspace
//   planes (conv_planes.cpp)               unit strides: im2col of (y, z) taps per source
//                                          plane, x taps as shifts between planes; the host
//                                          backend's vector kernels (backends/host) where
//                                          they run
//
// Fields are (batch, channel, x, y, z); weights (out, in / groups, kx, ky, kz) in C order. A
// kernel reads `xp`, the padded input, whose windows for every local output lie inside it.

#include <Kokkos_Core.hpp>
#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "shardtensor/core/box.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// Index arithmetic shared by the kernels.
struct ConvShape {
  Index batch, in_channels, out_channels, in_per_group, out_per_group;
  Index k[3], s[3], d[3];
  Index base[3];  // source index of the first local output's window start (the padded
                  // input's; the input's own, negative, where the plane path reads it unpadded)
  Index out[3];   // local output extents
  // Axes along which the unpadded input wraps around (periodic padding on one rank; the
  // outputs' extent is then the input's): plane path with vector kernels only.
  bool wrap[3] = {false, false, false};
  // The axis (0 or 1) along which the unpadded input's cells past its ends are other ranks'
  // (SourceSlabs), -1 for none: plane path with vector kernels only.
  int slab_axis = -1;

  KOKKOS_INLINE_FUNCTION Index weight_index(Index co, Index cig, Index a, Index b, Index c) const {
    return (((co * in_per_group + cig) * k[0] + a) * k[1] + b) * k[2] + c;
  }
};

/// At least `count` values of the process's convolution scratch, one buffer per value type,
/// grown as needed and freed when Kokkos finalizes. Its contents do not outlive the call that
/// reserved it: the next convolution reuses it.
template <class T>
T* shared_conv_scratch(std::size_t count);

/// Frees the convolution scratch of both value types now (the next convolution allocates it
/// again): for a caller that wants the memory back between calls, and for measurements that
/// should see the scratch allocated.
void release_conv_scratch();

/// A layer's forward weights as the host vector kernels read them (packed into register-tile
/// order), kept from call to call with the weights they were packed from: a call whose
/// weights are the same bit for bit reuses them (inference, the chunks of one forward), any
/// other packs again. Repacking every call was 5-6 % of the main job's inference; the check
/// is one contiguous comparison. Charged to workspaces. Kept in inference only
/// (ConvWorkspace::keeps_forward_weights): in training the weights change every step, and
/// packing into the scratch per call cost no measurable time against 2x the weights held.
template <class T>
struct PackedWeights {
  Kokkos::View<T*, DefaultMemorySpace> source;  // the weights `packed` was made from
  Kokkos::View<T*, DefaultMemorySpace> packed;
  std::array<Index, 10> layout{};  // what the packing depends on besides the values
};

/// Scratch memory of the GEMM and plane paths and of the convolution library: chunks are sized
/// to stay within budget_bytes whatever the field size. Every layer reserves from the one
/// process-wide buffer (no allocation once warm): layers compute one after another in stream
/// order on one host thread (Kokkos' host backends are not thread-safe either), so the
/// scratch costs the largest layer's need, not the sum over layers (the 3-D U-Net's cuDNN
/// workspaces held 337 MiB on an H100 when each layer kept its own).
template <class T>
struct ConvWorkspace {
  std::size_t budget_bytes = std::size_t(16) << 20;
  T* reserve(std::size_t count) { return shared_conv_scratch<T>(count); }
  PackedWeights<T> forward_weights;  // this layer's (host vector kernels only)
  /// Whether forward keeps forward_weights (its layer is in eval mode), else the kernels pack
  /// per call into the scratch and forward_weights stays empty.
  bool keeps_forward_weights = false;
};

template <class T>
using UnmanagedMatrix = Kokkos::View<T**, Kokkos::LayoutRight, DefaultMemorySpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// ---- direct ----------------------------------------------------------------------------

template <class T>
void conv_direct_forward(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& xp,
                         const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
                         const FieldView<T>& y);

/// Gradient of the padded input: each cell gathers from the outputs whose windows cover it.
template <class T>
void conv_direct_backward_data(const ExecutionSpace& space, const ConvShape& g,
                               const FieldView<T>& gy, const ReplicatedView<T>& w,
                               const FieldView<T>& gxp);

/// This rank's partial sums of the weight and bias gradients (over its own outputs), in
/// double: they add up every output cell, and float sums in different orders on different
/// decompositions would differ by more than float precision. Either view may be empty.
template <class T>
void conv_backward_parameters(const ExecutionSpace& space, const ConvShape& g,
                              const FieldView<T>& gy, const FieldView<T>& xp,
                              const ReplicatedView<T>& gw, const ReplicatedView<T>& gb);

// ---- im2col + GEMM ------------------------------------------------------------------------

/// Which chunks of outputs a call computes: all, or only those whose windows read (or do
/// not read) given boxes of the padded buffer (the halo-overlap split).
struct ChunkFilter {
  enum { all, avoiding, touching } keep = all;
  std::vector<Box> boxes;
  bool operator()(const Box& reads) const {
    if (keep == all) return true;
    bool touches = false;
    for (const Box& b : boxes) touches = touches || !intersect(reads, b).empty();
    return touches == (keep == touching);
  }
};

template <class T>
void conv_gemm_forward(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& xp,
                       const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
                       const FieldView<T>& y, ConvWorkspace<T>& workspace,
                       const ChunkFilter& filter = {});

/// Weight gradient (into `gw`, this rank's partial sum; may be empty) and padded input
/// gradient (into `gxp`, zero on entry; may be empty).
template <class T>
void conv_gemm_backward(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& gy,
                        const FieldView<T>& xp, const ReplicatedView<T>& w,
                        const ReplicatedView<T>& gw, const FieldView<T>& gxp,
                        ConvWorkspace<T>& workspace);

// ---- planes -------------------------------------------------------------------------------

/// out[o] = sum over taps t of W[t] . src[offset + o + t * dilation] along each axis, per
/// group; src cells outside its extents read as zero, or along a `wrap` axis as the cell an
/// extent away (periodic).
struct Correlation {
  Index groups, src_per_group, out_per_group;
  Index k[3], d[3], offset[3], out[3], src[3];
  bool wrap[3] = {false, false, false};
  int slab_axis = -1;  // src's cells past its ends along this axis are in SourceSlabs
  Index column_rows() const { return src_per_group * k[1] * k[2]; }
  Index slots() const { return (k[0] - 1) * d[0] + 1; }  // source planes one output plane spans
};

/// Ring slot of source plane sx (sx may be negative).
KOKKOS_INLINE_FUNCTION Index slot_of(Index sx, Index slots) {
  return ((sx % slots) + slots) % slots;
}

/// Weight of a correlation of group `group`: output o, source channel j, taps (a, b, c). The
/// forward's weight, or (transposed) the input gradient's flipped one.
KOKKOS_INLINE_FUNCTION Index correlation_weight_index(const ConvShape& g, Index group,
                                                     bool transposed, Index o, Index j, Index a,
                                                     Index b, Index c) {
  return transposed ? g.weight_index(group * g.out_per_group + j, o, g.k[0] - 1 - a,
                                     g.k[1] - 1 - b, g.k[2] - 1 - c)
                    : g.weight_index(group * g.out_per_group + o, j, a, b, c);
}
template <class T>
KOKKOS_INLINE_FUNCTION T correlation_weight(const ConvShape& g, const ReplicatedView<T>& w,
                                            Index group, bool transposed, Index o, Index j, Index a,
                                            Index b, Index c) {
  return w(correlation_weight_index(g, group, transposed, o, j, a, b, c));
}

/// Extent along axis a (1: y, 2: z) of the source cells that a correlation's outputs read.
inline Index read_extent(const Correlation& r, int a) {
  return r.out[a] + (r.k[a] - 1) * r.d[a];
}

/// Whether every window of the outputs lies inside the source in y and z (and no cell comes
/// from elsewhere: a wrap or a slab).
inline bool reads_inside(const Correlation& r) {
  if (r.wrap[0] || r.wrap[1] || r.wrap[2] || r.slab_axis >= 0) return false;
  for (int a = 1; a < 3; ++a)
    if (r.offset[a] < 0 || r.offset[a] + read_extent(r, a) > r.src[a]) return false;
  return true;
}

/// The cells past a plane-path source's two ends along its slab axis (Correlation::slab_axis)
/// that other ranks own, as fields of their own (SlabExchange, in the kernels' axes): `lower`
/// ends where the source begins, `upper` begins where it ends; an empty one reads zeros (an
/// open boundary). Read instead of a halo-padded copy of the source.
template <class T>
struct SourceSlabs {
  FieldView<T> lower, upper;
};

/// The plane path's correlations: the forward (also the weight gradient's columns) and the
/// input gradient, with the output rows per chunk that fit the workspace (0: does not apply).
struct PlanePlan {
  Correlation forward, data;
  Index forward_rows = 0, data_rows = 0;
  bool vector_kernels = false;  // the host backend's vector kernels instead of im2col + GEMM
  bool band_copies = false;     // vector kernels copy padded sources band by band
  bool bf16 = false;            // vector kernels take bf16 operands (ConvOptions::bf16)
  bool rounds_source = false;   // bf16: they round the source as they read it (any input)
  bool winograd = false;        // vector kernels: Winograd's tiles where a correlation's shape
                                // applies (host::conv_vector_winograd)
  bool winograd_gradient = false;  // and for the weight gradient, where it gains
                                   // (host::conv_vector_winograd_gradient)
  Index gradient_x_taps = 0;    // vector kernels: x taps per weight-gradient pass
  std::size_t values = 0;       // workspace values needed
  bool applies() const { return vector_kernels || forward_rows > 0; }
};

/// Whether the host backend's vector kernels run here for T: float, Kokkos kernels on the
/// host (Serial, or OpenMP: the work is split over its threads), a CPU they were built for.
template <class T>
bool conv_vector_kernels_available();

/// The plane path's plan for a convolution whose source has extents `padded`, if it applies;
/// `vector_kernels`: may use the host backend's vector kernels. The source is the padded input,
/// or the input itself: the path reads zeros where a window reaches past its source.
/// `bf16_operands`: the weights and sources are rounded to bf16 (ConvOptions::bf16): on the
/// vector kernels (AMX tiles, bf16 dot products or the float tiles: bf16), which round the
/// weights as they pack them and a source as they read it where they copy it (rounds_source);
/// on the others the caller rounds both. `winograd`: the vector kernels run float 3x3 windows
/// (in y and z) on Winograd's tiles (the correlations on F(2x4, 3x3) from 64 output columns on,
/// else and for the weight gradient on F(2x2, 3x3)), where the workspace fits them
/// (ConvOptions::winograd).
PlanePlan plan_planes(const ConvShape& g, const Index padded[3], std::size_t value_size,
                      std::size_t budget_bytes, bool vector_kernels, bool bf16_operands = false,
                      bool winograd = false);

/// The padded-buffer cells that output rows [y0, y1) of output plane ox read (plane path).
Box plane_reads(const ConvShape& g, Index ox, Index y0, Index y1);

/// Selects output chunks of the plane path: keep(x, y0, y1) for output plane x, rows [y0, y1).
using PlaneFilter = std::function<bool(Index x, Index y0, Index y1)>;

/// The plane path's correlation (plan.forward or plan.data; `rows` per GEMM chunk): out =
/// the correlation of src with w (flipped and transposed if `transposed`) plus bias when
/// given, every kept cell of out written. `workspace` holds plan.values values. With a
/// `cache`, the vector kernels keep the packed weights there (and reuse them while w is the
/// same), else they pack into the workspace every call.
template <class T>
void correlate_planes(const ExecutionSpace& space, const PlanePlan& plan, const Correlation& r,
                      Index rows, const ConvShape& g, const FieldView<T>& src,
                      const ReplicatedView<T>& w, bool transposed, const ReplicatedView<T>& bias,
                      const FieldView<T>& out, T* workspace, const PlaneFilter& keep,
                      PackedWeights<T>* cache = nullptr, const SourceSlabs<T>& slabs = {});

/// The plane path's weight gradient: gw += this rank's partial sum (`slabs`: xp's).
template <class T>
void weight_gradient_planes(const ExecutionSpace& space, const PlanePlan& plan, const ConvShape& g,
                            const FieldView<T>& xp, const FieldView<T>& gy,
                            const ReplicatedView<T>& gw, T* workspace,
                            const SourceSlabs<T>& slabs = {});

}  // namespace shardtensor::kernels
