#include "conv_winograd.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "host_threads.hpp"
#include "vector_kernels.hpp"

// Per band of output rows (a pair of rows per tile), for each sample in turn:
//   1. each source plane's band is transformed once into a ring slot, V[slot][j][xi][tile],
//      read from the field itself: zeros outside it, or the cells an extent away where it
//      wraps around, or its slabs' cells past its ends along the slab axis;
//   2. per output plane x and position xi (of 16), the products M[o][xi][tile]: the sum over
//      x taps a and source channels j of U[xi][a][j][o] V[x + a][j][xi][tile], on the direct
//      path's correlate tile (its taps are the source channels, its x taps the ring's planes);
//   3. the outputs from the products, plus the bias, written into the field.
// A band holds about 1 MiB of transformed planes and products per thread: each position's
// products read their operands from L1 and L2.

namespace shardtensor::kernels::host {

namespace {

constexpr Index positions = 16;  // of a tile's 4 x 4 transform

/// A correlation's bands: output rows per band (pairs; at most 16, the direct tiles' band, the
/// halo overlap's unit), tiles along a row, and the values a transformed channel (or a
/// product row) takes: the band's tiles and 16 more (the transforms write whole vectors past
/// the last tile).
struct WinogradBands {
  Index rows, columns, stride;
};
WinogradBands winograd_bands(const Correlation& r) {
  const Index columns = (r.out[2] + 1) / 2;
  const Index per_tile = positions * (r.slots() * r.src_per_group + r.out_per_group);
  const Index target = std::max<Index>(1, (Index(1) << 18) / per_tile);
  const Index tile_rows = std::clamp<Index>(target / columns, 1, 8);
  const Index tiles = tile_rows * columns;
  return {2 * tile_rows, columns, (tiles + 16 + 15) / 16 * 16};
}

/// Values of one thread: the transformed ring and the products.
std::size_t thread_values(const Correlation& r) {
  const WinogradBands bands = winograd_bands(r);
  return static_cast<std::size_t>(positions * bands.stride *
                                  (r.slots() * r.src_per_group + r.out_per_group));
}

/// i modulo extent, in [0, extent). Windows reach at most an extent past either end: one
/// addition or subtraction does (divisions were a tenth of a small field's transforms).
inline Index wrapped(Index i, Index extent) {
  if (i < 0) i += extent;
  if (i >= extent) i -= extent;
  return i >= 0 && i < extent ? i : ((i % extent) + extent) % extent;
}

/// to[k] = row[shift + k] for k < width; zeros outside [0, row_cells), or (wrap) the cells
/// row_cells away.
void pad_row(const float* row, Index shift, Index row_cells, bool wrap, Index width, float* to) {
  const Index lo = std::clamp<Index>(-shift, 0, width),
              hi = std::clamp<Index>(row_cells - shift, lo, width);
  std::copy(row + shift + lo, row + shift + hi, to + lo);
  for (Index k = 0; k < lo; ++k) to[k] = wrap ? row[wrapped(shift + k, row_cells)] : 0.0f;
  for (Index k = hi; k < width; ++k) to[k] = wrap ? row[wrapped(shift + k, row_cells)] : 0.0f;
}

/// Where a correlation's source rows are: the field's, wrapped around along a `wrap` axis, or
/// past its ends along the slab axis its slabs' (SourceSlabs); null where none (zeros).
class SourceRows {
 public:
  SourceRows(const Correlation& r, const FieldView<float>& src, const SourceSlabs<float>& slabs)
      : r_(r), src_(src), slabs_(slabs) {}
  /// Whether source plane sx has cells.
  bool plane(Index sx) const { return inside(0, sx) != outside; }
  /// Row (sx, sy) of channel c of sample n, null where it has no cells.
  const float* row(Index n, Index c, Index sx, Index sy) const {
    Index i[2] = {sx, sy};
    int field = 0;  // 0: src, -1: the lower slab, 1: the upper
    for (int a = 0; a < 2; ++a) {
      const int where = inside(a, i[a]);
      if (where == outside) return nullptr;
      if (where == inside_field) {
        if (r_.wrap[a]) i[a] = wrapped(i[a], r_.src[a]);
      } else {
        field = where;
        i[a] = where < 0 ? i[a] + Index(slabs_.lower.extent(2 + a)) : i[a] - r_.src[a];
      }
    }
    if (field == 0) return &src_(n, c, i[0], i[1], 0);
    return field < 0 ? &slabs_.lower(n, c, i[0], i[1], 0) : &slabs_.upper(n, c, i[0], i[1], 0);
  }

 private:
  static constexpr int outside = 2, inside_field = 0;
  /// Where index i along axis a (0 or 1) lies: the field (or wrapped into it), a slab (-1
  /// lower, 1 upper), or outside.
  int inside(int a, Index i) const {
    if (r_.wrap[a] || (i >= 0 && i < r_.src[a])) return inside_field;
    if (a != r_.slab_axis) return outside;
    if (i < 0) return -i <= Index(slabs_.lower.extent(2 + a)) ? -1 : outside;
    return i - r_.src[a] < Index(slabs_.upper.extent(2 + a)) ? 1 : outside;
  }
  const Correlation& r_;
  const FieldView<float>& src_;
  const SourceSlabs<float>& slabs_;
};

}  // namespace

bool conv_winograd_applies(const Correlation& r) {
  return r.k[1] == 3 && r.k[2] == 3 && r.d[1] == 1 && r.d[2] == 1 && r.out[1] >= 2 &&
         r.out[2] >= 2 && r.src_per_group >= 8 && r.out_per_group >= 8;
}

std::size_t conv_winograd_packed_values(const Correlation& r) {
  const Index outs = (r.out_per_group + max_tile_rows - 1) / max_tile_rows * max_tile_rows;
  return static_cast<std::size_t>(positions * outs * r.k[0] * r.src_per_group);
}

std::size_t conv_winograd_values(const Correlation& r) {
  return conv_winograd_packed_values(r) + thread_values(r) * host_threads();
}

void conv_winograd_pack_weights(const Correlation& r, const ConvShape& g,
                                const ReplicatedView<float>& w, bool transposed, Index group,
                                float* packed) {
  const Index R = conv_tile_shape().tile_rows, kx = r.k[0], srcs = r.src_per_group;
  const Index blocks = (r.out_per_group + R - 1) / R;
  // The weight index is linear in (o, b, c): walked by strides, as the direct tiles' packing.
  const auto weight_at = [&](Index o, Index j, Index a, Index b, Index c) {
    return correlation_weight_index(g, group, transposed, o, j, a, b, c);
  };
  const std::ptrdiff_t o_step = weight_at(1, 0, 0, 0, 0) - weight_at(0, 0, 0, 0, 0),
                       b_step = weight_at(0, 0, 0, 1, 0) - weight_at(0, 0, 0, 0, 0),
                       c_step = weight_at(0, 0, 0, 0, 1) - weight_at(0, 0, 0, 0, 0);
  float u[positions][max_tile_rows];  // a block's transformed windows, G g G^T
  for (Index block = 0; block < blocks; ++block)
    for (Index a = 0; a < kx; ++a)
      for (Index j = 0; j < srcs; ++j) {
        for (Index i = 0; i < R; ++i) {
          const Index o = block * R + i;
          if (o >= r.out_per_group) {  // past the outputs: zeros
            for (Index xi = 0; xi < positions; ++xi) u[xi][i] = 0.0f;
            continue;
          }
          const float* window = w.data() + weight_at(0, j, a, 0, 0) + o * o_step;
          double h[4][3];  // G g, in double: each transformed weight rounded once
          for (Index c = 0; c < 3; ++c) {
            const double g0 = window[c * c_step], g1 = window[b_step + c * c_step],
                         g2 = window[2 * b_step + c * c_step];
            h[0][c] = g0, h[1][c] = (g0 + g1 + g2) / 2, h[2][c] = (g0 - g1 + g2) / 2, h[3][c] = g2;
          }
          for (Index k = 0; k < 4; ++k) {
            u[4 * k][i] = float(h[k][0]);
            u[4 * k + 1][i] = float((h[k][0] + h[k][1] + h[k][2]) / 2);
            u[4 * k + 2][i] = float((h[k][0] - h[k][1] + h[k][2]) / 2);
            u[4 * k + 3][i] = float(h[k][2]);
          }
        }
        for (Index xi = 0; xi < positions; ++xi)
          std::copy(u[xi], u[xi] + R, packed + (((xi * blocks + block) * kx + a) * srcs + j) * R);
      }
}

void conv_winograd_correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                             const SourceSlabs<float>& slabs, const ReplicatedView<float>& w,
                             bool transposed, const ReplicatedView<float>& bias,
                             const FieldView<float>& out, float* workspace, const PlaneFilter& keep,
                             const float* packed_weights) {
  const ConvTileShape shape = conv_tile_shape();
  const Index R = shape.tile_rows, kx = r.k[0], slots = r.slots();
  const Index srcs = r.src_per_group, outs = r.out_per_group, blocks = (outs + R - 1) / R;
  const WinogradBands bands = winograd_bands(r);
  const Index stride = bands.stride, columns = bands.columns;
  const Index band_count = (r.out[1] + bands.rows - 1) / bands.rows;
  const int threads = host_threads();
  float* const packed = workspace;
  float* const thread_start = workspace + conv_winograd_packed_values(r);
  const std::size_t per_thread = thread_values(r);
  const Index transformed_plane = positions * srcs * stride;  // one ring slot
  const SourceRows source(r, src, slabs);
  std::vector<std::ptrdiff_t> channel_offsets(srcs);
  for (Index j = 0; j < srcs; ++j) channel_offsets[j] = j * positions * stride;
  const std::ptrdiff_t out_row_stride = out.stride(3);
  const bool has_bias = bias.extent(0) > 0;
  // Rows of at most 64 tiles that reach past the source are copied padded (a band's rows once).
  const Index padded_width = 2 * columns + 2;
  const bool copy_rows =
      columns <= 64 && (r.offset[2] < 0 || r.offset[2] + padded_width > r.src[2]);
  for (Index group = 0; group < r.groups; ++group) {
    const float* const weights = packed_weights ? packed_weights : packed;
    if (!packed_weights) conv_winograd_pack_weights(r, g, w, transposed, group, packed);
    split_over_threads(threads, g.batch * band_count, [&](int t, Index first, Index last) {
      float* const ring = thread_start + t * per_thread;         // [slot][j][xi][tile]
      float* const products = ring + slots * transformed_plane;  // [o][xi][tile]
      std::vector<Index> slot_plane(slots);
      std::vector<bool> slot_has_plane(slots);
      std::vector<const float*> planes(kx), position_planes(kx);
      std::vector<OutputVector> vectors;
      std::vector<float> padded(copy_rows ? (bands.rows + 2) * padded_width : 0);
      std::vector<const float*> padded_rows(bands.rows + 2);
      for (Index item = first; item < last; ++item) {
        const Index n = item / band_count, y0 = item % band_count * bands.rows,
                    y1 = std::min(y0 + bands.rows, r.out[1]);
        std::fill(slot_plane.begin(), slot_plane.end(), std::numeric_limits<Index>::min());
        const Index tile_rows = (y1 - y0 + 1) / 2, tiles = tile_rows * columns;
        vectors.clear();
        for (Index q = 0; q < tiles; q += shape.lanes) {
          const Index lanes = std::min<Index>(shape.lanes, tiles - q);
          vectors.push_back({q, q, 0, unsigned((uint64_t(1) << lanes) - 1), 0});
        }
        while (vectors.size() % shape.tile_vectors != 0) vectors.push_back({0, 0, 0, 0, 0});
        // Source plane sx's band transformed into its ring slot; false without cells. Short
        // rows that reach past the source are copied first, padded (zeros or wrapped cells):
        // the transforms take a row's ends cell by cell, and on such rows that is every tile.
        const auto transform = [&](Index sx, float* v) {
          if (!source.plane(sx)) return false;
          const float* rows[4];
          for (Index j = 0; j < srcs; ++j) {
            const Index c = group * srcs + j, sy0 = r.offset[1] + y0;
            if (copy_rows)
              for (Index k = 0; k < 2 * tile_rows + 2; ++k) {
                const float* row = source.row(n, c, sx, sy0 + k);
                padded_rows[k] = row ? padded.data() + k * padded_width : nullptr;
                if (row)
                  pad_row(row, r.offset[2], r.src[2], r.wrap[2], padded_width,
                          padded.data() + k * padded_width);
              }
            for (Index tr = 0; tr < tile_rows; ++tr) {
              for (Index i = 0; i < 4; ++i)
                rows[i] =
                    copy_rows ? padded_rows[2 * tr + i] : source.row(n, c, sx, sy0 + 2 * tr + i);
              if (copy_rows)
                winograd_input_tiles(rows, 0, padded_width, false, int(columns),
                                     v + j * positions * stride + tr * columns, stride);
              else
                winograd_input_tiles(rows, r.offset[2], r.src[2], r.wrap[2], int(columns),
                                     v + j * positions * stride + tr * columns, stride);
            }
          }
          return true;
        };
        for (Index x = 0; x < r.out[0]; ++x) {
          if (!keep(x, y0, y1)) continue;
          for (Index a = 0; a < kx; ++a) {
            const Index sx = r.offset[0] + x + a * r.d[0], slot = slot_of(sx, slots);
            float* const v = ring + slot * transformed_plane;
            if (slot_plane[slot] != sx) slot_has_plane[slot] = transform(sx, v);
            slot_plane[slot] = sx;
            planes[a] = slot_has_plane[slot] ? v : nullptr;
          }
          for (Index xi = 0; xi < positions; ++xi) {
            for (Index a = 0; a < kx; ++a)
              position_planes[a] = planes[a] ? planes[a] + xi * stride : nullptr;
            for (Index block = 0; block < blocks; ++block) {
              const float* block_weights = weights + (xi * blocks + block) * kx * srcs * R;
              float* const block_products = products + (block * R * positions + xi) * stride;
              const int rows = int(std::min(R, outs - block * R));
              for (std::size_t v = 0; v < vectors.size(); v += shape.tile_vectors)
                correlate_tile(position_planes.data(), int(kx), channel_offsets.data(), int(srcs),
                               block_weights, &vectors[v], block_products, positions * stride, rows,
                               /*bias=*/nullptr, /*accumulate=*/false);
            }
          }
          for (Index o = 0; o < outs; ++o) {
            const Index channel = group * outs + o;
            const float b = has_bias ? bias(channel) : 0.0f;
            for (Index tr = 0; tr < tile_rows; ++tr) {
              float* const row0 = &out(n, channel, x, y0 + 2 * tr, 0);
              float* const row1 = y0 + 2 * tr + 1 < y1 ? row0 + out_row_stride : nullptr;
              winograd_output_tiles(products + o * positions * stride + tr * columns, stride,
                                    int(columns), b, row0, row1, int(r.out[2]));
            }
          }
        }
      }
    });
  }
}

}  // namespace shardtensor::kernels::host
