#include "shardtensor/nn/pooling.hpp"

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"

#include "shardtensor/nn/impl/per_dim_option.hpp"

#include <limits>

namespace shardtensor {

namespace {

/// Index arithmetic shared by the pooling kernels.
struct PoolShape {
  Index channels;
  Index k[3], s[3], d[3];
  Index base[3];          // padded index of the first local output's window start
  Index out[3];           // local output extents
  Index padded[3];        // padded buffer extents
  Index first_global[3];  // global index of the first local output's window start
  Index global[3];        // global field extents
  bool count_include_pad;

  KOKKOS_INLINE_FUNCTION Index padded_flat(Index x, Index y, Index z) const {
    return (x * padded[1] + y) * padded[2] + z;
  }
  /// Cells of output o's window that average pooling divides by.
  KOKKOS_INLINE_FUNCTION Index divisor(Index ox, Index oy, Index oz) const {
    if (count_include_pad) return k[0] * k[1] * k[2];
    const Index o[3] = {ox, oy, oz};
    Index count = 1;
    for (int a = 0; a < 3; ++a) {
      const Index start = first_global[a] + o[a] * s[a];
      const Index lo = start < 0 ? 0 : start;
      const Index hi = start + k[a] > global[a] ? global[a] : start + k[a];
      count *= hi - lo;
    }
    return count;
  }
};

template <class T>
void pool_forward(const PoolShape& g, PoolKind kind, const FieldView<T>& xp, const FieldView<T>& y,
                  const Kokkos::View<Index*****, Kokkos::LayoutRight, DefaultMemorySpace>& argmax) {
  const Index extents[3] = {g.out[0], g.out[1], g.out[2]};
  for_each_cell_by_lines(
      "Pool::forward", y.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ox, const Index oy, const Index oz) {
        const Index x0 = g.base[0] + ox * g.s[0], y0 = g.base[1] + oy * g.s[1],
                    z0 = g.base[2] + oz * g.s[2];
        if (kind == PoolKind::max) {
          T best = -math::infinity<T>();
          Index where = g.padded_flat(x0, y0, z0);
          for (Index a = 0; a < g.k[0]; ++a)
            for (Index b = 0; b < g.k[1]; ++b)
              for (Index e = 0; e < g.k[2]; ++e) {
                const Index ix = x0 + a * g.d[0], iy = y0 + b * g.d[1], iz = z0 + e * g.d[2];
                const T v = xp(n, c, ix, iy, iz);
                if (v > best) {  // the first maximum wins, as in PyTorch
                  best = v;
                  where = g.padded_flat(ix, iy, iz);
                }
              }
          y(n, c, ox, oy, oz) = best;
          argmax(n, c, ox, oy, oz) = where;
        } else {
          T sum = 0;
          for (Index a = 0; a < g.k[0]; ++a)
            for (Index b = 0; b < g.k[1]; ++b)
              for (Index e = 0; e < g.k[2]; ++e) sum += xp(n, c, x0 + a, y0 + b, z0 + e);
          y(n, c, ox, oy, oz) = sum / T(g.divisor(ox, oy, oz));
        }
      });
}

/// Gradient of the padded input (zero on entry): each cell gathers from the outputs whose
/// windows cover it.
template <class T>
void pool_backward(const PoolShape& g, PoolKind kind, const FieldView<T>& gy,
                   const Kokkos::View<Index*****, Kokkos::LayoutRight, DefaultMemorySpace>& argmax,
                   const FieldView<T>& gxp) {
  bool disjoint = true;  // every padded cell lies in at most one window
  for (int d = 0; d < 3; ++d) disjoint = disjoint && g.s[d] >= (g.k[d] - 1) * g.d[d] + 1;
  if (kind == PoolKind::max && disjoint) {
    // Scatter each output's gradient to its window's maximum (gxp is zero on entry): the
    // gather below gives the same values, but tests every (cell, tap) pair with divisions.
    const Index rows = static_cast<Index>(gy.extent(0)) * g.channels * g.out[0] * g.out[1];
    Kokkos::parallel_for(
        "Pool::backward_scatter", rows, KOKKOS_LAMBDA(const Index row) {
          const CellIndex r = unflatten(row, g.channels, g.out[0], g.out[1], 1);
          T* const cells = &gxp(r.n, r.c, 0, 0, 0);  // indexed by padded_flat
          for (Index oz = 0; oz < g.out[2]; ++oz)
            cells[argmax(r.n, r.c, r.x, r.y, oz)] += gy(r.n, r.c, r.x, r.y, oz);
        });
    return;
  }
  const Index extents[3] = {g.padded[0], g.padded[1], g.padded[2]};
  if (kind == PoolKind::average && disjoint) {
    // Each padded cell lies in at most one window: a table per axis names it (the output, or
    // -1), and the cell takes that output's share (the same single term the gather below would
    // add to 0).
    const Index first[3] = {0, g.padded[0], g.padded[0] + g.padded[1]};
    const Kokkos::View<Index*, DefaultMemorySpace> window(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Pool::windows"),
        g.padded[0] + g.padded[1] + g.padded[2]);
    Kokkos::parallel_for(
        "Pool::windows", window.extent(0), KOKKOS_LAMBDA(const Index e) {
          const int a = e < first[1] ? 0 : e < first[2] ? 1 : 2;
          const Index t = e - first[a] - g.base[a];
          const Index o = t >= 0 ? t / g.s[a] : -1, tap = t - o * g.s[a];
          const bool inside = t >= 0 && o < g.out[a] && tap % g.d[a] == 0 && tap / g.d[a] < g.k[a];
          window(e) = inside ? o : -1;
        });
    for_each_cell_by_lines(
        "Pool::backward_average", gxp.extent(0), g.channels, extents,
        KOKKOS_LAMBDA(const Index n, const Index c, const Index ix, const Index iy,
                      const Index iz) {
          const Index ox = window(first[0] + ix), oy = window(first[1] + iy),
                      oz = window(first[2] + iz);
          gxp(n, c, ix, iy, iz) = ox >= 0 && oy >= 0 && oz >= 0
                                      ? T(0) + gy(n, c, ox, oy, oz) / T(g.divisor(ox, oy, oz))
                                      : T(0);
        });
    return;
  }
  for_each_cell_by_lines(
      "Pool::backward", gxp.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ix, const Index iy, const Index iz) {
        const Index self = g.padded_flat(ix, iy, iz);
        T sum = 0;
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ox = window_output_of(ix, g.base[0], a, g.s[0], g.d[0], g.out[0]);
          if (ox < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index oy = window_output_of(iy, g.base[1], b, g.s[1], g.d[1], g.out[1]);
            if (oy < 0) continue;
            for (Index e = 0; e < g.k[2]; ++e) {
              const Index oz = window_output_of(iz, g.base[2], e, g.s[2], g.d[2], g.out[2]);
              if (oz < 0) continue;
              if (kind == PoolKind::max) {
                if (argmax(n, c, ox, oy, oz) == self) sum += gy(n, c, ox, oy, oz);
              } else {
                sum += gy(n, c, ox, oy, oz) / T(g.divisor(ox, oy, oz));
              }
            }
          }
        }
        gxp(n, c, ix, iy, iz) = sum;
      });
}

}  // namespace

template <class T>
Pool<T>::Pool(const Communicator& comm, PoolOptions options, const std::string& name)
    : comm_(comm), options_(std::move(options)), name_(name) {
  const int ndims = static_cast<int>(options_.window.size());
  const std::string kind = options_.kind == PoolKind::max ? "MaxPool" : "AvgPool";
  SHARDTENSOR_REQUIRE(ndims >= 1 && ndims <= max_spatial_dims, kind + " '" + name + "'",
                      "window needs 1 to 3 sizes, got " << ndims);
  const std::string where = kind + std::to_string(ndims) + "d '" + name + "'";
  const std::vector<int> stride =
      impl::per_dim_option(options_.stride, ndims, options_.window, "stride", where);
  const std::vector<int> padding =
      impl::per_dim_option(options_.padding, ndims, std::vector<int>(ndims, 0), "padding", where);
  const std::vector<int> dilation =
      impl::per_dim_option(options_.dilation, ndims, std::vector<int>(ndims, 1), "dilation", where);
  geometry_.ndims = ndims;
  for (int d = 0; d < ndims; ++d) {
    SHARDTENSOR_REQUIRE(
        options_.window[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1 && padding[d] >= 0, where,
        "window " << options_.window[d] << ", stride " << stride[d] << ", dilation " << dilation[d]
                  << ", padding " << padding[d] << " along dim " << d);
    SHARDTENSOR_REQUIRE(2 * padding[d] <= options_.window[d], where,
                        "padding " << padding[d] << " along dim " << d
                                   << " exceeds half the window " << options_.window[d]);
    SHARDTENSOR_REQUIRE(
        options_.kind == PoolKind::max || dilation[d] == 1, where,
        "average pooling has no dilation, got " << dilation[d] << " along dim " << d);
    geometry_.kernel[d] = options_.window[d];
    geometry_.stride[d] = stride[d];
    geometry_.dilation[d] = dilation[d];
    geometry_.padding[d] = padding[d];
  }
  SHARDTENSOR_REQUIRE(
      options_.padding_mode == PaddingMode::zeros || options_.padding_mode == PaddingMode::periodic,
      where, "padding mode " << to_string(options_.padding_mode) << " is not supported by pooling");
  const T constant = options_.kind == PoolKind::max ? -math::infinity<T>() : T(0);
  halo_ =
      std::make_shared<HaloPadding<T>>(comm_, geometry_, options_.padding_mode, constant, where);
}

template <class T>
Variable<T> Pool<T>::forward(const Variable<T>& input) {
  const std::string where = (options_.kind == PoolKind::max ? "MaxPool" : "AvgPool") +
                            std::to_string(geometry_.ndims) + "d '" + name_ + "'";
  SHARDTENSOR_REQUIRE(input.is_field(), where, "input '" << input.name() << "' is not a field");
  const ShardTensor<T>& x = input.value();
  const Decomposition out_decomposition = geometry_.output_decomposition(x.decomposition(), where);
  const ShardTensor<T> padded = halo_->forward(x);
  ShardTensor<T> y = ShardTensor<T>::uninitialized(out_decomposition, x.rank(), x.batch(),
                                                   x.channels(), {}, name_ + ".output");
  Kokkos::View<Index*****, Kokkos::LayoutRight, DefaultMemorySpace> argmax;
  if (options_.kind == PoolKind::max)
    argmax = decltype(argmax)(name_ + ".argmax", x.batch(), x.channels(), y.local_extent(0),
                              y.local_extent(1), y.local_extent(2));
  PoolShape shape{};
  shape.channels = x.channels();
  shape.count_include_pad =
      options_.count_include_pad || options_.padding_mode == PaddingMode::periodic;
  const auto base = window_base(geometry_, x, y);
  for (int d = 0; d < max_spatial_dims; ++d) {
    shape.k[d] = geometry_.kernel[d];
    shape.s[d] = geometry_.stride[d];
    shape.d[d] = geometry_.dilation[d];
    shape.base[d] = base[d];
    shape.out[d] = y.local_extent(d);
    shape.padded[d] = padded.allocated_extent(d);
    shape.first_global[d] = y.global_box().lower[d] * geometry_.stride[d] - geometry_.padding[d];
    shape.global[d] = x.decomposition().global_extent(d);
  }
  pool_forward(shape, options_.kind, padded.view(), y.view(), argmax);

  auto node = make_result_node<T>(name_, {input.node()});
  node->field = y;
  if (node->requires_grad) {
    auto x_node = input.node();
    const PoolKind kind = options_.kind;
    const std::shared_ptr<HaloPadding<T>> halo = halo_;  // the graph may outlive the layer
    const std::string label = name_ + ".padded_grad";
    node->backward = [=](impl::Node<T>& self) {
      ShardTensor<T> grad_padded(padded.decomposition(), padded.rank(), padded.batch(),
                                 padded.channels(), padded.ghosts(), label);
      pool_backward(shape, kind, self.grad_field().view(), argmax, grad_padded.view());
      halo->backward(grad_padded, x_node->grad_field());
    };
  }
  return Variable<T>(node);
}

template class Pool<float>;
template class Pool<double>;

}  // namespace shardtensor
