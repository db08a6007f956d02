#include <algorithm>
#include "blas.hpp"  // kernels/backends: private to kernels

#include "shardtensor/kernels/conv.hpp"
#include "shardtensor/kernels/window_index.hpp"

namespace shardtensor::kernels {

namespace {

// ---------------------------------------------------------------------------------------
// The fast path: blocked im2col + GEMM. Output cells are processed in chunks of whole z rows
// (consecutive (x, y) pairs); a chunk's column matrix (taps x cells) lives in a workspace of
// bounded size, so memory does not grow with the field. Per sample n, group g and chunk:
//   forward:  Y[co, p]   = W_g[co, k] . X[k, p]          (+ bias)
//   backward: dW_g      += dY[co, p] . X[k, p]^T
//             dX[k, p]   = W_g^T . dY, then col2im gathers dX into the padded gradient.

/// Output z rows [first, last) of one chunk, row = ox * (output extent in y) + oy.
struct Chunk {
  Index first, last;
  KOKKOS_INLINE_FUNCTION Index rows() const { return last - first; }
};

/// im2col's copies for tap row `row` (cig, a, b, c) of group g and the chunk's z rows
/// [z_first, z_last).
template <class T>
KOKKOS_INLINE_FUNCTION void im2col_rows(const ConvShape& g, const FieldView<T>& xp, Index n,
                                        Index group, const Chunk& chunk,
                                        const UnmanagedMatrix<T>& columns, Index row, Index z_first,
                                        Index z_last) {
  Index t = row;
  const Index c = t % g.k[2];
  t /= g.k[2];
  const Index b = t % g.k[1];
  t /= g.k[1];
  const Index a = t % g.k[0];
  const Index ci = group * g.in_per_group + t / g.k[0];
  Index ox = (chunk.first + z_first) / g.out[1], oy = (chunk.first + z_first) % g.out[1];
  const Index z0 = g.base[2] + c * g.d[2];
  for (Index z_row = z_first; z_row < z_last; ++z_row) {
    const Index x = g.base[0] + ox * g.s[0] + a * g.d[0];
    const Index y = g.base[1] + oy * g.s[1] + b * g.d[1];
    T* out = &columns(row, z_row * g.out[2]);
    if (g.s[2] == 1) {
      const T* in = &xp(n, ci, x, y, z0);
      for (Index oz = 0; oz < g.out[2]; ++oz) out[oz] = in[oz];
    } else {
      for (Index oz = 0; oz < g.out[2]; ++oz) out[oz] = xp(n, ci, x, y, z0 + oz * g.s[2]);
    }
    if (++oy == g.out[1]) oy = 0, ++ox;
  }
}

/// columns(r, p) = padded input under tap r of output p, for the chunk's outputs of group g.
template <class T>
void im2col(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& xp, Index n,
            Index group, const Chunk& chunk, const UnmanagedMatrix<T>& columns) {
  const Index rows = g.in_per_group * g.k[0] * g.k[1] * g.k[2];
  if constexpr (kernels_run_on_host) {
    // A work item per tap row, walking the chunk's z rows: on a small field's short rows the
    // index arithmetic per (tap, z row) cost more than the copies and the GEMM together.
    Kokkos::parallel_for(
        "Conv::im2col", kernel_range(space, rows), KOKKOS_LAMBDA(const Index row) {
          im2col_rows(g, xp, n, group, chunk, columns, row, 0, chunk.rows());
        });
  } else {
    Kokkos::parallel_for(
        "Conv::im2col", kernel_range(space, rows * chunk.rows()), KOKKOS_LAMBDA(const Index flat) {
          const Index z_row = flat % chunk.rows();
          im2col_rows(g, xp, n, group, chunk, columns, flat / chunk.rows(), z_row, z_row + 1);
        });
  }
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
void col2im(const ExecutionSpace& space, const ConvShape& g, const UnmanagedMatrix<T>& columns,
            Index n, Index group, const Chunk& chunk, const FieldView<T>& gxp) {
  // Input x-planes that the chunk's windows reach.
  const Index ix0 = g.base[0] + (chunk.first / g.out[1]) * g.s[0];
  const Index ix1 = g.base[0] + ((chunk.last - 1) / g.out[1]) * g.s[0] + (g.k[0] - 1) * g.d[0] + 1;
  const Index py = gxp.extent(3), pz = gxp.extent(4);
  Kokkos::parallel_for(
      "Conv::col2im", kernel_range(space, g.in_per_group * (ix1 - ix0) * py),
      KOKKOS_LAMBDA(const Index flat) {
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
void copy_chunk(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& field, Index n,
                Index group, const Chunk& chunk, const UnmanagedMatrix<T>& matrix, bool to_field,
                const ReplicatedView<T>& bias) {
  const bool has_bias = bias.extent(0) > 0;
  Kokkos::parallel_for(
      "Conv::copy_chunk", kernel_range(space, g.out_per_group * chunk.rows()),
      KOKKOS_LAMBDA(const Index flat) {
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

}  // namespace

template <class T>
void conv_gemm_forward(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& xp,
                       const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
                       const FieldView<T>& y, ConvWorkspace<T>& workspace,
                       const ChunkFilter& filter) {
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
        im2col(space, g, xp, n, group, chunk, columns);
        gemm(space, "N", "N", T(1), weights, columns, T(0), out);
        copy_chunk(space, g, y, n, group, chunk, out, /*to_field=*/true, bias);
      }
    }
}

template <class T>
void conv_gemm_backward(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& gy,
                        const FieldView<T>& xp, const ReplicatedView<T>& w,
                        const ReplicatedView<T>& gw, const FieldView<T>& gxp,
                        ConvWorkspace<T>& workspace) {
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
        copy_chunk(space, g, gy, n, group, chunk, grad_out, /*to_field=*/false, no_bias);
        if (gw.extent(0) > 0) {
          im2col(space, g, xp, n, group, chunk, columns);
          gemm(space, "N", "T", T(1), grad_out, columns, T(1), weight_matrix(g, gw, group));
        }
        if (gxp.span() > 0) {
          gemm(space, "T", "N", T(1), weights, grad_out, T(0), columns);
          if (g.s[0] == 1 && g.s[1] == 1 && g.s[2] == 1)
            col2im<true>(space, g, columns, n, group, chunk, gxp);
          else
            col2im<false>(space, g, columns, n, group, chunk, gxp);
        }
      }
    }
}

#define SHARDTENSOR_INSTANTIATE(T)                                                              \
  template void conv_gemm_forward(const ExecutionSpace&, const ConvShape&, const FieldView<T>&, \
                                  const ReplicatedView<T>&, const ReplicatedView<T>&,           \
                                  const FieldView<T>&, ConvWorkspace<T>&, const ChunkFilter&);  \
  template void conv_gemm_backward(                                                             \
      const ExecutionSpace&, const ConvShape&, const FieldView<T>&, const FieldView<T>&,        \
      const ReplicatedView<T>&, const ReplicatedView<T>&, const FieldView<T>&, ConvWorkspace<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
