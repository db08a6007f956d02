// The transposed convolution whose taps tile the output (kernel = stride, no dilation, no
// padding, one group: the U-Net's upsampling) as GEMMs. Each output cell then takes exactly
// one input cell and one tap, so with the weights as a Cin x (Cout T) matrix W (their own
// layout, T taps) and one sample's input as a Cin x P matrix X (P cells):
//   forward           G = W^T X,  then each G row (co, tap) lands on its outputs (+ bias);
//   input gradient    dX = W G,   with G gathered from the output gradient;
//   weight gradient   dW += X G^T.
// G is one sample's output in tap-major order, made in chunks of input rows (TapChunks).

#include "conv_transpose_gemm.hpp"
#include "blas.hpp"  // kernels/backends: private to kernels

#include <algorithm>
#include "shardtensor/core/bfloat16.hpp"
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

/// One sample's G is the output's size (8 MiB for the 64^3 bench U-Net's finest upsampling), a
/// transient beside the output itself, so it is made in chunks of input rows: an eighth of
/// G at most, or 64 Ki values where that is more (the GEMMs stay wide). A small field's G
/// is one chunk: one GEMM per sample, as before.
constexpr Index least_chunk_values = Index(1) << 16;

/// One sample's input cells in chunks of whole (x, y) input rows: [row0, row0 + rows) of
/// `total` rows of nz cells.
struct TapChunks {
  Index total, per_chunk, nz;
  TapChunks(const ConvTransposeShape& g, Index columns)
      : total(g.padded[0] * g.padded[1]), nz(g.padded[2]) {
    const Index values = columns * total * nz,
                chunk = values <= least_chunk_values
                            ? values
                            : std::max(least_chunk_values, (values + 7) / 8);
    per_chunk = std::min(total, std::max<Index>(chunk / (columns * nz), 1));
  }
  bool whole() const { return per_chunk == total; }
  Index cells() const { return per_chunk * nz; }
};

/// Between G (rows co * T + tap, columns the cells of input rows [row0, row0 + rows)) and one
/// sample's output field: to_field writes the outputs (plus bias) where `at` says, else
/// gathers them (from all of y) into G. One work item per (co, input row) row of taps.
template <class T>
void move_taps(const ExecutionSpace& space, const ConvTransposeShape& g, Index n, Index row0,
               Index rows, T* taps, const FieldView<T>& y, const ReplicatedView<T>& bias,
               bool to_field, const ConvTransposeOutput& at = {}) {
  const Index ny = g.padded[1], nz = g.padded[2];
  const Index cells = rows * nz, tap_count = g.k[0] * g.k[1] * g.k[2];
  const bool has_bias = bias.extent(0) > 0;
  Kokkos::parallel_for(
      to_field ? "ConvTranspose::gemm_scatter" : "ConvTranspose::gemm_gather",
      kernel_range(space, g.out_channels * rows), KOKKOS_LAMBDA(const Index item) {
        const Index co = item / rows, row = item % rows, ix = (row0 + row) / ny,
                    iy = (row0 + row) % ny;
        const T shift = has_bias && to_field ? bias(co) : T(0);
        Index tap = 0;
        for (Index a = 0; a < g.k[0]; ++a)
          for (Index b = 0; b < g.k[1]; ++b)
            for (Index c = 0; c < g.k[2]; ++c, ++tap) {
              T* const line = taps + (co * tap_count + tap) * cells + row * nz;
              T* const out = &y(n, at.channel + co, at.lower[0] + ix * g.s[0] + a,
                                at.lower[1] + iy * g.s[1] + b, at.lower[2] + c);
              const Index step = g.s[2];
              if (to_field && at.bf16)
                for (Index iz = 0; iz < nz; ++iz)
                  out[iz * step] = T(round_to_bfloat16(float(line[iz] + shift)));
              else if (to_field)
                for (Index iz = 0; iz < nz; ++iz) out[iz * step] = line[iz] + shift;
              else
                for (Index iz = 0; iz < nz; ++iz) line[iz] = out[iz * step];
            }
      });
}

/// Between a sample's input (or input gradient) rows and a chunk's contiguous copy:
/// to_chunk copies rows [row0, row0 + rows) of every channel into `chunk` (rounded to
/// bfloat16 with `round`), else back. Over (channel, cell): a flat index split by a division
/// per value was 2 % of a bf16 U-Net step.
template <class T>
void move_chunk(const ExecutionSpace& space, Index channels, Index sample_cells, Index row0,
                Index rows, Index nz, T* field, T* chunk, bool to_chunk, bool round = false) {
  const Index cells = rows * nz;
  Kokkos::parallel_for(
      "ConvTranspose::gemm_chunk",
      Kokkos::MDRangePolicy<ExecutionSpace, RightRank<2>, Kokkos::IndexType<Index>>(
          space, {0, 0}, {channels, cells}),
      KOKKOS_LAMBDA(const Index c, const Index i) {
        T* const at = field + c * sample_cells + row0 * nz + i;
        if (to_chunk)
          chunk[c * cells + i] = round ? T(round_to_bfloat16(float(*at))) : *at;
        else
          *at = chunk[c * cells + i];
      });
}

/// A call's chunk of G and, where a chunk is not the whole sample or the input is rounded
/// as it is read, of input rows: from the process's convolution scratch (shared_conv_scratch),
/// like the convolutions' own transients, not two allocations per call (on a GPU each a
/// cudaMalloc, and a cudaFree that waits).
template <class T>
struct ChunkBuffers {
  T* taps;
  T* inputs;
  ChunkBuffers(const ConvTransposeShape& g, const TapChunks& chunks, Index columns) {
    const Index tap_values = columns * chunks.cells(),
                input_values =
                    chunks.whole() && !g.round_source ? 0 : g.in_channels * chunks.cells();
    taps = shared_conv_scratch<T>(static_cast<std::size_t>(tap_values + input_values));
    inputs = taps + tap_values;
  }
};

}  // namespace

template <class T>
void conv_transpose_gemm_forward(const ExecutionSpace& space, const ConvTransposeShape& g,
                                 const FieldView<T>& xp, const ReplicatedView<T>& w,
                                 const ReplicatedView<T>& bias, const FieldView<T>& y,
                                 const ConvTransposeOutput& at) {
  const Index cells = g.padded[0] * g.padded[1] * g.padded[2];
  const Index columns = g.out_channels * g.k[0] * g.k[1] * g.k[2];
  const TapChunks chunks(g, columns);
  const ChunkBuffers<T> buffers(g, chunks, columns);
  const UnmanagedMatrix<T> weights(w.data(), g.in_channels, columns);
  for (Index n = 0; n < g.batch; ++n)
    for (Index row0 = 0; row0 < chunks.total; row0 += chunks.per_chunk) {
      const Index rows = std::min(chunks.per_chunk, chunks.total - row0), part = rows * chunks.nz;
      T* x = xp.data() + n * xp.stride(0);
      if (!chunks.whole() || g.round_source) {
        move_chunk(space, g.in_channels, cells, row0, rows, chunks.nz, x, buffers.inputs, true,
                   g.round_source);
        x = buffers.inputs;
      }
      gemm(space, "T", "N", T(1), weights, UnmanagedMatrix<T>(x, g.in_channels, part), T(0),
           UnmanagedMatrix<T>(buffers.taps, columns, part));
      move_taps(space, g, n, row0, rows, buffers.taps, y, bias, true, at);
    }
}

template <class T>
void conv_transpose_gemm_backward(const ExecutionSpace& space, const ConvTransposeShape& g,
                                  const FieldView<T>& gy, const FieldView<T>& xp,
                                  const ReplicatedView<T>& w, const ReplicatedView<T>& gw,
                                  const FieldView<T>& gxp) {
  const Index cells = g.padded[0] * g.padded[1] * g.padded[2];
  const Index columns = g.out_channels * g.k[0] * g.k[1] * g.k[2];
  const TapChunks chunks(g, columns);
  const ChunkBuffers<T> buffers(g, chunks, columns);  // inputs: of the input and its gradient
  for (Index n = 0; n < g.batch; ++n)
    for (Index row0 = 0; row0 < chunks.total; row0 += chunks.per_chunk) {
      const Index rows = std::min(chunks.per_chunk, chunks.total - row0), part = rows * chunks.nz;
      const UnmanagedMatrix<T> tap_rows(buffers.taps, columns, part);
      move_taps(space, g, n, row0, rows, buffers.taps, gy, ReplicatedView<T>(), false);
      if (gw.extent(0) > 0) {
        T* x = xp.data() + n * xp.stride(0);
        if (!chunks.whole() || g.round_source) {
          move_chunk(space, g.in_channels, cells, row0, rows, chunks.nz, x, buffers.inputs, true,
                     g.round_source);
          x = buffers.inputs;
        }
        gemm(space, "N", "T", T(1), UnmanagedMatrix<T>(x, g.in_channels, part), tap_rows, T(1),
             UnmanagedMatrix<T>(gw.data(), g.in_channels, columns));
      }
      if (gxp.extent(0) > 0) {
        T* const gx = gxp.data() + n * gxp.stride(0);
        gemm(space, "N", "N", T(1), UnmanagedMatrix<T>(w.data(), g.in_channels, columns), tap_rows,
             T(0), UnmanagedMatrix<T>(chunks.whole() ? gx : buffers.inputs, g.in_channels, part));
        if (!chunks.whole())
          move_chunk(space, g.in_channels, cells, row0, rows, chunks.nz, gx, buffers.inputs, false);
      }
    }
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                \
  template void conv_transpose_gemm_forward(const ExecutionSpace&, const ConvTransposeShape&,     \
                                            const FieldView<T>&, const ReplicatedView<T>&,        \
                                            const ReplicatedView<T>&, const FieldView<T>&,        \
                                            const ConvTransposeOutput&);                          \
  template void conv_transpose_gemm_backward(                                                     \
      const ExecutionSpace&, const ConvTransposeShape&, const FieldView<T>&, const FieldView<T>&, \
      const ReplicatedView<T>&, const ReplicatedView<T>&, const FieldView<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
