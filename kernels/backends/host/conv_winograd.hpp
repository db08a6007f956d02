#pragma once
// Winograd's F(2x2, 3x3) for the plane path's float correlations on the host (the forward and
// the input gradient of a 3x3 window in y and z, any window in x): each 2 x 2 block of outputs
// from its 4 x 4 source cells transformed (B^T d B), 16 products per source and output channel
// instead of 36 (a GEMM per transformed position on the direct path's register tiles), and
// the outputs transformed back (A^T m A). 2.25x fewer multiplications; the sums differ from
// the direct tiles' by rounding (below 1e-6 of the largest output), not their bits, and are
// the same bits on every instruction set. Run only where conv_winograd_applies() and the layer
// asks for it (ConvOptions::winograd).

#include <cstddef>

#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels::host {

/// Whether a correlation can run on Winograd's tiles: a 3x3 window in y and z with unit
/// dilations there, at least 2 x 2 outputs per plane, and at least 8 source and 8 output
/// channels per group (fewer leave the transforms most of the work).
bool conv_winograd_applies(const Correlation& r);

/// Values of one group's weights packed for conv_winograd_correlate (conv_winograd_pack_weights).
std::size_t conv_winograd_packed_values(const Correlation& r);
/// Workspace values conv_winograd_correlate needs: the packed weights, then per host thread the
/// transformed source planes of a band and its products.
std::size_t conv_winograd_values(const Correlation& r);

/// Packs group `group`'s weights of correlation r (flipped and transposed if `transposed`),
/// transformed (G g G^T, in double, rounded once): [position][block of tile rows][x tap]
/// [source channel][tile rows].
void conv_winograd_pack_weights(const Correlation& r, const ConvShape& g,
                                const ReplicatedView<float>& w, bool transposed, Index group,
                                float* packed);

/// out = the correlation of src (plus bias when given), every kept output cell written, as
/// conv_vector_correlate (its `keep`, `slabs` and wrap-around): per sample and band of output
/// rows, each source plane's band transformed once into a ring, then per output plane the
/// products and the outputs. Weights packed into the workspace per group, or given packed (one
/// group).
void conv_winograd_correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                             const SourceSlabs<float>& slabs, const ReplicatedView<float>& w,
                             bool transposed, const ReplicatedView<float>& bias,
                             const FieldView<float>& out, float* workspace, const PlaneFilter& keep,
                             const float* packed_weights);

}  // namespace shardtensor::kernels::host
