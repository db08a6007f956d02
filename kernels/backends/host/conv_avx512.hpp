#pragma once
// Register-blocked AVX-512 kernels for the plane path of Conv<float> (conv_vector.cpp): the
// correlation of a source field with a small weight tensor, read straight from the source
// planes (no im2col), and its weight gradient. Only where cpu_features.hpp says so.

#include "cpu_features.hpp"

#ifdef SHARDTENSOR_HOST_AVX512
#include <cstddef>

// Loops over a tile's registers are unrolled fully, so that its accumulators stay in registers.
#define SHARDTENSOR_CONV_UNROLL _Pragma("GCC unroll 16")

namespace shardtensor::kernels::host::conv_avx512 {

constexpr int lanes = 16;  // floats per AVX-512 register

/// True where this CPU can run the kernels below.
inline bool available() {
  return avx512_available();
}

/// One output vector: 16 consecutive source positions. `source` is the offset (from the
/// source plane's origin) that tap (0, 0, 0) of lane 0 reads. Lanes in `mask` are output
/// cells at `output` + lane (offset in the output plane); a vector that runs on past the end
/// of an output row has its lanes of the next row in `next_mask`, at `next_output` + lane.
/// Other lanes are neither read nor written (all of them for padding vectors).
struct OutputVector {
  std::ptrdiff_t source, output, next_output;
  unsigned mask, next_mask;
};

/// Output rows per tile (weights broadcast) and vectors per tile (source loads): 8 x 3
/// accumulators, 3 loads and 8 broadcasts per 24 FMAs.
constexpr int tile_rows = 8;
constexpr int tile_vectors = 3;

/// out[r][vector v] = sum over x taps a and taps t of weights[a][t][r] * plane[a][v + tap[t]]
/// (+ bias[r] when bias is given; added to out when `accumulate`) for the tile's `rows`
/// (<= tile_rows) output rows, a channel stride apart in `out`. planes[a] is null for source
/// planes outside the source (they read as zero).
__attribute__((target("avx512f"))) inline void correlate_tile(
    const float* const* planes, int x_taps, const std::ptrdiff_t* tap_offsets, int taps,
    const float* weights, const OutputVector* vectors, float* out,
    std::ptrdiff_t out_channel_stride, int rows, const float* bias, bool accumulate) {
  constexpr int R = tile_rows, V = tile_vectors;
  __m512 acc[R][V];
  SHARDTENSOR_CONV_UNROLL
  for (int r = 0; r < R; ++r) SHARDTENSOR_CONV_UNROLL
  for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  __mmask16 mask[V];  // the lanes read
  SHARDTENSOR_CONV_UNROLL
  for (int v = 0; v < V; ++v)
    mask[v] = static_cast<__mmask16>(vectors[v].mask | vectors[v].next_mask);
  for (int a = 0; a < x_taps; ++a) {
    if (!planes[a]) continue;
    const float* source[V];
    SHARDTENSOR_CONV_UNROLL
    for (int v = 0; v < V; ++v) source[v] = planes[a] + vectors[v].source;
    const float* w = weights + std::ptrdiff_t(a) * taps * R;
    for (int t = 0; t < taps; ++t, w += R) {
      const std::ptrdiff_t offset = tap_offsets[t];
      __m512 x[V];
      SHARDTENSOR_CONV_UNROLL
      for (int v = 0; v < V; ++v) x[v] = _mm512_maskz_loadu_ps(mask[v], source[v] + offset);
      SHARDTENSOR_CONV_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512 weight = _mm512_set1_ps(w[r]);
        SHARDTENSOR_CONV_UNROLL
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(weight, x[v], acc[r][v]);
      }
    }
  }
  SHARDTENSOR_CONV_UNROLL
  for (int r = 0; r < R; ++r) {  // constant bounds: acc stays in registers
    if (r >= rows) break;
    const __m512 b = _mm512_set1_ps(bias ? bias[r] : 0.0f);
    SHARDTENSOR_CONV_UNROLL
    for (int v = 0; v < V; ++v) {
      const OutputVector& vector = vectors[v];
      float* const p = out + r * out_channel_stride + vector.output;
      float* const next = out + r * out_channel_stride + vector.next_output;
      const __mmask16 row = static_cast<__mmask16>(vector.mask);
      const __mmask16 next_row = static_cast<__mmask16>(vector.next_mask);
      __m512 sum = _mm512_add_ps(acc[r][v], b);
      if (accumulate)
        sum =
            _mm512_add_ps(sum, _mm512_mask_loadu_ps(_mm512_maskz_loadu_ps(row, p), next_row, next));
      _mm512_mask_storeu_ps(p, row, sum);
      if (next_row) _mm512_mask_storeu_ps(next, next_row, sum);
    }
  }
}

/// dst[p * dst_stride + i] = rows[i][p] for 16 rows of 16 values: a 16 x 16 transpose in
/// registers (pairs of rows interleaved, then quadruples, then 128-bit lanes).
__attribute__((target("avx512f"))) inline void transpose_16x16(const float* const* rows, float* dst,
                                                               std::ptrdiff_t dst_stride) {
  // The zero-masked forms with every lane kept: the same instructions, without the
  // _mm512_undefined_ps() that trips GCC 12's -Wuninitialized (bug 105593) where inlined.
  constexpr __mmask16 all = 0xffff;
  __m512 r[16], t[16];
  SHARDTENSOR_CONV_UNROLL
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows[i]);
  // t[2i], t[2i + 1], 128-bit lane L: rows 2i, 2i + 1 at columns 4L, 4L + 1 and 4L + 2, 4L + 3.
  SHARDTENSOR_CONV_UNROLL
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
  }
  // r[4i + k], lane L: rows 4i .. 4i + 3 at column 4L + k.
  SHARDTENSOR_CONV_UNROLL
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // Column 4L + k: lane L of r[k], r[4 + k], r[8 + k], r[12 + k].
  SHARDTENSOR_CONV_UNROLL
  for (int k = 0; k < 4; ++k) {
    const __m512 low_a = _mm512_maskz_shuffle_f32x4(all, r[k], r[4 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 high_a = _mm512_maskz_shuffle_f32x4(all, r[k], r[4 + k], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 low_b =
        _mm512_maskz_shuffle_f32x4(all, r[8 + k], r[12 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 high_b =
        _mm512_maskz_shuffle_f32x4(all, r[8 + k], r[12 + k], _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_storeu_ps(dst + k * dst_stride,
                     _mm512_maskz_shuffle_f32x4(all, low_a, low_b, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_ps(dst + (4 + k) * dst_stride,
                     _mm512_maskz_shuffle_f32x4(all, low_a, low_b, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_ps(dst + (8 + k) * dst_stride,
                     _mm512_maskz_shuffle_f32x4(all, high_a, high_b, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_ps(dst + (12 + k) * dst_stride,
                     _mm512_maskz_shuffle_f32x4(all, high_a, high_b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
}

/// Taps per weight-gradient tile (each broadcast per cell) and output-channel vectors.
constexpr int gradient_taps = 12;
constexpr int gradient_vectors = 2;

/// gradient[t][o] += sum over cells of source[tap[t] + cell] * dy_t[cell][o] for 12 taps and
/// 32 output channels (dy_t: the output gradient transposed, 32 channels per cell, zero
/// padded; gradient: a row of 32 every `gradient_stride` values). Cells: `rows` rows of
/// `columns` cells, a row `row_stride` apart in the source.
__attribute__((target("avx512f"))) inline void weight_gradient_tile(
    const float* source, const std::ptrdiff_t* tap_offsets, std::ptrdiff_t row_stride, int rows,
    int columns, const float* dy_t, float* gradient, std::ptrdiff_t gradient_stride) {
  constexpr int T = gradient_taps, O = gradient_vectors;
  __m512 acc[T][O];
  SHARDTENSOR_CONV_UNROLL
  for (int t = 0; t < T; ++t) SHARDTENSOR_CONV_UNROLL
  for (int o = 0; o < O; ++o) acc[t][o] = _mm512_setzero_ps();
  const float* row = source;
  for (int y = 0; y < rows; ++y, row += row_stride) {
    for (int z = 0; z < columns; ++z, dy_t += O * lanes) {
      __m512 g[O];
      SHARDTENSOR_CONV_UNROLL
      for (int o = 0; o < O; ++o) g[o] = _mm512_loadu_ps(dy_t + o * lanes);
      SHARDTENSOR_CONV_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m512 x = _mm512_set1_ps(row[tap_offsets[t] + z]);
        SHARDTENSOR_CONV_UNROLL
        for (int o = 0; o < O; ++o) acc[t][o] = _mm512_fmadd_ps(x, g[o], acc[t][o]);
      }
    }
  }
  SHARDTENSOR_CONV_UNROLL
  for (int t = 0; t < T; ++t) SHARDTENSOR_CONV_UNROLL
  for (int o = 0; o < O; ++o) {
    float* p = gradient + t * gradient_stride + o * lanes;
    _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), acc[t][o]));
  }
}

}  // namespace shardtensor::kernels::host::conv_avx512

#undef SHARDTENSOR_CONV_UNROLL

#endif
