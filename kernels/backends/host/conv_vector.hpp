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
/// band copies band by band, else plane by plane; `pairs`: the correlations copy every source
/// into pair planes).
std::size_t conv_vector_values(const Correlation& forward, const Correlation& data,
                               bool band_copies, bool pairs);

/// Values of the packed weights of a one-group correlation (conv_vector_pack_weights), on
/// every instruction set's tiles.
std::size_t conv_vector_packed_values(const Correlation& r);
/// What the packed layout depends on besides the correlation and `pairs`: the current path's
/// tile rows.
int conv_vector_packing();
/// Whether bf16 operands run on the pair tiles (bf16 dot products) now; else on the float
/// tiles, whose products of bf16 values are the same.
bool conv_vector_bf16_pairs();
/// Packs a one-group correlation's weights for conv_vector_correlate (with the same `pairs`).
void conv_vector_pack_weights(const Correlation& r, const ConvShape& g,
                              const ReplicatedView<float>& w, bool transposed, bool pairs,
                              float* packed);

/// out = the correlation of src (plus bias when given; `slabs`: src's, Correlation::slab_axis),
/// every kept output cell written. The
/// weights are packed into the start of the workspace, unless given packed (one group, by
/// conv_vector_pack_weights for the same correlation and path). `pairs` (only where
/// conv_vector_bf16_pairs()): src and w hold bf16 values (a bf16 convolution's operands), read
/// as channel pairs on bf16 dot products; each output then adds its products pair by pair.
void conv_vector_correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                           const ReplicatedView<float>& w, bool transposed,
                           const ReplicatedView<float>& bias, const FieldView<float>& out,
                           float* workspace, bool band_copies, bool pairs, const PlaneFilter& keep,
                           const float* packed_weights = nullptr,
                           const SourceSlabs<float>& slabs = {});

/// gw += this rank's weight gradient of the forward correlation r over its source xp (read
/// in place where its windows lie inside it, reads_inside(r), else through zero-padded copies).
/// `bf16_pairs` (only where conv_vector_bf16_pairs()): xp and gy hold bf16 values, summed on
/// bf16 dot products over pairs of a row's cells (the same bits as the float tiles).
void conv_vector_weight_gradient(const Correlation& r, const ConvShape& g,
                                 const FieldView<float>& xp, const FieldView<float>& gy,
                                 const ReplicatedView<float>& gw, float* workspace,
                                 bool band_copies, bool bf16_pairs,
                                 const SourceSlabs<float>& slabs = {});

}  // namespace shardtensor::kernels::host
