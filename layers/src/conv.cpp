#include "shardtensor/layers/conv.hpp"

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"

#include "impl/conv_avx512.hpp"
#include "shardtensor/layers/halo_overlap.hpp"
#include "shardtensor/layers/impl/conv_parameters.hpp"
#include "shardtensor/layers/impl/per_dim_option.hpp"
#include "shardtensor/layers/impl/run_sum.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace shardtensor {

namespace {

/// Index arithmetic shared by the kernels: weights (out, in / groups, kx, ky, kz) in C order.
struct ConvShape {
  Index batch, in_channels, out_channels, in_per_group, out_per_group;
  Index k[3], s[3], d[3];
  Index base[3];  // padded-buffer index of the first local output's window start
  Index out[3];   // local output extents

  KOKKOS_INLINE_FUNCTION Index weight_index(Index co, Index cig, Index a, Index b, Index c) const {
    return (((co * in_per_group + cig) * k[0] + a) * k[1] + b) * k[2] + c;
  }
};

template <class T>
void conv_forward(const ConvShape& g, const FieldView<T>& xp, const ReplicatedView<T>& w,
                  const ReplicatedView<T>& bias, const FieldView<T>& y) {
  const bool has_bias = bias.extent(0) > 0;
  const Index total = g.batch * g.out_channels * g.out[0] * g.out[1] * g.out[2];
  Kokkos::parallel_for(
      "Conv::forward", total, KOKKOS_LAMBDA(const Index flat) {
        const CellIndex cell = unflatten(flat, g.out_channels, g.out[0], g.out[1], g.out[2]);
        const Index n = cell.n, co = cell.c, ox = cell.x, oy = cell.y, oz = cell.z;
        const Index group = co / g.out_per_group;
        T sum = has_bias ? bias(co) : T(0);
        for (Index cig = 0; cig < g.in_per_group; ++cig) {
          const Index ci = group * g.in_per_group + cig;
          for (Index a = 0; a < g.k[0]; ++a)
            for (Index b = 0; b < g.k[1]; ++b)
              for (Index c = 0; c < g.k[2]; ++c)
                sum +=
                    w(g.weight_index(co, cig, a, b, c)) *
                    xp(n, ci, g.base[0] + ox * g.s[0] + a * g.d[0],
                       g.base[1] + oy * g.s[1] + b * g.d[1], g.base[2] + oz * g.s[2] + c * g.d[2]);
        }
        y(n, co, ox, oy, oz) = sum;
      });
}

/// Gradient of the padded input: each cell gathers from the outputs whose windows cover it.
template <class T>
void conv_backward_data(const ConvShape& g, const FieldView<T>& gy, const ReplicatedView<T>& w,
                        const FieldView<T>& gxp) {
  const Index px = gxp.extent(2), py = gxp.extent(3), pz = gxp.extent(4);
  const Index total = g.batch * g.in_channels * px * py * pz;
  Kokkos::parallel_for(
      "Conv::backward_data", total, KOKKOS_LAMBDA(const Index flat) {
        const CellIndex cell = unflatten(flat, g.in_channels, px, py, pz);
        const Index n = cell.n, ci = cell.c, ix = cell.x, iy = cell.y, iz = cell.z;
        const Index group = ci / g.in_per_group, cig = ci % g.in_per_group;
        T sum = 0;
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ox = window_output_of(ix, g.base[0], a, g.s[0], g.d[0], g.out[0]);
          if (ox < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index oy = window_output_of(iy, g.base[1], b, g.s[1], g.d[1], g.out[1]);
            if (oy < 0) continue;
            for (Index c = 0; c < g.k[2]; ++c) {
              const Index oz = window_output_of(iz, g.base[2], c, g.s[2], g.d[2], g.out[2]);
              if (oz < 0) continue;
              for (Index cog = 0; cog < g.out_per_group; ++cog) {
                const Index co = group * g.out_per_group + cog;
                sum += w(g.weight_index(co, cig, a, b, c)) * gy(n, co, ox, oy, oz);
              }
            }
          }
        }
        gxp(n, ci, ix, iy, iz) = sum;
      });
}

/// This rank's partial sums of the weight and bias gradients (over its own outputs), in
/// double: they add up every output cell, and float sums in different orders on different
/// decompositions would differ by more than float precision.
template <class T>
void conv_backward_parameters(const ConvShape& g, const FieldView<T>& gy, const FieldView<T>& xp,
                              const ReplicatedView<T>& gw, const ReplicatedView<T>& gb) {
  if (gw.extent(0) > 0) {
    Kokkos::parallel_for(
        "Conv::backward_weight", static_cast<Index>(gw.extent(0)), KOKKOS_LAMBDA(const Index flat) {
          const CellIndex cell = unflatten(flat, g.in_per_group, g.k[0], g.k[1], g.k[2]);
          const Index co = cell.n, cig = cell.c, a = cell.x, b = cell.y, c = cell.z;
          const Index ci = (co / g.out_per_group) * g.in_per_group + cig;
          double sum = 0;  // many terms: accumulate in double
          for (Index n = 0; n < g.batch; ++n)
            for (Index ox = 0; ox < g.out[0]; ++ox)
              for (Index oy = 0; oy < g.out[1]; ++oy)
                for (Index oz = 0; oz < g.out[2]; ++oz)
                  sum += gy(n, co, ox, oy, oz) * xp(n, ci, g.base[0] + ox * g.s[0] + a * g.d[0],
                                                    g.base[1] + oy * g.s[1] + b * g.d[1],
                                                    g.base[2] + oz * g.s[2] + c * g.d[2]);
          gw(flat) += static_cast<T>(sum);
        });
  }
  if (gb.extent(0) > 0) {
    Kokkos::parallel_for(
        "Conv::backward_bias", g.out_channels, KOKKOS_LAMBDA(const Index co) {
          double sum = 0;  // many terms: accumulate in double
          for (Index n = 0; n < g.batch; ++n)
            for (Index ox = 0; ox < g.out[0]; ++ox)
              for (Index oy = 0; oy < g.out[1]; ++oy)
                sum += impl::run_sum(&gy(n, co, ox, oy, 0), g.out[2]);
          gb(co) += static_cast<T>(sum);
        });
  }
}

// ---------------------------------------------------------------------------------------
// The fast path: blocked im2col + GEMM. Output cells are processed in chunks of whole z rows
// (consecutive (x, y) pairs); a chunk's column matrix (taps x cells) lives in a workspace of
// bounded size, so memory does not grow with the field. Per sample n, group g and chunk:
//   forward:  Y[co, p]   = W_g[co, k] . X[k, p]          (+ bias)
//   backward: dW_g      += dY[co, p] . X[k, p]^T
//             dX[k, p]   = W_g^T . dY, then col2im gathers dX into the padded gradient.

template <class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, DefaultMemorySpace>;
template <class T>
using UnmanagedMatrix = Kokkos::View<T**, Kokkos::LayoutRight, DefaultMemorySpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Output z rows [first, last) of one chunk, row = ox * (output extent in y) + oy.
struct Chunk {
  Index first, last;
  KOKKOS_INLINE_FUNCTION Index rows() const { return last - first; }
};

/// columns(r, p) = padded input under tap r of output p, for the chunk's outputs of group g.
template <class T>
void im2col(const ConvShape& g, const FieldView<T>& xp, Index n, Index group, const Chunk& chunk,
            const UnmanagedMatrix<T>& columns) {
  const Index taps = g.k[0] * g.k[1] * g.k[2];
  Kokkos::parallel_for(
      "Conv::im2col", g.in_per_group * taps * chunk.rows(), KOKKOS_LAMBDA(const Index flat) {
        const Index z_row = flat % chunk.rows();  // within the chunk
        const Index ox = (chunk.first + z_row) / g.out[1], oy = (chunk.first + z_row) % g.out[1];
        const Index row = flat / chunk.rows();  // (cig, a, b, c)
        Index t = row;
        const Index c = t % g.k[2];
        t /= g.k[2];
        const Index b = t % g.k[1];
        t /= g.k[1];
        const Index a = t % g.k[0];
        const Index ci = group * g.in_per_group + t / g.k[0];
        const Index x = g.base[0] + ox * g.s[0] + a * g.d[0];
        const Index y = g.base[1] + oy * g.s[1] + b * g.d[1];
        const Index z0 = g.base[2] + c * g.d[2];
        T* out = &columns(row, z_row * g.out[2]);
        if (g.s[2] == 1) {
          const T* in = &xp(n, ci, x, y, z0);
          for (Index oz = 0; oz < g.out[2]; ++oz) out[oz] = in[oz];
        } else {
          for (Index oz = 0; oz < g.out[2]; ++oz) out[oz] = xp(n, ci, x, y, z0 + oz * g.s[2]);
        }
      });
}

/// Output index along one axis that tap `tap` of a window reads padded index i from; -1 if
/// none. Unit stride (the common case) needs no division.
template <bool unit_stride>
KOKKOS_INLINE_FUNCTION Index tap_output(Index i, Index base, Index tap, Index stride,
                                        Index dilation, Index outputs) {
  if (unit_stride) {
    const Index o = i - base - tap * dilation;
    return o >= 0 && o < outputs ? o : -1;
  }
  return window_output_of(i, base, tap, stride, dilation, outputs);
}

/// Adds the column gradients of one chunk into the padded input gradient (gather form:
/// each padded cell sums the taps of the chunk's outputs that read it; race-free).
template <bool unit_stride, class T>
void col2im(const ConvShape& g, const UnmanagedMatrix<T>& columns, Index n, Index group,
            const Chunk& chunk, const FieldView<T>& gxp) {
  // Input x-planes that the chunk's windows reach.
  const Index ix0 = g.base[0] + (chunk.first / g.out[1]) * g.s[0];
  const Index ix1 = g.base[0] + ((chunk.last - 1) / g.out[1]) * g.s[0] + (g.k[0] - 1) * g.d[0] + 1;
  const Index py = gxp.extent(3), pz = gxp.extent(4);
  Kokkos::parallel_for(
      "Conv::col2im", g.in_per_group * (ix1 - ix0) * py, KOKKOS_LAMBDA(const Index flat) {
        const Index iy = flat % py;
        const Index ix = ix0 + (flat / py) % (ix1 - ix0);
        const Index cig = flat / (py * (ix1 - ix0));
        T* out = &gxp(n, group * g.in_per_group + cig, ix, iy, 0);
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ox = tap_output<unit_stride>(ix, g.base[0], a, g.s[0], g.d[0], g.out[0]);
          if (ox < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index oy = tap_output<unit_stride>(iy, g.base[1], b, g.s[1], g.d[1], g.out[1]);
            const Index z_row = ox * g.out[1] + oy;
            if (oy < 0 || z_row < chunk.first || z_row >= chunk.last) continue;
            for (Index c = 0; c < g.k[2]; ++c) {
              const Index row = ((cig * g.k[0] + a) * g.k[1] + b) * g.k[2] + c;
              const T* in = &columns(row, (z_row - chunk.first) * g.out[2]);
              if (unit_stride) {
                // Output oz reads padded z = base + oz + c * d: a shifted contiguous row.
                const Index shift = g.base[2] + c * g.d[2];
                const Index first = shift, last = shift + g.out[2];
                for (Index iz = first < 0 ? 0 : first; iz < last && iz < pz; ++iz)
                  out[iz] += in[iz - shift];
              } else {
                for (Index iz = 0; iz < pz; ++iz) {
                  const Index oz = window_output_of(iz, g.base[2], c, g.s[2], g.d[2], g.out[2]);
                  if (oz >= 0) out[iz] += in[oz];
                }
              }
            }
          }
        }
      });
}

/// Copies a chunk of one group's output channels between the field and a (channels x cells)
/// matrix, adding `bias` on the way in (forward) when given.
template <class T>
void copy_chunk(const ConvShape& g, const FieldView<T>& field, Index n, Index group,
                const Chunk& chunk, const UnmanagedMatrix<T>& matrix, bool to_field,
                const ReplicatedView<T>& bias) {
  const bool has_bias = bias.extent(0) > 0;
  Kokkos::parallel_for(
      "Conv::copy_chunk", g.out_per_group * chunk.rows(), KOKKOS_LAMBDA(const Index flat) {
        const Index z_row = flat % chunk.rows();
        const Index ox = (chunk.first + z_row) / g.out[1], oy = (chunk.first + z_row) % g.out[1];
        const Index co = group * g.out_per_group + flat / chunk.rows();
        T* f = &field(n, co, ox, oy, 0);
        T* m = &matrix(flat / chunk.rows(), z_row * g.out[2]);
        if (to_field) {
          const T b = has_bias ? bias(co) : T(0);
          for (Index oz = 0; oz < g.out[2]; ++oz) f[oz] = m[oz] + b;
        } else {
          for (Index oz = 0; oz < g.out[2]; ++oz) m[oz] = f[oz];
        }
      });
}

/// z rows per chunk so that the column and output matrices stay within the budget (at least
/// one row).
inline Index rows_per_chunk(const ConvShape& g, std::size_t value_size, std::size_t budget_bytes) {
  const std::size_t taps = static_cast<std::size_t>(g.in_per_group * g.k[0] * g.k[1] * g.k[2]);
  const std::size_t per_row = (taps + static_cast<std::size_t>(g.out_per_group)) *
                              static_cast<std::size_t>(g.out[2]) * value_size;
  return std::max<Index>(
      1, std::min<Index>(g.out[0] * g.out[1], static_cast<Index>(budget_bytes / per_row)));
}

template <class T>
UnmanagedMatrix<T> weight_matrix(const ConvShape& g, const ReplicatedView<T>& w, Index group) {
  const Index taps = g.in_per_group * g.k[0] * g.k[1] * g.k[2];
  return UnmanagedMatrix<T>(w.data() + group * g.out_per_group * taps, g.out_per_group, taps);
}

/// The padded-buffer cells the windows of a chunk's outputs read (a bounding box).
inline Box chunk_reads(const ConvShape& g, const Chunk& chunk) {
  const Index x_first = chunk.first / g.out[1], x_last = (chunk.last - 1) / g.out[1];
  const bool one_plane = x_first == x_last;
  const Index first[3] = {x_first, one_plane ? chunk.first % g.out[1] : 0, 0};
  const Index last[3] = {x_last, one_plane ? (chunk.last - 1) % g.out[1] : g.out[1] - 1,
                         g.out[2] - 1};
  Box box;
  for (int a = 0; a < 3; ++a) {
    box.lower[a] = g.base[a] + first[a] * g.s[a];
    box.extent[a] = (last[a] - first[a]) * g.s[a] + (g.k[a] - 1) * g.d[a] + 1;
  }
  return box;
}

/// Which chunks a call computes: all, or only those that read (or do not read) given boxes.
struct ChunkFilter {
  enum { all, avoiding, touching } keep = all;
  std::vector<Box> boxes;
  bool operator()(const Box& reads) const {
    if (keep == all) return true;
    bool touches = false;
    for (const Box& b : boxes) touches = touches || !intersect(reads, b).empty();
    return touches == (keep == touching);
  }
};

template <class T>
void conv_forward_gemm(const ConvShape& g, const FieldView<T>& xp, const ReplicatedView<T>& w,
                       const ReplicatedView<T>& bias, const FieldView<T>& y,
                       impl::ConvWorkspace<T>& workspace, const ChunkFilter& filter = {}) {
  const Index taps = g.in_per_group * g.k[0] * g.k[1] * g.k[2];
  const Index chunk_rows = rows_per_chunk(g, sizeof(T), workspace.budget_bytes);
  T* buffer =
      workspace.reserve(static_cast<std::size_t>((taps + g.out_per_group) * chunk_rows * g.out[2]));
  const Index groups = g.out_channels / g.out_per_group;
  for (Index n = 0; n < g.batch; ++n)
    for (Index group = 0; group < groups; ++group) {
      const UnmanagedMatrix<T> weights = weight_matrix(g, w, group);
      for (Index first = 0; first < g.out[0] * g.out[1]; first += chunk_rows) {
        const Chunk chunk{first, std::min(first + chunk_rows, g.out[0] * g.out[1])};
        if (!filter(chunk_reads(g, chunk))) continue;
        const Index cells = chunk.rows() * g.out[2];
        const UnmanagedMatrix<T> columns(buffer, taps, cells);
        const UnmanagedMatrix<T> out(buffer + taps * cells, g.out_per_group, cells);
        im2col(g, xp, n, group, chunk, columns);
        KokkosBlas::gemm("N", "N", T(1), weights, columns, T(0), out);
        copy_chunk(g, y, n, group, chunk, out, /*to_field=*/true, bias);
      }
    }
}

/// Weight gradient (into `gw`, this rank's partial sum; may be empty) and padded input
/// gradient (into `gxp`, zero on entry; may be empty).
template <class T>
void conv_backward_gemm(const ConvShape& g, const FieldView<T>& gy, const FieldView<T>& xp,
                        const ReplicatedView<T>& w, const ReplicatedView<T>& gw,
                        const FieldView<T>& gxp, impl::ConvWorkspace<T>& workspace) {
  const Index taps = g.in_per_group * g.k[0] * g.k[1] * g.k[2];
  const Index chunk_rows = rows_per_chunk(g, sizeof(T), workspace.budget_bytes);
  T* buffer =
      workspace.reserve(static_cast<std::size_t>((taps + g.out_per_group) * chunk_rows * g.out[2]));
  const Index groups = g.out_channels / g.out_per_group;
  const ReplicatedView<T> no_bias;
  for (Index n = 0; n < g.batch; ++n)
    for (Index group = 0; group < groups; ++group) {
      const UnmanagedMatrix<T> weights = weight_matrix(g, w, group);
      for (Index first = 0; first < g.out[0] * g.out[1]; first += chunk_rows) {
        const Chunk chunk{first, std::min(first + chunk_rows, g.out[0] * g.out[1])};
        const Index cells = chunk.rows() * g.out[2];
        const UnmanagedMatrix<T> columns(buffer, taps, cells);
        const UnmanagedMatrix<T> grad_out(buffer + taps * cells, g.out_per_group, cells);
        copy_chunk(g, gy, n, group, chunk, grad_out, /*to_field=*/false, no_bias);
        if (gw.extent(0) > 0) {
          im2col(g, xp, n, group, chunk, columns);
          KokkosBlas::gemm("N", "T", T(1), grad_out, columns, T(1), weight_matrix(g, gw, group));
        }
        if (gxp.span() > 0) {
          KokkosBlas::gemm("T", "N", T(1), weights, grad_out, T(0), columns);
          if (g.s[0] == 1 && g.s[1] == 1 && g.s[2] == 1)
            col2im<true>(g, columns, n, group, chunk, gxp);
          else
            col2im<false>(g, columns, n, group, chunk, gxp);
        }
      }
    }
}

// ---------------------------------------------------------------------------------------
// The plane path, for unit strides (the common case): im2col expands only the (y, z) taps,
// one source x-plane at a time, and the x taps become shifts between planes. Output plane o
// under x tap a reads source plane offset + o + a * dilation, whose (y, z)-expanded columns
// are built once into a ring of workspace slots and reused by the next outputs. So the
// column data is 9x (not 27x) the field for a 3x3x3 kernel, and the GEMMs read and write the
// fields in place (no copies of outputs or output gradients). Per output plane and x tap a:
//   out[co, cells] += W_a[co, (ci, b, c)] . columns(plane)[(ci, b, c), cells]
// The input gradient is the same correlation of the output gradient with flipped, transposed
// weights (gather form: every padded cell written once, no col2im); the weight gradient is
// dW_a += dY[co, cells] . columns(plane)^T over the forward's columns.

/// out[o] = sum over taps t of W[t] . src[offset + o + t * dilation] along each axis, per
/// group; src cells outside its extents read as zero.
struct Correlation {
  Index groups, src_per_group, out_per_group;
  Index k[3], d[3], offset[3], out[3], src[3];
  Index column_rows() const { return src_per_group * k[1] * k[2]; }
  Index slots() const { return (k[0] - 1) * d[0] + 1; }  // source planes one output plane spans
};

/// Ring slot of source plane sx (sx may be negative).
KOKKOS_INLINE_FUNCTION Index slot_of(Index sx, Index slots) {
  return ((sx % slots) + slots) % slots;
}

/// Weight of a correlation of group `group`: output o, source channel j, taps (a, b, c). The
/// forward's weight, or (transposed) the input gradient's flipped one.
template <class T>
KOKKOS_INLINE_FUNCTION T correlation_weight(const ConvShape& g, const ReplicatedView<T>& w,
                                            Index group, bool transposed, Index o, Index j, Index a,
                                            Index b, Index c) {
  return transposed ? w(g.weight_index(group * g.out_per_group + j, o, g.k[0] - 1 - a,
                                       g.k[1] - 1 - b, g.k[2] - 1 - c))
                    : w(g.weight_index(group * g.out_per_group + o, j, a, b, c));
}

/// The weights of one group for every ring rotation r (the slot of the output plane's first
/// tap): packed[r][o][(s, j, b, c)] = weight of x tap a for the slot s = r + a * d (mod slots),
/// zero for slots no tap reads.
template <class T>
void pack_weights(const Correlation& r, const ConvShape& g, const ReplicatedView<T>& w, Index group,
                  bool transposed, T* packed) {
  const Index outs = r.out_per_group, srcs = r.src_per_group, slots = r.slots();
  const Index kx = g.k[0], ky = g.k[1], kz = g.k[2], dx = g.d[0];
  Kokkos::parallel_for(
      "Conv::pack_weights", slots * outs * slots * srcs * ky * kz, KOKKOS_LAMBDA(const Index flat) {
        const Index taps = srcs * ky * kz, j_b_c = flat % taps;
        const CellIndex cell = unflatten(flat / taps, outs, slots, 1, 1);  // (r, o, s)
        const Index rotation = cell.n, o = cell.c, s = cell.x;
        const Index j = j_b_c / (ky * kz), b = (j_b_c / kz) % ky, c = j_b_c % kz;
        const Index shift = slot_of(s - rotation, slots);  // = a * dx for a tap a
        const Index a = shift / dx;
        packed[flat] = shift % dx == 0 && a < kx
                           ? correlation_weight(g, w, group, transposed, o, j, a, b, c)
                           : T(0);
      });
}
/// columns[(j, b, c), (y - y0) * out_z + z] = src(n, group's channel j, x, offset_y + y + b d_y,
/// offset_z + z + c d_z) for output rows y in [y0, y1) of source plane x (zero outside src).
template <class T>
void plane_im2col(const Correlation& r, const FieldView<T>& src, Index n, Index group, Index x,
                  Index y0, Index y1, const UnmanagedMatrix<T>& columns) {
  const Index rows = y1 - y0;
  Kokkos::parallel_for(
      "Conv::plane_im2col", r.column_rows() * rows, KOKKOS_LAMBDA(const Index flat) {
        const Index oy = y0 + flat % rows;
        const Index row = flat / rows;  // (j, b, c)
        const Index c = row % r.k[2], b = (row / r.k[2]) % r.k[1], j = row / (r.k[2] * r.k[1]);
        T* out = &columns(row, (oy - y0) * r.out[2]);
        const Index y = r.offset[1] + oy + b * r.d[1];
        const Index shift = r.offset[2] + c * r.d[2];  // source z of output z = 0
        // Output z in [first, last) reads inside the source; the rest is zero.
        const Index first = math::min(r.out[2], math::max<Index>(0, -shift));
        const Index last = math::max(first, math::min(r.out[2], r.src[2] - shift));
        if (x < 0 || x >= r.src[0] || y < 0 || y >= r.src[1]) {  // plane or row outside src
          for (Index z = 0; z < r.out[2]; ++z) out[z] = T(0);
          return;
        }
        const T* in = &src(n, group * r.src_per_group + j, x, y, 0);
        for (Index z = 0; z < first; ++z) out[z] = T(0);
        for (Index z = first; z < last; ++z) out[z] = in[z + shift];
        for (Index z = last; z < r.out[2]; ++z) out[z] = T(0);
      });
}

/// Channels [c0, c0 + count) of output rows [y0, y1) of plane x of a field as a matrix
/// (channels x cells): the rows are contiguous, the channels a stride apart. No copy.
template <class T>
UnmanagedMatrix<T> plane_rows(const FieldView<T>& f, Index n, Index c0, Index count, Index x,
                              Index y0, Index y1) {
  const UnmanagedMatrix<T> whole(&f(n, c0, x, y0, 0), count, f.stride(1));
  return Kokkos::subview(whole, Kokkos::ALL,
                         std::make_pair(Index(0), (y1 - y0) * Index(f.extent(4))));
}

/// Rows of output cells per chunk so that the ring of column slots fits `budget` values;
/// 0 if not even one row fits.
inline Index plane_chunk_rows(const Correlation& r, std::size_t budget) {
  const std::size_t per_row = static_cast<std::size_t>(r.slots() * r.column_rows() * r.out[2]);
  return std::min<Index>(r.out[1], static_cast<Index>(budget / per_row));
}

/// Calls plane(n, group, x, y0, y1, rotation, columns) for every output plane x and chunk of
/// rows [y0, y1) selected by keep(x, y0, y1). `columns` stacks the ring's slots (slots x
/// column rows, cells): the (y, z)-expanded source planes offset + x ... offset + x +
/// (k - 1) d, the one of tap a in slot rotation + a d (mod slots); planes outside src are
/// zero. Each source plane is expanded once per chunk of rows.
template <class T, class Keep, class Plane>
void for_each_plane(const Correlation& r, const FieldView<T>& src, T* ring, Index chunk_rows,
                    const Keep& keep, const Plane& plane) {
  const Index slots = r.slots();
  std::vector<Index> slot_plane(slots);
  for (Index n = 0; n < Index(src.extent(0)); ++n)
    for (Index group = 0; group < r.groups; ++group)
      for (Index y0 = 0; y0 < r.out[1]; y0 += chunk_rows) {
        const Index y1 = std::min(y0 + chunk_rows, r.out[1]), cells = (y1 - y0) * r.out[2];
        std::fill(slot_plane.begin(), slot_plane.end(), std::numeric_limits<Index>::min());
        for (Index x = 0; x < r.out[0]; ++x) {
          if (!keep(x, y0, y1)) continue;
          for (Index sx = r.offset[0] + x; sx < r.offset[0] + x + slots; ++sx) {
            const Index slot = slot_of(sx, slots);
            if (slot_plane[slot] == sx) continue;
            const UnmanagedMatrix<T> columns(ring + slot * r.column_rows() * cells, r.column_rows(),
                                             cells);
            plane_im2col(r, src, n, group, sx, y0, y1, columns);
            slot_plane[slot] = sx;
          }
          plane(n, group, x, y0, y1, slot_of(r.offset[0] + x, slots),
                UnmanagedMatrix<T>(ring, slots * r.column_rows(), cells));
        }
      }
}

/// out = the correlation of src (every cell of out written), plus bias when given: the
/// forward (y from the padded input) or the input gradient (padded gradient from dY, with
/// `transposed` flipped weights). One GEMM per output plane (and chunk of rows), written
/// straight into the field. `keep(x, y0, y1)` selects output chunks.
template <class T, class Keep>
void plane_correlate(const Correlation& r, const ConvShape& g, const FieldView<T>& src,
                     const ReplicatedView<T>& w, bool transposed, const ReplicatedView<T>& bias,
                     const FieldView<T>& out, T* workspace, Index chunk_rows, const Keep& keep) {
  const Index width = r.slots() * r.column_rows();  // GEMM depth
  T* const packed = workspace;                      // weights per rotation, then the ring
  T* const ring = workspace + r.slots() * r.out_per_group * width;
  const bool has_bias = bias.extent(0) > 0;
  Index packed_group = -1;
  const auto plane = [&](Index n, Index group, Index x, Index y0, Index y1, Index rotation,
                         const UnmanagedMatrix<T>& columns) {
    if (packed_group != group) pack_weights(r, g, w, group, transposed, packed);
    packed_group = group;
    const UnmanagedMatrix<T> weights(packed + rotation * r.out_per_group * width, r.out_per_group,
                                     width);
    const UnmanagedMatrix<T> result =
        plane_rows(out, n, group * r.out_per_group, r.out_per_group, x, y0, y1);
    KokkosBlas::gemm("N", "N", T(1), weights, columns, T(0), result);
    if (!has_bias) return;
    const Index cells = result.extent(1), c0 = group * r.out_per_group;
    Kokkos::parallel_for(
        "Conv::plane_bias", r.out_per_group, KOKKOS_LAMBDA(const Index o) {
          for (Index p = 0; p < cells; ++p) result(o, p) += bias(c0 + o);
        });
  };
  for_each_plane(r, src, ring, chunk_rows, keep, plane);
}

/// gw += this rank's weight gradient: per output plane, dW[rotation] += dY plane rows .
/// columns^T, accumulated per group and rotation in packed buffers, then added into gw's
/// (co, ci, a, b, c) order.
template <class T>
void plane_weight_gradient(const Correlation& r, const ConvShape& g, const FieldView<T>& xp,
                           const FieldView<T>& gy, const ReplicatedView<T>& gw, T* workspace,
                           Index chunk_rows) {
  const Index slots = r.slots(), width = slots * r.column_rows();
  const Index packed_size = slots * r.out_per_group * width;
  T* const packed = workspace;  // this group's dW per rotation, then the ring
  T* const ring = workspace + packed_size;
  const Kokkos::View<T*, DefaultMemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> all(
      packed, packed_size);
  Kokkos::deep_copy(all, T(0));
  // Every rotation holds a part of each weight's gradient (x tap a of rotation r sits in slot
  // r + a d): each weight gathers its parts over the rotations in a fixed order (a scatter
  // from the packed buffers would have `slots` iterations adding into one weight).
  const auto add_packed = [&](Index group) {
    const Index kx = g.k[0], dx = g.d[0];
    const Index outs = r.out_per_group, taps = r.column_rows();
    Kokkos::parallel_for(
        "Conv::plane_weight_gradient", outs * kx * taps, KOKKOS_LAMBDA(const Index flat) {
          const Index j_b_c = flat % taps, a = (flat / taps) % kx, o = flat / (taps * kx);
          T sum = 0;
          for (Index rotation = 0; rotation < slots; ++rotation)
            sum += all(((rotation * outs + o) * slots + slot_of(rotation + a * dx, slots)) * taps +
                       j_b_c);
          const Index j = j_b_c / (g.k[1] * g.k[2]), b = (j_b_c / g.k[2]) % g.k[1];
          gw(g.weight_index(group * outs + o, j, a, b, j_b_c % g.k[2])) += sum;
        });
    Kokkos::deep_copy(all, T(0));
  };
  Index current_group = 0;
  const auto keep_all = [](Index, Index, Index) { return true; };
  const auto plane = [&](Index n, Index group, Index x, Index y0, Index y1, Index rotation,
                         const UnmanagedMatrix<T>& columns) {
    if (group != current_group) add_packed(current_group);
    current_group = group;
    const UnmanagedMatrix<T> weights(packed + rotation * r.out_per_group * width, r.out_per_group,
                                     width);
    KokkosBlas::gemm("N", "T", T(1),
                     plane_rows(gy, n, group * r.out_per_group, r.out_per_group, x, y0, y1),
                     columns, T(1), weights);
  };
  for_each_plane(r, xp, ring, chunk_rows, keep_all, plane);
  add_packed(current_group);
}

// ---------------------------------------------------------------------------------------
// The plane path's vector kernels (float on the host, AVX-512 CPUs: impl/conv_avx512.hpp).
// The same correlations without im2col or a GEMM library: a tile of 8 output channels x 3
// vectors of 16 output cells accumulates in registers over the taps, loading the source
// straight from its planes (a tap is an offset). The weight gradient keeps 12 taps x 32 output
// channels in registers while it streams a band of cells. On bench_conv, im2col +
// KokkosBlas::gemm ran at 76-81 GFLOP/s per core (OpenBLAS sgemm alone: 105-135 on these
// shapes); see docs/performance.md for what the kernels reach.

/// Whether this build and CPU run the vector kernels: float, Kokkos kernels on the host
/// (Serial, or OpenMP: the work is split over its threads), AVX-512F at run time.
template <class T>
bool vector_kernels_available() {
#if defined(SHARDTENSOR_CONV_AVX512)
  return std::is_same<T, float>::value &&
         std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>::value &&
         impl::conv_avx512::available();
#else
  return false;
#endif
}

#ifdef SHARDTENSOR_CONV_AVX512
namespace vector_kernels = impl::conv_avx512;

/// Threads the vector kernels split their work over: the host backend's (1 on Serial).
inline int vector_threads() {
  return static_cast<int>(Kokkos::DefaultHostExecutionSpace().concurrency());
}

/// Runs work(t, first, last) on each of `threads` host threads for its contiguous share
/// [first, last) of `items` (a static split: the same items go to the same thread every run,
/// so sums kept per thread add up in the same order every time).
template <class Work>
void split_over_threads(int threads, Index items, const Work& work) {
  const auto share = [&](int t) { work(t, items * t / threads, items * (t + 1) / threads); };
  if (threads == 1) return share(0);
  Kokkos::parallel_for(
      "Conv::vector_kernels",
      Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Schedule<Kokkos::Static>>(
          0, threads),
      [&](const int t) { share(t); });
}

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

/// Extent along axis a (1: y, 2: z) of the source cells that a correlation's outputs read.
inline Index read_extent(const Correlation& r, int a) {
  return r.out[a] + (r.k[a] - 1) * r.d[a];
}

/// Whether every window of the outputs lies inside the source in y and z.
inline bool reads_inside(const Correlation& r) {
  for (int a = 1; a < 3; ++a)
    if (r.offset[a] < 0 || r.offset[a] + read_extent(r, a) > r.src[a]) return false;
  return true;
}

/// Rows of a plane's copy: the whole plane's read extent, or (band copies) the rows one band
/// of output rows reads.
inline Index copied_rows(const Correlation& r, bool bands) {
  const Index band_reads = band_rows + (r.k[1] - 1) * r.d[1];
  return bands ? std::min(read_extent(r, 1), band_reads) : read_extent(r, 1);
}

/// Where the vector kernels read source plane sx: the field itself when the windows lie inside
/// it in y and z (the forward's padded input), else a ring of zero-padded copies of its
/// planes (the output gradient, read by the input gradient). A plane points at the cell that
/// output (0, first_row()) reads at y and z taps 0, channel 0 of the group. With `bands`, a
/// copy holds only the rows that one band of output rows reads (start_band() before the
/// band's planes): a 2-D field is one plane, too large to copy whole into the workspace.
class PlaneSource {
 public:
  PlaneSource(const Correlation& r, const FieldView<float>& src, float* ring, bool bands = false)
      : r_(r),
        src_(src),
        ring_(ring),
        in_place_(reads_inside(r)),
        rows_(copied_rows(r, bands)),
        slot_plane_(r.slots()) {
    channel_stride_ = in_place_ ? src.stride(1) : rows_ * read_extent(r, 2);
    row_stride_ = in_place_ ? src.stride(3) : read_extent(r, 2);
  }
  /// Workspace values the ring needs (none when the source is read in place).
  static std::size_t ring_values(const Correlation& r, bool bands) {
    return reads_inside(r) ? 0
                           : static_cast<std::size_t>(r.slots() * r.src_per_group *
                                                      copied_rows(r, bands) * read_extent(r, 2));
  }
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
  const float* plane(Index sx) {
    if (sx < 0 || sx >= r_.src[0]) return nullptr;
    const Index c0 = group_ * r_.src_per_group;
    if (in_place_) return &src_(n_, c0, sx, r_.offset[1], r_.offset[2]);
    const Index slot = slot_of(sx, r_.slots());
    float* copy = ring_ + slot * r_.src_per_group * channel_stride_;
    if (slot_plane_[slot] == sx) return copy;
    const Index rows = std::min(rows_, read_extent(r_, 1) - first_row_);
    for (Index j = 0; j < r_.src_per_group; ++j)
      for (Index y = 0; y < rows; ++y) {
        const Index sy = r_.offset[1] + first_row_ + y;
        float* row = copy + j * channel_stride_ + y * row_stride_;
        for (Index z = 0; z < read_extent(r_, 2); ++z) {
          const Index sz = r_.offset[2] + z;
          const bool inside = sy >= 0 && sy < r_.src[1] && sz >= 0 && sz < r_.src[2];
          row[z] = inside ? src_(n_, c0 + j, sx, sy, sz) : 0.0f;
        }
      }
    slot_plane_[slot] = sx;
    return copy;
  }

 private:
  const Correlation& r_;
  FieldView<float> src_;
  float* ring_;
  bool in_place_;
  Index rows_;  // rows per copy
  std::ptrdiff_t channel_stride_, row_stride_;
  std::vector<Index> slot_plane_;  // source plane in each ring slot
  Index n_ = 0, group_ = 0, first_row_ = 0;
};

/// Offsets from a source plane of the (y, z) taps of source channels [0, channels): entry
/// (j, b, c) = j * channel stride + b * dy * row stride + c * dz.
inline std::vector<std::ptrdiff_t> tap_offsets(const Correlation& r, const PlaneSource& source) {
  std::vector<std::ptrdiff_t> offsets;
  for (Index j = 0; j < r.src_per_group; ++j)
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
                           Index y0, Index y1, Index source_first_row,
                           std::vector<vector_kernels::OutputVector>& vectors) {
  const Index source_base = source_first_row * source_row_stride;  // where the source starts
  constexpr Index lanes = vector_kernels::lanes;
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
  while (vectors.size() % vector_kernels::tile_vectors != 0) vectors.push_back({0, 0, 0, 0, 0});
}

/// out = the correlation of src (plus bias when given), like plane_correlate: per output plane
/// and band of rows, tiles of output vectors, one pass per channels_per_pass(r) source channels.
/// Weights are packed per group as [block of 8 outputs][pass][a][(j, b, c) of the pass][8]
/// (outputs past out_per_group zero).
template <class Keep>
void vector_correlate(const Correlation& r, const ConvShape& g, const FieldView<float>& src,
                      const ReplicatedView<float>& w, bool transposed,
                      const ReplicatedView<float>& bias, const FieldView<float>& out,
                      float* workspace, bool band_copies, const Keep& keep) {
  constexpr Index rows_per_tile = vector_kernels::tile_rows;
  constexpr Index vectors_per_tile = vector_kernels::tile_vectors;
  const Index kx = r.k[0], yz_taps = r.k[1] * r.k[2], taps = r.src_per_group * yz_taps;
  const Index blocks = (r.out_per_group + rows_per_tile - 1) / rows_per_tile;
  float* const packed = workspace;  // the weights, then a ring per thread
  float* const rings = packed + blocks * rows_per_tile * kx * taps;
  const std::size_t ring_size = PlaneSource::ring_values(r, band_copies);
  const std::vector<std::ptrdiff_t> offsets =
      tap_offsets(r, PlaneSource(r, src, rings, band_copies));
  const std::ptrdiff_t out_channel_stride = out.stride(1), out_row_stride = out.stride(3);
  const Index bands = (r.out[1] + band_rows - 1) / band_rows;
  const int threads = vector_threads();
  // One source per thread, made here: no View is copied inside the threads.
  std::vector<PlaneSource> sources;
  for (int t = 0; t < threads; ++t)
    sources.emplace_back(r, src, rings + t * ring_size, band_copies);
  const Index batch = out.extent(0), per_sample = r.out[0] * bands;
  for (Index group = 0; group < r.groups; ++group) {  // weights packed once per group
    for (Index block = 0; block < blocks; ++block)
      for (Index j0 = 0; j0 < r.src_per_group; j0 += channels_per_pass(r)) {
        const Index pass = std::min(channels_per_pass(r), r.src_per_group - j0);
        float* p = packed + (block * r.src_per_group + j0) * kx * yz_taps * rows_per_tile;
        for (Index a = 0; a < kx; ++a)
          for (Index j = j0; j < j0 + pass; ++j)
            for (Index b = 0; b < r.k[1]; ++b)
              for (Index c = 0; c < r.k[2]; ++c)
                for (Index i = 0; i < rows_per_tile; ++i, ++p) {
                  const Index o = block * rows_per_tile + i;
                  *p = o < r.out_per_group
                           ? correlation_weight(g, w, group, transposed, o, j, a, b, c)
                           : 0.0f;
                }
      }
    // Each thread computes whole bands of output rows (disjoint outputs) of every sample, in
    // order.
    split_over_threads(threads, batch * per_sample, [&](int t, Index first, Index last) {
      PlaneSource& source = sources[t];
      std::vector<const float*> planes(kx);
      std::vector<vector_kernels::OutputVector> vectors;
      for (Index item = first; item < last; ++item) {
        const Index n = item / per_sample, x = (item % per_sample) / bands,
                    y0 = (item % bands) * band_rows;
        if (item == first || item % per_sample == 0) source.start(n, group);
        const Index y1 = std::min(y0 + band_rows, r.out[1]);
        if (!keep(x, y0, y1)) continue;
        source.start_band(y0);
        for (Index a = 0; a < kx; ++a) planes[a] = source.plane(r.offset[0] + x + a * r.d[0]);
        output_vectors(r, source.row_stride(), out_row_stride, y0, y1, source.first_row(), vectors);
        float* const out_plane = &out(n, group * r.out_per_group, x, 0, 0);
        for (Index j0 = 0; j0 < r.src_per_group; j0 += channels_per_pass(r)) {
          const Index pass = std::min(channels_per_pass(r), r.src_per_group - j0);
          for (Index block = 0; block < blocks; ++block) {
            const Index o0 = block * rows_per_tile;
            const float* weights =
                packed + (block * r.src_per_group + j0) * kx * yz_taps * rows_per_tile;
            const float* block_bias =
                bias.extent(0) > 0 && j0 == 0 ? &bias(group * r.out_per_group + o0) : nullptr;
            for (std::size_t v = 0; v < vectors.size(); v += vectors_per_tile)
              vector_kernels::correlate_tile(
                  planes.data(), int(kx), offsets.data() + j0 * yz_taps, int(pass * yz_taps),
                  weights, &vectors[v], out_plane + o0 * out_channel_stride, out_channel_stride,
                  int(std::min(rows_per_tile, r.out_per_group - o0)), block_bias,
                  /*accumulate=*/j0 > 0);
          }
        }
      }
    });
  }
}

/// Output channels per weight-gradient tile (its register vectors).
constexpr Index gradient_channels = vector_kernels::gradient_vectors * vector_kernels::lanes;

/// Workspace values of vector_correlate and vector_weight_gradient.
inline std::size_t vector_correlate_values(const Correlation& r, bool band_copies) {
  const Index blocks =
      (r.out_per_group + vector_kernels::tile_rows - 1) / vector_kernels::tile_rows;
  return static_cast<std::size_t>(blocks * vector_kernels::tile_rows * r.k[0] * r.src_per_group *
                                  r.k[1] * r.k[2]) +
         PlaneSource::ring_values(r, band_copies) * vector_threads();
}
inline Index padded_taps(const Correlation& r) {
  const Index taps = r.column_rows(), per_tile = vector_kernels::gradient_taps;
  return (taps + per_tile - 1) / per_tile * per_tile;
}
inline Index padded_outputs(const Correlation& r) {
  return (r.out_per_group + gradient_channels - 1) / gradient_channels * gradient_channels;
}
/// Workspace values of one thread of vector_weight_gradient: the output gradient of a band
/// transposed, a plane's float sums and the double totals (an even count: doubles stay aligned).
inline std::size_t weight_gradient_thread_values(const Correlation& r) {
  const std::size_t gradient = r.k[0] * padded_taps(r) * padded_outputs(r);
  const std::size_t values =
      static_cast<std::size_t>(padded_outputs(r) * band_rows * r.out[2]) + 3 * gradient;
  return values + values % 2;
}
inline std::size_t vector_weight_gradient_values(const Correlation& r) {
  return weight_gradient_thread_values(r) * vector_threads();
}

/// gw += this rank's weight gradient (forward correlation r over the padded input xp, whose
/// windows lie inside it): per output plane and band of rows, the output gradient transposed
/// to (cell, channel), then tiles of 12 taps x 32 channels summed over the band's cells. Each
/// plane's float sums are added into double totals.
void vector_weight_gradient(const Correlation& r, const ConvShape& g, const FieldView<float>& xp,
                            const FieldView<float>& gy, const ReplicatedView<float>& gw,
                            float* workspace) {
  const Index kx = r.k[0], ky = r.k[1], kz = r.k[2];
  const Index taps = padded_taps(r), outs = padded_outputs(r),
              cells_per_band = band_rows * r.out[2];
  const Index gradient_size = kx * taps * outs;
  std::vector<std::ptrdiff_t> offsets = tap_offsets(r, PlaneSource(r, xp, nullptr));
  offsets.resize(taps, 0);  // padding taps read tap 0; their sums are not used
  const Index bands = (r.out[1] + band_rows - 1) / band_rows;
  const int threads = vector_threads();
  const std::size_t per_thread = weight_gradient_thread_values(r);
  // Thread t's totals: [thread t's share][transposed band | float sums | double totals].
  std::vector<PlaneSource> sources(threads, PlaneSource(r, xp, nullptr));  // in place: no ring
  const auto totals_of = [&](int t) {
    return reinterpret_cast<double*>(workspace + t * per_thread + outs * cells_per_band +
                                     gradient_size);
  };
  const Index per_sample = r.out[0] * bands;
  for (Index group = 0; group < r.groups; ++group) {
    // Each thread sums over its own bands of rows of every sample (in order): float sums
    // per plane, added into its double totals when the plane changes; the totals add up in
    // thread order.
    split_over_threads(threads, g.batch * per_sample, [&](int t, Index first, Index last) {
      float* const transposed = workspace + t * per_thread;  // [32-channel block][cell][32]
      float* const sums = transposed + outs * cells_per_band;
      double* const totals = totals_of(t);
      PlaneSource& source = sources[t];
      Index zeroed_cells = -1;  // the band size whose padding lanes are zero
      std::fill(totals, totals + gradient_size, 0.0);
      std::fill(sums, sums + gradient_size, 0.0f);
      for (Index item = first; item < last; ++item) {
        const Index n = item / per_sample, x = (item % per_sample) / bands,
                    y0 = (item % bands) * band_rows;
        if (item == first || item % per_sample == 0) source.start(n, group);
        const Index y1 = std::min(y0 + band_rows, r.out[1]), cells = (y1 - y0) * r.out[2];
        // The lanes of padding channels (past out_per_group) are zero; no band writes them
        // again, so they stay zero until the band size (so the layout) changes.
        const Index written = cells == zeroed_cells ? r.out_per_group : outs;
        zeroed_cells = cells;
        for (Index o = 0; o < written; ++o) {
          float* column = transposed + (o / gradient_channels) * cells * gradient_channels +
                          o % gradient_channels;
          const float* row =
              o < r.out_per_group ? &gy(n, group * r.out_per_group + o, x, y0, 0) : nullptr;
          for (Index p = 0; p < cells; ++p) column[p * gradient_channels] = row ? row[p] : 0.0f;
        }
        for (Index a = 0; a < kx; ++a) {
          const float* plane = source.plane(r.offset[0] + x + a * r.d[0]);
          if (!plane) continue;  // outside the source: reads zero
          for (Index block = 0; block < outs / gradient_channels; ++block)
            for (Index tap = 0; tap < taps; tap += vector_kernels::gradient_taps)
              vector_kernels::weight_gradient_tile(
                  plane + y0 * source.row_stride(), offsets.data() + tap, source.row_stride(),
                  int(y1 - y0), int(r.out[2]), transposed + block * cells * gradient_channels,
                  sums + (a * taps + tap) * outs + block * gradient_channels, outs);
        }
        if (item + 1 == last || (item + 1) / bands != item / bands) {  // the plane's last band
          for (Index i = 0; i < gradient_size; ++i) totals[i] += sums[i];
          std::fill(sums, sums + gradient_size, 0.0f);
        }
      }
    });
    for (Index o = 0; o < r.out_per_group; ++o)
      for (Index j = 0; j < r.src_per_group; ++j)
        for (Index a = 0; a < kx; ++a)
          for (Index b = 0; b < ky; ++b)
            for (Index c = 0; c < kz; ++c) {
              const Index i = (a * taps + (j * ky + b) * kz + c) * outs + o;
              double total = 0;
              for (int t = 0; t < threads; ++t) total += totals_of(t)[i];
              gw(g.weight_index(group * r.out_per_group + o, j, a, b, c)) +=
                  static_cast<float>(total);
            }
  }
}
#endif  // SHARDTENSOR_CONV_AVX512

/// The padded-buffer cells that output rows [y0, y1) of output plane ox read (plane path).
inline Box plane_reads(const ConvShape& g, Index ox, Index y0, Index y1) {
  Box box;
  box.lower = {g.base[0] + ox, g.base[1] + y0, g.base[2]};
  box.extent = {(g.k[0] - 1) * g.d[0] + 1, (y1 - y0 - 1) + (g.k[1] - 1) * g.d[1] + 1,
                (g.out[2] - 1) + (g.k[2] - 1) * g.d[2] + 1};
  return box;
}

/// The plane path's correlations: the forward (also the weight gradient's columns) and the
/// input gradient, with the output rows per chunk that fit the workspace (0: does not apply).
struct PlanePlan {
  Correlation forward, data;
  Index forward_rows = 0, data_rows = 0;
  bool vector_kernels = false;  // the AVX-512 kernels instead of im2col + GEMM
  bool band_copies = false;     // vector kernels copy padded sources band by band
  std::size_t values = 0;       // workspace values needed
  bool applies() const { return vector_kernels || forward_rows > 0; }
};

/// The plane path's plan, if it applies; `vector_kernels`: may use the AVX-512 kernels.
PlanePlan plan_planes(const ConvShape& g, const Index padded[3], std::size_t value_size,
                      std::size_t budget_bytes, bool vector_kernels) {
  PlanePlan plan;
  const Index groups = g.out_channels / g.out_per_group;
  Correlation& f = plan.forward;
  Correlation& d = plan.data;
  f = {groups, g.in_per_group, g.out_per_group, {}, {}, {}, {}, {}};
  d = {groups, g.out_per_group, g.in_per_group, {}, {}, {}, {}, {}};
  for (int a = 0; a < 3; ++a) {
    f.k[a] = d.k[a] = g.k[a];
    f.d[a] = d.d[a] = g.d[a];
    f.offset[a] = g.base[a];
    f.out[a] = d.src[a] = g.out[a];
    f.src[a] = d.out[a] = padded[a];
    d.offset[a] = -g.base[a] - (g.k[a] - 1) * g.d[a];
    // Unit strides only (the planes are shifts of each other); planes of at least 64 cells.
    if (g.s[a] != 1) return plan;
  }
  if (g.out[1] * g.out[2] < 64) return plan;
  const std::size_t budget = budget_bytes / value_size;
#ifdef SHARDTENSOR_CONV_AVX512
  if (vector_kernels) {
    const auto values = [&](bool bands) {
      return std::max({vector_correlate_values(f, bands), vector_correlate_values(d, bands),
                       vector_weight_gradient_values(f)});
    };
    // Whole padded planes in the ring when they fit, else the rows of one band at a time.
    plan.band_copies = values(false) > budget;
    plan.values = values(plan.band_copies);
    // The weight gradient reads the padded input in place (the forward's windows lie inside).
    plan.vector_kernels = plan.values <= budget && reads_inside(f);
    if (plan.vector_kernels) return plan;
  }
#else
  (void)vector_kernels;
#endif
  const auto weights = [](const Correlation& r) {
    return static_cast<std::size_t>(r.slots() * r.out_per_group * r.slots() * r.column_rows());
  };
  if (budget <= std::max(weights(f), weights(d))) return plan;
  plan.forward_rows = plane_chunk_rows(f, budget - weights(f));
  plan.data_rows = plane_chunk_rows(d, budget - weights(d));
  if (plan.forward_rows < 1 || plan.data_rows < 1) plan.forward_rows = plan.data_rows = 0;
  const auto needs = [&](const Correlation& r, Index rows) {
    return weights(r) + static_cast<std::size_t>(r.slots() * r.column_rows() * rows * r.out[2]);
  };
  plan.values = std::max(needs(f, plan.forward_rows), needs(d, plan.data_rows));
  return plan;
}

/// The plane path's correlation (forward or input gradient; `rows` per GEMM chunk): the
/// vector kernels where planned, else im2col + GEMM.
template <class T, class Keep>
void correlate_planes(const PlanePlan& plan, const Correlation& r, Index rows, const ConvShape& g,
                      const FieldView<T>& src, const ReplicatedView<T>& w, bool transposed,
                      const ReplicatedView<T>& bias, const FieldView<T>& out, T* workspace,
                      const Keep& keep) {
#ifdef SHARDTENSOR_CONV_AVX512
  if constexpr (std::is_same<T, float>::value)
    if (plan.vector_kernels)
      return vector_correlate(r, g, src, w, transposed, bias, out, workspace, plan.band_copies,
                              keep);
#endif
  plane_correlate(r, g, src, w, transposed, bias, out, workspace, rows, keep);
}

/// The plane path's weight gradient: the vector kernels where planned, else im2col + GEMM.
template <class T>
void weight_gradient_planes(const PlanePlan& plan, const ConvShape& g, const FieldView<T>& xp,
                            const FieldView<T>& gy, const ReplicatedView<T>& gw, T* workspace) {
#ifdef SHARDTENSOR_CONV_AVX512
  if constexpr (std::is_same<T, float>::value)
    if (plan.vector_kernels) return vector_weight_gradient(plan.forward, g, xp, gy, gw, workspace);
#endif
  plane_weight_gradient(plan.forward, g, xp, gy, gw, workspace, plan.forward_rows);
}

// ---------------------------------------------------------------------------------------
// 1-D and 2-D fields are stored as (x, 1, 1) and (x, y, 1): their trailing axes have extent 1,
// so the same memory is also a (1, 1, x) or (1, x, y) field. Every kernel above runs along
// contiguous z rows (im2col copies whole rows, the plane path's GEMMs and vector kernels
// stream them); a z row of one cell defeats them all. So a 1-D or 2-D convolution computes
// on the rotated view, where the field's rows lie along z: computed axis a is stored axis
// (a + ndims) % 3.

/// Axes rotated by `shift`: computed axis a holds stored axis (a + shift) % 3.
struct AxisRotation {
  int shift = 0;
  template <class Array>
  Array apply(const Array& stored) const {
    Array computed = stored;
    for (int a = 0; a < 3; ++a) computed[a] = stored[(a + shift) % 3];
    return computed;
  }
  Box apply(const Box& stored) const { return {apply(stored.lower), apply(stored.extent)}; }
  /// The same memory as a field with rotated spatial extents (no copy).
  template <class T>
  FieldView<T> apply(const FieldView<T>& stored) const {
    if (shift == 0 || stored.data() == nullptr) return stored;
    const std::array<Index, 3> e = apply(std::array<Index, 3>{
        Index(stored.extent(2)), Index(stored.extent(3)), Index(stored.extent(4))});
    return FieldView<T>(stored.data(), stored.extent(0), stored.extent(1), e[0], e[1], e[2]);
  }
};

/// The rotation of a convolution of `ndims` dimensions whose padded input is `padded`: none
/// for 3-D, or when an axis past ndims is not a single cell (then the rotated view would not
/// be the same memory).
template <class T>
AxisRotation rotation_for(int ndims, const ShardTensor<T>& padded) {
  for (int a = ndims; a < 3; ++a)
    if (padded.allocated_extent(a) != 1) return {};
  return {ndims % 3};
}

/// A convolution's shape with its axes rotated (see AxisRotation).
inline ConvShape rotated(const ConvShape& g, const AxisRotation& rotation) {
  ConvShape r = g;
  for (int a = 0; a < 3; ++a) {
    const int s = (a + rotation.shift) % 3;
    r.k[a] = g.k[s], r.s[a] = g.s[s], r.d[a] = g.d[s], r.base[a] = g.base[s], r.out[a] = g.out[s];
  }
  return r;
}

std::string layer_name(int ndims, const std::string& name) {
  return "Conv" + std::to_string(ndims) + "d '" + name + "'";
}

}  // namespace

template <class T>
Conv<T>::Conv(const Communicator& comm, ConvOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const int ndims = static_cast<int>(options_.kernel.size());
  SHARDTENSOR_REQUIRE(ndims >= 1 && ndims <= max_spatial_dims, "Conv '" + name + "'",
                      "kernel needs 1 to 3 sizes, got " << ndims);
  const std::string where = layer_name(ndims, name);
  geometry_.ndims = ndims;
  const std::vector<int> stride = impl::per_dim_option(options_.stride, ndims, 1, "stride", where);
  const std::vector<int> dilation =
      impl::per_dim_option(options_.dilation, ndims, 1, "dilation", where);
  const std::vector<int> padding =
      impl::per_dim_option(options_.padding, ndims, 0, "padding", where);
  for (int d = 0; d < ndims; ++d) {
    SHARDTENSOR_REQUIRE(
        options_.kernel[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 && padding[d] >= 0, where,
        "kernel " << options_.kernel[d] << ", stride " << stride[d] << ", dilation " << dilation[d]
                  << ", padding " << padding[d] << " along dim " << d);
    geometry_.kernel[d] = options_.kernel[d];
    geometry_.stride[d] = stride[d];
    geometry_.dilation[d] = dilation[d];
    geometry_.padding[d] = padding[d];
  }
  impl::check_channel_groups(options_.in_channels, options_.out_channels, options_.groups, where);
  double bound = 0;
  const std::vector<Index> shape = impl::kernel_weight_shape(
      options_.out_channels, options_.in_channels / options_.groups, options_.kernel, bound);
  const std::uint64_t seed = this->initialisation_seed(options_.seed, name);
  weight_ = this->register_parameter("weight", shape, bound, 2 * seed);
  if (options_.bias)
    bias_ = this->register_parameter("bias", {options_.out_channels}, bound, 2 * seed + 1);
  halo_ = std::make_shared<HaloPadding<T>>(comm_, geometry_, options_.padding_mode, T(0), where);
  workspace_->budget_bytes = options_.workspace_bytes;
}

template <class T>
Variable<T> Conv<T>::forward(const Variable<T>& input) {
  const std::string where = layer_name(geometry_.ndims, name_);
  SHARDTENSOR_REQUIRE(input.is_field(), where, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  SHARDTENSOR_REQUIRE(
      x.channels() == options_.in_channels, where,
      "input has " << x.channels() << " channels, the layer expects " << options_.in_channels);
  const Decomposition out_decomposition = geometry_.output_decomposition(x.decomposition(), where);

  // Post the halo exchange first; chunks of outputs whose windows read no exchanged ghost
  // cell are computed while the messages travel.
  const ShardTensor<T> padded = halo_->start(x);

  ShardTensor<T> y = ShardTensor<T>::uninitialized(out_decomposition, x.rank(), x.batch(),
                                                   options_.out_channels, {}, name_ + ".output");
  ConvShape shape{x.batch(),
                  options_.in_channels,
                  options_.out_channels,
                  options_.in_channels / options_.groups,
                  options_.out_channels / options_.groups,
                  {},
                  {},
                  {},
                  {},
                  {}};
  const auto base = window_base(geometry_, x, y);
  for (int d = 0; d < max_spatial_dims; ++d) {
    shape.k[d] = geometry_.kernel[d];
    shape.s[d] = geometry_.stride[d];
    shape.d[d] = geometry_.dilation[d];
    shape.out[d] = y.local_extent(d);
    shape.base[d] = base[d];
  }
  // From here on the kernels see the rotated axes (1-D and 2-D rows along z).
  const AxisRotation rotation = rotation_for(geometry_.ndims, padded);
  shape = rotated(shape, rotation);
  const FieldView<T> xp = rotation.apply(padded.view()), yv = rotation.apply(y.view());
  const ReplicatedView<T> no_bias;
  const ConvAlgorithm algorithm = options_.algorithm;
  const std::shared_ptr<impl::ConvWorkspace<T>> workspace = workspace_;
  const ReplicatedView<T> bias = bias_.defined() ? bias_.data() : no_bias;
  const Index padded_extent[3] = {Index(xp.extent(2)), Index(xp.extent(3)), Index(xp.extent(4))};
  const PlanePlan planes =
      algorithm == ConvAlgorithm::gemm
          ? plan_planes(shape, padded_extent, sizeof(T), workspace->budget_bytes,
                        options_.vector_kernels && vector_kernels_available<T>())
          : PlanePlan{};
  const auto forward_gemm = [&](const ChunkFilter& filter) {
    if (!planes.applies()) {
      conv_forward_gemm(shape, xp, weight_.data(), bias, yv, *workspace, filter);
      return;
    }
    const auto keep = [&](Index ox, Index y0, Index y1) {
      return filter(plane_reads(shape, ox, y0, y1));
    };
    correlate_planes(planes, planes.forward, planes.forward_rows, shape, xp, weight_.data(), false,
                     bias, yv, workspace->reserve(planes.values), keep);
  };
  if (algorithm == ConvAlgorithm::gemm && halo_overlap() && halo_->padding_ready_after_start()) {
    ChunkFilter interior{ChunkFilter::avoiding, {}};
    for (const Box& box : halo_->exchanged_boxes(padded))
      interior.boxes.push_back(rotation.apply(box));
    forward_gemm(interior);
    halo_->finish(padded);
    interior.keep = ChunkFilter::touching;
    forward_gemm(interior);
  } else {
    halo_->finish(padded);
    if (algorithm == ConvAlgorithm::gemm)
      forward_gemm(ChunkFilter{});
    else
      conv_forward(shape, xp, weight_.data(), bias, yv);
  }

  std::vector<std::shared_ptr<impl::Node<T>>> inputs{input.node(), weight_.node()};
  if (bias_.defined()) inputs.push_back(bias_.node());
  auto node = make_result_node<T>(name_, inputs);
  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    auto w_node = weight_.node();
    auto b_node = bias_.defined() ? bias_.node() : nullptr;
    const Communicator comm = comm_;
    const std::shared_ptr<HaloPadding<T>> halo = halo_;  // the graph may outlive the layer
    node->backward = [=](impl::Node<T>& self) {
      const FieldView<T> gy = rotation.apply(self.grad_field().view());
      const ReplicatedView<T> gw =
          w_node->requires_grad ? w_node->grad_partial(comm) : ReplicatedView<T>();
      const ReplicatedView<T> gb =
          b_node && b_node->requires_grad ? b_node->grad_partial(comm) : ReplicatedView<T>();
      ShardTensor<T> grad_padded;
      if (planes.applies()) {
        // Plane path: weight gradient first, then the input gradient, which writes every
        // padded cell. The padded input is dead by then (backward runs once per forward), so
        // its buffer takes the padded gradient: no allocation, no zero fill.
        T* scratch = workspace->reserve(planes.values);
        if (gw.extent(0) > 0) weight_gradient_planes(planes, shape, xp, gy, gw, scratch);
        conv_backward_parameters(shape, gy, xp, ReplicatedView<T>(), gb);  // bias only
        if (x_node->requires_grad) {
          grad_padded = padded;
          const auto keep_all = [](Index, Index, Index) { return true; };
          correlate_planes(planes, planes.data, planes.data_rows, shape, gy, w_node->data, true,
                           ReplicatedView<T>(), xp, scratch, keep_all);
        }
      } else {
        if (x_node->requires_grad)
          grad_padded = ShardTensor<T>(padded.decomposition(), padded.rank(), padded.batch(),
                                       padded.channels(), padded.ghosts(), name_ + ".padded_grad");
        const FieldView<T> gxp = rotation.apply(grad_padded.view());
        if (algorithm == ConvAlgorithm::gemm) {
          conv_backward_gemm(shape, gy, xp, w_node->data, gw, gxp, *workspace);
          conv_backward_parameters(shape, gy, xp, ReplicatedView<T>(), gb);  // bias only
        } else {
          conv_backward_parameters(shape, gy, xp, gw, gb);
          if (x_node->requires_grad) conv_backward_data(shape, gy, w_node->data, gxp);
        }
      }
      if (x_node->requires_grad) halo->backward(grad_padded, x_node->grad_field());
    };
  }
  return Variable<T>(node);
}

template class Conv<float>;
template class Conv<double>;

}  // namespace shardtensor
