#include "shardtensor/layers/conv.hpp"

#include "shardtensor/core/cell_index.hpp"

#include "shardtensor/layers/impl/conv_parameters.hpp"
#include "shardtensor/layers/impl/per_dim_option.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <cmath>
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
                for (Index oz = 0; oz < g.out[2]; ++oz) sum += gy(n, co, ox, oy, oz);
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
  bool operator()(const ConvShape& g, const Chunk& chunk) const {
    if (keep == all) return true;
    const Box reads = chunk_reads(g, chunk);
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
        if (!filter(g, chunk)) continue;
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
  halo_ = std::make_unique<HaloPadding<T>>(comm_, geometry_, options_.padding_mode, T(0), where);
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
  const ReplicatedView<T> no_bias;
  const ConvAlgorithm algorithm = options_.algorithm;
  const std::shared_ptr<impl::ConvWorkspace<T>> workspace = workspace_;
  const ReplicatedView<T> bias = bias_.defined() ? bias_.data() : no_bias;
  if (algorithm == ConvAlgorithm::gemm && halo_->padding_ready_after_start()) {
    ChunkFilter interior{ChunkFilter::avoiding, halo_->exchanged_boxes(padded)};
    conv_forward_gemm(shape, padded.view(), weight_.data(), bias, y.view(), *workspace, interior);
    halo_->finish(padded);
    interior.keep = ChunkFilter::touching;
    conv_forward_gemm(shape, padded.view(), weight_.data(), bias, y.view(), *workspace, interior);
  } else {
    halo_->finish(padded);
    if (algorithm == ConvAlgorithm::gemm)
      conv_forward_gemm(shape, padded.view(), weight_.data(), bias, y.view(), *workspace);
    else
      conv_forward(shape, padded.view(), weight_.data(), bias, y.view());
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
    HaloPadding<T>* halo = halo_.get();
    node->backward = [=](impl::Node<T>& self) {
      const FieldView<T> gy = self.grad_field().view();
      const ReplicatedView<T> gw =
          w_node->requires_grad ? w_node->grad_partial(comm) : ReplicatedView<T>();
      const ReplicatedView<T> gb =
          b_node && b_node->requires_grad ? b_node->grad_partial(comm) : ReplicatedView<T>();
      ShardTensor<T> grad_padded;
      if (x_node->requires_grad)
        grad_padded = ShardTensor<T>(padded.decomposition(), padded.rank(), padded.batch(),
                                     padded.channels(), padded.ghosts(), name_ + ".padded_grad");
      if (algorithm == ConvAlgorithm::gemm) {
        conv_backward_gemm(shape, gy, padded.view(), w_node->data, gw, grad_padded.view(),
                           *workspace);
        conv_backward_parameters(shape, gy, padded.view(), ReplicatedView<T>(), gb);  // bias only
      } else {
        conv_backward_parameters(shape, gy, padded.view(), gw, gb);
        if (x_node->requires_grad) conv_backward_data(shape, gy, w_node->data, grad_padded.view());
      }
      if (x_node->requires_grad) halo->backward(grad_padded, x_node->grad_field());
    };
  }
  return Variable<T>(node);
}

template class Conv<float>;
template class Conv<double>;

}  // namespace shardtensor
