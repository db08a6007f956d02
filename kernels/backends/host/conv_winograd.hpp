#pragma once
// Winograd's tiles for the plane path's float convolutions on the host (the forward, the input
// gradient and the weight gradient of a 3x3 window in y and z, any window in x). The forward
// and input gradient of planes 64 output columns wide or more run F(2x4, 3x3) (narrower ones
// F(2x2, 3x3), as the weight gradient): each 2 x 4 block of outputs from its 4 x 6 source cells
// transformed (B^T d B), 24 products per source and output channel instead of 72 (a GEMM per
// transformed position on the direct path's register tiles), and the outputs transformed back
// (A^T m A); F(2, 3) along the rows, F(4, 3) along the columns on the points 0, 1, -1, 1/2, -2
// (of the choices with adds and halvings, the one that rounds least). The weight gradient runs
// F(2x2, 3x3): it sums the products of the transformed source and output gradient (A dy A^T)
// per position and transforms the sums back (G^T dU G). 3x and 2.25x fewer multiplications;
// the sums differ from the direct tiles' by rounding (forward and input gradient within 2e-6
// of the largest, the weight gradient within 1e-6), not their bits, and are the same bits on
// every instruction set. Run only where conv_winograd_applies() and the layer asks for it
// (ConvOptions::winograd).

#include <cstddef>

#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels::host {

/// Whether a correlation can run on Winograd's tiles: a 3x3 window in y and z with unit
/// dilations there, at least 2 x 2 outputs per plane, and at least 8 source and 8 output
/// channels per group (fewer leave the transforms most of the work).
bool conv_winograd_applies(const Correlation& r);

/// The transformed positions of r's forward tile: 24 (F(2x4, 3x3), from 64 output columns on)
/// or 16 (F(2x2, 3x3)). Its packed weights' layout follows it.
Index conv_winograd_positions(const Correlation& r);

/// Values of one group's weights packed for conv_winograd_correlate (conv_winograd_pack_weights).
std::size_t conv_winograd_packed_values(const Correlation& r);
/// Workspace values conv_winograd_correlate needs: the packed weights, then per host thread the
/// transformed source planes of a band and its products.
std::size_t conv_winograd_values(const Correlation& r);

/// Packs group `group`'s weights of correlation r (flipped and transposed if `transposed`),
/// transformed (G g G^T of F(2x4, 3x3), in double, rounded once): [position][block of tile rows]
/// [x tap][source channel][tile rows].
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

/// Whether the weight gradient of a correlation that applies gains on Winograd's tiles: at least
/// 16 source and 16 output channels per group and 2048 tiles times x taps over the batch (fewer
/// leave its transforms and per-call sums most of the work; measured).
bool conv_winograd_gradient_pays(const Correlation& r, Index batch);

/// Workspace values conv_winograd_weight_gradient needs, summing `x_taps_per_pass` x taps per pass.
std::size_t conv_winograd_gradient_values(const Correlation& r, Index x_taps_per_pass);

/// gw += this rank's weight gradient of the forward correlation r over its source xp (and its
/// `slabs`), as conv_vector_weight_gradient: per sample and band of output rows, each source
/// plane's band transformed (B^T d B) and each output plane's output gradient (A dy A^T), their
/// products summed per position over the band's tiles (dU, on the direct path's weight-gradient
/// tiles: taps are the source channels), and at the end dg = G^T dU G in double. Float sums
/// added into double totals every 16384 tiles; `x_taps_per_pass` as the direct path's.
void conv_winograd_weight_gradient(const Correlation& r, const ConvShape& g,
                                   const FieldView<float>& xp, const SourceSlabs<float>& slabs,
                                   const FieldView<float>& gy, const ReplicatedView<float>& gw,
                                   float* workspace, Index x_taps_per_pass);

}  // namespace shardtensor::kernels::host
