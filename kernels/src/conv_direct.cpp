#include "shardtensor/kernels/conv.hpp"

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/kernels/channel_sums.hpp"
#include "shardtensor/kernels/window_index.hpp"

// The direct loops: one thread per output (forward), padded input cell (data gradient) or
// weight (weight gradient); every written value is written by one thread (race-free).

namespace shardtensor::kernels {

template <class T>
void conv_direct_forward(const ExecutionSpace& space, const ConvShape& g, const FieldView<T>& xp,
                         const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
                         const FieldView<T>& y) {
  const bool has_bias = bias.extent(0) > 0;
  const Index total = g.batch * g.out_channels * g.out[0] * g.out[1] * g.out[2];
  Kokkos::parallel_for(
      "Conv::forward", kernel_range(space, total), KOKKOS_LAMBDA(const Index flat) {
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

template <class T>
void conv_direct_backward_data(const ExecutionSpace& space, const ConvShape& g,
                               const FieldView<T>& gy, const ReplicatedView<T>& w,
                               const FieldView<T>& gxp) {
  const Index px = gxp.extent(2), py = gxp.extent(3), pz = gxp.extent(4);
  const Index total = g.batch * g.in_channels * px * py * pz;
  Kokkos::parallel_for(
      "Conv::backward_data", kernel_range(space, total), KOKKOS_LAMBDA(const Index flat) {
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

template <class T>
void conv_backward_parameters(const ExecutionSpace& space, const ConvShape& g,
                              const FieldView<T>& gy, const FieldView<T>& xp,
                              const ReplicatedView<T>& gw, const ReplicatedView<T>& gb) {
  if (gw.extent(0) > 0) {
    Kokkos::parallel_for(
        "Conv::backward_weight", kernel_range(space, static_cast<Index>(gw.extent(0))),
        KOKKOS_LAMBDA(const Index flat) {
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
  if (gb.extent(0) > 0) add_channel_sums(space, "Conv::backward_bias", gy, g.batch, g.out, gb);
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                \
  template void conv_direct_forward(const ExecutionSpace&, const ConvShape&, const FieldView<T>&, \
                                    const ReplicatedView<T>&, const ReplicatedView<T>&,           \
                                    const FieldView<T>&);                                         \
  template void conv_direct_backward_data(const ExecutionSpace&, const ConvShape&,                \
                                          const FieldView<T>&, const ReplicatedView<T>&,          \
                                          const FieldView<T>&);                                   \
  template void conv_backward_parameters(const ExecutionSpace&, const ConvShape&,                 \
                                         const FieldView<T>&, const FieldView<T>&,                \
                                         const ReplicatedView<T>&, const ReplicatedView<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
