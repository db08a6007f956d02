#pragma once
// LineFft<T>: batched 1-D discrete Fourier transforms along one axis of every line of a
// (batch, channel, x, y, z) array: the local transforms of spectral/'s distributed FFT. One
// interface; one implementation per backend: kernels/backends/host/fft_fftw.cpp (FFTW, host
// memory) in host builds, kernels/backends/cuda/fft_cufft.cpp (cuFFT, device memory) in CUDA
// builds.
//
// The memory space is checked at compile time: a plan on Views the build's backend cannot
// read (host Views in a CUDA build) does not compile.

#include <Kokkos_Complex.hpp>
#include <Kokkos_Core.hpp>
#include <memory>
#include <type_traits>

#include "shardtensor/core/types.hpp"

namespace shardtensor {

/// How the FFT backend chooses its algorithms when a plan is built (once).
enum class FftPlanning {
  estimate,  ///< heuristics: instant planning
  measure    ///< times candidate algorithms: slower planning (seconds for 128^3), faster runs
};

namespace kernels {

/// Which transform: real to complex (the halved axis: n reals -> n/2 + 1 modes), its inverse
/// complex to real (unnormalised), or a complex transform forward (e^-i) or backward (e^+i).
enum class FftKind { real_to_complex, complex_to_real, forward, backward };

/// Whether this build's FFT backend reads and writes memory of `MemorySpace`: the backend runs
/// where the default execution space runs (FFTW on the host, cuFFT on the GPU).
template <class MemorySpace>
constexpr bool fft_backend_accepts =
    Kokkos::SpaceAccessibility<Kokkos::DefaultExecutionSpace, MemorySpace>::accessible;

template <class T>
class LineFft {
 public:
  /// An empty plan: execute() does nothing (a rank that holds no cells).
  LineFft();
  /// Plans `kind` along spatial `axis` (0, 1, 2) of the logical length `length` for every line
  /// of `in` and `out`, (batch, channel, x, y, z) Views of T or Kokkos::complex<T> (they may be
  /// the same View: in place). The plan runs on these Views' memory only; planning with
  /// `measure` may overwrite them.
  template <class InView, class OutView>
  LineFft(FftKind kind, int axis, Index length, const InView& in, const OutView& out,
          FftPlanning planning)
      : LineFft(kind, axis, length, Index(in.extent(0) * in.extent(1)), extents(in), extents(out),
                in.data(), out.data(), planning) {
    static_assert(fft_backend_accepts<typename InView::memory_space> &&
                      fft_backend_accepts<typename OutView::memory_space>,
                  "LineFft: this build's FFT backend reads the default execution space's "
                  "memory only (host memory with FFTW, device memory with cuFFT)");
    static_assert(InView::rank == 5 && OutView::rank == 5,
                  "LineFft: (batch, channel, x, y, z) Views");
  }
  LineFft(LineFft&&) noexcept;
  LineFft& operator=(LineFft&&) noexcept;
  ~LineFft();

  /// Runs the transform, after the Kokkos kernels that wrote its input have finished.
  void execute() const;

 private:
  template <class View>
  static SpatialIndex extents(const View& v) {
    return {Index(v.extent(2)), Index(v.extent(3)), Index(v.extent(4))};
  }
  LineFft(FftKind kind, int axis, Index length, Index planes, const SpatialIndex& in_extents,
          const SpatialIndex& out_extents, const void* in, const void* out, FftPlanning planning);

  struct Plan;  // the backend's
  std::unique_ptr<Plan> plan_;
};

extern template class LineFft<float>;
extern template class LineFft<double>;

}  // namespace kernels
}  // namespace shardtensor
