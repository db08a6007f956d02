// The host backend's vector kernels (vector_kernels.hpp), written once on Google Highway and
// compiled by Highway's foreach_target.h once per instruction set: this file includes itself.
// Without Highway (SHARDTENSOR_HOST_VECTOR_KERNELS undefined: CUDA builds, whose kernels run
// on the device) the path is always "off".

#include "host/vector_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "host/environment_switch.hpp"
#include "shardtensor/core/error.hpp"

#ifdef SHARDTENSOR_HOST_VECTOR_KERNELS

#include "host/vector_targets.hpp"
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "host/vector_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace shardtensor::kernels::host {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// At most 16 floats a vector: masks fit an unsigned, and 16 is the row sums' block.
using D = hn::CappedTag<float, 16>;
using V = hn::Vec<D>;
using M = hn::Mask<D>;
constexpr int lanes = static_cast<int>(hn::MaxLanes(D()));

// The register tiles: AVX2 has 16 vector registers, AVX-512 and NEON 32.
#if HWY_TARGET == HWY_AVX2
constexpr int registers = 16;
#else
constexpr int registers = 32;
#endif
// Correlate: rows x vectors accumulators, plus a load per vector and one broadcast.
constexpr int tile_rows = registers == 32 ? 8 : 4;
constexpr int tile_vectors = 3;
// Weight gradient: taps x vectors accumulators, plus a load per vector and one broadcast.
constexpr int gradient_taps = registers == 32 ? 12 : 6;
constexpr int gradient_vectors = 2;
// A weight-gradient tile of one vector of channels (a narrow tile, for outputs that fill no
// more) holds tap_padding taps instead: as many accumulators or fewer. Its vector is a whole
// one, or (for 8 outputs or fewer on AVX-512) 8 lanes: on CPUs that split a 512-bit multiply-add
// in two halves (Zen 4), half the time where half the lanes would be padding.
using DN = hn::CappedTag<float, 8>;
constexpr int narrow_lanes = static_cast<int>(hn::MaxLanes(DN()));
static_assert(tap_padding % gradient_taps == 0 && max_narrow_lanes % narrow_lanes == 0 &&
              tile_rows <= max_tile_rows && gradient_vectors == 2 &&
              gradient_vectors * lanes <= gradient_channels &&
              tap_padding <= gradient_taps * gradient_vectors);

// Masked loads and stores that never touch the other lanes: native on AVX-512 and (float)
// AVX2; elsewhere (NEON) Highway's would read or write the whole vector, so the lanes go
// through a copy.
#if !HWY_MEM_OPS_MIGHT_FAULT || HWY_TARGET == HWY_AVX2
constexpr bool native_masks = true;
#else
constexpr bool native_masks = false;
#endif
constexpr unsigned all_lanes = lanes >= 32 ? ~0u : (1u << lanes) - 1u;

HWY_INLINE M mask_of(unsigned bits) {
  uint8_t bytes[8] = {};
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(bits >> (8 * i));
  return hn::LoadMaskBits(D(), bytes);
}
HWY_INLINE V load_lanes(unsigned bits, const float* p) {
  if (bits == all_lanes) return hn::LoadU(D(), p);
  if constexpr (native_masks) {
    return hn::MaskedLoad(mask_of(bits), D(), p);
  } else {
    HWY_ALIGN float copy[lanes] = {};
    for (int i = 0; i < lanes; ++i)
      if (bits >> i & 1u) copy[i] = p[i];
    return hn::Load(D(), copy);
  }
}
HWY_INLINE void store_lanes(V v, unsigned bits, float* p) {
  if (bits == all_lanes) return hn::StoreU(v, D(), p);
  if constexpr (native_masks) {
    hn::BlendedStore(v, mask_of(bits), D(), p);
  } else {
    HWY_ALIGN float copy[lanes];
    hn::Store(v, D(), copy);
    for (int i = 0; i < lanes; ++i)
      if (bits >> i & 1u) p[i] = copy[i];
  }
}

// ---- convolution tiles ---------------------------------------------------------------------

ConvTileShape TileShape() {
  return {lanes, tile_rows, tile_vectors, gradient_taps, gradient_vectors, narrow_lanes};
}

/// out[r][vector v] = acc[r][v] + bias[r] (+ out when `accumulate`) for the tile's `rows`
/// rows and first T vectors: the lanes of each vector's own row, and of the next row where it
/// runs on.
template <int T = tile_vectors>
HWY_INLINE void store_tile(V (&acc)[tile_rows][tile_vectors], const OutputVector* vectors,
                           float* out, std::ptrdiff_t out_channel_stride, int rows,
                           const float* bias, bool accumulate) {
  constexpr int R = tile_rows;
  const D d;
  HWY_UNROLL(16)
  for (int r = 0; r < R; ++r) {  // constant bounds: acc stays in registers
    if (r >= rows) break;
    const V b = hn::Set(d, bias ? bias[r] : 0.0f);
    HWY_UNROLL(16)
    for (int v = 0; v < T; ++v) {
      const OutputVector& vector = vectors[v];
      float* const p = out + r * out_channel_stride + vector.output;
      float* const next = out + r * out_channel_stride + vector.next_output;
      V sum = hn::Add(acc[r][v], b);
      if (vector.next_mask == 0) {
        if (accumulate) sum = hn::Add(sum, load_lanes(vector.mask, p));
        store_lanes(sum, vector.mask, p);
      } else {  // lanes of two output rows
        if (accumulate)
          sum =
              hn::Add(sum, hn::Or(load_lanes(vector.mask, p), load_lanes(vector.next_mask, next)));
        store_lanes(sum, vector.mask, p);
        store_lanes(sum, vector.next_mask, next);
      }
    }
  }
}

/// Whether every one of the first T vectors' lanes are all read (plain loads).
template <int T = tile_vectors>
HWY_INLINE bool whole_tile(const OutputVector* vectors) {
  bool whole = true;
  for (int v = 0; v < T; ++v)
    whole = whole && (vectors[v].mask | vectors[v].next_mask) == all_lanes;
  return whole;
}

/// The correlate tile's sums over its first T vectors; `whole`: their lanes are all read
/// (plain loads).
template <bool whole, int T>
HWY_INLINE void correlate_sums(const float* const* planes, int x_taps,
                               const std::ptrdiff_t* tap_offsets, int taps, const float* weights,
                               const OutputVector* vectors, V (&acc)[tile_rows][tile_vectors]) {
  constexpr int R = tile_rows;
  const D d;
  unsigned read[T];
  HWY_UNROLL(16)
  for (int v = 0; v < T; ++v) read[v] = vectors[v].mask | vectors[v].next_mask;
  for (int a = 0; a < x_taps; ++a) {
    if (!planes[a]) continue;
    const float* source[T];
    HWY_UNROLL(16)
    for (int v = 0; v < T; ++v) source[v] = planes[a] + vectors[v].source;
    const float* w = weights + std::ptrdiff_t(a) * taps * R;
    for (int t = 0; t < taps; ++t, w += R) {
      const std::ptrdiff_t offset = tap_offsets[t];
      V x[T];
      HWY_UNROLL(16)
      for (int v = 0; v < T; ++v)
        x[v] = whole ? hn::LoadU(d, source[v] + offset) : load_lanes(read[v], source[v] + offset);
      HWY_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const V weight = hn::Set(d, w[r]);
        HWY_UNROLL(16)
        for (int v = 0; v < T; ++v) acc[r][v] = hn::MulAdd(weight, x[v], acc[r][v]);
      }
    }
  }
}

/// CorrelateTile on its first T vectors.
template <int T>
HWY_INLINE void correlate_vectors(const float* const* planes, int x_taps,
                                  const std::ptrdiff_t* tap_offsets, int taps, const float* weights,
                                  const OutputVector* vectors, float* out,
                                  std::ptrdiff_t out_channel_stride, int rows, const float* bias,
                                  bool accumulate) {
  V acc[tile_rows][tile_vectors];
  HWY_UNROLL(16)
  for (int r = 0; r < tile_rows; ++r)
    HWY_UNROLL(16) for (int v = 0; v < T; ++v) acc[r][v] = hn::Zero(D());
  if (whole_tile<T>(vectors))
    correlate_sums<true, T>(planes, x_taps, tap_offsets, taps, weights, vectors, acc);
  else
    correlate_sums<false, T>(planes, x_taps, tap_offsets, taps, weights, vectors, acc);
  store_tile<T>(acc, vectors, out, out_channel_stride, rows, bias, accumulate);
}

/// The vectors of a tile before its padding (vectors without lanes, which only the last tile
/// of a band has): the last tile sums and loads no padding, and its real vectors keep their
/// plain loads.
HWY_INLINE int vectors_in(const OutputVector* vectors) {
  int count = tile_vectors;
  while (count > 1 && (vectors[count - 1].mask | vectors[count - 1].next_mask) == 0) --count;
  return count;
}

void CorrelateTile(const float* const* planes, int x_taps, const std::ptrdiff_t* tap_offsets,
                   int taps, const float* weights, const OutputVector* vectors, float* out,
                   std::ptrdiff_t out_channel_stride, int rows, const float* bias,
                   bool accumulate) {
  static_assert(tile_vectors == 3, "one case per count of vectors");
  switch (vectors_in(vectors)) {
    case 1:
      return correlate_vectors<1>(planes, x_taps, tap_offsets, taps, weights, vectors, out,
                                  out_channel_stride, rows, bias, accumulate);
    case 2:
      return correlate_vectors<2>(planes, x_taps, tap_offsets, taps, weights, vectors, out,
                                  out_channel_stride, rows, bias, accumulate);
    default:
      return correlate_vectors<3>(planes, x_taps, tap_offsets, taps, weights, vectors, out,
                                  out_channel_stride, rows, bias, accumulate);
  }
}

// ---- bf16 dot products ----------------------------------------------------------------------
// A pair plane holds two bf16 values in each 32-bit cell (two source channels for the
// correlation, two neighbouring cells for the weight gradient), the first in the upper half
// (where a float keeps it). AVX512_BF16's vdpbf16ps adds the upper pair's product, then the
// lower's, each exact (bf16 x bf16 fits a float) and each add rounded once: the bits of two
// multiply-adds in that order, except that it flushes subnormal values to zero.

using DU = hn::RebindToUnsigned<D>;
using VU = hn::Vec<DU>;

HWY_INLINE VU load_pair_lanes(unsigned bits, const uint32_t* p) {
  const DU du;
  if (bits == all_lanes) return hn::LoadU(du, p);
  if constexpr (native_masks) {
    return hn::MaskedLoad(hn::RebindMask(du, mask_of(bits)), du, p);
  } else {
    HWY_ALIGN uint32_t copy[lanes] = {};
    for (int i = 0; i < lanes; ++i)
      if (bits >> i & 1u) copy[i] = p[i];
    return hn::Load(du, copy);
  }
}

#if HWY_TARGET == HWY_AVX3 || (HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64)
#if HWY_TARGET == HWY_AVX3
// Compiled for AVX512_BF16 besides the target's own instructions (Highway 1.0.3 has no op for
// vdpbf16ps); run only where the CPU has it (bf16_dot_products()).
#define SHARDTENSOR_BF16_DOT __attribute__((target("avx512bf16")))

/// acc + the bf16 dot products of a and b's pairs (vdpbf16ps), at the vector's width.
SHARDTENSOR_BF16_DOT HWY_INLINE V DotPairs(V acc, VU a, VU b) {
  acc.raw = _mm512_dpbf16_ps(acc.raw, (__m512bh)a.raw, (__m512bh)b.raw);
  return acc;
}
SHARDTENSOR_BF16_DOT HWY_INLINE hn::Vec<DN> DotPairs(hn::Vec<DN> acc,
                                                     hn::Vec<hn::RebindToUnsigned<DN>> a,
                                                     hn::Vec<hn::RebindToUnsigned<DN>> b) {
  acc.raw = _mm256_dpbf16_ps(acc.raw, (__m256bh)a.raw, (__m256bh)b.raw);
  return acc;
}
#else
// Arm's BFDOT (FEAT_BF16: Neoverse V1 and later, Graviton 3 and later, Grace, Apple M2 and
// later), compiled for it besides NEON; run only where the CPU has it (bf16_dot_products()).
// It rounds otherwise than vdpbf16ps: acc + (a's pair's two products summed), each add rounded
// to odd (FPCR.EBF is 0 under Linux), subnormals flushed to zero.
// (Highway's NEON functions are compiled with +crypto: a caller must have it to inline them.)
#define SHARDTENSOR_BF16_DOT __attribute__((target("arch=armv8.2-a+crypto+bf16")))

/// acc + the bf16 dot products of a and b's pairs (BFDOT), four lanes (DN is D here).
SHARDTENSOR_BF16_DOT HWY_INLINE V DotPairs(V acc, VU a, VU b) {
  acc.raw = vbfdotq_f32(acc.raw, vreinterpretq_bf16_u32(a.raw), vreinterpretq_bf16_u32(b.raw));
  return acc;
}
#endif

/// The pair tile's sums on bf16 dot products over its first T vectors. Weights: per pair tap,
/// the tile's R pairs.
template <bool whole, int T>
SHARDTENSOR_BF16_DOT HWY_INLINE void pair_dot_sums(const uint32_t* const* planes, int x_taps,
                                                   const std::ptrdiff_t* tap_offsets, int taps,
                                                   const uint32_t* weights,
                                                   const OutputVector* vectors,
                                                   V (&acc)[tile_rows][tile_vectors]) {
  constexpr int R = tile_rows;
  const DU du;
  unsigned read[T];
  HWY_UNROLL(16)
  for (int v = 0; v < T; ++v) read[v] = vectors[v].mask | vectors[v].next_mask;
  for (int a = 0; a < x_taps; ++a) {
    if (!planes[a]) continue;
    const uint32_t* source[T];
    HWY_UNROLL(16)
    for (int v = 0; v < T; ++v) source[v] = planes[a] + vectors[v].source;
    const uint32_t* w = weights + std::ptrdiff_t(a) * taps * R;
    for (int t = 0; t < taps; ++t, w += R) {
      const std::ptrdiff_t offset = tap_offsets[t];
      VU x[T];
      HWY_UNROLL(16)
      for (int v = 0; v < T; ++v)
        x[v] = whole ? hn::LoadU(du, source[v] + offset)
                     : load_pair_lanes(read[v], source[v] + offset);
      HWY_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const VU pair = hn::Set(du, w[r]);
        HWY_UNROLL(16)
        for (int v = 0; v < T; ++v) acc[r][v] = DotPairs(acc[r][v], x[v], pair);
      }
    }
  }
}

/// CorrelatePairsTileDot on its first T vectors.
template <int T>
SHARDTENSOR_BF16_DOT HWY_INLINE void correlate_pair_vectors(
    const uint32_t* const* planes, int x_taps, const std::ptrdiff_t* tap_offsets, int taps,
    const uint32_t* weights, const OutputVector* vectors, float* out,
    std::ptrdiff_t out_channel_stride, int rows, const float* bias, bool accumulate) {
  V acc[tile_rows][tile_vectors];
  HWY_UNROLL(16)
  for (int r = 0; r < tile_rows; ++r)
    HWY_UNROLL(16) for (int v = 0; v < T; ++v) acc[r][v] = hn::Zero(D());
  if (whole_tile<T>(vectors))
    pair_dot_sums<true, T>(planes, x_taps, tap_offsets, taps, weights, vectors, acc);
  else
    pair_dot_sums<false, T>(planes, x_taps, tap_offsets, taps, weights, vectors, acc);
  store_tile<T>(acc, vectors, out, out_channel_stride, rows, bias, accumulate);
}

SHARDTENSOR_BF16_DOT void CorrelatePairsTileDot(const uint32_t* const* planes, int x_taps,
                                                const std::ptrdiff_t* tap_offsets, int taps,
                                                const uint32_t* weights,
                                                const OutputVector* vectors, float* out,
                                                std::ptrdiff_t out_channel_stride, int rows,
                                                const float* bias, bool accumulate) {
  static_assert(tile_vectors == 3, "one case per count of vectors");
  switch (vectors_in(vectors)) {
    case 1:
      return correlate_pair_vectors<1>(planes, x_taps, tap_offsets, taps, weights, vectors, out,
                                       out_channel_stride, rows, bias, accumulate);
    case 2:
      return correlate_pair_vectors<2>(planes, x_taps, tap_offsets, taps, weights, vectors, out,
                                       out_channel_stride, rows, bias, accumulate);
    default:
      return correlate_pair_vectors<3>(planes, x_taps, tap_offsets, taps, weights, vectors, out,
                                       out_channel_stride, rows, bias, accumulate);
  }
}

/// WeightGradientTile on bf16 dot products, over pairs of a row's cells (z, z + 1): the
/// source as a pair plane of its own cells (cell k: k's bf16 value upper, k + 1's lower) and
/// the output gradient transposed as pairs (per row, per pair of cells, dy_channels pairs).
/// Each sum adds cell z's product, then z + 1's, as WeightGradientTile does. O vectors of
/// output channels of tag DT (one vector: tap_padding taps).
template <class DT, int O>
SHARDTENSOR_BF16_DOT HWY_INLINE void weight_gradient_pair_sums(const uint32_t* source,
                                                               const std::ptrdiff_t* tap_offsets,
                                                               std::ptrdiff_t row_stride, int rows,
                                                               int pairs, const uint32_t* dy_pairs,
                                                               int dy_channels, float* gradient,
                                                               std::ptrdiff_t gradient_stride) {
  constexpr int T = O == 1 ? tap_padding : gradient_taps;
  constexpr int L = static_cast<int>(hn::MaxLanes(DT()));
  const DT d;
  const hn::RebindToUnsigned<DT> du;
  hn::Vec<DT> acc[T][O];
  HWY_UNROLL(16)
  for (int t = 0; t < T; ++t) HWY_UNROLL(16) for (int o = 0; o < O; ++o) acc[t][o] = hn::Zero(d);
  const uint32_t* row = source;
  for (int y = 0; y < rows; ++y, row += row_stride) {
    for (int q = 0; q < pairs; ++q, dy_pairs += dy_channels) {
      hn::Vec<decltype(du)> g[O];
      HWY_UNROLL(16)
      for (int o = 0; o < O; ++o) g[o] = hn::LoadU(du, dy_pairs + o * L);
      HWY_UNROLL(16)
      for (int t = 0; t < T; ++t) {
        const auto x = hn::Set(du, row[tap_offsets[t] + 2 * q]);
        HWY_UNROLL(16)
        for (int o = 0; o < O; ++o) acc[t][o] = DotPairs(acc[t][o], x, g[o]);
      }
    }
  }
  HWY_UNROLL(16)
  for (int t = 0; t < T; ++t) HWY_UNROLL(16) for (int o = 0; o < O; ++o) {
      float* p = gradient + t * gradient_stride + o * L;
      hn::StoreU(hn::Add(hn::LoadU(d, p), acc[t][o]), d, p);
    }
}

SHARDTENSOR_BF16_DOT void WeightGradientPairsTileDot(const uint32_t* source,
                                                     const std::ptrdiff_t* tap_offsets,
                                                     std::ptrdiff_t row_stride, int rows, int pairs,
                                                     const uint32_t* dy_pairs, int dy_channels,
                                                     int channels, float* gradient,
                                                     std::ptrdiff_t gradient_stride) {
  if (channels == gradient_vectors * lanes)
    weight_gradient_pair_sums<D, gradient_vectors>(source, tap_offsets, row_stride, rows, pairs,
                                                   dy_pairs, dy_channels, gradient,
                                                   gradient_stride);
  else if (channels == lanes)
    weight_gradient_pair_sums<D, 1>(source, tap_offsets, row_stride, rows, pairs, dy_pairs,
                                    dy_channels, gradient, gradient_stride);
  else if (channels == narrow_lanes)
    weight_gradient_pair_sums<DN, 1>(source, tap_offsets, row_stride, rows, pairs, dy_pairs,
                                     dy_channels, gradient, gradient_stride);
  else
    SHARDTENSOR_FAIL("weight_gradient_pairs_tile", "no tile of " << channels << " channels");
}
#undef SHARDTENSOR_BF16_DOT
#else
void WeightGradientPairsTileDot(const uint32_t*, const std::ptrdiff_t*, std::ptrdiff_t, int, int,
                                const uint32_t*, int, int, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("weight_gradient_pairs_tile", "this path has no bf16 dot products");
}
void CorrelatePairsTileDot(const uint32_t* const*, int, const std::ptrdiff_t*, int, const uint32_t*,
                           const OutputVector*, float*, std::ptrdiff_t, int, const float*, bool) {
  SHARDTENSOR_FAIL("correlate_pairs_tile", "this path has no bf16 dot products");
}
#endif

/// WeightGradientTile's sums for O vectors of output channels of tag DT (one vector:
/// tap_padding taps).
template <class DT, int O>
HWY_INLINE void weight_gradient_sums(const float* source, const std::ptrdiff_t* tap_offsets,
                                     std::ptrdiff_t row_stride, int rows, int columns,
                                     const float* dy_t, int dy_channels, float* gradient,
                                     std::ptrdiff_t gradient_stride) {
  constexpr int T = O == 1 ? tap_padding : gradient_taps;
  constexpr int L = static_cast<int>(hn::MaxLanes(DT()));
  const DT d;
  hn::Vec<DT> acc[T][O];
  HWY_UNROLL(16)
  for (int t = 0; t < T; ++t) HWY_UNROLL(16) for (int o = 0; o < O; ++o) acc[t][o] = hn::Zero(d);
  const float* row = source;
  for (int y = 0; y < rows; ++y, row += row_stride) {
    for (int z = 0; z < columns; ++z, dy_t += dy_channels) {
      hn::Vec<DT> g[O];
      HWY_UNROLL(16)
      for (int o = 0; o < O; ++o) g[o] = hn::LoadU(d, dy_t + o * L);
      HWY_UNROLL(16)
      for (int t = 0; t < T; ++t) {
        const hn::Vec<DT> x = hn::Set(d, row[tap_offsets[t] + z]);
        HWY_UNROLL(16)
        for (int o = 0; o < O; ++o) acc[t][o] = hn::MulAdd(x, g[o], acc[t][o]);
      }
    }
  }
  HWY_UNROLL(16)
  for (int t = 0; t < T; ++t) HWY_UNROLL(16) for (int o = 0; o < O; ++o) {
      float* p = gradient + t * gradient_stride + o * L;
      hn::StoreU(hn::Add(hn::LoadU(d, p), acc[t][o]), d, p);
    }
}

void WeightGradientTile(const float* source, const std::ptrdiff_t* tap_offsets,
                        std::ptrdiff_t row_stride, int rows, int columns, const float* dy_t,
                        int dy_channels, int channels, float* gradient,
                        std::ptrdiff_t gradient_stride) {
  if (channels == gradient_vectors * lanes)
    weight_gradient_sums<D, gradient_vectors>(source, tap_offsets, row_stride, rows, columns, dy_t,
                                              dy_channels, gradient, gradient_stride);
  else if (channels == lanes)
    weight_gradient_sums<D, 1>(source, tap_offsets, row_stride, rows, columns, dy_t, dy_channels,
                               gradient, gradient_stride);
  else if (channels == narrow_lanes)
    weight_gradient_sums<DN, 1>(source, tap_offsets, row_stride, rows, columns, dy_t, dy_channels,
                                gradient, gradient_stride);
  else
    SHARDTENSOR_FAIL("weight_gradient_tile", "no tile of " << channels << " channels");
}

// ---- exp, GELU, rows -----------------------------------------------------------------------

/// exp(x) for x <= 88: x = n ln2 + r, Cephes' degree-5 polynomial for exp(r), 2^n built in
/// the exponent bits (~1 ulp). x < -87 returns exp(-87) ~ 1.6e-38, not 0.
HWY_INLINE V Exp(V x) {
  const D d;
  const hn::RebindToSigned<D> di;
  x = hn::Max(x, hn::Set(d, -87.0f));
  // x log2(e) + 1.5 * 2^23: round(x log2 e) lands in the low mantissa bits.
  const V shifted = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), hn::Set(d, 12582912.0f));
  const V n = hn::Sub(shifted, hn::Set(d, 12582912.0f));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);  // ln2 in two parts
  r = hn::MulAdd(n, hn::Set(d, 2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::MulAdd(hn::Mul(p, r), r, hn::Add(r, hn::Set(d, 1.0f)));
  const auto exponent = hn::ShiftLeft<23>(
      hn::Sub(hn::BitCast(di, shifted), hn::Set(di, int32_t{0x4B400000 - 127})));
  return hn::Mul(p, hn::BitCast(d, exponent));
}

/// Phi(x) in two stages (see kernels/gelu.hpp): the first without exp, the second with it.
/// The row loops run the first stage on a block of vectors, then the second: each stage's
/// chain of dependent operations is half as long, so more vectors are in flight (1.5x on
/// AVX2, 1.2x on AVX-512), with the same operations in the same order.
struct CdfParts {
  V t;         // 1 / (1 + z / 2), z = |x| / sqrt 2
  V exponent;  // of erfc(z) = t exp(exponent)
  V square;    // -x^2 / 2 (hi + lo), the density's exponent
};

HWY_INLINE CdfParts CdfStage1(V x) {
  const D d;
  // -x^2 / 2 as hi + lo (hi = fl(x^2), lo = its rounding error): the exponent's absolute
  // error is what becomes the tail's relative error, and x^2 reaches ~170 there.
  const V square = hn::Mul(x, x);
  const V square_error = hn::MulSub(x, x, square);
  const V minus_half = hn::Set(d, -0.5f);
  const V hi = hn::Mul(minus_half, square);  // exact: a power of two
  const V lo = hn::Mul(minus_half, square_error);
  // z = |x| / sqrt 2; t = 1 / (1 + z / 2).
  const V z = hn::Mul(hn::Abs(x), hn::Set(d, 0.70710678118654752f));
  const V one = hn::Set(d, 1.0f);
  const V t = hn::Div(one, hn::MulAdd(hn::Set(d, 0.5f), z, one));
  V p = hn::Set(d, 0.17087277f);
  p = hn::MulAdd(p, t, hn::Set(d, -0.82215223f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.48851587f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.13520398f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.27886807f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.18628806f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.09678418f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.37409196f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.00002368f));
  p = hn::MulAdd(p, t, hn::Set(d, -1.26551223f));
  return {t, hn::Add(hn::Add(p, lo), hi), hn::Add(hi, lo)};
}

/// Phi(x) from the first stage, and exp(-x^2 / 2) (for the density) when `density` is given.
HWY_INLINE V CdfStage2(V x, const CdfParts& parts, V* density) {
  const D d;
  // erfc(z) / 2 = t exp(-z^2 + P) / 2; exp underflows to 0 below -87 (Exp clamps there).
  const V floor = hn::Set(d, -87.0f);
  const V tail = hn::IfThenElseZero(hn::Ge(parts.exponent, floor),
                                    hn::Mul(hn::Mul(hn::Set(d, 0.5f), parts.t), Exp(parts.exponent)));
  if (density) *density = hn::IfThenElseZero(hn::Ge(parts.square, floor), Exp(parts.square));
  // Phi(x) = tail for x < 0, 1 - tail otherwise.
  return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), tail, hn::Sub(hn::Set(d, 1.0f), tail));
}

HWY_INLINE V GeluFromParts(V x, const CdfParts& parts) {
  return hn::Mul(x, CdfStage2(x, parts, nullptr));
}

/// gx + gy (Phi(x) + x phi(x)).
HWY_INLINE V GeluGradientFromParts(V x, const CdfParts& parts, V gy, V gx) {
  V density;
  const V cdf = CdfStage2(x, parts, &density);
  const V pdf = hn::Mul(density, hn::Set(D(), 0.39894228040143267794f));
  return hn::MulAdd(gy, hn::MulAdd(x, pdf, cdf), gx);
}

/// Vectors per block of the two-stage row loops.
constexpr int cdf_block = 8;

/// finish(i, CdfStage1(x[i, i + lanes))) for every whole vector of x[0, n), the first stages of
/// a block of vectors before its finishes. The caller does the last partial vector.
template <class Finish>
HWY_INLINE void CdfRows(const float* x, std::size_t n, const Finish& finish) {
  const D d;
  // The block's first stages in aligned floats: an array of vector structs would be
  // default-constructed outside the target's attributes (GCC refuses that on NEON).
  HWY_ALIGN float t[cdf_block * lanes], exponent[cdf_block * lanes], square[cdf_block * lanes];
  std::size_t i = 0;
  for (; i + cdf_block * lanes <= n; i += cdf_block * lanes) {
    for (int k = 0; k < cdf_block; ++k) {
      const CdfParts parts = CdfStage1(hn::LoadU(d, x + i + k * lanes));
      hn::Store(parts.t, d, t + k * lanes);
      hn::Store(parts.exponent, d, exponent + k * lanes);
      hn::Store(parts.square, d, square + k * lanes);
    }
    for (int k = 0; k < cdf_block; ++k)
      finish(i + k * lanes, CdfParts{hn::Load(d, t + k * lanes), hn::Load(d, exponent + k * lanes),
                                     hn::Load(d, square + k * lanes)});
  }
  for (; i + lanes <= n; i += lanes) finish(i, CdfStage1(hn::LoadU(d, x + i)));
}

void GeluRows(const float* x, float* y, std::size_t n) {
  const D d;
  CdfRows(x, n, [&](std::size_t i, const CdfParts& parts) {
    hn::StoreU(GeluFromParts(hn::LoadU(d, x + i), parts), d, y + i);
  });
  const std::size_t i = n / lanes * lanes;
  if (i == n) return;
  HWY_ALIGN float tail[lanes] = {};
  std::copy(x + i, x + n, tail);
  const V v = hn::Load(d, tail);
  hn::Store(GeluFromParts(v, CdfStage1(v)), d, tail);
  std::copy(tail, tail + (n - i), y + i);
}

void GeluBackwardRows(const float* x, const float* gy, float* gx, std::size_t n) {
  const D d;
  CdfRows(x, n, [&](std::size_t i, const CdfParts& parts) {
    hn::StoreU(GeluGradientFromParts(hn::LoadU(d, x + i), parts, hn::LoadU(d, gy + i),
                                     hn::LoadU(d, gx + i)),
               d, gx + i);
  });
  const std::size_t i = n / lanes * lanes;
  if (i == n) return;
  HWY_ALIGN float tails[3][lanes] = {};
  std::copy(x + i, x + n, tails[0]);
  std::copy(gy + i, gy + n, tails[1]);
  std::copy(gx + i, gx + n, tails[2]);
  const V v = hn::Load(d, tails[0]);
  hn::Store(GeluGradientFromParts(v, CdfStage1(v), hn::Load(d, tails[1]), hn::Load(d, tails[2])),
            d, tails[2]);
  std::copy(tails[2], tails[2] + (n - i), gx + i);
}

float RowMax(const float* x, std::size_t n) {
  const D d;
  V m = hn::Set(d, -HUGE_VALF);
  std::size_t j = 0;
  for (; j + lanes <= n; j += lanes) m = hn::Max(m, hn::LoadU(d, x + j));
  float result = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; j < n; ++j) result = std::max(result, x[j]);
  return result;
}

/// The sum of 16 partial sums in one fixed tree (halves, then quarters, ...), whatever the
/// vector width: the order an AVX-512 register's reduction takes.
inline float sum_of_16(const float* s) {
  float q[8], r[4];
  for (int i = 0; i < 8; ++i) q[i] = s[i + 8] + s[i];
  for (int i = 0; i < 4; ++i) r[i] = q[i + 4] + q[i];
  return (r[0] + r[2]) + (r[1] + r[3]);
}

float ExpRow(float* x, std::size_t n, float shift) {
  // Blocks of 16 values, `parts` vectors each, summed lane by lane into 16 partial sums.
  constexpr int parts = 16 / lanes;
  const D d;
  const V s = hn::Set(d, shift);
  V sum[parts];
  for (int k = 0; k < parts; ++k) sum[k] = hn::Zero(d);
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < parts; ++k) {
      const V p = Exp(hn::Sub(hn::LoadU(d, x + j + k * lanes), s));
      hn::StoreU(p, d, x + j + k * lanes);
      sum[k] = hn::Add(sum[k], p);
    }
  if (j < n) {
    const std::size_t left = n - j;
    HWY_ALIGN float tail[16] = {};
    std::copy(x + j, x + n, tail);
    for (int k = 0; k < parts; ++k) {
      const V p = Exp(hn::Sub(hn::Load(d, tail + k * lanes), s));
      hn::Store(p, d, tail + k * lanes);
      const std::size_t first = std::size_t(k) * lanes;
      sum[k] = hn::Add(sum[k], hn::IfThenElseZero(hn::FirstN(d, left > first ? left - first : 0), p));
    }
    std::copy(tail, tail + left, x + j);
  }
  HWY_ALIGN float partial[16];
  for (int k = 0; k < parts; ++k) hn::Store(sum[k], d, partial + k * lanes);
  return sum_of_16(partial);
}

// ---- bf16 pairs ----------------------------------------------------------------------------

/// x's bf16 bits in the upper half (the lower zero): rounded to nearest even on the lower
/// half, carrying into the exponent where it must (to inf past the top); NaN stays NaN, quiet.
/// core/bfloat16.hpp's bfloat16_bits, a vector at a time.
HWY_INLINE VU UpperBf16(V x) {
  const DU du;
  const hn::RebindToSigned<D> di;
  const VU u = hn::BitCast(du, x);
  const VU rounded =
      hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
  const auto nan = hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu))),
                          hn::Set(di, int32_t{0x7f800000}));
  const VU kept =
      hn::IfThenElse(hn::RebindMask(du, nan), hn::Or(u, hn::Set(du, 0x00400000u)), rounded);
  return hn::And(kept, hn::Set(du, 0xffff0000u));
}

void Bf16Pairs(const float* upper, const float* lower, uint32_t* to, std::size_t n) {
  const D d;
  const DU du;
  const auto pair = [&](V u, V l) {
    return hn::Or(UpperBf16(u), hn::ShiftRight<16>(UpperBf16(l)));
  };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(pair(hn::LoadU(d, upper + i), lower ? hn::LoadU(d, lower + i) : hn::Zero(d)), du,
               to + i);
  if (i == n) return;
  // The last, partial vector (rows of 64 cells and their padding end in one).
  if constexpr (native_masks) {
    const M m = hn::FirstN(d, n - i);
    const V u = hn::MaskedLoad(m, d, upper + i);
    const V l = lower ? hn::MaskedLoad(m, d, lower + i) : hn::Zero(d);
    hn::BlendedStore(pair(u, l), hn::RebindMask(du, m), du, to + i);
  } else {
    HWY_ALIGN float tails[2][lanes] = {};
    std::copy(upper + i, upper + n, tails[0]);
    if (lower) std::copy(lower + i, lower + n, tails[1]);
    HWY_ALIGN uint32_t out[lanes];
    hn::Store(pair(hn::Load(d, tails[0]), hn::Load(d, tails[1])), du, out);
    std::copy(out, out + (n - i), to + i);
  }
}

void Bf16Round(const float* from, float* to, std::size_t n) {
  const D d;
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::BitCast(d, UpperBf16(hn::LoadU(d, from + i))), d, to + i);
  if (i == n) return;
  HWY_ALIGN float tail[lanes] = {};
  std::copy(from + i, from + n, tail);
  hn::Store(hn::BitCast(d, UpperBf16(hn::Load(d, tail))), d, tail);
  std::copy(tail, tail + (n - i), to + i);
}

std::size_t Bf16Pack(const float* from, uint16_t* bits, std::size_t n) {
  const D d;
  const hn::Rebind<uint16_t, D> d16;
  const hn::RebindToSigned<D> di;
  // Stores x's 16 bits at `to`; returns how many of x's lanes were not bfloat16 values (NaN
  // never equals itself, so it counts: not Eq, as Highway's Ne is false for NaN).
  const auto pack = [&](V x, uint16_t* to) {
    const VU upper = UpperBf16(x);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(upper))), d16, to);
    return hn::CountTrue(d, hn::Not(hn::Eq(hn::BitCast(d, upper), x)));
  };
  std::size_t inexact = 0, i = 0;
  for (; i + lanes <= n; i += lanes) inexact += pack(hn::LoadU(d, from + i), bits + i);
  if (i == n) return inexact;
  HWY_ALIGN float tail[lanes] = {};  // zeros past the end: exact, not counted
  HWY_ALIGN uint16_t packed[lanes];
  std::copy(from + i, from + n, tail);
  inexact += pack(hn::Load(d, tail), packed);
  std::copy(packed, packed + (n - i), bits + i);
  return inexact;
}

// ---- transposition --------------------------------------------------------------------------

void TransposeRows(const float* const* rows, int channels, int cells, float* to,
                   std::ptrdiff_t to_stride) {
  const D d;
  HWY_ALIGN float quads[4 * lanes];  // a vector of cells, four channels each
  for (int c = 0; c < channels; c += 4) {
    const float *r0 = rows[c], *r1 = rows[c + 1], *r2 = rows[c + 2], *r3 = rows[c + 3];
    float* const out = to + c;
    int p = 0;
    for (; p + lanes <= cells; p += lanes) {
      hn::StoreInterleaved4(hn::LoadU(d, r0 + p), hn::LoadU(d, r1 + p), hn::LoadU(d, r2 + p),
                            hn::LoadU(d, r3 + p), d, quads);
      HWY_UNROLL(16)
      for (int i = 0; i < lanes; ++i)
        std::memcpy(out + (p + i) * to_stride, quads + 4 * i, 4 * sizeof(float));
    }
    for (; p < cells; ++p) {
      float* const cell = out + p * to_stride;
      cell[0] = r0[p], cell[1] = r1[p], cell[2] = r2[p], cell[3] = r3[p];
    }
  }
}

// ---- Winograd's transforms (conv_winograd.cpp drives them) --------------------------------
// F(2x2, 3x3): a tile is 2 x 2 outputs, read from 4 x 4 source cells; `lanes` tiles side by
// side along a row at a time (tile t's cells start at column 2t: loads that deinterleave even
// and odd columns). F(2x4, 3x3): 2 x 4 outputs from 4 x 6 cells, tile t's from column 4t.
// Adds, subtractions and multiply-adds only, in one order per lane on every path: the same
// bits.

/// d[i][j] = cell shift + Columns t + j of row i (j < Columns + 2) for the `lanes` tiles from
/// first_tile (Columns 2: F(2x2, 3x3), 4: F(2x4, 3x3)); a null row reads as zero, and so do
/// cells outside [0, row_cells), or (wrap) the cells a row away.
template <int Columns>
HWY_INLINE void load_tile_cells(const float* const* rows, std::ptrdiff_t shift,
                                std::ptrdiff_t row_cells, bool wrap, int first_tile,
                                V (&d)[4][Columns + 2]) {
  static_assert(Columns == 2 || Columns == 4);
  const D dd;
  // Loads that deinterleave Columns columns: from the tiles' first cell, then from their
  // Columns-th (of F(2x4)'s, the first two: columns 4 and 5).
  constexpr std::ptrdiff_t count = Columns * lanes + Columns;
  const std::ptrdiff_t first = shift + Columns * first_tile;
  const bool inside = first >= 0 && first + count <= row_cells;
  HWY_UNROLL(4)
  for (int i = 0; i < 4; ++i) {
    if (!rows[i]) {
      for (int j = 0; j < Columns + 2; ++j) d[i][j] = hn::Zero(dd);
      continue;
    }
    const float* p = rows[i] + first;
    HWY_ALIGN float cells[count];
    if (!inside) {  // a row's ends: a copy, zeros (or wrapped cells) outside the row
      for (std::ptrdiff_t k = 0; k < count; ++k) {
        const std::ptrdiff_t z = first + k;
        cells[k] = z >= 0 && z < row_cells ? rows[i][z]
                   : wrap                  ? rows[i][((z % row_cells) + row_cells) % row_cells]
                                           : 0.0f;
      }
      p = cells;
    }
    if constexpr (Columns == 2) {
      hn::LoadInterleaved2(dd, p, d[i][0], d[i][1]);
      hn::LoadInterleaved2(dd, p + 2, d[i][2], d[i][3]);
    } else {
      V unused0, unused1;
      hn::LoadInterleaved4(dd, p, d[i][0], d[i][1], d[i][2], d[i][3]);
      hn::LoadInterleaved4(dd, p + 4, d[i][4], d[i][5], unused0, unused1);
    }
  }
}

void WinogradInputTiles(const float* const* rows, std::ptrdiff_t shift, std::ptrdiff_t row_cells,
                        bool wrap, int tiles, float* v, std::ptrdiff_t v_stride) {
  for (int t0 = 0; t0 < tiles; t0 += lanes) {
    V d[4][4];
    load_tile_cells<2>(rows, shift, row_cells, wrap, t0, d);
    V t[4][4];  // B^T d
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) {
      t[0][j] = hn::Sub(d[0][j], d[2][j]);
      t[1][j] = hn::Add(d[1][j], d[2][j]);
      t[2][j] = hn::Sub(d[2][j], d[1][j]);
      t[3][j] = hn::Sub(d[1][j], d[3][j]);
    }
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i) {  // (B^T d) B
      float* const to = v + 4 * i * v_stride + t0;
      hn::StoreU(hn::Sub(t[i][0], t[i][2]), D(), to);
      hn::StoreU(hn::Add(t[i][1], t[i][2]), D(), to + v_stride);
      hn::StoreU(hn::Sub(t[i][2], t[i][1]), D(), to + 2 * v_stride);
      hn::StoreU(hn::Sub(t[i][1], t[i][3]), D(), to + 3 * v_stride);
    }
  }
}

void WinogradOutputTiles(const float* m, std::ptrdiff_t m_stride, int tiles, float bias,
                         float* row0, float* row1, int columns) {
  const D d;
  const V b = hn::Set(d, bias);
  for (int t0 = 0; t0 < tiles; t0 += lanes) {
    V s[2][4];  // A^T m
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) {
      const V m0 = hn::LoadU(d, m + j * m_stride + t0),
              m1 = hn::LoadU(d, m + (4 + j) * m_stride + t0),
              m2 = hn::LoadU(d, m + (8 + j) * m_stride + t0),
              m3 = hn::LoadU(d, m + (12 + j) * m_stride + t0);
      s[0][j] = hn::Add(hn::Add(m0, m1), m2);
      s[1][j] = hn::Sub(hn::Sub(m1, m2), m3);
    }
    float* const rows[2] = {row0, row1};
    HWY_UNROLL(2)
    for (int i = 0; i < 2; ++i) {  // (A^T m) A, plus the bias
      if (!rows[i]) continue;
      const V y0 = hn::Add(hn::Add(hn::Add(s[i][0], s[i][1]), s[i][2]), b);
      const V y1 = hn::Add(hn::Sub(hn::Sub(s[i][1], s[i][2]), s[i][3]), b);
      const int first = 2 * t0, left = columns - first;
      if (left >= 2 * lanes) {
        hn::StoreInterleaved2(y0, y1, d, rows[i] + first);
      } else {  // the row's end
        HWY_ALIGN float cells[2 * lanes];
        hn::StoreInterleaved2(y0, y1, d, cells);
        std::copy(cells, cells + left, rows[i] + first);
      }
    }
  }
}

void WinogradGradientTiles(const float* row0, const float* row1, int columns, int tiles, float* m,
                           std::ptrdiff_t m_stride) {
  const D d;
  for (int t0 = 0; t0 < tiles; t0 += lanes) {
    // y[i][c]: cell 2t + c of row i, zero past `columns` and for a null row.
    V y[2][2];
    const float* const rows[2] = {row0, row1};
    HWY_UNROLL(2)
    for (int i = 0; i < 2; ++i) {
      const int first = 2 * t0, left = columns - first;
      if (!rows[i]) {
        y[i][0] = y[i][1] = hn::Zero(d);
      } else if (left >= 2 * lanes) {
        hn::LoadInterleaved2(d, rows[i] + first, y[i][0], y[i][1]);
      } else {  // the row's end
        HWY_ALIGN float cells[2 * lanes] = {};
        std::copy(rows[i] + first, rows[i] + first + left, cells);
        hn::LoadInterleaved2(d, cells, y[i][0], y[i][1]);
      }
    }
    V s[4][2];  // A y
    HWY_UNROLL(2)
    for (int c = 0; c < 2; ++c) {
      s[0][c] = y[0][c];
      s[1][c] = hn::Add(y[0][c], y[1][c]);
      s[2][c] = hn::Sub(y[0][c], y[1][c]);
      s[3][c] = hn::Neg(y[1][c]);
    }
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i) {  // (A y) A^T
      float* const to = m + 4 * i * m_stride + t0;
      hn::StoreU(s[i][0], d, to);
      hn::StoreU(hn::Add(s[i][0], s[i][1]), d, to + m_stride);
      hn::StoreU(hn::Sub(s[i][0], s[i][1]), d, to + 2 * m_stride);
      hn::StoreU(hn::Neg(s[i][1]), d, to + 3 * m_stride);
    }
  }
}

void WinogradWideInputTiles(const float* const* rows, std::ptrdiff_t shift,
                            std::ptrdiff_t row_cells, bool wrap, int tiles, float* v,
                            std::ptrdiff_t v_stride) {
  const D dd;
  const V half = hn::Set(dd, 0.5f), one_and_half = hn::Set(dd, 1.5f), two = hn::Set(dd, 2.0f),
          two_and_half = hn::Set(dd, 2.5f), minus_half = hn::Set(dd, -0.5f),
          minus_two = hn::Set(dd, -2.0f), minus_two_and_half = hn::Set(dd, -2.5f);
  for (int t0 = 0; t0 < tiles; t0 += lanes) {
    V d[4][6];
    load_tile_cells<4>(rows, shift, row_cells, wrap, t0, d);
    V t[4][6];  // B^T d, F(2, 3) along the rows
    HWY_UNROLL(6)
    for (int j = 0; j < 6; ++j) {
      t[0][j] = hn::Sub(d[0][j], d[2][j]);
      t[1][j] = hn::Add(d[1][j], d[2][j]);
      t[2][j] = hn::Sub(d[2][j], d[1][j]);
      t[3][j] = hn::Sub(d[1][j], d[3][j]);
    }
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i) {  // (B^T d) B, F(4, 3) along the columns
      const V* c = t[i];
      const V e = hn::Sub(c[4], c[2]), f = hn::Sub(c[3], c[1]);
      float* const to = v + 6 * i * v_stride + t0;
      hn::StoreU(hn::MulAdd(one_and_half, f, hn::MulAdd(minus_two, c[2], hn::Add(c[0], c[4]))), dd,
                 to);
      hn::StoreU(hn::MulAdd(two_and_half, c[3], hn::MulAdd(half, c[2], hn::Sub(c[4], c[1]))), dd,
                 to + v_stride);
      hn::StoreU(hn::MulAdd(half, c[3], hn::MulAdd(minus_two_and_half, c[2], hn::Add(c[4], c[1]))),
                 dd, to + 2 * v_stride);
      hn::StoreU(hn::MulAdd(two, f, e), dd, to + 3 * v_stride);
      hn::StoreU(hn::MulAdd(minus_half, f, e), dd, to + 4 * v_stride);
      hn::StoreU(hn::MulAdd(one_and_half, e, hn::MulAdd(minus_two, c[3], hn::Add(c[1], c[5]))), dd,
                 to + 5 * v_stride);
    }
  }
}

void WinogradWideOutputTiles(const float* m, std::ptrdiff_t m_stride, int tiles, float bias,
                             float* row0, float* row1, int columns) {
  const D d;
  const V b = hn::Set(d, bias), half = hn::Set(d, 0.5f), quarter = hn::Set(d, 0.25f),
          eighth = hn::Set(d, 0.125f), four = hn::Set(d, 4.0f), minus_two = hn::Set(d, -2.0f),
          minus_eight = hn::Set(d, -8.0f);
  for (int t0 = 0; t0 < tiles; t0 += lanes) {
    V s[2][6];  // A^T m, F(2, 3) along the rows
    HWY_UNROLL(6)
    for (int j = 0; j < 6; ++j) {
      const V m0 = hn::LoadU(d, m + j * m_stride + t0),
              m1 = hn::LoadU(d, m + (6 + j) * m_stride + t0),
              m2 = hn::LoadU(d, m + (12 + j) * m_stride + t0),
              m3 = hn::LoadU(d, m + (18 + j) * m_stride + t0);
      s[0][j] = hn::Add(hn::Add(m0, m1), m2);
      s[1][j] = hn::Sub(hn::Sub(m1, m2), m3);
    }
    float* const rows[2] = {row0, row1};
    HWY_UNROLL(2)
    for (int i = 0; i < 2; ++i) {  // (A^T m) A, F(4, 3) along the columns, plus the bias
      if (!rows[i]) continue;
      const V* c = s[i];
      const V p = hn::Add(c[1], c[2]), q = hn::Sub(c[1], c[2]);
      const V y0 = hn::Add(hn::Add(hn::Add(c[0], p), hn::Add(c[3], c[4])), b);
      const V y1 = hn::Add(hn::MulAdd(minus_two, c[4], hn::MulAdd(half, c[3], q)), b);
      const V y2 = hn::Add(hn::MulAdd(four, c[4], hn::MulAdd(quarter, c[3], p)), b);
      const V y3 =
          hn::Add(hn::Add(hn::MulAdd(minus_eight, c[4], hn::MulAdd(eighth, c[3], q)), c[5]), b);
      const int first = 4 * t0, left = columns - first;
      if (left >= 4 * lanes) {
        hn::StoreInterleaved4(y0, y1, y2, y3, d, rows[i] + first);
      } else {  // the row's end
        HWY_ALIGN float cells[4 * lanes];
        hn::StoreInterleaved4(y0, y1, y2, y3, d, cells);
        std::copy(cells, cells + left, rows[i] + first);
      }
    }
  }
}

// ---- the multiply-add ceiling ---------------------------------------------------------------

double MultiplyAddChains(std::size_t rounds) {
  // Independent chains, more than multiply-add latency x pipes on every path (4 x 2 on Zen 4
  // and Skylake-X), and with b and c within AVX2's 16 registers.
  constexpr int chains = 12;
  const D d;
  const V b = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-6f);
  V acc[chains];
  HWY_UNROLL(12)
  for (int i = 0; i < chains; ++i) acc[i] = hn::Set(d, float(i));
  for (std::size_t k = 0; k < rounds; ++k) {
    HWY_UNROLL(12)
    for (int i = 0; i < chains; ++i) acc[i] = hn::MulAdd(acc[i], b, c);
  }
  V sum = acc[0];
  HWY_UNROLL(12)
  for (int i = 1; i < chains; ++i) sum = hn::Add(sum, acc[i]);
  volatile float kept = hn::GetLane(sum);  // the chains' result is used: they run
  (void)kept;
  return 2.0 * double(rounds) * chains * lanes;
}

}  // namespace HWY_NAMESPACE
}  // namespace shardtensor::kernels::host
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <atomic>
#include <cstdlib>
#include <string>
#if HWY_ARCH_ARM_A64 && defined(__linux__)
#include <asm/hwcap.h>  // HWCAP2_BF16
#include <sys/auxv.h>
#endif

namespace shardtensor::kernels::host {

HWY_EXPORT(TileShape);
HWY_EXPORT(CorrelateTile);
HWY_EXPORT(CorrelatePairsTileDot);
HWY_EXPORT(WeightGradientTile);
HWY_EXPORT(WeightGradientPairsTileDot);
HWY_EXPORT(GeluRows);
HWY_EXPORT(GeluBackwardRows);
HWY_EXPORT(RowMax);
HWY_EXPORT(ExpRow);
HWY_EXPORT(Bf16Pairs);
HWY_EXPORT(Bf16Round);
HWY_EXPORT(Bf16Pack);
HWY_EXPORT(MultiplyAddChains);
HWY_EXPORT(TransposeRows);
HWY_EXPORT(WinogradInputTiles);
HWY_EXPORT(WinogradOutputTiles);
HWY_EXPORT(WinogradWideInputTiles);
HWY_EXPORT(WinogradWideOutputTiles);
HWY_EXPORT(WinogradGradientTiles);

namespace {

/// This project's name for a Highway target with FMA vectors, or null for the others.
const char* isa_name(int64_t target) {
  switch (target) {
    case HWY_AVX3: return "avx512";
    case HWY_AVX2: return "avx2";
    case HWY_NEON: return "neon";
    default: return nullptr;
  }
}

/// The targets compiled here that this CPU runs, read before any selection narrows them.
int64_t usable_targets() {
  static const int64_t usable = [] {
    int64_t targets = 0;
    for (int64_t t : hwy::SupportedAndGeneratedTargets())
      if (isa_name(t)) targets |= t;
    return targets;
  }();
  return usable;
}

/// The target of `name` ("best": the best usable one, "off": 0); throws for the others.
int64_t target_named(const std::string& name, const char* where) {
  const int64_t usable = usable_targets();
  if (name == "best") return usable & -usable;  // the lowest bit is the best
  if (name == "off") return 0;
  std::string choices = "best, off";
  for (int64_t t = usable; t != 0; t &= t - 1) {
    if (name == isa_name(t & -t)) return t & -t;
    choices += std::string(", ") + isa_name(t & -t);
  }
  SHARDTENSOR_FAIL(where, "instruction set '" << name
                                              << "' is not one this build and CPU run (choose "
                                              << choices << ")");
}

/// Points Highway's dispatch at `target` (its own best choice for the best one).
int64_t dispatch_to(int64_t target) {
  const int64_t usable = usable_targets();
  hwy::SetSupportedTargetsForTest(target == (usable & -usable) ? 0 : target);
  return target;
}

/// The selected target, 0 for "off": SHARDTENSOR_SIMD's on first use, else the best.
std::atomic<int64_t>& selected() {
  static std::atomic<int64_t> target = [] {
    const char* env = std::getenv("SHARDTENSOR_SIMD");
    return dispatch_to(target_named(env && *env ? env : "best", "SHARDTENSOR_SIMD"));
  }();
  return target;
}

/// The path whose tiles have bf16 dot products, and whether this CPU has them (AVX512_BF16
/// on x86, FEAT_BF16 on Arm).
#if HWY_ARCH_X86 && defined(__GNUC__)
constexpr int64_t bf16_dot_target = HWY_AVX3;
bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#elif HWY_ARCH_ARM_A64 && defined(__linux__)
constexpr int64_t bf16_dot_target = HWY_NEON;
bool cpu_has_bf16_dot() {
  static const bool has = (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
  return has;
}
#else
constexpr int64_t bf16_dot_target = 0;
bool cpu_has_bf16_dot() {
  return false;
}
#endif

/// When bf16 convolutions use the dot products (kernels::set_bf16_dot_products): the index
/// of the mode's name in dot_modes.
enum DotMode : int { dot_auto, dot_on, dot_off };
constexpr std::initializer_list<const char*> dot_modes{"auto", "on", "off"};

/// The mode: SHARDTENSOR_BF16_DOT's on first use (auto where unset).
std::atomic<int>& bf16_dot_mode() {
  static std::atomic<int> mode{environment_choice("SHARDTENSOR_BF16_DOT", dot_modes)};
  return mode;
}

/// Whether this CPU's bf16 dot products outrun its float multiply-adds per product. AMD's
/// (Zen 4 and later) do: there a bf16 step took 0.8x float's. Intel's vdpbf16ps (Cooper Lake,
/// Sapphire Rapids) runs at half the rate of products of the two FMA ports (measured on a
/// Sapphire Rapids core: 60 against 120 G products/s), so there the float tiles on bf16 values
/// are faster where AMX does not run. Arm's BFDOT: taken as faster (two products per lane for
/// one instruction), not measured (no Arm machine yet).
bool dot_outruns_fma() {
#if HWY_ARCH_X86 && defined(__GNUC__)
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
#else
  return bf16_dot_target != 0;
#endif
}

}  // namespace

bool pair_tiles_use_dot() {
  return bf16_dot_target != 0 && selected().load() == bf16_dot_target && cpu_has_bf16_dot() &&
         bf16_dot_mode().load() != dot_off;
}

ConvTileShape conv_tile_shape() {
  return HWY_DYNAMIC_DISPATCH(TileShape)();
}
void correlate_tile(const float* const* planes, int x_taps, const std::ptrdiff_t* tap_offsets,
                    int taps, const float* weights, const OutputVector* vectors, float* out,
                    std::ptrdiff_t out_channel_stride, int rows, const float* bias,
                    bool accumulate) {
  HWY_DYNAMIC_DISPATCH(CorrelateTile)
  (planes, x_taps, tap_offsets, taps, weights, vectors, out, out_channel_stride, rows, bias,
   accumulate);
}
void correlate_pairs_tile(const uint32_t* const* planes, int x_taps,
                          const std::ptrdiff_t* tap_offsets, int taps, const uint32_t* weights,
                          const OutputVector* vectors, float* out,
                          std::ptrdiff_t out_channel_stride, int rows, const float* bias,
                          bool accumulate) {
  SHARDTENSOR_REQUIRE(pair_tiles_use_dot(), "correlate_pairs_tile",
                      "bf16 dot products do not run here");
  HWY_DYNAMIC_DISPATCH(CorrelatePairsTileDot)
  (planes, x_taps, tap_offsets, taps, weights, vectors, out, out_channel_stride, rows, bias,
   accumulate);
}
void weight_gradient_tile(const float* source, const std::ptrdiff_t* tap_offsets,
                          std::ptrdiff_t row_stride, int rows, int columns, const float* dy_t,
                          int dy_channels, int channels, float* gradient,
                          std::ptrdiff_t gradient_stride) {
  HWY_DYNAMIC_DISPATCH(WeightGradientTile)
  (source, tap_offsets, row_stride, rows, columns, dy_t, dy_channels, channels, gradient,
   gradient_stride);
}
void weight_gradient_pairs_tile(const uint32_t* source, const std::ptrdiff_t* tap_offsets,
                                std::ptrdiff_t row_stride, int rows, int pairs,
                                const uint32_t* dy_pairs, int dy_channels, int channels,
                                float* gradient, std::ptrdiff_t gradient_stride) {
  SHARDTENSOR_REQUIRE(pair_tiles_use_dot(), "weight_gradient_pairs_tile",
                      "bf16 dot products do not run here");
  HWY_DYNAMIC_DISPATCH(WeightGradientPairsTileDot)
  (source, tap_offsets, row_stride, rows, pairs, dy_pairs, dy_channels, channels, gradient,
   gradient_stride);
}
void transpose_rows(const float* const* rows, int channels, int cells, float* to,
                    std::ptrdiff_t to_stride) {
  HWY_DYNAMIC_DISPATCH(TransposeRows)(rows, channels, cells, to, to_stride);
}
void winograd_input_tiles(const float* const* rows, std::ptrdiff_t shift, std::ptrdiff_t row_cells,
                          bool wrap, int tiles, float* v, std::ptrdiff_t v_stride) {
  HWY_DYNAMIC_DISPATCH(WinogradInputTiles)(rows, shift, row_cells, wrap, tiles, v, v_stride);
}
void winograd_output_tiles(const float* m, std::ptrdiff_t m_stride, int tiles, float bias,
                           float* row0, float* row1, int columns) {
  HWY_DYNAMIC_DISPATCH(WinogradOutputTiles)(m, m_stride, tiles, bias, row0, row1, columns);
}
void winograd_gradient_tiles(const float* row0, const float* row1, int columns, int tiles, float* m,
                             std::ptrdiff_t m_stride) {
  HWY_DYNAMIC_DISPATCH(WinogradGradientTiles)(row0, row1, columns, tiles, m, m_stride);
}
void winograd_wide_input_tiles(const float* const* rows, std::ptrdiff_t shift,
                               std::ptrdiff_t row_cells, bool wrap, int tiles, float* v,
                               std::ptrdiff_t v_stride) {
  HWY_DYNAMIC_DISPATCH(WinogradWideInputTiles)(rows, shift, row_cells, wrap, tiles, v, v_stride);
}
void winograd_wide_output_tiles(const float* m, std::ptrdiff_t m_stride, int tiles, float bias,
                                float* row0, float* row1, int columns) {
  HWY_DYNAMIC_DISPATCH(WinogradWideOutputTiles)(m, m_stride, tiles, bias, row0, row1, columns);
}
void gelu_rows(const float* x, float* y, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluRows)(x, y, n);
}
void gelu_backward_rows(const float* x, const float* gy, float* gx, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluBackwardRows)(x, gy, gx, n);
}
float row_max(const float* x, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(RowMax)(x, n);
}
float exp_row(float* x, std::size_t n, float shift) {
  return HWY_DYNAMIC_DISPATCH(ExpRow)(x, n, shift);
}
void bf16_pairs(const float* upper, const float* lower, uint32_t* to, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(Bf16Pairs)(upper, lower, to, n);
}
void bf16_round(const float* from, float* to, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(Bf16Round)(from, to, n);
}
std::size_t bf16_pack(const float* from, uint16_t* bits, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(Bf16Pack)(from, bits, n);
}

}  // namespace shardtensor::kernels::host

namespace shardtensor::kernels {

std::string vector_isa() {
  const int64_t t = host::selected().load();
  return t ? host::isa_name(t) : "off";
}

bool vector_kernels_on() {
  return host::selected().load() != 0;
}

int vector_lanes() {
  return vector_kernels_on() ? host::conv_tile_shape().lanes : 0;
}

std::vector<std::string> vector_isas() {
  std::vector<std::string> names;
  for (int64_t t = host::usable_targets(); t != 0; t &= t - 1)
    names.push_back(host::isa_name(t & -t));
  return names;
}

void select_vector_isa(const std::string& isa) {
  host::selected();  // the environment's choice first, so that this one overrides it
  host::selected().store(host::dispatch_to(host::target_named(isa, "select_vector_isa")));
}

bool bf16_dot_products() {
  return host::pair_tiles_use_dot() &&
         (host::bf16_dot_mode().load() == host::dot_on || host::dot_outruns_fma());
}

double run_multiply_add_chains(std::size_t rounds) {
  using namespace host;  // the dispatch table's name
  return HWY_DYNAMIC_DISPATCH(MultiplyAddChains)(rounds);
}

double run_correlate_tiles(std::size_t rounds) {
  if (!vector_kernels_on()) return 0.0;
  const host::ConvTileShape shape = host::conv_tile_shape();
  // A 2-D correlation's tile: three rows of 34 cells per channel, whole vectors of outputs.
  constexpr std::ptrdiff_t channels = 32, width = 34, rows = 3;
  const int lanes = shape.lanes, vectors_per_tile = shape.tile_vectors;
  std::vector<std::ptrdiff_t> offsets;
  for (std::ptrdiff_t j = 0; j < channels; ++j)
    for (std::ptrdiff_t b = 0; b < 3; ++b)
      for (std::ptrdiff_t c = 0; c < 3; ++c) offsets.push_back((j * rows + b) * width + c);
  const int taps = int(offsets.size());
  // The vectors run on past a row: room for the last tap's reads.
  std::vector<float> source(std::size_t(channels * rows * width + vectors_per_tile * lanes), 0.5f);
  std::vector<float> weights(std::size_t(taps * shape.tile_rows), 1e-3f);
  std::vector<float> out(std::size_t(shape.tile_rows * vectors_per_tile * lanes));
  std::vector<host::OutputVector> vectors;
  for (int v = 0; v < vectors_per_tile; ++v)
    vectors.push_back({std::ptrdiff_t(v) * lanes, std::ptrdiff_t(v) * lanes, 0,
                       unsigned((std::uint64_t(1) << lanes) - 1), 0});
  const float* planes[1] = {source.data()};
  for (std::size_t k = 0; k < rounds; ++k)
    host::correlate_tile(planes, 1, offsets.data(), taps, weights.data(), vectors.data(),
                         out.data(), vectors_per_tile * lanes, shape.tile_rows, nullptr,
                         /*accumulate=*/false);
  return 2.0 * double(rounds) * shape.tile_rows * vectors_per_tile * lanes * taps;
}

void set_bf16_dot_products(const std::string& mode) {
  host::bf16_dot_mode().store(host::setting_choice(mode, host::dot_modes, "set_bf16_dot_products"));
}

}  // namespace shardtensor::kernels
#endif  // HWY_ONCE


#else  // no Highway in this build: the callers' portable kernels always run

namespace shardtensor::kernels {

std::string vector_isa() {
  return "off";
}
bool vector_kernels_on() {
  return false;
}
int vector_lanes() {
  return 0;
}
std::vector<std::string> vector_isas() {
  return {};
}
bool bf16_dot_products() {
  return false;
}
void set_bf16_dot_products(const std::string& mode) {
  host::setting_choice(mode, {"auto", "on", "off"}, "set_bf16_dot_products");  // checks it only
}
double run_multiply_add_chains(std::size_t) {
  return 0.0;
}
double run_correlate_tiles(std::size_t) {
  return 0.0;
}
void select_vector_isa(const std::string& isa) {
  SHARDTENSOR_REQUIRE(isa == "off" || isa == "best", "select_vector_isa",
                      "instruction set '" << isa
                                          << "': this build has no host vector kernels (choose "
                                             "best or off)");
}

namespace host {

ConvTileShape conv_tile_shape() {
  return {1, 1, 1, 1, 1, 1};
}
void correlate_tile(const float* const*, int, const std::ptrdiff_t*, int, const float*,
                    const OutputVector*, float*, std::ptrdiff_t, int, const float*, bool) {
  SHARDTENSOR_FAIL("correlate_tile", "this build has no host vector kernels");
}
bool pair_tiles_use_dot() {
  return false;
}
void correlate_pairs_tile(const uint32_t* const*, int, const std::ptrdiff_t*, int, const uint32_t*,
                          const OutputVector*, float*, std::ptrdiff_t, int, const float*, bool) {
  SHARDTENSOR_FAIL("correlate_pairs_tile", "this build has no host vector kernels");
}
void weight_gradient_tile(const float*, const std::ptrdiff_t*, std::ptrdiff_t, int, int,
                          const float*, int, int, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("weight_gradient_tile", "this build has no host vector kernels");
}
void weight_gradient_pairs_tile(const uint32_t*, const std::ptrdiff_t*, std::ptrdiff_t, int, int,
                                const uint32_t*, int, int, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("weight_gradient_pairs_tile", "this build has no host vector kernels");
}
void transpose_rows(const float* const*, int, int, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("transpose_rows", "this build has no host vector kernels");
}
void winograd_input_tiles(const float* const*, std::ptrdiff_t, std::ptrdiff_t, bool, int, float*,
                          std::ptrdiff_t) {
  SHARDTENSOR_FAIL("winograd_input_tiles", "this build has no host vector kernels");
}
void winograd_output_tiles(const float*, std::ptrdiff_t, int, float, float*, float*, int) {
  SHARDTENSOR_FAIL("winograd_output_tiles", "this build has no host vector kernels");
}
void winograd_gradient_tiles(const float*, const float*, int, int, float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("winograd_gradient_tiles", "this build has no host vector kernels");
}
void winograd_wide_input_tiles(const float* const*, std::ptrdiff_t, std::ptrdiff_t, bool, int,
                               float*, std::ptrdiff_t) {
  SHARDTENSOR_FAIL("winograd_wide_input_tiles", "this build has no host vector kernels");
}
void winograd_wide_output_tiles(const float*, std::ptrdiff_t, int, float, float*, float*, int) {
  SHARDTENSOR_FAIL("winograd_wide_output_tiles", "this build has no host vector kernels");
}
void gelu_rows(const float*, float*, std::size_t) {
  SHARDTENSOR_FAIL("gelu_rows", "this build has no host vector kernels");
}
void gelu_backward_rows(const float*, const float*, float*, std::size_t) {
  SHARDTENSOR_FAIL("gelu_backward_rows", "this build has no host vector kernels");
}
float row_max(const float*, std::size_t) {
  SHARDTENSOR_FAIL("row_max", "this build has no host vector kernels");
}
float exp_row(float*, std::size_t, float) {
  SHARDTENSOR_FAIL("exp_row", "this build has no host vector kernels");
}
void bf16_pairs(const float*, const float*, uint32_t*, std::size_t) {
  SHARDTENSOR_FAIL("bf16_pairs", "this build has no host vector kernels");
}
void bf16_round(const float*, float*, std::size_t) {
  SHARDTENSOR_FAIL("bf16_round", "this build has no host vector kernels");
}
std::size_t bf16_pack(const float*, uint16_t*, std::size_t) {
  SHARDTENSOR_FAIL("bf16_pack", "this build has no host vector kernels");
}

}  // namespace host
}  // namespace shardtensor::kernels
#endif
