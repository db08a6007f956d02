#pragma once
// The host backend's vector kernels: one source (vector_kernels.cpp, on Google Highway),
// compiled for every instruction set this build targets (x86-64: AVX2 with FMA, AVX-512;
// aarch64: NEON) and dispatched at run time to the best one the CPU runs, so a binary built
// on one machine runs its best path on another. No raw intrinsics anywhere else.
//
// Every kernel sums in the same order on every instruction set (each lane's chain of
// multiply-adds is the same; the row sums add 16 partial sums in one fixed tree), so the
// paths give the same bits and the tests compare them bit for bit. Pointers and counts only:
// no Kokkos, no MPI, so the aarch64 cross-test builds this file alone.
//
// Which path runs: shardtensor/kernels/vector_isa.hpp. Callers check vector_kernels_on()
// (and that Kokkos kernels run on the host) before calling these; where it is off they run
// their portable kernels.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardtensor/kernels/vector_isa.hpp"

namespace shardtensor::kernels::host {

// ---- convolution tiles (conv_vector.cpp drives them) ---------------------------------------

/// The register tiles of the current path (they depend on its vector width and register count).
struct ConvTileShape {
  int lanes;             // output cells per vector
  int tile_rows;         // output channels per correlate tile (weights broadcast)
  int tile_vectors;      // vectors per correlate tile (source loads)
  int gradient_taps;     // taps per weight-gradient tile
  int gradient_vectors;  // output-channel vectors per weight-gradient tile
  int narrow_lanes;      // output channels of the narrowest weight-gradient tile (at most 8)
};
ConvTileShape conv_tile_shape();
/// Bounds over every path, for workspace sizes that do not depend on the path.
constexpr int max_tile_rows = 8;
constexpr int tap_padding = 12;        // every path's gradient_taps divides it
constexpr int gradient_channels = 32;  // the most output channels per transposed cell
constexpr int max_narrow_lanes = 8;    // every path's narrow_lanes divides it

/// One output vector of `lanes` cells: `source` is the offset (from the source plane's
/// origin) that tap 0 of lane 0 reads. Lanes in `mask` are output cells at `output` + lane;
/// a vector that runs on past the end of an output row has its lanes of the next row in
/// `next_mask`, at `next_output` + lane. Other lanes are neither read nor written.
struct OutputVector {
  std::ptrdiff_t source, output, next_output;
  unsigned mask, next_mask;
};

/// out[r][vector v] = sum over x taps a and taps t of weights[a][t][r] * plane[a][v + tap[t]]
/// (+ bias[r] when bias is given; added to out when `accumulate`) for the tile's `rows`
/// (<= tile_rows) output rows, a channel stride apart in `out`. planes[a] is null for source
/// planes outside the source (they read as zero). `vectors`: tile_vectors of them.
void correlate_tile(const float* const* planes, int x_taps, const std::ptrdiff_t* tap_offsets,
                    int taps, const float* weights, const OutputVector* vectors, float* out,
                    std::ptrdiff_t out_channel_stride, int rows, const float* bias,
                    bool accumulate);

/// correlate_tile on bf16 dot products (only where pair_tiles_use_dot()), over planes of bf16
/// channel pairs (a 32-bit cell holds channel 2p's bf16 value in its upper half, 2p + 1's in
/// the lower; a tap is a pair's (y, z) tap; weights: per x tap and pair tap, the tile's R
/// weight pairs in the same layout). Each output adds channel 2p's product, then 2p + 1's, per
/// pair tap.
void correlate_pairs_tile(const uint32_t* const* planes, int x_taps,
                          const std::ptrdiff_t* tap_offsets, int taps, const uint32_t* weights,
                          const OutputVector* vectors, float* out,
                          std::ptrdiff_t out_channel_stride, int rows, const float* bias,
                          bool accumulate);
/// Whether the pair tiles run: the avx512 path of a CPU with AVX512_BF16, unless forbidden
/// (kernels::bf16_dot_products).
bool pair_tiles_use_dot();

/// gradient[t][o] += sum over cells of source[tap[t] + cell] * dy_t[cell][o] for `channels`
/// output channels: gradient_vectors x lanes of them and gradient_taps taps, or (a narrow
/// tile, for outputs that fill no more) one vector of lanes or of narrow_lanes channels and
/// tap_padding taps. dy_t: the output gradient transposed, dy_channels values per cell;
/// gradient: a row every `gradient_stride` values. Cells: `rows` rows of `columns` cells, a
/// row `row_stride` apart in the source.
void weight_gradient_tile(const float* source, const std::ptrdiff_t* tap_offsets,
                          std::ptrdiff_t row_stride, int rows, int columns, const float* dy_t,
                          int dy_channels, int channels, float* gradient,
                          std::ptrdiff_t gradient_stride);

/// Output channels per cell of the weight gradient's transposed output gradient (a block of a
/// group's `outs`): the group's, rounded up to the narrowest tile's channels, at most
/// gradient_channels. A group of 8 or 16 outputs has no 32-channel tiles of which most lanes
/// sum zeros.
inline int gradient_block_channels(int outs, const ConvTileShape& shape) {
  const int narrow = shape.narrow_lanes;
  return std::min(gradient_channels, (outs + narrow - 1) / narrow * narrow);
}
/// A bound over every path of a group's `outs` padded to whole blocks (gradient_block_channels).
inline int gradient_padded_outputs(int outs) {
  const int block = outs > gradient_channels ? gradient_channels : max_narrow_lanes;
  return (outs + block - 1) / block * block;
}
/// `taps` padded to whole weight-gradient tiles of every path.
inline int gradient_padded_taps(int taps) {
  return (taps + tap_padding - 1) / tap_padding * tap_padding;
}
/// A weight-gradient tile of a block of output channels: its first channel, channels and taps.
struct GradientTile {
  int first_channel, channels, taps;
};
/// The current path's tiles over a block of `block` channels: tiles of gradient_vectors x lanes
/// channels (gradient_taps taps), and where fewer are left, of a vector or of narrow_lanes
/// (tap_padding taps).
inline std::vector<GradientTile> gradient_block_tiles(int block, const ConvTileShape& shape) {
  const int whole = shape.gradient_vectors * shape.lanes;
  std::vector<GradientTile> tiles;
  for (int c0 = 0; c0 < block;) {
    const int left = block - c0;
    const int channels = left >= whole         ? whole
                         : left >= shape.lanes ? shape.lanes
                                               : shape.narrow_lanes;
    tiles.push_back({c0, channels, channels == whole ? shape.gradient_taps : tap_padding});
    c0 += channels;
  }
  return tiles;
}

/// weight_gradient_tile on bf16 dot products (only where pair_tiles_use_dot()), over pairs of
/// a row's cells: `source` a pair plane of the source's own cells (cell k holds k's bf16 value
/// in its upper half, k + 1's in the lower), `dy_pairs` the output gradient transposed as
/// pairs (per row, `pairs` pairs of cells (z, z + 1), dy_channels 32-bit pairs each; the
/// pair past an odd row's end is zero). The same sums in the same order: the same bits as
/// weight_gradient_tile on bf16 values (bar subnormal products).
void weight_gradient_pairs_tile(const uint32_t* source, const std::ptrdiff_t* tap_offsets,
                                std::ptrdiff_t row_stride, int rows, int pairs,
                                const uint32_t* dy_pairs, int dy_channels, int channels,
                                float* gradient, std::ptrdiff_t gradient_stride);

/// to[p * to_stride + c] = rows[c][p] for c < channels (a multiple of 4) and p < cells: rows of
/// cells transposed to a row of channels per cell (the weight gradient's output gradient,
/// weight_gradient_tile's dy_t). Copies only: the same bits on every path.
void transpose_rows(const float* const* rows, int channels, int cells, float* to,
                    std::ptrdiff_t to_stride);

/// to[(k * cells + p) * block + c] = rows[k * block + c][p] for p < cells: `channels` rows (a
/// multiple of `block`, at most gradient_channels a block; a null row reads as zeros)
/// transposed a block at a time (weight_gradient_tile's dy_t), 16 cells at a time so that their
/// rows of `block` channels stay in L1 while every channel writes into them.
inline void transpose_channel_blocks(const float* const* rows, int channels, int block, int cells,
                                     float* to) {
  static constexpr float zeros[16] = {};
  const float* block_rows[gradient_channels];
  for (int p0 = 0; p0 < cells; p0 += 16) {
    const int count = std::min(16, cells - p0);
    for (int k = 0; k < channels / block; ++k) {
      for (int c = 0; c < block; ++c) {
        const float* row = rows[k * block + c];
        block_rows[c] = row ? row + p0 : zeros;
      }
      transpose_rows(block_rows, block, count, to + (std::ptrdiff_t(k) * cells + p0) * block,
                     block);
    }
  }
}

// ---- Winograd's transforms (conv_winograd.cpp drives them) ------------------------------
// F(2x2, 3x3), the weight gradient's and narrow planes': a tile is 2 x 2 outputs of a 3x3
// correlation, read from 4 x 4 source cells; `tiles` tiles side by side along a pair of output
// rows, tile t at columns 2t. F(2x4, 3x3), wide planes' forward and input gradient: 2 x 4
// outputs from 4 x 6 source cells, tile t at columns 4t; F(2, 3) along the rows and F(4, 3) on the
// points 0, 1, -1, 1/2, -2 along the columns (the points of the smallest rounding).

/// v[xi * v_stride + t] = (B^T d_t B)[xi] (xi = 4 i + j) for t < tiles, d_t the 4 x 4 cells of
/// rows[0..4) from cell shift + 2t (a null row reads as zero, and so do cells outside
/// [0, row_cells), or with `wrap` the cells row_cells away). Writes v up to t rounded up to a
/// multiple of 16.
void winograd_input_tiles(const float* const* rows, std::ptrdiff_t shift, std::ptrdiff_t row_cells,
                          bool wrap, int tiles, float* v, std::ptrdiff_t v_stride);
/// The outputs of `tiles` tiles from their products m[xi * m_stride + t] (t read up to a
/// multiple of 16): y_t = A^T m_t A + bias, y_t's row i at row_i[2t], row_i[2t + 1] where
/// below `columns` (row1 null: not written).
void winograd_output_tiles(const float* m, std::ptrdiff_t m_stride, int tiles, float bias,
                           float* row0, float* row1, int columns);
/// The weight gradient's transformed output gradient: m[xi * m_stride + t] = (A y_t A^T)[xi]
/// for t < tiles, y_t the 2 x 2 cells 2t, 2t + 1 of row0 and row1 (zeros at and past `columns`,
/// and for a null row1). Writes m up to t rounded up to a multiple of 16.
void winograd_gradient_tiles(const float* row0, const float* row1, int columns, int tiles, float* m,
                             std::ptrdiff_t m_stride);
/// F(2x4, 3x3): v[xi * v_stride + t] = (B^T d_t B)[xi] (xi = 6 i + j) for t < tiles, d_t the
/// 4 x 6 cells of rows[0..4) from cell shift + 4t, read as winograd_input_tiles reads. Writes v
/// up to t rounded up to a multiple of 16.
void winograd_wide_input_tiles(const float* const* rows, std::ptrdiff_t shift,
                               std::ptrdiff_t row_cells, bool wrap, int tiles, float* v,
                               std::ptrdiff_t v_stride);
/// F(2x4, 3x3): the outputs of `tiles` tiles from their products m[xi * m_stride + t] (t read up
/// to a multiple of 16): y_t = A^T m_t A + bias, y_t's row i at row_i[4t .. 4t + 4) where below
/// `columns` (row1 null: not written).
void winograd_wide_output_tiles(const float* m, std::ptrdiff_t m_stride, int tiles, float bias,
                                float* row0, float* row1, int columns);

// ---- rows of float ------------------------------------------------------------------------

/// y[i] = x[i] Phi(x[i]) (GELU) for i < n.
void gelu_rows(const float* x, float* y, std::size_t n);
/// gx[i] += gy[i] (Phi(x[i]) + x[i] phi(x[i])) for i < n.
void gelu_backward_rows(const float* x, const float* gy, float* gx, std::size_t n);
/// max of x[0..n) (n > 0).
float row_max(const float* x, std::size_t n);
/// x[j] = exp(x[j] - shift) for j < n; returns their sum.
float exp_row(float* x, std::size_t n, float shift);
/// to[i] = upper[i]'s bf16 bits in the upper half and lower[i]'s in the lower half (zero
/// where lower is null), for i < n: rounded to nearest even, NaN kept (quiet), as
/// core/bfloat16.hpp's bfloat16_bits. The pair planes of the bf16 dot-product tiles.
void bf16_pairs(const float* upper, const float* lower, uint32_t* to, std::size_t n);
/// to[i] = from[i] rounded to bfloat16 (as bf16_pairs rounds), for i < n; to may be from.
void bf16_round(const float* from, float* to, std::size_t n);
/// bits[i] = from[i]'s bfloat16 bits (as bf16_pairs rounds) for i < n; returns how many of
/// from[0..n) were not bfloat16 values (NaN counts).
std::size_t bf16_pack(const float* from, uint16_t* bits, std::size_t n);

// ---- normalization rows (float cells, double arithmetic) ----------------------------------
// The portable kernels' expressions (kernels/src/normalization.cpp), op for op: the same bits
// per cell. A row's sums take one fixed order on every path (cell j adds to partial sum
// j mod 8, in order; the 8 partial sums add in a fixed tree), not the portable kernels' one.

/// The sum of x[0..n).
double sum_row(const float* x, std::size_t n);
/// sums = {sum of d, sum of d^2} over d = x[j] - mean, j < n.
void deviation_sums_row(const float* x, std::size_t n, double mean, double* sums);
/// sums = {sum of g, sum of g xhat} over g = dy[j], xhat = (x[j] - mean) rstd, j < n.
void gradient_sums_row(const float* dy, const float* x, std::size_t n, double mean, double rstd,
                       double* sums);
/// y[j] = (x[j] - mean) rstd scale + shift, rounded to float, for j < n.
void normalize_row(const float* x, float* y, std::size_t n, double mean, double rstd, double scale,
                   double shift);
/// dx[j] += c1 dy[j] - c2 - c3 xhat (rounded to float first; dx[j] = ... with `overwrite`),
/// xhat = (x[j] - mean) rstd, j < n.
void normalize_backward_row(const float* dy, const float* x, float* dx, std::size_t n, double mean,
                            double rstd, double c1, double c2, double c3, bool overwrite);

}  // namespace shardtensor::kernels::host
