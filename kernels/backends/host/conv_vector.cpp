#include "conv_vector.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "amx/amx_tiles.hpp"
#include "conv_winograd.hpp"
#include "host_threads.hpp"
#include "row_padding.hpp"
#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/core/error.hpp"
#include "source_rows.hpp"
#include "vector_kernels.hpp"

// The plane path's vector kernels (float on the host; the register tiles of vector_kernels.hpp
// on the instruction set the CPU runs). The same correlations without im2col or a GEMM
// library: a tile of output channels x vectors of output cells (8 x 3 vectors of 16 on
// AVX-512) accumulates in registers over the taps, loading the source straight from its planes
// (a tap is an offset). The weight gradient keeps taps x output channels in registers (12 x 32
// on AVX-512; narrow tiles of 12 x 16 or 12 x 8 where fewer outputs are left) while it streams
// a band of cells. Each output's sum runs in the same order on every instruction set: the
// paths give the same bits. See docs/performance.md for what the kernels reach against sgemm
// and PyTorch.

namespace shardtensor::kernels::host {

namespace {

/// Source channels per pass over a tile: a pass reads channels x kx planes. With kx = 3,
/// 8 channels (about 24 pages, which the TLB holds); all 32 channels in one pass (96 pages
/// per tile) ran 20 % slower. With one plane (2-D fields, rotated), 32 channels: each pass
/// reads and writes the tile's outputs, so fewer passes save that traffic.
inline Index channels_per_pass(const Correlation& r) {
  return r.k[0] == 1 ? 32 : 8;
}
/// Output rows per band: the unit that the halo-overlap filter selects, and the cells per
/// weight-gradient sweep (32 channels x 16 rows of 64 cells transposed = 128 KiB, kept in L2).
constexpr Index band_rows = 16;

/// Output vectors per chunk of a band in the correlation: a chunk runs every pass and block of
/// output channels over its own vectors, so that what a pass reads stays in L2 from block to
/// block (a 2-D band of 512-cell rows, 32 channels: 1.2 MiB, read from L3 once per block, 8
/// times on AVX2). A whole band where a pass's planes fit already (3-D, 64-cell rows: 8 channels
/// x 3 planes x 18 rows, 114 KiB). Whole tiles; the outputs and their sums do not change.
inline Index vectors_per_chunk(const Correlation& r, std::ptrdiff_t source_row_stride,
                               std::size_t value_bytes, const ConvTileShape& shape,
                               Index band_vectors) {
  constexpr std::size_t l2_share = std::size_t(256) << 10;
  const std::size_t pass = std::size_t(std::min(channels_per_pass(r), r.src_per_group)),
                    row_bytes = pass * std::size_t(r.k[0] * source_row_stride) * value_bytes,
                    read_rows =
                        std::max<std::size_t>(l2_share / std::max<std::size_t>(row_bytes, 1), 1);
  const Index halo_rows = (r.k[1] - 1) * r.d[1];
  const Index rows = std::max<Index>(Index(read_rows) - halo_rows, 1);
  const Index tile_cells = Index(shape.tile_vectors) * shape.lanes;
  const Index tiles = (rows * source_row_stride + tile_cells - 1) / tile_cells;
  return std::min(band_vectors, tiles * shape.tile_vectors);
}

/// Rows of a plane's copy: the whole plane's read extent, or (band copies) the rows one band
/// of output rows reads.
inline Index copied_rows(const Correlation& r, bool bands) {
  const Index band_reads = band_rows + (r.k[1] - 1) * r.d[1];
  return bands ? std::min(read_extent(r, 1), band_reads) : read_extent(r, 1);
}

/// x rounded to the nearest bf16 (bfloat16_bits: branch-free, so the copies into pair planes
/// vectorize) in the upper half of 32 bits. The pair planes round as they copy: a bf16
/// convolution may read its input itself.
inline uint32_t upper_bf16(float x) {
  return uint32_t(bfloat16_bits(x)) << 16;
}
/// Two values rounded to bf16 as one cell of a pair plane (correlate_pairs_tile).
inline uint32_t bf16_pair(float upper, float lower) {
  return upper_bf16(upper) | bfloat16_bits(lower);
}

/// AMX weight gradient: pairs of cells per chunk of an output row of `cells` cells (16 or
/// fewer, chunks of equal size), and the row's pairs padded to whole chunks.
inline Index amx_chunk_pairs_of_row(Index cells) {
  const Index pairs = (cells + 1) / 2, chunks = (pairs + 15) / 16;
  return (pairs + chunks - 1) / chunks;
}
inline Index amx_row_pairs(Index cells) {
  const Index pairs = (cells + 1) / 2, chunk = amx_chunk_pairs_of_row(cells);
  return (pairs + chunk - 1) / chunk * chunk;
}

/// Where the vector kernels read source plane sx: the field itself when the windows lie inside
/// it in y and z (a padded input), else a ring of zero-padded copies of its planes (the output
/// gradient, read by the input gradient; an input read without a padded copy), whose cells past
/// the field's ends come from its slabs (SourceSlabs) along the slab axis. A plane points at
/// the cell that output (0, first_row()) reads at y and z taps 0, channel 0 of the group. With
/// `bands`, a copy holds only the rows that one band of output rows reads (start_band() before the
/// band's planes): a 2-D field is one plane, too large to copy whole into the workspace.
/// Value float with `round_bf16` (a bf16 convolution's source on the float tiles): the copies
/// hold the cells rounded to bf16; a source read in place must hold bf16 values already (a
/// rounded padded copy: conv_vector_rounds_source).
/// Value uint32_t: the copies are pair planes (bf16 channel pairs, correlate_pairs_tile), always
/// copied; a copy "channel" is a pair of the group's channels (an odd last one pairs with zeros).
/// With cell_pairs, the pairs are of a row's cells instead (weight_gradient_pairs_tile): cell z
/// holds z's bf16 value and z + 1's, zero past the row's end; a copy "channel" is a channel.
/// Value uint16_t: the copies hold bf16 values (the AMX weight gradient's source), always
/// copied, each row padded with zeros to row_width(r) cells: the tiles read whole chunks of
/// pairs of cells.
template <class Value, bool cell_pairs = false>
class PlaneSource {
  static constexpr bool pairs = std::is_same<Value, uint32_t>::value;
  static constexpr bool bf16_values = std::is_same<Value, uint16_t>::value;
  static constexpr bool channel_pairs = pairs && !cell_pairs;
  static_assert(pairs || !cell_pairs, "cell pairs are uint32_t");
  static Index copy_channels(const Correlation& r) {
    return channel_pairs ? (r.src_per_group + 1) / 2 : r.src_per_group;
  }
  static bool reads_in_place(const Correlation& r) {
    return std::is_same<Value, float>::value && reads_inside(r);
  }

 public:
  PlaneSource(const Correlation& r, const FieldView<float>& src, Value* ring, bool bands = false,
              const SourceSlabs<float>& slabs = {}, bool round_bf16 = false)
      : r_(r),
        src_(src),
        rows_of_source_(r, src, slabs),
        ring_(ring),
        in_place_(reads_in_place(r)),
        round_bf16_(round_bf16),
        rows_(copied_rows(r, bands)),
        slot_plane_(r.slots()),
        row_floats_(cell_pairs ? read_extent(r, 2) : 0) {
    channel_stride_ = in_place_ ? src.stride(1) : rows_ * row_width(r);
    row_stride_ = in_place_ ? src.stride(3) : row_width(r);
  }
  /// Cells of a copied row: the read extent, and for bf16 values the AMX chunks' padding.
  static Index row_width(const Correlation& r) {
    if constexpr (bf16_values)
      return std::max(read_extent(r, 2), 2 * amx_row_pairs(r.out[2]) + (r.k[2] - 1) * r.d[2]);
    return read_extent(r, 2);
  }
  /// Workspace values the ring needs (none when the source is read in place).
  static std::size_t ring_values(const Correlation& r, bool bands) {
    return reads_in_place(r) ? 0
                             : static_cast<std::size_t>(r.slots() * copy_channels(r) *
                                                        copied_rows(r, bands) * row_width(r));
  }
  /// Channels (pairs for pair planes) of a plane, a channel_stride() apart.
  Index channels() const { return copy_channels(r_); }
  std::ptrdiff_t channel_stride() const { return channel_stride_; }
  std::ptrdiff_t row_stride() const { return row_stride_; }
  /// The output row that a plane's first row belongs to.
  Index first_row() const { return first_row_; }

  /// Starts sample n, group `group`: the ring holds none of its planes yet.
  void start(Index n, Index group) {
    n_ = n, group_ = group;
    std::fill(slot_plane_.begin(), slot_plane_.end(), std::numeric_limits<Index>::min());
  }
  /// Starts the band of output rows from y0 (band copies only; else nothing to do).
  void start_band(Index y0) {
    if (in_place_ || rows_ == read_extent(r_, 1)) return;
    first_row_ = y0;
    std::fill(slot_plane_.begin(), slot_plane_.end(), std::numeric_limits<Index>::min());
  }
  /// Source plane sx of the current sample and group; null outside the source (reads zero).
  const Value* plane(Index sx) {
    if (!rows_of_source_.plane(sx)) return nullptr;
    const Index c0 = group_ * r_.src_per_group;
    if constexpr (std::is_same<Value, float>::value)
      if (in_place_) return &src_(n_, c0, sx, r_.offset[1], r_.offset[2]);  // no wrap, no slab
    const Index slot = slot_of(sx, r_.slots());
    Value* copy = ring_ + slot * channels() * channel_stride_;
    if (slot_plane_[slot] == sx) return copy;
    // Row by row: the source's cells [z0, z1) of the row (contiguous), and around them zeros
    // or (wrap) the cells an extent away.
    const Index rows = std::min(rows_, read_extent(r_, 1) - first_row_);
    const Index width = read_extent(r_, 2), extent = r_.src[2];
    const Index z0 = std::clamp<Index>(-r_.offset[2], 0, width);
    const Index z1 = std::clamp<Index>(extent - r_.offset[2], z0, width);
    for (Index j = 0; j < channels(); ++j)
      for (Index y = 0; y < rows; ++y) {
        const Index sy = r_.offset[1] + first_row_ + y;
        // Channel pairs: the pair's first channel (its second's row is there where this is).
        const Index c = c0 + (channel_pairs ? 2 * j : j);
        const float* source_row = rows_of_source_.row(n_, c, sx, sy);
        Value* row = copy + j * channel_stride_ + y * row_stride_;
        std::fill(row + width, row + row_stride_, Value(0));  // padding past the read extent
        if (!source_row || (z0 == z1 && !r_.wrap[2])) {
          std::fill(row, row + width, Value(0));
          continue;
        }
        if constexpr (bf16_values) {
          copy_padded_row(
              row, width, r_.offset[2], extent, r_.wrap[2],
              [&](Index sz) { return bfloat16_bits(source_row[sz]); },
              [&](Index sz, Index count, Value* to) {
                bf16_pack(source_row + sz, to, std::size_t(count));
              });
        } else if constexpr (cell_pairs) {
          // The row as floats (with its zeros or wrapped cells), then as pairs of cells.
          float* floats = row_floats_.data();
          copy_padded_row(
              floats, width, r_.offset[2], extent, r_.wrap[2],
              [&](Index sz) { return source_row[sz]; },
              [&](Index sz, Index count, float* to) {
                std::copy(source_row + sz, source_row + sz + count, to);
              });
          bf16_pairs(floats, floats + 1, row, std::size_t(width - 1));
          row[width - 1] = upper_bf16(floats[width - 1]);
        } else if constexpr (pairs) {
          const float* upper = source_row;
          const float* lower =
              2 * j + 1 < r_.src_per_group ? rows_of_source_.row(n_, c + 1, sx, sy) : nullptr;
          const auto cell = [&](Index sz) {
            return lower ? bf16_pair(upper[sz], lower[sz]) : upper_bf16(upper[sz]);
          };
          copy_padded_row(row, width, r_.offset[2], extent, r_.wrap[2], cell,
                          [&](Index sz, Index count, Value* to) {
                            bf16_pairs(upper + sz, lower ? lower + sz : nullptr, to,
                                       std::size_t(count));
                          });
        } else if (round_bf16_) {
          copy_padded_row(
              row, width, r_.offset[2], extent, r_.wrap[2],
              [&](Index sz) { return round_to_bfloat16(source_row[sz]); },
              [&](Index sz, Index count, Value* to) {
                bf16_round(source_row + sz, to, std::size_t(count));
              });
        } else {
          copy_padded_row(
              row, width, r_.offset[2], extent, r_.wrap[2],
              [&](Index sz) { return source_row[sz]; },
              [&](Index sz, Index count, Value* to) {
                std::copy(source_row + sz, source_row + sz + count, to);
              });
        }
      }
    slot_plane_[slot] = sx;
    return copy;
  }

 private:
  const Correlation& r_;
  FieldView<float> src_;
  SourceRows rows_of_source_;
  Value* ring_;
  bool in_place_;
  bool round_bf16_;  // float copies round to bf16
  Index rows_;       // rows per copy
  std::ptrdiff_t channel_stride_, row_stride_;
  std::vector<Index> slot_plane_;  // source plane in each ring slot
  std::vector<float> row_floats_;  // cell pairs: a row before it is paired
  Index n_ = 0, group_ = 0, first_row_ = 0;
};

/// Offsets from a source plane of the (y, z) taps of its channels (or pairs) j: entry
/// (j, b, c) = j * channel stride + b * dy * row stride + c * dz.
template <class Value, bool cell_pairs>
std::vector<std::ptrdiff_t> tap_offsets(const Correlation& r,
                                        const PlaneSource<Value, cell_pairs>& source) {
  std::vector<std::ptrdiff_t> offsets;
  for (Index j = 0; j < source.channels(); ++j)
    for (Index b = 0; b < r.k[1]; ++b)
      for (Index c = 0; c < r.k[2]; ++c)
        offsets.push_back(j * source.channel_stride() + b * r.d[1] * source.row_stride() +
                          c * r.d[2]);
  return offsets;
}

/// The output vectors of output rows [y0, y1), padded to whole tiles: row by row, or, where
/// that takes fewer vectors (rows of 66 cells: 5 vectors, 14 lanes idle), running on over the
/// source's rows (its row stride, at least the output row), so that a vector's lanes past
/// the end of an output row are the next row's first cells (the rows' last source columns
/// in between are skipped).
inline void output_vectors(const Correlation& r, Index source_row_stride, Index out_row_stride,
                           Index y0, Index y1, Index source_first_row, const ConvTileShape& shape,
                           std::vector<OutputVector>& vectors) {
  const Index source_base = source_first_row * source_row_stride;  // where the source starts
  const Index lanes = shape.lanes;
  const Index row = r.out[2], rows = y1 - y0;
  const bool run_on =
      source_row_stride >= lanes && ((rows - 1) * source_row_stride + row + lanes - 1) / lanes <
                                        rows * ((row + lanes - 1) / lanes);
  vectors.clear();
  if (!run_on) {
    for (Index y = y0; y < y1; ++y)
      for (Index z = 0; z < row; z += lanes)
        vectors.push_back({y * source_row_stride + z - source_base, y * out_row_stride + z, 0,
                           (1u << std::min(lanes, row - z)) - 1, 0});
  } else {
    const Index end = (y1 - 1) * source_row_stride + row;  // past the last cell read
    for (Index q = y0 * source_row_stride; q < end; q += lanes) {
      const Index y = q / source_row_stride, z = q % source_row_stride;
      unsigned mask = 0, next_mask = 0;
      for (Index i = 0; i < lanes; ++i) {
        if (z + i < row) mask |= 1u << i;
        const Index next_z = z + i - source_row_stride;
        if (next_z >= 0 && next_z < row && y + 1 < y1) next_mask |= 1u << i;
      }
      vectors.push_back({q - source_base, y * out_row_stride + z,
                         (y + 1) * out_row_stride + z - source_row_stride, mask, next_mask});
    }
  }
  while (vectors.size() % shape.tile_vectors != 0) vectors.push_back({0, 0, 0, 0, 0});
}

/// Packs group `group`'s weights of correlation r (flipped and transposed if `transposed`)
/// for the current path's tiles: [block of R outputs][pass][a][(j, b, c) of the pass][R]
/// (R = the tile's rows; outputs past out_per_group zero). With `pairs` (for pair planes),
/// (j, b, c) runs over channel pairs j, each entry the tile's R weight pairs (rounded to bf16
/// as they are paired); else, with `round_bf16`, the weights rounded to bf16. So a bf16 layer
/// hands these kernels its float weights, not a rounded copy.
void pack_correlation_weights(const Correlation& r, const ConvShape& g,
                              const ReplicatedView<float>& w, bool transposed, Index group,
                              bool pairs, bool round_bf16, void* packed) {
  const Index rows_per_tile = conv_tile_shape().tile_rows;
  const Index kx = r.k[0], yz_taps = r.k[1] * r.k[2];
  const Index blocks = (r.out_per_group + rows_per_tile - 1) / rows_per_tile;
  // Channels per (a, j, b, c) entry of R values.
  const Index step = pairs ? 2 : 1, entries = (r.src_per_group + step - 1) / step;
  // The weight index is linear in (o, b, c): walked by strides (an index computed per weight
  // was most of the packing, a tenth of a small field's convolution).
  const auto weight_at = [&](Index grp, Index o, Index j, Index a, Index b, Index c) {
    return correlation_weight_index(g, grp, transposed, o, j, a, b, c);
  };
  const std::ptrdiff_t o_step = weight_at(0, 1, 0, 0, 0, 0) - weight_at(0, 0, 0, 0, 0, 0),
                       b_step = weight_at(0, 0, 0, 0, 1, 0) - weight_at(0, 0, 0, 0, 0, 0),
                       c_step = weight_at(0, 0, 0, 0, 0, 1) - weight_at(0, 0, 0, 0, 0, 0);
  for (Index block = 0; block < blocks; ++block)
    for (Index j0 = 0; j0 < r.src_per_group; j0 += channels_per_pass(r)) {
      const Index pass = std::min(channels_per_pass(r), r.src_per_group - j0);
      const Index o0 = block * rows_per_tile,
                  rows = std::min(rows_per_tile, r.out_per_group - o0);  // the rest are zero
      // Channel j's weights of the block's outputs at tap (a, b, c), an o_step apart; null
      // past the channels (zeros).
      const auto column = [&](Index j, Index a, Index b, Index c) -> const float* {
        return j < r.src_per_group
                   ? w.data() + weight_at(group, o0, j, a, 0, 0) + b * b_step + c * c_step
                   : nullptr;
      };
      const Index first = (block * entries + j0 / step) * kx * yz_taps * rows_per_tile;
      float* p = static_cast<float*>(packed) + first;
      uint32_t* q = static_cast<uint32_t*>(packed) + first;
      for (Index a = 0; a < kx; ++a)
        for (Index j = j0; j < j0 + pass; j += step)
          for (Index b = 0; b < r.k[1]; ++b)
            for (Index c = 0; c < r.k[2]; ++c, p += rows_per_tile, q += rows_per_tile) {
              const float* upper = column(j, a, b, c);
              const float* lower = pairs ? column(j + 1, a, b, c) : nullptr;
              for (Index i = 0; i < rows_per_tile; ++i) {
                const float u = i < rows ? upper[i * o_step] : 0.0f,
                            l = i < rows && lower ? lower[i * o_step] : 0.0f;
                if (pairs)
                  q[i] = bf16_pair(u, l);
                else
                  p[i] = round_bf16 ? round_to_bfloat16(u) : u;
              }
            }
    }
}

/// One source per host thread, each with its own ring of `ring_size` values from `rings`: made
/// before the threads run, so that no View is copied inside them.
template <class Value>
std::vector<PlaneSource<Value>> thread_sources(const Correlation& r, const FieldView<float>& src,
                                               Value* rings, bool band_copies,
                                               const SourceSlabs<float>& slabs,
                                               bool round_bf16 = false) {
  const std::size_t ring_size = PlaneSource<Value>::ring_values(r, band_copies);
  std::vector<PlaneSource<Value>> sources;
  for (int t = 0; t < host_threads(); ++t)
    sources.emplace_back(r, src, rings + t * ring_size, band_copies, slabs, round_bf16);
  return sources;
}

/// Runs body(source, planes, vectors, out_plane) for each band of output rows of group `group`
/// that `keep` selects, every sample in order, each thread on whole bands (disjoint outputs)
/// with its own source (sources[t], made by the caller: no View is copied inside the
/// threads): planes[a] is x tap a's source plane, vectors the band's output vectors
/// (output_vectors), out_plane the group's first output channel at the band's plane.
template <class Value, class Body>
void for_each_band(const Correlation& r, const FieldView<float>& out,
                   std::vector<PlaneSource<Value>>& sources, Index group, const PlaneFilter& keep,
                   const Body& body) {
  const ConvTileShape shape = conv_tile_shape();
  const Index kx = r.k[0], bands = (r.out[1] + band_rows - 1) / band_rows;
  const Index per_sample = r.out[0] * bands;
  const std::ptrdiff_t out_row_stride = out.stride(3);
  split_over_threads(int(sources.size()), Index(out.extent(0)) * per_sample,
                     [&](int t, Index first, Index last) {
                       PlaneSource<Value>& source = sources[t];
                       std::vector<const Value*> planes(kx);
                       // Each band's output vectors, made once per correlation where the
                       // bands are few (a small field's one or two), not once per sample and
                       // plane; else made per item.
                       const bool keep_vectors = bands <= 8;
                       std::vector<std::vector<OutputVector>> vectors(keep_vectors ? bands : 1);
                       for (Index item = first; item < last; ++item) {
                         const Index n = item / per_sample, x = (item % per_sample) / bands,
                                     band = item % bands, y0 = band * band_rows;
                         if (item == first || item % per_sample == 0) source.start(n, group);
                         const Index y1 = std::min(y0 + band_rows, r.out[1]);
                         if (!keep(x, y0, y1)) continue;
                         source.start_band(y0);
                         for (Index a = 0; a < kx; ++a)
                           planes[a] = source.plane(r.offset[0] + x + a * r.d[0]);
                         // Never empty once made: a band has at least one output vector.
                         std::vector<OutputVector>& band_vectors = vectors[keep_vectors ? band : 0];
                         if (!keep_vectors || band_vectors.empty())
                           output_vectors(r, source.row_stride(), out_row_stride, y0, y1,
                                          source.first_row(), shape, band_vectors);
                         body(source, planes, band_vectors,
                              &out(n, group * r.out_per_group, x, 0, 0));
                       }
                     });
}

/// The correlation on float planes (correlate_tile; `round_bf16`: the copies round the source
/// to bf16) or on pair planes (correlate_pairs_tile).
template <class Value>
void correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
               const SourceSlabs<float>& slabs, const ReplicatedView<float>& w, bool transposed,
               const ReplicatedView<float>& bias, const FieldView<float>& out, float* workspace,
               bool band_copies, const PlaneFilter& keep, const void* packed_weights,
               bool round_bf16 = false) {
  constexpr bool pairs = std::is_same<Value, uint32_t>::value;
  const ConvTileShape shape = conv_tile_shape();
  const Index rows_per_tile = shape.tile_rows, vectors_per_tile = shape.tile_vectors;
  const Index kx = r.k[0], yz_taps = r.k[1] * r.k[2];
  const Index blocks = (r.out_per_group + rows_per_tile - 1) / rows_per_tile;
  // Channels per weight entry (a tile's R weights at one tap of one channel or pair).
  const Index step = pairs ? 2 : 1, entries = (r.src_per_group + step - 1) / step;
  Value* const packed = reinterpret_cast<Value*>(workspace);  // the weights, then the rings
  Value* const rings = packed + blocks * kx * entries * yz_taps * rows_per_tile;
  const std::vector<std::ptrdiff_t> offsets =
      tap_offsets(r, PlaneSource<Value>(r, src, rings, band_copies));
  const std::ptrdiff_t out_channel_stride = out.stride(1);
  std::vector<PlaneSource<Value>> sources =
      thread_sources(r, src, rings, band_copies, slabs, round_bf16);
  for (Index group = 0; group < r.groups; ++group) {
    // The kept packed weights (one group), else this group's packed into the workspace.
    const Value* const weights_of_group =
        packed_weights ? static_cast<const Value*>(packed_weights) : packed;
    if (!packed_weights)
      pack_correlation_weights(r, g, w, transposed, group, pairs, round_bf16, packed);
    for_each_band<Value>(
        r, out, sources, group, keep,
        [&](const PlaneSource<Value>& source, const std::vector<const Value*>& planes,
            const std::vector<OutputVector>& vectors, float* out_plane) {
          const Index band_vectors = Index(vectors.size()),
                      chunk = vectors_per_chunk(r, source.row_stride(), sizeof(Value), shape,
                                                band_vectors);
          for (Index v0 = 0; v0 < band_vectors; v0 += chunk)
            for (Index j0 = 0; j0 < r.src_per_group; j0 += channels_per_pass(r)) {
              const Index pass = std::min(channels_per_pass(r), r.src_per_group - j0);
              const Index pass_entries = (pass + step - 1) / step;
              for (Index block = 0; block < blocks; ++block) {
                const Index o0 = block * rows_per_tile;
                const Value* weights =
                    weights_of_group + (block * entries + j0 / step) * kx * yz_taps * rows_per_tile;
                const float* block_bias =
                    bias.extent(0) > 0 && j0 == 0 ? &bias(group * r.out_per_group + o0) : nullptr;
                const int rows = int(std::min(rows_per_tile, r.out_per_group - o0));
                for (Index v = v0; v < std::min(v0 + chunk, band_vectors); v += vectors_per_tile) {
                  const auto args = std::make_tuple(
                      planes.data(), int(kx), offsets.data() + j0 / step * yz_taps,
                      int(pass_entries * yz_taps), weights, &vectors[v],
                      out_plane + o0 * out_channel_stride, out_channel_stride, rows, block_bias,
                      /*accumulate=*/j0 > 0);
                  if constexpr (pairs)
                    std::apply(correlate_pairs_tile, args);
                  else
                    std::apply(correlate_tile, args);
                }
              }
            }
        });
  }
}

/// AMX: source pairs per chunk (16 or fewer, the chunks of equal size), 0 where the pairs
/// split into no such chunks (17 pairs: those correlations run on the bf16 dot products).
inline int amx_chunk_pairs(const Correlation& r) {
  const Index pairs = (r.src_per_group + 1) / 2, chunks = (pairs + 15) / 16;
  return pairs % chunks == 0 ? int(pairs / chunks) : 0;
}
/// Whether a bf16 correlation runs on AMX tiles now.
inline bool amx_runs(const Correlation& r) {
  return bf16_matrix_tiles() && amx_chunk_pairs(r) > 0;
}
/// Whether a correlation (`bf16`: of bf16 operands) reads pair planes: on AMX tiles, or on
/// bf16 dot products where they run (kernels::bf16_dot_products); else the float tiles, on
/// copies rounded to bf16 for bf16 operands.
inline bool correlation_pairs(const Correlation& r, bool bf16) {
  return bf16 && (amx_runs(r) || bf16_dot_products());
}
/// Likewise the weight gradient, whose AMX tiles take every shape.
inline bool gradient_pairs(bool bf16) {
  return bf16 && (bf16_matrix_tiles() || bf16_dot_products());
}
/// Values of group `group`'s weights packed for amx_correlate_tile: per block of 16 outputs.
inline Index amx_block_values(const Correlation& r) {
  return 16 * r.k[0] * r.k[1] * r.k[2] * ((r.src_per_group + 1) / 2);
}

/// Packs group `group`'s weights of correlation r (flipped and transposed if `transposed`)
/// for amx_correlate_tile: [block of 16 outputs][a][chunk][(b, c)][16 outputs][chunk's pairs],
/// each a pair of channels 2p (upper half) and 2p + 1 (lower; zero past the channels), zero
/// past out_per_group.
void pack_amx_weights(const Correlation& r, const ConvShape& g, const ReplicatedView<float>& w,
                      bool transposed, Index group, uint32_t* packed) {
  const Index chunk_pairs = amx_chunk_pairs(r), pairs = (r.src_per_group + 1) / 2;
  const Index blocks = (r.out_per_group + 15) / 16;
  uint32_t* p = packed;
  for (Index block = 0; block < blocks; ++block)
    for (Index a = 0; a < r.k[0]; ++a)
      for (Index k0 = 0; k0 < pairs; k0 += chunk_pairs)
        for (Index b = 0; b < r.k[1]; ++b)
          for (Index c = 0; c < r.k[2]; ++c)
            for (Index i = 0; i < 16; ++i)
              for (Index q = k0; q < k0 + chunk_pairs; ++q, ++p) {
                const Index o = block * 16 + i, j = 2 * q;
                const auto weight = [&](Index channel) {
                  return o < r.out_per_group && channel < r.src_per_group
                             ? w(correlation_weight_index(g, group, transposed, o, channel, a, b,
                                                          c))
                             : 0.0f;
                };
                *p = bf16_pair(weight(j), weight(j + 1));
              }
}

/// The correlation on AMX tiles (amx_correlate_tile) over pair planes: per band of output
/// rows, tiles of up to 32 outputs x 2 (3 for 16 outputs or fewer) vectors of 16 cells, each
/// summing over every source channel at once.
void correlate_amx(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                   const SourceSlabs<float>& slabs, const ReplicatedView<float>& w, bool transposed,
                   const ReplicatedView<float>& bias, const FieldView<float>& out, float* workspace,
                   bool band_copies, const PlaneFilter& keep, const void* packed_weights) {
  const int chunk_pairs = amx_chunk_pairs(r);
  const int chunks = int((r.src_per_group + 1) / 2 / chunk_pairs);
  const Index kx = r.k[0], block_values = amx_block_values(r);
  const Index blocks = (r.out_per_group + 15) / 16;
  uint32_t* const packed = reinterpret_cast<uint32_t*>(workspace);  // the weights, the rings
  uint32_t* const rings = packed + blocks * block_values;
  std::vector<PlaneSource<uint32_t>> sources = thread_sources(r, src, rings, band_copies, slabs);
  std::vector<std::ptrdiff_t> yz_offsets;
  for (Index b = 0; b < r.k[1]; ++b)
    for (Index c = 0; c < r.k[2]; ++c)
      yz_offsets.push_back(b * r.d[1] * sources[0].row_stride() + c * r.d[2]);
  const std::ptrdiff_t out_channel_stride = out.stride(1);
  for (Index group = 0; group < r.groups; ++group) {
    const uint32_t* const weights =
        packed_weights ? static_cast<const uint32_t*>(packed_weights) : packed;
    if (!packed_weights) pack_amx_weights(r, g, w, transposed, group, packed);
    for_each_band<uint32_t>(
        r, out, sources, group, keep,
        [&](const PlaneSource<uint32_t>& source, const std::vector<const uint32_t*>& planes,
            const std::vector<OutputVector>& vectors, float* out_plane) {
          std::size_t count = vectors.size();  // without the padding vectors at the end
          while (count > 0 && vectors[count - 1].mask == 0) --count;
          for (Index o0 = 0; o0 < r.out_per_group; o0 += 32) {
            const int rows = int(std::min<Index>(32, r.out_per_group - o0));
            const int per_tile = rows > 16 ? 2 : amx_tile_vectors;
            const float* block_bias =
                bias.extent(0) > 0 ? &bias(group * r.out_per_group + o0) : nullptr;
            for (std::size_t v = 0; v < count; v += per_tile)
              amx_correlate_tile(
                  planes.data(), int(kx), yz_offsets.data(), int(yz_offsets.size()),
                  source.channel_stride(), chunk_pairs, chunks, weights + o0 / 16 * block_values,
                  block_values, &vectors[v], int(std::min<std::size_t>(per_tile, count - v)),
                  out_plane + o0 * out_channel_stride, out_channel_stride, rows, block_bias);
          }
        });
  }
}

}  // namespace

std::size_t conv_vector_packed_values(const Correlation& r, bool winograd) {
  // Channels rounded up to pairs: room for the pair layouts too.
  const Index blocks = (r.out_per_group + max_tile_rows - 1) / max_tile_rows;
  const std::size_t direct = static_cast<std::size_t>(
      blocks * max_tile_rows * r.k[0] * (r.src_per_group + 1) / 2 * 2 * r.k[1] * r.k[2]);
  return winograd && conv_winograd_applies(r) ? std::max(direct, conv_winograd_packed_values(r))
                                              : direct;
}

bool conv_vector_winograd(const Correlation& r, bool bf16, bool winograd) {
  return winograd && !bf16 && conv_winograd_applies(r);
}

bool conv_vector_winograd_gradient(const Correlation& forward, Index batch, bool bf16,
                                   bool winograd) {
  return conv_vector_winograd(forward, bf16, winograd) &&
         conv_winograd_gradient_pays(forward, batch);
}

int conv_vector_packing() {
  // AMX's layout (per correlation: where it runs) is told apart from the tile rows' by sign,
  // the pair tiles' (where bf16 dot products run) by 64 more.
  const int rows = conv_tile_shape().tile_rows + (bf16_dot_products() ? 64 : 0);
  return bf16_matrix_tiles() ? -rows : rows;
}

bool conv_vector_rounds_source(const Correlation& forward, bool bf16) {
  // A source that the windows reach past is copied by every path; one read in place by the
  // float tiles must hold bf16 values already.
  return bf16 &&
         (!reads_inside(forward) || (correlation_pairs(forward, true) && gradient_pairs(true)));
}

void conv_vector_pack_weights(const Correlation& r, const ConvShape& g,
                              const ReplicatedView<float>& w, bool transposed, bool bf16,
                              bool winograd, float* packed) {
  SHARDTENSOR_REQUIRE(r.groups == 1, "conv_vector_pack_weights",
                      "kept packed weights need one group, not " << r.groups);
  if (conv_vector_winograd(r, bf16, winograd))
    return conv_winograd_pack_weights(r, g, w, transposed, 0, packed);
  if (bf16 && amx_runs(r))
    return pack_amx_weights(r, g, w, transposed, 0, reinterpret_cast<uint32_t*>(packed));
  pack_correlation_weights(r, g, w, transposed, 0, correlation_pairs(r, bf16), bf16, packed);
}

/// out = the correlation of src (plus bias when given), like plane_correlate: per output plane
/// and band of rows, tiles of output vectors, one pass per channels_per_pass(r) source channels.
/// Weights packed per group into the workspace (pack_correlation_weights), or given packed.
void conv_vector_correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                           const ReplicatedView<float>& w, bool transposed,
                           const ReplicatedView<float>& bias, const FieldView<float>& out,
                           float* workspace, bool band_copies, bool bf16, bool winograd,
                           const PlaneFilter& keep, const float* packed_weights,
                           const SourceSlabs<float>& slabs) {
  if (conv_vector_winograd(r, bf16, winograd))
    return conv_winograd_correlate(r, g, src, slabs, w, transposed, bias, out, workspace, keep,
                                   packed_weights);
  if (bf16 && amx_runs(r))
    return correlate_amx(r, g, src, slabs, w, transposed, bias, out, workspace, band_copies, keep,
                         packed_weights);
  if (correlation_pairs(r, bf16))
    correlate<uint32_t>(r, g, src, slabs, w, transposed, bias, out, workspace, band_copies, keep,
                        packed_weights);
  else
    correlate<float>(r, g, src, slabs, w, transposed, bias, out, workspace, band_copies, keep,
                     packed_weights, /*round_bf16=*/bf16);
}

namespace {

/// Workspace values of vector_correlate and vector_weight_gradient, for every instruction set's
/// tiles (a plan made on one path runs on any other).
inline std::size_t vector_correlate_values(const Correlation& r, bool band_copies, bool bf16) {
  const std::size_t ring = correlation_pairs(r, bf16)
                               ? PlaneSource<uint32_t>::ring_values(r, band_copies)
                               : PlaneSource<float>::ring_values(r, band_copies);
  // AMX tiles read up to 15 cells past a vector: past the last ring, these.
  constexpr std::size_t tile_overrun = 16;
  return conv_vector_packed_values(r, false) + ring * host_threads() + tile_overrun;
}
/// Taps padded to whole weight-gradient tiles (of every path).
inline Index padded_taps(const Correlation& r) {
  return gradient_padded_taps(int(r.column_rows()));
}
/// A bound over every path of a group's outputs in the weight gradient's blocks.
inline Index padded_outputs(const Correlation& r) {
  return gradient_padded_outputs(int(r.out_per_group));
}
/// The weight gradient's source with bf16 pairs: a ring of cell-pair planes, each made once
/// for the kx output planes that read it.
using CellPairSource = PlaneSource<uint32_t, true>;

/// Workspace values of one thread of vector_weight_gradient, summing `x_taps` x taps at a
/// time: the output gradient of a band transposed, a plane's float sums and the double totals
/// (of x_taps x taps), and the source's ring (of cell-pair planes where a bf16 gradient reads
/// pairs; an even count: doubles stay aligned).
inline std::size_t weight_gradient_thread_values(const Correlation& r, bool band_copies, bool bf16,
                                                 Index x_taps) {
  const std::size_t gradient = x_taps * padded_taps(r) * padded_outputs(r);
  const std::size_t ring = gradient_pairs(bf16) ? CellPairSource::ring_values(r, band_copies)
                                                : PlaneSource<float>::ring_values(r, band_copies);
  const std::size_t values =
      static_cast<std::size_t>(padded_outputs(r) * band_rows * r.out[2]) + 3 * gradient + ring;
  return values + values % 2;
}
inline std::size_t vector_weight_gradient_values(const Correlation& r, bool band_copies, bool bf16,
                                                 Index x_taps) {
  return weight_gradient_thread_values(r, band_copies, bf16, x_taps) * host_threads();
}

/// The band's output gradient transposed as pairs of a row's cells (weight_gradient_pairs_tile):
/// [block of B channels][row][pair of cells][B], padding channels and the pair past an odd
/// row's end zero. 16 pairs at a time: their 16 rows of B channels stay in L1 while every
/// channel writes into them.
void transpose_gradient_pairs(const Correlation& r, const FieldView<float>& gy, Index n,
                              Index first_channel, Index x, Index y0, Index rows, Index outs,
                              Index B, uint32_t* transposed) {
  const Index row = r.out[2], pairs = (row + 1) / 2, per_block = rows * pairs;
  for (Index y = 0; y < rows; ++y)
    for (Index q0 = 0; q0 < pairs; q0 += 16) {
      const Index q1 = std::min(q0 + 16, pairs), whole = std::min(q1, row / 2);
      for (Index o = 0; o < outs; ++o) {
        uint32_t* to = transposed + (o / B) * per_block * B + y * pairs * B + o % B;
        if (o >= r.out_per_group) {
          for (Index q = q0; q < q1; ++q) to[q * B] = 0;
          continue;
        }
        const float* cells = &gy(n, first_channel + o, x, y0 + y, 0);
        for (Index q = q0; q < whole; ++q) to[q * B] = bf16_pair(cells[2 * q], cells[2 * q + 1]);
        if (whole < q1) to[(q1 - 1) * B] = upper_bf16(cells[row - 1]);
      }
    }
}

/// The band's output gradient for the AMX weight gradient (amx_weight_gradient_tile): [row][pair
/// of cells (z, z + 1), padded to row_pairs][output channel], each pair z's bf16 value in the
/// lower half and z + 1's in the upper (memory order), zero past the row's cells.
void transpose_gradient_amx(const Correlation& r, const FieldView<float>& gy, Index n,
                            Index first_channel, Index x, Index y0, Index rows, Index row_pairs,
                            uint32_t* to) {
  const Index row = r.out[2], outs = r.out_per_group, whole = row / 2;
  for (Index y = 0; y < rows; ++y)
    for (Index o = 0; o < outs; ++o) {
      const float* cells = &gy(n, first_channel + o, x, y0 + y, 0);
      uint32_t* column = to + y * row_pairs * outs + o;
      for (Index q = 0; q < whole; ++q)
        column[q * outs] = bf16_pair(cells[2 * q + 1], cells[2 * q]);
      for (Index q = whole; q < row_pairs; ++q)
        column[q * outs] = 2 * q < row ? uint32_t(bfloat16_bits(cells[2 * q])) : 0u;
    }
}

}  // namespace

/// gw += this rank's weight gradient (forward correlation r over its source xp): per output
/// plane and band of rows, the output gradient transposed to (cell, channel), then tiles of
/// taps x channels summed over the band's cells. Each plane's float sums are added into
/// double totals.
void conv_vector_weight_gradient(const Correlation& r, const ConvShape& g,
                                 const FieldView<float>& xp, const FieldView<float>& gy,
                                 const ReplicatedView<float>& gw, float* workspace,
                                 bool band_copies, bool bf16, bool winograd, Index x_taps_per_pass,
                                 const SourceSlabs<float>& slabs) {
  if (conv_vector_winograd(r, bf16, winograd))
    return conv_winograd_weight_gradient(r, g, xp, slabs, gy, gw, workspace, x_taps_per_pass);
  // bf16 on AMX tiles, or on dot products over pairs of a row's cells (the float tiles' sums
  // in the same order), else on the float tiles over copies rounded to bf16.
  const bool amx = bf16 && bf16_matrix_tiles();
  const bool pairs = gradient_pairs(bf16) && !amx;
  const ConvTileShape shape = conv_tile_shape();
  const Index kx = r.k[0], ky = r.k[1], kz = r.k[2];
  // Blocks of B output channels (the transposed gradient's per cell), each summed by the
  // path's gradient tiles.
  const Index B = gradient_block_channels(int(r.out_per_group), shape);
  const Index taps = padded_taps(r), outs = (r.out_per_group + B - 1) / B * B,
              cells_per_band = band_rows * r.out[2];
  const std::vector<GradientTile> block_tiles = gradient_block_tiles(int(B), shape);
  // x taps [a0, a0 + pass_taps) per pass over the bands, their sums at (a - a0).
  const Index pass_taps = std::clamp<Index>(x_taps_per_pass, 1, kx);
  const Index gradient_size = pass_taps * taps * outs;
  std::vector<std::ptrdiff_t> offsets =
      pairs || amx ? tap_offsets(r, CellPairSource(r, xp, nullptr, band_copies))
                   : tap_offsets(r, PlaneSource<float>(r, xp, nullptr, band_copies));
  offsets.resize(taps, 0);  // padding taps read tap 0; their sums are not used
  const Index bands = (r.out[1] + band_rows - 1) / band_rows;
  const int threads = host_threads();
  const std::size_t per_thread = weight_gradient_thread_values(r, band_copies, bf16, pass_taps);
  // Thread t's share: [transposed band | float sums | double totals | ring].
  const auto totals_of = [&](int t) {
    return reinterpret_cast<double*>(workspace + t * per_thread + outs * cells_per_band +
                                     gradient_size);
  };
  // On AMX tiles: plain bf16 planes (their rows padded to whole chunks of cell pairs).
  const Index amx_pairs = amx_chunk_pairs_of_row(r.out[2]), row_pairs = amx_row_pairs(r.out[2]);
  std::vector<PlaneSource<float>> sources;  // one of the three per thread
  std::vector<CellPairSource> pair_sources;
  std::vector<PlaneSource<uint16_t>> bf16_sources;
  for (int t = 0; t < threads; ++t) {
    void* const ring = totals_of(t) + gradient_size;
    if (amx)
      bf16_sources.emplace_back(r, xp, static_cast<uint16_t*>(ring), band_copies, slabs);
    else if (pairs)
      pair_sources.emplace_back(r, xp, static_cast<uint32_t*>(ring), band_copies, slabs);
    else
      sources.emplace_back(r, xp, static_cast<float*>(ring), band_copies, slabs, bf16);
  }
  const Index per_sample = r.out[0] * bands;
  const Index passes_per_group = (kx + pass_taps - 1) / pass_taps;
  for (Index pass = 0; pass < r.groups * passes_per_group; ++pass) {
    const Index group = pass / passes_per_group, a0 = pass % passes_per_group * pass_taps,
                a1 = std::min(a0 + pass_taps, kx);
    // Each thread sums over its own bands of rows of every sample (in order): float sums
    // per plane, added into its double totals when the plane changes; the totals add up in
    // thread order. A pass over fewer x taps sums each of its weights in the same order.
    split_over_threads(threads, g.batch * per_sample, [&](int t, Index first, Index last) {
      float* const transposed = workspace + t * per_thread;  // [32-channel block][cell][32]
      float* const sums = transposed + outs * cells_per_band;
      double* const totals = totals_of(t);
      std::vector<const float*> channel_rows(outs);  // the band's output gradient per channel
      std::fill(totals, totals + gradient_size, 0.0);
      std::fill(sums, sums + gradient_size, 0.0f);
      for (Index item = first; item < last; ++item) {
        const Index n = item / per_sample, x = (item % per_sample) / bands,
                    y0 = (item % bands) * band_rows;
        const bool new_sample = item == first || item % per_sample == 0;
        const Index y1 = std::min(y0 + band_rows, r.out[1]), cells = (y1 - y0) * r.out[2];
        if (amx) {
          PlaneSource<uint16_t>& source = bf16_sources[t];
          if (new_sample) source.start(n, group);
          const Index rows = y1 - y0, outs_of_group = r.out_per_group;
          uint32_t* const dy_pairs = reinterpret_cast<uint32_t*>(transposed);
          transpose_gradient_amx(r, gy, n, group * outs_of_group, x, y0, rows, row_pairs, dy_pairs);
          source.start_band(y0);
          const std::ptrdiff_t cs = source.channel_stride(), rs = source.row_stride();
          for (Index a = a0; a < a1; ++a) {
            const uint16_t* plane = source.plane(r.offset[0] + x + a * r.d[0]);
            if (!plane) continue;  // outside the source: reads zero
            const uint16_t* band = plane + (y0 - source.first_row()) * rs;
            for (Index j0 = 0; j0 < r.src_per_group; j0 += 32) {
              const int channels = int(std::min<Index>(32, r.src_per_group - j0));
              const Index per_tile = channels > 16 ? 32 : 48;
              for (Index o0 = 0; o0 < outs_of_group; o0 += per_tile)
                for (Index b = 0; b < ky; ++b)
                  for (Index c = 0; c < kz; ++c)
                    amx_weight_gradient_tile(
                        band + j0 * cs + b * r.d[1] * rs + c * r.d[2], cs, rs, channels,
                        dy_pairs + o0, row_pairs * outs_of_group, int(outs_of_group),
                        int(std::min(per_tile, outs_of_group - o0)), int(rows), int(amx_pairs),
                        int(row_pairs / amx_pairs),
                        sums + ((a - a0) * taps + (j0 * ky + b) * kz + c) * outs + o0,
                        ky * kz * outs);
            }
          }
        } else if (pairs) {
          CellPairSource& source = pair_sources[t];
          if (new_sample) source.start(n, group);
          const Index rows = y1 - y0, pairs_per_row = (r.out[2] + 1) / 2;
          uint32_t* const dy_pairs = reinterpret_cast<uint32_t*>(transposed);
          transpose_gradient_pairs(r, gy, n, group * r.out_per_group, x, y0, rows, outs, B,
                                   dy_pairs);
          source.start_band(y0);
          for (Index a = a0; a < a1; ++a) {
            const uint32_t* plane = source.plane(r.offset[0] + x + a * r.d[0]);
            if (!plane) continue;  // outside the source: reads zero
            const uint32_t* band = plane + (y0 - source.first_row()) * source.row_stride();
            for (Index block = 0; block < outs / B; ++block)
              for (const GradientTile& tile : block_tiles)
                for (Index tap = 0; tap < taps; tap += tile.taps)
                  weight_gradient_pairs_tile(
                      band, offsets.data() + tap, source.row_stride(), int(rows),
                      int(pairs_per_row),
                      dy_pairs + block * rows * pairs_per_row * B + tile.first_channel, int(B),
                      tile.channels,
                      sums + ((a - a0) * taps + tap) * outs + block * B + tile.first_channel, outs);
          }
        } else {
          PlaneSource<float>& source = sources[t];
          if (new_sample) source.start(n, group);
          // The band's output gradient transposed; padding channels (past out_per_group)
          // read zeros.
          for (Index o = 0; o < outs; ++o)
            channel_rows[o] =
                o < r.out_per_group ? &gy(n, group * r.out_per_group + o, x, y0, 0) : nullptr;
          transpose_channel_blocks(channel_rows.data(), int(outs), int(B), int(cells), transposed);
          source.start_band(y0);
          for (Index a = a0; a < a1; ++a) {
            const float* plane = source.plane(r.offset[0] + x + a * r.d[0]);
            if (!plane) continue;  // outside the source: reads zero
            const float* band = plane + (y0 - source.first_row()) * source.row_stride();
            for (Index block = 0; block < outs / B; ++block)
              for (const GradientTile& tile : block_tiles)
                for (Index tap = 0; tap < taps; tap += tile.taps)
                  weight_gradient_tile(
                      band, offsets.data() + tap, source.row_stride(), int(y1 - y0), int(r.out[2]),
                      transposed + block * cells * B + tile.first_channel, int(B), tile.channels,
                      sums + ((a - a0) * taps + tap) * outs + block * B + tile.first_channel, outs);
          }
        }
        if (item + 1 == last || (item + 1) / bands != item / bands) {  // the plane's last band
          for (Index i = 0; i < gradient_size; ++i) totals[i] += sums[i];
          std::fill(sums, sums + gradient_size, 0.0f);
        }
      }
    });
    for (Index o = 0; o < r.out_per_group; ++o)
      for (Index j = 0; j < r.src_per_group; ++j)
        for (Index a = a0; a < a1; ++a)
          for (Index b = 0; b < ky; ++b)
            for (Index c = 0; c < kz; ++c) {
              const Index i = ((a - a0) * taps + (j * ky + b) * kz + c) * outs + o;
              double total = 0;
              for (int t = 0; t < threads; ++t) total += totals_of(t)[i];
              gw(g.weight_index(group * r.out_per_group + o, j, a, b, c)) +=
                  static_cast<float>(total);
            }
  }
}

bool conv_vector_available() {
  return vector_kernels_on();
}

Index conv_vector_gradient_x_taps(const Correlation& forward, const Correlation& data,
                                  bool band_copies, bool bf16) {
  const std::size_t correlations = std::max(vector_correlate_values(forward, band_copies, bf16),
                                            vector_correlate_values(data, band_copies, bf16));
  // Where the sums of all x taps are most of the weight gradient's need and it is the layer's
  // largest: the passes then cost a transposition of the output gradient per x tap.
  const Index kx = forward.k[0];
  const std::size_t all = vector_weight_gradient_values(forward, band_copies, bf16, kx),
                    sums = 3 * static_cast<std::size_t>(kx * padded_taps(forward) *
                                                        padded_outputs(forward) * host_threads());
  return all > correlations && 2 * sums > all ? 1 : kx;
}

std::size_t conv_vector_values(const Correlation& forward, const Correlation& data,
                               bool band_copies, bool bf16, bool winograd) {
  const Index x_taps = conv_vector_gradient_x_taps(forward, data, band_copies, bf16);
  const auto correlate_values = [&](const Correlation& r) {
    return conv_vector_winograd(r, bf16, winograd) ? conv_winograd_values(r)
                                                   : vector_correlate_values(r, band_copies, bf16);
  };
  // Either weight gradient may run (conv_vector_winograd_gradient depends on the batch).
  std::size_t gradient = vector_weight_gradient_values(forward, band_copies, bf16, x_taps);
  if (conv_vector_winograd(forward, bf16, winograd))
    gradient = std::max(gradient, conv_winograd_gradient_values(forward, x_taps));
  return std::max({correlate_values(forward), correlate_values(data), gradient});
}

}  // namespace shardtensor::kernels::host
