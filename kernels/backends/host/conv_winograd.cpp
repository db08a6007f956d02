#include "conv_winograd.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "host_threads.hpp"
#include "row_padding.hpp"
#include "source_rows.hpp"
#include "vector_kernels.hpp"

// Per band of output rows (a pair of rows per tile), for each sample in turn:
//   1. each source plane's band is transformed once into a ring slot, V[slot][j][xi][tile],
//      read from the field itself: zeros outside it, or the cells an extent away where it
//      wraps around, or its slabs' cells past its ends along the slab axis;
//   2. per output plane x and position xi (of 24), the products M[o][xi][tile]: the sum over
//      x taps a and source channels j of U[xi][a][j][o] V[x + a][j][xi][tile], on the direct
//      path's correlate tile (its taps are the source channels, its x taps the ring's planes);
//   3. the outputs from the products, plus the bias, written into the field.
// A band holds about 1 MiB of transformed planes and products per thread: each position's
// products read their operands from L1 and L2.

namespace shardtensor::kernels::host {

namespace {

/// A tile's shape: 2 output rows by `columns` output columns, from 4 x (columns + 2) source
/// cells, `positions` transformed values.
struct WinogradTile {
  Index columns, positions;
};
/// F(2x4, 3x3): wide planes' forward and input gradient (3 multiplications per output).
constexpr WinogradTile wide_tile{4, 24};
/// F(2x2, 3x3): narrow planes' forward and input gradient, and the weight gradient's (4
/// multiplications per output; its sums over a band's tiles round less on the smaller
/// transforms).
constexpr WinogradTile narrow_tile{2, 16};

/// The forward's or input gradient's tile: F(2x4) from 64 output columns on. Narrower planes
/// keep F(2x2): their transforms run a vector per pair of tile rows, mostly lanes past the
/// row's tiles, and on F(2x4)'s they cost more than the products save (a U-Net at 32², the main
/// job's: level held to AVX2, its steps 10-15 % slower with AVX-512 on F(2x4) from 32 columns,
/// 5-25 % from 16; measured).
constexpr Index wide_tile_from = 64;
WinogradTile correlation_tile(const Correlation& r) {
  return r.out[2] >= wide_tile_from ? wide_tile : narrow_tile;
}

/// A correlation's bands: output rows per band (pairs; at most 16, the direct tiles' band, the
/// halo overlap's unit), tiles along a pair of rows, and the values a transformed position of
/// a channel (or of an output channel's products) takes: the band's tiles and 16 more (the
/// transforms write whole vectors past the last tile).
struct WinogradBands {
  Index rows, columns, stride;
};
WinogradBands winograd_bands(const Correlation& r, WinogradTile tile) {
  const Index columns = (r.out[2] + tile.columns - 1) / tile.columns;
  const Index per_tile = tile.positions * (r.slots() * r.src_per_group + r.out_per_group);
  const Index target = std::max<Index>(1, (Index(1) << 18) / per_tile);
  const Index tile_rows = std::clamp<Index>(target / columns, 1, 8);
  const Index tiles = tile_rows * columns;
  return {2 * tile_rows, columns, (tiles + 16 + 15) / 16 * 16};
}

/// Values of one thread of the correlation: the transformed ring and the products.
std::size_t thread_values(const Correlation& r) {
  const WinogradTile tile = correlation_tile(r);
  const WinogradBands bands = winograd_bands(r, tile);
  return static_cast<std::size_t>(tile.positions * bands.stride *
                                  (r.slots() * r.src_per_group + r.out_per_group));
}

/// The transformed source planes of a band (B^T d B per tile, V[j][xi][tile]) in a ring of
/// r.slots() slots: each source plane transformed once per band for the x taps that read it.
/// One per host thread, over its share of the workspace.
class TransformedRing {
 public:
  TransformedRing(const Correlation& r, WinogradTile tile, const FieldView<float>& src,
                  const SourceSlabs<float>& slabs, float* ring)
      : r_(r),
        tile_(tile),
        source_(r, src, slabs),
        bands_(winograd_bands(r, tile)),
        ring_(ring),
        slot_plane_(r.slots()),
        slot_has_plane_(r.slots()),
        padded_width_(tile.columns * bands_.columns + 2),
        // Rows of at most 64 tiles that reach past the source are copied padded (a band's
        // rows once): the transforms take a row's ends cell by cell, and on such rows that is
        // every tile.
        copy_rows_(bands_.columns <= 64 &&
                   (r.offset[2] < 0 || r.offset[2] + padded_width_ > r.src[2])),
        padded_(copy_rows_ ? (bands_.rows + 2) * padded_width_ : 0),
        rows_(bands_.rows + 2) {}
  /// Values of a slot: a source plane's band, transformed.
  static Index slot_values(const Correlation& r, WinogradTile tile) {
    return tile.positions * r.src_per_group * winograd_bands(r, tile).stride;
  }
  /// Starts group `group`'s band of `tile_rows` pairs of output rows from y0 of sample n.
  void start_band(Index n, Index group, Index y0, Index tile_rows) {
    n_ = n, group_ = group, y0_ = y0, tile_rows_ = tile_rows;
    std::fill(slot_plane_.begin(), slot_plane_.end(), std::numeric_limits<Index>::min());
  }
  /// Source plane sx's band transformed: V[j][xi][tile], a tile row's `columns` tiles after
  /// another, positions `stride` apart; null where the plane has no cells (zeros).
  const float* plane(Index sx) {
    const Index slot = slot_of(sx, Index(slot_plane_.size()));
    float* const v = ring_ + slot * slot_values(r_, tile_);
    if (slot_plane_[slot] != sx) slot_has_plane_[slot] = transform(sx, v);
    slot_plane_[slot] = sx;
    return slot_has_plane_[slot] ? v : nullptr;
  }

 private:
  bool transform(Index sx, float* v) {
    if (!source_.plane(sx)) return false;
    const Index sy0 = r_.offset[1] + y0_, band_rows = 2 * tile_rows_ + 2;
    for (Index j = 0; j < r_.src_per_group; ++j) {
      const Index c = group_ * r_.src_per_group + j;
      for (Index k = 0; k < band_rows; ++k) {
        const float* row = source_.row(n_, c, sx, sy0 + k);
        rows_[k] = row;
        if (row && copy_rows_) {
          float* const copy = padded_.data() + k * padded_width_;
          copy_padded_row(
              copy, padded_width_, r_.offset[2], r_.src[2], r_.wrap[2],
              [row](Index sz) { return row[sz]; },
              [row](Index sz, Index count, float* to) {
                std::copy(row + sz, row + sz + count, to);
              });
          rows_[k] = copy;
        }
      }
      const Index columns = bands_.columns, stride = bands_.stride;
      const auto input_tiles =
          tile_.columns == wide_tile.columns ? winograd_wide_input_tiles : winograd_input_tiles;
      for (Index tr = 0; tr < tile_rows_; ++tr) {
        float* const to = v + j * tile_.positions * stride + tr * columns;
        const float* const* rows = rows_.data() + 2 * tr;
        if (copy_rows_)
          input_tiles(rows, 0, padded_width_, false, int(columns), to, stride);
        else
          input_tiles(rows, r_.offset[2], r_.src[2], r_.wrap[2], int(columns), to, stride);
      }
    }
    return true;
  }
  const Correlation& r_;
  const WinogradTile tile_;
  const SourceRows source_;
  const WinogradBands bands_;
  float* const ring_;
  std::vector<Index> slot_plane_;
  std::vector<bool> slot_has_plane_;
  const Index padded_width_;
  const bool copy_rows_;
  std::vector<float> padded_;
  std::vector<const float*> rows_;  // a channel's band of source rows (or their padded copies)
  Index n_ = 0, group_ = 0, y0_ = 0, tile_rows_ = 0;
};

}  // namespace

bool conv_winograd_applies(const Correlation& r) {
  return r.k[1] == 3 && r.k[2] == 3 && r.d[1] == 1 && r.d[2] == 1 && r.out[1] >= 2 &&
         r.out[2] >= 2 && r.src_per_group >= 8 && r.out_per_group >= 8;
}

Index conv_winograd_positions(const Correlation& r) {
  return correlation_tile(r).positions;
}

std::size_t conv_winograd_packed_values(const Correlation& r) {
  const Index outs = (r.out_per_group + max_tile_rows - 1) / max_tile_rows * max_tile_rows;
  return static_cast<std::size_t>(correlation_tile(r).positions * outs * r.k[0] * r.src_per_group);
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
  const WinogradTile tile = correlation_tile(r);
  const Index positions = tile.positions;
  float u[wide_tile.positions][max_tile_rows];  // a block's transformed windows, G g G^T
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
          double h[4][3];  // G g along the rows (F(2, 3)), in double: rounded once, at the end
          for (Index c = 0; c < 3; ++c) {
            const double g0 = window[c * c_step], g1 = window[b_step + c * c_step],
                         g2 = window[2 * b_step + c * c_step];
            h[0][c] = g0, h[1][c] = (g0 + g1 + g2) / 2, h[2][c] = (g0 - g1 + g2) / 2, h[3][c] = g2;
          }
          for (Index k = 0; k < 4; ++k) {  // (G g) G^T along the columns: F(2, 3) or F(4, 3)
            const double* const e = h[k];
            if (tile.columns == narrow_tile.columns) {
              u[4 * k][i] = float(e[0]);
              u[4 * k + 1][i] = float((e[0] + e[1] + e[2]) / 2);
              u[4 * k + 2][i] = float((e[0] - e[1] + e[2]) / 2);
              u[4 * k + 3][i] = float(e[2]);
              continue;
            }
            u[6 * k][i] = float(e[0]);
            u[6 * k + 1][i] = float((e[0] + e[1] + e[2]) / 3);
            u[6 * k + 2][i] = float((-e[0] + e[1] - e[2]) / 3);
            u[6 * k + 3][i] = float((-16 * e[0] - 8 * e[1] - 4 * e[2]) / 15);
            u[6 * k + 4][i] = float((e[0] - 2 * e[1] + 4 * e[2]) / 15);
            u[6 * k + 5][i] = float(e[2]);
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
  const WinogradTile tile = correlation_tile(r);
  const Index positions = tile.positions;
  const WinogradBands bands = winograd_bands(r, tile);
  const Index stride = bands.stride, columns = bands.columns;
  const Index band_count = (r.out[1] + bands.rows - 1) / bands.rows;
  const int threads = host_threads();
  float* const packed = workspace;
  float* const thread_start = workspace + conv_winograd_packed_values(r);
  const std::size_t per_thread = thread_values(r);
  std::vector<std::ptrdiff_t> channel_offsets(srcs);
  for (Index j = 0; j < srcs; ++j) channel_offsets[j] = j * positions * stride;
  const std::ptrdiff_t out_row_stride = out.stride(3);
  const bool has_bias = bias.extent(0) > 0;
  for (Index group = 0; group < r.groups; ++group) {
    const float* const weights = packed_weights ? packed_weights : packed;
    if (!packed_weights) conv_winograd_pack_weights(r, g, w, transposed, group, packed);
    split_over_threads(threads, g.batch * band_count, [&](int t, Index first, Index last) {
      float* const thread_ring = thread_start + t * per_thread;
      TransformedRing ring(r, tile, src, slabs, thread_ring);
      float* const products =
          thread_ring + slots * TransformedRing::slot_values(r, tile);  // [o][xi][tile]
      std::vector<const float*> planes(kx), position_planes(kx);
      std::vector<OutputVector> vectors;
      const auto output_tiles =
          tile.columns == wide_tile.columns ? winograd_wide_output_tiles : winograd_output_tiles;
      for (Index item = first; item < last; ++item) {
        const Index n = item / band_count, y0 = item % band_count * bands.rows,
                    y1 = std::min(y0 + bands.rows, r.out[1]);
        const Index tile_rows = (y1 - y0 + 1) / 2, tiles = tile_rows * columns;
        ring.start_band(n, group, y0, tile_rows);
        vectors.clear();
        for (Index q = 0; q < tiles; q += shape.lanes) {
          const Index lanes = std::min<Index>(shape.lanes, tiles - q);
          vectors.push_back({q, q, 0, unsigned((uint64_t(1) << lanes) - 1), 0});
        }
        while (vectors.size() % shape.tile_vectors != 0) vectors.push_back({0, 0, 0, 0, 0});
        for (Index x = 0; x < r.out[0]; ++x) {
          if (!keep(x, y0, y1)) continue;
          for (Index a = 0; a < kx; ++a) planes[a] = ring.plane(r.offset[0] + x + a * r.d[0]);
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
              output_tiles(products + o * positions * stride + tr * columns, stride, int(columns),
                           b, row0, row1, int(r.out[2]));
            }
          }
        }
      }
    });
  }
}

namespace {

/// Tiles a thread's float sums of the weight gradient take before they are added into its
/// double totals (at the end of the band that reaches it): a 256 x 256 plane's.
constexpr Index tiles_per_flush = 16384;

/// The weight gradient's sums per thread, of `x_taps` x taps: [position][x tap][source channel,
/// padded to whole tiles][output channel, padded to whole blocks].
std::size_t gradient_sums(const Correlation& r, Index x_taps) {
  return static_cast<std::size_t>(narrow_tile.positions * x_taps *
                                  gradient_padded_taps(int(r.src_per_group)) *
                                  gradient_padded_outputs(int(r.out_per_group)));
}

/// Values of one thread of the weight gradient: the double totals and float sums, the ring of
/// transformed source planes, the transformed output gradient of a band [o][xi][tile] and one
/// position's of it transposed [block][tile][channel]. An even count: doubles stay aligned.
std::size_t gradient_thread_values(const Correlation& r, Index x_taps) {
  const WinogradBands bands = winograd_bands(r, narrow_tile);
  const std::size_t values =
      3 * gradient_sums(r, x_taps) +
      static_cast<std::size_t>(r.slots() * TransformedRing::slot_values(r, narrow_tile) +
                               (narrow_tile.positions * r.out_per_group +
                                gradient_padded_outputs(int(r.out_per_group))) *
                                   bands.stride);
  return values + values % 2;
}

}  // namespace

bool conv_winograd_gradient_pays(const Correlation& r, Index batch) {
  const Index tiles = batch * r.out[0] * ((r.out[1] + 1) / 2) * ((r.out[2] + 1) / 2);
  return r.src_per_group >= 16 && r.out_per_group >= 16 && tiles * r.k[0] >= 2048;
}

std::size_t conv_winograd_gradient_values(const Correlation& r, Index x_taps_per_pass) {
  return gradient_thread_values(r, std::clamp<Index>(x_taps_per_pass, 1, r.k[0])) * host_threads();
}

void conv_winograd_weight_gradient(const Correlation& r, const ConvShape& g,
                                   const FieldView<float>& xp, const SourceSlabs<float>& slabs,
                                   const FieldView<float>& gy, const ReplicatedView<float>& gw,
                                   float* workspace, Index x_taps_per_pass) {
  const ConvTileShape shape = conv_tile_shape();
  const Index kx = r.k[0], slots = r.slots(), srcs = r.src_per_group, outs = r.out_per_group;
  constexpr Index positions = narrow_tile.positions;
  const WinogradBands bands = winograd_bands(r, narrow_tile);
  const Index stride = bands.stride, columns = bands.columns;
  const Index band_count = (r.out[1] + bands.rows - 1) / bands.rows;
  // Blocks of B output channels, each summed by the path's gradient tiles; taps are the source
  // channels (padding taps read channel 0; their sums are not used).
  const Index B = gradient_block_channels(int(outs), shape);
  const Index taps = gradient_padded_taps(int(srcs)), outs_padded = (outs + B - 1) / B * B;
  const std::vector<GradientTile> block_tiles = gradient_block_tiles(int(B), shape);
  std::vector<std::ptrdiff_t> channel_offsets(taps, 0);
  for (Index j = 0; j < srcs; ++j) channel_offsets[j] = j * positions * stride;
  const Index pass_taps = std::clamp<Index>(x_taps_per_pass, 1, kx);
  const std::size_t sums_size = gradient_sums(r, pass_taps);
  // Sums of position xi, x tap a (of the pass), tap (source channel) j and output o.
  const auto sum_index = [&](Index xi, Index a, Index j, Index o) {
    return ((xi * pass_taps + a) * taps + j) * outs_padded + o;
  };
  const int threads = host_threads();
  const std::size_t per_thread = gradient_thread_values(r, pass_taps);
  const auto totals_of = [&](int t) {
    return reinterpret_cast<double*>(workspace + t * per_thread);
  };
  const Index passes_per_group = (kx + pass_taps - 1) / pass_taps;
  for (Index pass = 0; pass < r.groups * passes_per_group; ++pass) {
    const Index group = pass / passes_per_group, a0 = pass % passes_per_group * pass_taps,
                a1 = std::min(a0 + pass_taps, kx);
    // Each thread sums over its own bands of every sample (in order): float sums, added into
    // its double totals every tiles_per_flush tiles; the totals add up in thread order.
    split_over_threads(threads, g.batch * band_count, [&](int t, Index first, Index last) {
      double* const totals = totals_of(t);
      float* const sums = workspace + t * per_thread + 2 * sums_size;
      float* const thread_ring = sums + sums_size;
      TransformedRing ring(r, narrow_tile, xp, slabs, thread_ring);
      float* const dm =
          thread_ring + slots * TransformedRing::slot_values(r, narrow_tile);   // [o][xi][tile]
      float* const dm_t = dm + positions * outs * stride;                       // [block][tile][B]
      std::fill(totals, totals + sums_size, 0.0);
      std::fill(sums, sums + sums_size, 0.0f);
      std::vector<const float*> planes(kx), position_rows(outs_padded);
      Index unflushed = 0;  // tiles summed since the last flush
      for (Index item = first; item < last; ++item) {
        const Index n = item / band_count, y0 = item % band_count * bands.rows,
                    y1 = std::min(y0 + bands.rows, r.out[1]);
        const Index tile_rows = (y1 - y0 + 1) / 2, tiles = tile_rows * columns;
        ring.start_band(n, group, y0, tile_rows);
        for (Index x = 0; x < r.out[0]; ++x) {
          bool any = false;
          for (Index a = a0; a < a1; ++a) {
            planes[a] = ring.plane(r.offset[0] + x + a * r.d[0]);
            any = any || planes[a];
          }
          if (!any) continue;  // every source plane outside: their products are zeros
          for (Index o = 0; o < outs; ++o)
            for (Index tr = 0; tr < tile_rows; ++tr) {
              const float* const row0 = &gy(n, group * outs + o, x, y0 + 2 * tr, 0);
              const float* const row1 = y0 + 2 * tr + 1 < y1 ? row0 + gy.stride(3) : nullptr;
              winograd_gradient_tiles(row0, row1, int(r.out[2]), int(columns),
                                      dm + o * positions * stride + tr * columns, stride);
            }
          for (Index xi = 0; xi < positions; ++xi) {
            // This position's transformed output gradient transposed; padding channels read
            // zeros.
            for (Index o = 0; o < outs_padded; ++o)
              position_rows[o] = o < outs ? dm + (o * positions + xi) * stride : nullptr;
            transpose_channel_blocks(position_rows.data(), int(outs_padded), int(B), int(tiles),
                                     dm_t);
            for (Index a = a0; a < a1; ++a) {
              if (!planes[a]) continue;
              for (Index block = 0; block < outs_padded / B; ++block)
                for (const GradientTile& tile : block_tiles)
                  for (Index tap = 0; tap < taps; tap += tile.taps)
                    weight_gradient_tile(
                        planes[a] + xi * stride, channel_offsets.data() + tap, 0, 1, int(tiles),
                        dm_t + block * tiles * B + tile.first_channel, int(B), tile.channels,
                        sums + sum_index(xi, a - a0, tap, block * B + tile.first_channel),
                        outs_padded);
            }
          }
          unflushed += tiles;
        }
        if (item + 1 == last || unflushed >= tiles_per_flush) {
          for (std::size_t i = 0; i < sums_size; ++i) totals[i] += sums[i];
          std::fill(sums, sums + sums_size, 0.0f);
          unflushed = 0;
        }
      }
    });
    // dg = G^T dU G per weight window, in double from the threads' totals (in thread order).
    for (Index o = 0; o < outs; ++o)
      for (Index j = 0; j < srcs; ++j)
        for (Index a = a0; a < a1; ++a) {
          double du[4][4];
          for (Index xi = 0; xi < positions; ++xi) {
            double total = 0;
            for (int t = 0; t < threads; ++t) total += totals_of(t)[sum_index(xi, a - a0, j, o)];
            du[xi / 4][xi % 4] = total;
          }
          double h[3][4];  // G^T dU
          for (Index l = 0; l < 4; ++l) {
            h[0][l] = du[0][l] + (du[1][l] + du[2][l]) / 2;
            h[1][l] = (du[1][l] - du[2][l]) / 2;
            h[2][l] = (du[1][l] + du[2][l]) / 2 + du[3][l];
          }
          for (Index b = 0; b < 3; ++b) {  // (G^T dU) G
            const double dg[3] = {h[b][0] + (h[b][1] + h[b][2]) / 2, (h[b][1] - h[b][2]) / 2,
                                  (h[b][1] + h[b][2]) / 2 + h[b][3]};
            for (Index c = 0; c < 3; ++c)
              gw(g.weight_index(group * outs + o, j, a, b, c)) += static_cast<float>(dg[c]);
          }
        }
  }
}

}  // namespace shardtensor::kernels::host
