// The transposed convolution whose taps tile the output (kernel = stride, no dilation, no
// padding, one group: the U-Net's upsampling) as GEMMs. Each output cell then takes exactly
// one input cell and one tap, so with the weights as a Cin x (Cout T) matrix W (their own
// layout, T taps) and one sample's input as a Cin x P matrix X (P cells):
//   forward           G = W^T X,  then each G row (co, tap) lands on its outputs (+ bias);
//   input gradient    dX = W G,   with G gathered from the output gradient;
//   weight gradient   dW += X G^T.
// G is one sample's output in tap-major order: a transient of the output's size.

#include "conv_transpose_gemm.hpp"
#include "blas.hpp"  // kernels/backends: private to kernels

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels {

bool conv_transpose_gemm_applies(const ConvTransposeShape& g) {
  if (g.in_per_group != g.in_channels) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (g.k[dim] != g.s[dim] || g.d[dim] != 1 || g.p[dim] != 0) return false;
    // The whole padded buffer is the input (X contiguous), and its outputs are exactly the
    // owned ones, for every tap.
    for (Index t = 0; t < g.k[dim]; ++t)
      if (g.first_input(dim, t) != 0 || g.end_input(dim, t) != g.padded[dim] ||
          g.offset(dim, t) != t)
        return false;
    if (g.out[dim] != g.padded[dim] * g.s[dim]) return false;
  }
  return true;
}

namespace {

/// Between G (rows co * T + tap, columns the input cells) and one sample's output field:
/// to_field writes the outputs (plus bias), else gathers them into G. One work item per
/// (co, input x, input y) row of taps.
template <class T>
void move_taps(const ExecutionSpace& space, const ConvTransposeShape& g, Index n, T* taps,
               const FieldView<T>& y, const ReplicatedView<T>& bias, bool to_field) {
  const Index nx = g.padded[0], ny = g.padded[1], nz = g.padded[2];
  const Index cells = nx * ny * nz, tap_count = g.k[0] * g.k[1] * g.k[2];
  const bool has_bias = bias.extent(0) > 0;
  const Index rows = g.out_channels * nx * ny;
  Kokkos::parallel_for(
      to_field ? "ConvTranspose::gemm_scatter" : "ConvTranspose::gemm_gather",
      kernel_range(space, rows), KOKKOS_LAMBDA(const Index row) {
        const CellIndex r = unflatten(row, nx, ny, 1, 1);  // (co, ix, iy)
        const Index co = r.n, ix = r.c, iy = r.x;
        const T shift = has_bias && to_field ? bias(co) : T(0);
        Index tap = 0;
        for (Index a = 0; a < g.k[0]; ++a)
          for (Index b = 0; b < g.k[1]; ++b)
            for (Index c = 0; c < g.k[2]; ++c, ++tap) {
              T* const line = taps + (co * tap_count + tap) * cells + (ix * ny + iy) * nz;
              T* const out = &y(n, co, ix * g.s[0] + a, iy * g.s[1] + b, c);
              const Index step = g.s[2];
              if (to_field)
                for (Index iz = 0; iz < nz; ++iz) out[iz * step] = line[iz] + shift;
              else
                for (Index iz = 0; iz < nz; ++iz) line[iz] = out[iz * step];
            }
      });
}

template <class T>
Kokkos::View<T*, DefaultMemorySpace> tap_buffer(const ConvTransposeShape& g) {
  const Index cells = g.padded[0] * g.padded[1] * g.padded[2];
  return Kokkos::View<T*, DefaultMemorySpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "ConvTranspose::taps"),
      g.out_channels * g.k[0] * g.k[1] * g.k[2] * cells);
}

}  // namespace

template <class T>
void conv_transpose_gemm_forward(const ExecutionSpace& space, const ConvTransposeShape& g,
                                 const FieldView<T>& xp, const ReplicatedView<T>& w,
                                 const ReplicatedView<T>& bias, const FieldView<T>& y) {
  const Index cells = g.padded[0] * g.padded[1] * g.padded[2];
  const Index columns = g.out_channels * g.k[0] * g.k[1] * g.k[2];
  const auto buffer = tap_buffer<T>(g);
  const UnmanagedMatrix<T> weights(w.data(), g.in_channels, columns);
  const UnmanagedMatrix<T> taps(buffer.data(), columns, cells);
  for (Index n = 0; n < g.batch; ++n) {
    const UnmanagedMatrix<T> x(xp.data() + n * xp.stride(0), g.in_channels, cells);
    gemm(space, "T", "N", T(1), weights, x, T(0), taps);
    move_taps(space, g, n, buffer.data(), y, bias, true);
  }
}

template <class T>
void conv_transpose_gemm_backward(const ExecutionSpace& space, const ConvTransposeShape& g,
                                  const FieldView<T>& gy, const FieldView<T>& xp,
                                  const ReplicatedView<T>& w, const ReplicatedView<T>& gw,
                                  const FieldView<T>& gxp) {
  const Index cells = g.padded[0] * g.padded[1] * g.padded[2];
  const Index columns = g.out_channels * g.k[0] * g.k[1] * g.k[2];
  const auto buffer = tap_buffer<T>(g);
  const UnmanagedMatrix<T> taps(buffer.data(), columns, cells);
  for (Index n = 0; n < g.batch; ++n) {
    move_taps(space, g, n, buffer.data(), gy, ReplicatedView<T>(), false);
    if (gw.extent(0) > 0) {
      const UnmanagedMatrix<T> x(xp.data() + n * xp.stride(0), g.in_channels, cells);
      gemm(space, "N", "T", T(1), x, taps, T(1), UnmanagedMatrix<T>(gw.data(), g.in_channels,
                                                                   columns));
    }
    if (gxp.extent(0) > 0) {
      const UnmanagedMatrix<T> gx(gxp.data() + n * gxp.stride(0), g.in_channels, cells);
      gemm(space, "N", "N", T(1), UnmanagedMatrix<T>(w.data(), g.in_channels, columns), taps,
           T(0), gx);
    }
  }
}

#define SHARDTENSOR_INSTANTIATE(T)                                                            \
  template void conv_transpose_gemm_forward(const ExecutionSpace&, const ConvTransposeShape&, \
                                            const FieldView<T>&, const ReplicatedView<T>&,    \
                                            const ReplicatedView<T>&, const FieldView<T>&);   \
  template void conv_transpose_gemm_backward(                                                 \
      const ExecutionSpace&, const ConvTransposeShape&, const FieldView<T>&,                  \
      const FieldView<T>&, const ReplicatedView<T>&, const ReplicatedView<T>&,                \
      const FieldView<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
