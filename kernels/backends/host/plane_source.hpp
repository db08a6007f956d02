#pragma once
// Where the plane path's vector kernels read a source plane (PlaneSource): the field itself, or
// a ring of zero-padded (wrapped, slab-extended, bf16-rounded or paired) copies of its planes,
// whole or one band of output rows at a time. Shared by the direct tiles (conv_vector.cpp) and
// Winograd's (conv_winograd.cpp). Private to the host backend.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/kernels/conv.hpp"
#include "vector_kernels.hpp"

namespace shardtensor::kernels::host {

/// Output rows per band: the unit that the halo-overlap filter selects, and the cells per
/// weight-gradient sweep (32 channels x 16 rows of 64 cells transposed = 128 KiB, kept in L2).
constexpr Index band_rows = 16;

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
  /// i modulo extent, in [0, extent). Padding reaches at most an extent past either end, so
  /// one addition or subtraction does: the divisions were most of a small field's ring copies.
  static Index wrapped(Index i, Index extent) {
    if (i < 0) i += extent;
    if (i >= extent) i -= extent;
    return i >= 0 && i < extent ? i : ((i % extent) + extent) % extent;
  }
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
        slabs_(slabs),
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
    const Index px = r_.wrap[0] ? wrapped(sx, r_.src[0]) : sx;  // the plane's own index
    if (!inside(0, px)) return nullptr;
    const Index c0 = group_ * r_.src_per_group;
    if constexpr (std::is_same<Value, float>::value)
      if (in_place_) return &src_(n_, c0, px, r_.offset[1], r_.offset[2]);
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
        Index sy = r_.offset[1] + first_row_ + y;
        if (r_.wrap[1]) sy = wrapped(sy, r_.src[1]);
        Value* row = copy + j * channel_stride_ + y * row_stride_;
        std::fill(row + width, row + row_stride_, Value(0));  // padding past the read extent
        if (!inside(1, sy) || (z0 == z1 && !r_.wrap[2])) {
          std::fill(row, row + width, Value(0));
          continue;
        }
        if constexpr (bf16_values) {
          const float* source_row = source(c0 + j, px, sy);
          copy_row(
              row, width, z0, z1, extent, [&](Index sz) { return bfloat16_bits(source_row[sz]); },
              [&](Index sz, Index count, Value* to) {
                bf16_pack(source_row + sz, to, std::size_t(count));
              });
        } else if constexpr (cell_pairs) {
          // The row as floats (with its zeros or wrapped cells), then as pairs of cells.
          const float* source_row = source(c0 + j, px, sy);
          float* floats = row_floats_.data();
          copy_row(
              floats, width, z0, z1, extent, [&](Index sz) { return source_row[sz]; },
              [&](Index sz, Index count, float* to) {
                std::copy(source_row + sz, source_row + sz + count, to);
              });
          bf16_pairs(floats, floats + 1, row, std::size_t(width - 1));
          row[width - 1] = upper_bf16(floats[width - 1]);
        } else if constexpr (pairs) {
          const float* upper = source(c0 + 2 * j, px, sy);
          const float* lower =
              2 * j + 1 < r_.src_per_group ? source(c0 + 2 * j + 1, px, sy) : nullptr;
          const auto cell = [&](Index sz) {
            return lower ? bf16_pair(upper[sz], lower[sz]) : upper_bf16(upper[sz]);
          };
          copy_row(row, width, z0, z1, extent, cell, [&](Index sz, Index count, Value* to) {
            bf16_pairs(upper + sz, lower ? lower + sz : nullptr, to, std::size_t(count));
          });
        } else if (round_bf16_) {
          const float* source_row = source(c0 + j, px, sy);
          copy_row(
              row, width, z0, z1, extent,
              [&](Index sz) { return round_to_bfloat16(source_row[sz]); },
              [&](Index sz, Index count, Value* to) {
                bf16_round(source_row + sz, to, std::size_t(count));
              });
        } else {
          const float* source_row = source(c0 + j, px, sy);
          copy_row(
              row, width, z0, z1, extent, [&](Index sz) { return source_row[sz]; },
              [&](Index sz, Index count, Value* to) {
                std::copy(source_row + sz, source_row + sz + count, to);
              });
        }
      }
    slot_plane_[slot] = sx;
    return copy;
  }

 private:
  /// Whether index i along axis a (0 or 1) has cells: the source's, or a slab's past its ends.
  bool inside(int a, Index i) const {
    if (i >= 0 && i < r_.src[a]) return true;
    if (a != r_.slab_axis) return false;
    return i < 0 ? -i <= Index(slabs_.lower.extent(2 + a))
                 : i - r_.src[a] < Index(slabs_.upper.extent(2 + a));
  }
  /// Row (px, sy) of channel c: the source's, or a slab's (inside(0, px), inside(1, sy)).
  const float* source(Index c, Index px, Index sy) const {
    Index i[2] = {px, sy};
    const int a = r_.slab_axis;
    if (a < 0 || (i[a] >= 0 && i[a] < r_.src[a])) return &src_(n_, c, px, sy, 0);
    const bool below = i[a] < 0;
    const FieldView<float>& slab = below ? slabs_.lower : slabs_.upper;
    i[a] = below ? i[a] + Index(slab.extent(2 + a)) : i[a] - r_.src[a];
    return &slab(n_, c, i[0], i[1], 0);
  }

  /// row[z] = cell(offset + z) for z in [z0, z1) (cells(sz, count, to): the cells from sz,
  /// contiguous); around it zeros, or (wrap) the cells an extent away.
  template <class Out, class Cell, class Cells>
  void copy_row(Out* row, Index width, Index z0, Index z1, Index extent, const Cell& cell,
                const Cells& cells) const {
    const Index offset = r_.offset[2];
    if (r_.wrap[2]) {
      for (Index z = 0; z < z0; ++z) row[z] = cell(wrapped(offset + z, extent));
      for (Index z = z1; z < width; ++z) row[z] = cell(wrapped(offset + z, extent));
    } else {
      std::fill(row, row + z0, Out(0));
      std::fill(row + z1, row + width, Out(0));
    }
    cells(offset + z0, z1 - z0, row + z0);
  }

  const Correlation& r_;
  FieldView<float> src_;
  SourceSlabs<float> slabs_;
  Value* ring_;
  bool in_place_;
  bool round_bf16_;  // float copies round to bf16
  Index rows_;       // rows per copy
  std::ptrdiff_t channel_stride_, row_stride_;
  std::vector<Index> slot_plane_;  // source plane in each ring slot
  std::vector<float> row_floats_;  // cell pairs: a row before it is paired
  Index n_ = 0, group_ = 0, first_row_ = 0;
};

}  // namespace shardtensor::kernels::host
