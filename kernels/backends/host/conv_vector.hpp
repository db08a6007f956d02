#pragma once
// The host backend's vector kernels for the plane path of Conv<float> (kernels/conv.hpp):
// the same correlations as im2col + GEMM, register-blocked on the host's vector instruction
// set (vector_kernels.hpp) and split over the host execution space's threads; run only where
// conv_vector_available() (a vector path is on: AVX2, AVX-512 or NEON).

#include <cstddef>

#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels::host {

/// Whether this build has the kernels and this CPU runs them.
bool conv_vector_available();

/// Workspace values (floats) the kernels need for a plan's forward and data correlations
/// and the weight gradient (a source whose windows reach past it is copied, zero-padded, with
/// band copies band by band, else plane by plane; `bf16`: bf16 operands, whose paths may copy
/// every source into pair planes; `winograd`: the correlations that can run on Winograd's tiles
/// do, conv_vector_winograd).
std::size_t conv_vector_values(const Correlation& forward, const Correlation& data,
                               bool band_copies, bool bf16, bool winograd = false);
/// Whether a correlation runs on Winograd's tiles (conv_winograd.hpp): where the layer asks
/// (`winograd`), its operands are float (not `bf16`) and its shape applies.
bool conv_vector_winograd(const Correlation& r, bool bf16, bool winograd);
/// Whether the weight gradient of forward correlation `forward` over `batch` samples runs on
/// Winograd's tiles: where conv_vector_winograd() and it gains there
/// (conv_winograd_gradient_pays).
bool conv_vector_winograd_gradient(const Correlation& forward, Index batch, bool bf16,
                                   bool winograd);
/// The x taps the weight gradient sums per pass over the bands (conv_vector_weight_gradient):
/// all of them, or one where summing all would make the weight gradient this layer's largest
/// workspace (a wide layer's per-thread sums, 3x its weights per thread: a U-Net's bottom).
Index conv_vector_gradient_x_taps(const Correlation& forward, const Correlation& data,
                                  bool band_copies, bool bf16);

/// Values of the packed weights of a one-group correlation (conv_vector_pack_weights), on
/// every instruction set's tiles: the direct tiles', or (`winograd`, where it applies) the most
/// of theirs and Winograd's.
std::size_t conv_vector_packed_values(const Correlation& r, bool winograd);
/// What the packed layout depends on besides the correlation and `bf16`: the current path's
/// tile rows, and whether AMX tiles and bf16 dot products run.
int conv_vector_packing();
/// Whether the kernels of a convolution with bf16 operands (forward correlation `forward`)
/// round its source as they read it, so that it may be the unrounded input: every path that
/// copies it does (a source the windows reach past; pair planes always), the float tiles read
/// a source in place as it is. False for float operands.
bool conv_vector_rounds_source(const Correlation& forward, bool bf16);
/// Packs a one-group correlation's weights for conv_vector_correlate (with the same `bf16` and
/// `winograd`).
void conv_vector_pack_weights(const Correlation& r, const ConvShape& g,
                              const ReplicatedView<float>& w, bool transposed, bool bf16,
                              bool winograd, float* packed);

/// out = the correlation of src (plus bias when given; `slabs`: src's, Correlation::slab_axis),
/// every kept output cell written. The
/// weights are packed into the start of the workspace, unless given packed (one group, by
/// conv_vector_pack_weights for the same correlation and path). `bf16`: a bf16 convolution's
/// operands (w is rounded to bf16 as it is packed, src as it is read, conv_vector_rounds_source):
/// on AMX tiles where they run, else as channel pairs on bf16 dot products where those run
/// (each output then adds its products pair by pair), else on the float tiles. `winograd`: on
/// Winograd's tiles where conv_vector_winograd().
void conv_vector_correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                           const ReplicatedView<float>& w, bool transposed,
                           const ReplicatedView<float>& bias, const FieldView<float>& out,
                           float* workspace, bool band_copies, bool bf16, bool winograd,
                           const PlaneFilter& keep, const float* packed_weights = nullptr,
                           const SourceSlabs<float>& slabs = {});

/// gw += this rank's weight gradient of the forward correlation r over its source xp (read
/// in place where its windows lie inside it, reads_inside(r), else through zero-padded copies).
/// `bf16`: gy holds bf16 values and xp is rounded as it is read (conv_vector_rounds_source):
/// on AMX tiles where they run, else on bf16 dot products over pairs of a row's cells where
/// those run (the same bits as the float tiles), else on the float tiles. `winograd`: on
/// Winograd's tiles where conv_vector_winograd() (sums that differ by rounding; callers pass
/// conv_vector_winograd_gradient()). `x_taps_per_pass` (conv_vector_gradient_x_taps): the x taps
/// summed per pass over the bands; each weight's sum is the same whatever the passes.
void conv_vector_weight_gradient(const Correlation& r, const ConvShape& g,
                                 const FieldView<float>& xp, const FieldView<float>& gy,
                                 const ReplicatedView<float>& gw, float* workspace,
                                 bool band_copies, bool bf16, bool winograd, Index x_taps_per_pass,
                                 const SourceSlabs<float>& slabs = {});

}  // namespace shardtensor::kernels::host
