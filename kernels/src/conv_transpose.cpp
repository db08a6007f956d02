#include "shardtensor/kernels/conv_transpose.hpp"

#include "conv_transpose_gemm.hpp"  // private to kernels/src

#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/kernels/channel_sums.hpp"

namespace shardtensor::kernels {

bool conv_transpose_rounds_on_read(const ConvTransposeShape& g) {
  return conv_transpose_gemm_applies(g);
}

template <class T>
void conv_transpose_forward(const ExecutionSpace& space, const ConvTransposeShape& g,
                            const FieldView<T>& xp, const ReplicatedView<T>& w,
                            const ReplicatedView<T>& bias, const FieldView<T>& y,
                            const ConvTransposeOutput& at) {
  if (conv_transpose_gemm_applies(g))
    return conv_transpose_gemm_forward(space, g, xp, w, bias, y, at);
  SHARDTENSOR_REQUIRE(!g.round_source, "conv_transpose_forward",
                      "an input rounded as it is read needs the GEMM path (kernel = stride)");
  const bool has_bias = bias.extent(0) > 0;
  const Index rows = g.batch * g.out_channels * g.out[0] * g.out[1];
  Kokkos::parallel_for(
      "ConvTranspose::forward", kernel_range(space, rows), KOKKOS_LAMBDA(const Index row) {
        const CellIndex r = unflatten(row, g.out_channels, g.out[0], g.out[1], 1);
        const Index n = r.n, co = r.c, ox = r.x, oy = r.y;
        const Index group = co / g.out_per_group, cog = co % g.out_per_group;
        const T start = has_bias ? bias(co) : T(0);
        // This row's outputs in y: oz at line[oz].
        T* const line = &y(n, at.channel + co, at.lower[0] + ox, at.lower[1] + oy, at.lower[2]);
        for (Index oz = 0; oz < g.out[2]; ++oz) line[oz] = start;
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ix = g.input_of(0, ox, a);
          if (ix < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index iy = g.input_of(1, oy, b);
            if (iy < 0) continue;
            for (Index c = 0; c < g.k[2]; ++c) {
              const Index z0 = g.first_input(2, c), z1 = g.end_input(2, c);
              const Index shift = g.offset(2, c), sz = g.s[2];
              for (Index cig = 0; cig < g.in_per_group; ++cig) {
                const Index ci = group * g.in_per_group + cig;
                const T weight = w(g.weight_index(ci, cog, a, b, c));
                for (Index iz = z0; iz < z1; ++iz)
                  line[iz * sz + shift] += weight * xp(n, ci, ix, iy, iz);
              }
            }
          }
        }
        if (at.bf16)
          for (Index oz = 0; oz < g.out[2]; ++oz) line[oz] = T(round_to_bfloat16(float(line[oz])));
      });
}

template <class T>
void conv_transpose_backward_data(const ExecutionSpace& space, const ConvTransposeShape& g,
                                  const FieldView<T>& gy, const ReplicatedView<T>& w,
                                  const FieldView<T>& gxp) {
  const Index rows = g.batch * g.in_channels * g.padded[0] * g.padded[1];
  Kokkos::parallel_for(
      "ConvTranspose::backward_data", kernel_range(space, rows), KOKKOS_LAMBDA(const Index row) {
        const CellIndex r = unflatten(row, g.in_channels, g.padded[0], g.padded[1], 1);
        const Index n = r.n, ci = r.c, ix = r.x, iy = r.y;
        const Index group = ci / g.in_per_group;
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ox = g.output_of(0, ix, a);
          if (ox < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index oy = g.output_of(1, iy, b);
            if (oy < 0) continue;
            for (Index c = 0; c < g.k[2]; ++c) {
              const Index z0 = g.first_input(2, c), z1 = g.end_input(2, c);
              const Index shift = g.offset(2, c), sz = g.s[2];
              for (Index cog = 0; cog < g.out_per_group; ++cog) {
                const Index co = group * g.out_per_group + cog;
                const T weight = w(g.weight_index(ci, cog, a, b, c));
                for (Index iz = z0; iz < z1; ++iz)
                  gxp(n, ci, ix, iy, iz) += weight * gy(n, co, ox, oy, iz * sz + shift);
              }
            }
          }
        }
      });
}

template <class T>
void conv_transpose_backward_parameters(const ExecutionSpace& space, const ConvTransposeShape& g,
                                        const FieldView<T>& gy, const FieldView<T>& xp,
                                        const ReplicatedView<T>& gw, const ReplicatedView<T>& gb) {
  if (gw.extent(0) > 0) {
    // One team per weight (a thread per weight walked 2M cells alone, uncoalesced: 14 ms per
    // call at 128^3 on an H100), its threads over the input rows (n, x, y), vector lanes
    // along z. A host team is one thread: the same order as a plain loop.
    using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
    Kokkos::parallel_for(
        "ConvTranspose::backward_weight",
        Policy(space, static_cast<int>(gw.extent(0)), Kokkos::AUTO, Kokkos::AUTO),
        KOKKOS_LAMBDA(const Policy::member_type& team) {
          const Index flat = team.league_rank();
          const CellIndex cell = unflatten(flat, g.out_per_group, g.k[0], g.k[1], g.k[2]);
          const Index ci = cell.n, cog = cell.c, a = cell.x, b = cell.y, c = cell.z;
          const Index co = (ci / g.in_per_group) * g.out_per_group + cog;
          const Index x0 = g.first_input(0, a), x1 = g.end_input(0, a);
          const Index y0 = g.first_input(1, b), y1 = g.end_input(1, b);
          const Index z0 = g.first_input(2, c), z1 = max_index(g.end_input(2, c), z0);
          const Index shift = g.offset(2, c), sz = g.s[2];
          const Index nx = max_index(x1 - x0, 0), ny = max_index(y1 - y0, 0);
          double sum = 0;  // many terms: accumulate in double
          // Each (owned output, tap) pair has exactly one input cell: walk those inputs.
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, g.batch * nx * ny),
              [&](const Index row, double& acc) {
                const Index n = row / (nx * ny), ix = x0 + (row / ny) % nx, iy = y0 + row % ny;
                const Index ox = ix * g.s[0] + g.offset(0, a), oy = iy * g.s[1] + g.offset(1, b);
                double row_sum = 0;
                Kokkos::parallel_reduce(
                    Kokkos::ThreadVectorRange(team, z0, z1),
                    [&](const Index iz, double& partial) {
                      partial += double(gy(n, co, ox, oy, iz * sz + shift)) *
                                 double(xp(n, ci, ix, iy, iz));
                    },
                    row_sum);
                acc += row_sum;
              },
              sum);
          Kokkos::single(Kokkos::PerTeam(team), [&]() { gw(flat) += static_cast<T>(sum); });
        });
  }
  if (gb.extent(0) > 0)
    add_channel_sums(space, "ConvTranspose::backward_bias", gy, g.batch, g.out, gb);
}

template <class T>
void conv_transpose_backward(const ExecutionSpace& space, const ConvTransposeShape& g,
                             const FieldView<T>& gy, const FieldView<T>& xp,
                             const ReplicatedView<T>& w, const ReplicatedView<T>& gw,
                             const ReplicatedView<T>& gb, const FieldView<T>& gxp) {
  if (conv_transpose_gemm_applies(g)) {
    // One gather of gy into tap order serves both GEMMs.
    conv_transpose_gemm_backward(space, g, gy, xp, w, gw, gxp);
    conv_transpose_backward_parameters(space, g, gy, xp, ReplicatedView<T>(), gb);  // bias
    return;
  }
  SHARDTENSOR_REQUIRE(!g.round_source, "conv_transpose_backward",
                      "an input rounded as it is read needs the GEMM path (kernel = stride)");
  conv_transpose_backward_parameters(space, g, gy, xp, gw, gb);
  if (gxp.extent(0) > 0) conv_transpose_backward_data(space, g, gy, w, gxp);
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                \
  template void conv_transpose_backward(const ExecutionSpace&, const ConvTransposeShape&,         \
                                        const FieldView<T>&, const FieldView<T>&,                 \
                                        const ReplicatedView<T>&, const ReplicatedView<T>&,       \
                                        const ReplicatedView<T>&, const FieldView<T>&);           \
  template void conv_transpose_forward(const ExecutionSpace&, const ConvTransposeShape&,          \
                                       const FieldView<T>&, const ReplicatedView<T>&,             \
                                       const ReplicatedView<T>&, const FieldView<T>&,             \
                                       const ConvTransposeOutput&);                               \
  template void conv_transpose_backward_data(const ExecutionSpace&, const ConvTransposeShape&,    \
                                             const FieldView<T>&, const ReplicatedView<T>&,       \
                                             const FieldView<T>&);                                \
  template void conv_transpose_backward_parameters(                                               \
      const ExecutionSpace&, const ConvTransposeShape&, const FieldView<T>&, const FieldView<T>&, \
      const ReplicatedView<T>&, const ReplicatedView<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
