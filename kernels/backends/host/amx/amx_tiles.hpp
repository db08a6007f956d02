#pragma once
// bf16 convolution tiles on Intel AMX (Advanced Matrix Extensions: Sapphire Rapids and later
// Xeons): one TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 float
// sums, sixteen times the multiply-adds per cycle of AVX-512's. The one file of raw intrinsics
// in the host backend: Highway has no matrix tiles. Compiled for x86-64 only (with
// -mamx-tile -mamx-bf16); elsewhere amx_tiles_usable() is false and nothing calls the tile.
//
// The operands are the pair planes of the bf16 dot-product tiles (vector_kernels.hpp): a
// 32-bit cell holds channel 2p's bf16 value in its upper half and 2p + 1's in the lower. A
// tile's B operand is 16 cells of `chunk_pairs` consecutive pair planes (a strided load), its
// A operand 16 output channels' weight pairs, its sums 16 output channels x 16 cells: per
// output cell, the order of the sums is the hardware's within a chunk of pairs, and chunk by
// chunk, tap by tap otherwise, the same for every cell (so sharded runs give one rank's bits).
//
// A thread's tiles stay configured from one call to the next (each call loads a configuration
// only where it differs from the one in place): loading and releasing them per call cost 15-20 %
// of a bf16 convolution's forward. amx_peak_products releases them.

#include <cstddef>
#include <cstdint>

#include "../vector_kernels.hpp"

namespace shardtensor::kernels::host {

/// Whether this CPU has AMX with bf16 and Linux lets this process use its tile registers
/// (asked once, ARCH_REQ_XCOMP_PERM).
bool amx_tiles_usable();
/// Whether they may run (SHARDTENSOR_AMX=off in the environment forbids, read on first use),
/// and allowing or forbidding them, for tests and measurements (kernels::allow_amx_tiles).
bool amx_tiles_allowed();
void allow_amx_tiles(bool allow);

/// Runs `rounds` rounds of four independent full tile products and returns the flops run (0
/// where the tiles are not usable): the tiles' ceiling, for benchmarks.
double amx_peak_products(std::size_t rounds);

/// Most output cells' vectors (16 cells each) per amx_correlate_tile call.
constexpr int amx_tile_vectors = 3;

/// out[o][cells of vector v] = bias[o] + sum over x taps a, chunks k, (y, z) taps t and the
/// chunk's pairs p of weights · planes[a] pair plane (k chunk_pairs + p) at vectors[v].source +
/// yz_offsets[t], for `rows` (<= 32) output channels a channel stride apart, `vector_count`
/// vectors (<= 2 where rows > 16, else <= 3). planes[a] null: outside the source (reads zero).
/// Pair planes of a plane lie `pair_stride` cells apart; 15 cells past a vector are read (the
/// lanes outside its masks are not written). weights: for each 16 output channels, [a][k][t]
/// [16 rows][chunk_pairs] weight pairs (rows past `rows` zero); `block_stride` values from one
/// 16 to the next.
void amx_correlate_tile(const uint32_t* const* planes, int x_taps, const std::ptrdiff_t* yz_offsets,
                        int yz_taps, std::ptrdiff_t pair_stride, int chunk_pairs, int chunks,
                        const uint32_t* weights, std::ptrdiff_t block_stride,
                        const OutputVector* vectors, int vector_count, float* out,
                        std::ptrdiff_t out_channel_stride, int rows, const float* bias);

/// gradient[j][o] += sum over `rows` rows and `chunks` chunks of `chunk_pairs` cell pairs of
/// source[j][cells] · dy[o][cells], for `channels` (<= 32) source channels j and `outs`
/// (<= 32; <= 48 for 16 channels or fewer) output channels o. source: bf16 values, channel j's
/// row y at source + j channel_stride + y row_stride (the pair planes' tap already applied),
/// its chunk k at cells 2 k chunk_pairs ...; dy_pairs: per row (dy_row_stride values apart)
/// and pair of cells, dy_channels 32-bit pairs (cell 2q's bf16 value in the lower half, 2q +
/// 1's in the upper: memory order, as the source's), zero past a row's cells. gradient: row j
/// gradient_channel_stride floats apart, o contiguous.
void amx_weight_gradient_tile(const uint16_t* source, std::ptrdiff_t channel_stride,
                              std::ptrdiff_t row_stride, int channels, const uint32_t* dy_pairs,
                              std::ptrdiff_t dy_row_stride, int dy_channels, int outs, int rows,
                              int chunk_pairs, int chunks, float* gradient,
                              std::ptrdiff_t gradient_channel_stride);

/// C = alpha op(A) op(B) + beta C on AMX tiles, row-major (leading dimensions lda, ldb, ldc;
/// op(A) m x k: A stored m x k, or k x m with trans_a; op(B) k x n: B stored k x n, or n x k
/// with trans_b), C not read where beta is 0. Each operand value is rounded to bf16 (nearest
/// even; subnormal values become zero, as the tiles take them) and the products summed in
/// float: per element of C, in the hardware's order within each chunk of 32 k, chunk after
/// chunk, the same for every element. Packs the operands into a scratch of the calling thread
/// (1 KiB per 16 x 32 values of A or B). Runs on the calling thread.
void amx_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
              std::ptrdiff_t lda, const float* b, std::ptrdiff_t ldb, float beta, float* c,
              std::ptrdiff_t ldc);

}  // namespace shardtensor::kernels::host
