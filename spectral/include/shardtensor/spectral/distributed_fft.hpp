#pragma once
// DistributedFFT<T>: real-to-complex FFT of a sharded 2-D or 3-D field and its inverse, with
// the adjoints autodiff needs; slab transposes (all-to-all) around local FFTW transforms.

#include <Kokkos_Complex.hpp>
#include <Kokkos_Core.hpp>
#include <memory>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/shard_tensor.hpp"
#include "shardtensor/kernels/fft.hpp"  // FftPlanning, the local transforms

namespace shardtensor {

/// One rank's block of a spectrum: (batch, channel, k0, k1, k2) complex values, C order, of
/// the modes DistributedFFT::local_spectral_box() names (mode k0 of the View is global mode
/// box.lower[0] + k0, ...).
template <class T>
using SpectralView = Kokkos::View<Kokkos::complex<T>*****, Kokkos::LayoutRight, DefaultMemorySpace>;

/// The discrete Fourier transform of a real field of extents (n0, n1[, n2]), sharded over
/// any decomposition, for `batch` samples of `channels` channels each.
///
/// Spectrum. The last spatial axis is halved (Hermitian symmetry of a real signal): the
/// global spectrum has extents spectral_extents() = (n0, n1, n2/2 + 1) in 3-D and
/// (n0, n1/2 + 1) in 2-D. Along the other axes, index k is the frequency k for
/// k < (n + 1) / 2 and k - n above (FFTW's and numpy's order).
///
/// Spectral layout. Rank r holds every mode along axes 0 and 2 and a balanced slab of axis 1:
/// spectral_box(r). Ranks past the axis-1 extent hold nothing (an empty box).
///
/// Algorithm (forward; the inverse runs it backwards):
///   1. all-to-all: the field's decomposition -> x-slabs (axis 0 split, the rest whole);
///   2. FFTW r2c along the last axis, c2c along axis 1 (3-D), locally;
///   3. all-to-all: x-slabs -> y-slabs of the spectrum (axis 1 split, the rest whole);
///   4. FFTW c2c along axis 0, locally.
/// Ranks past n0 idle in step 2, ranks past the axis-1 spectral extent in step 4.
///
/// Normalization: forward is unnormalized, inverse divides by n0 n1 n2, so
/// inverse(forward(x)) == x. inverse() reads only the real part of the modes at frequency 0
/// and n/2 of the last axis after the transforms along the other axes (a real signal has no
/// other). Plans (FFTW, the transposes, the work buffers) are built once, in the constructor;
/// forward and inverse allocate only their results. Every call is collective.
template <class T>
class DistributedFFT {
 public:
  DistributedFFT(const Communicator& comm, const Decomposition& decomposition, Index batch,
                 Index channels, FftPlanning planning = FftPlanning::estimate);
  ~DistributedFFT();
  DistributedFFT(const DistributedFFT&) = delete;
  DistributedFFT& operator=(const DistributedFFT&) = delete;

  const Decomposition& decomposition() const;
  Index batch() const;
  Index channels() const;
  /// Global extents of the (half) spectrum; 1 past ndims().
  SpatialIndex spectral_extents() const;
  /// The modes rank `rank` holds (global mode indices; may be empty).
  Box spectral_box(int rank) const;
  Box local_spectral_box() const;
  /// A zero-filled spectrum block for this rank.
  SpectralView<T> allocate_spectrum(const std::string& label = "spectrum") const;

  /// Unnormalized r2c transform of the owned cells of `field` (its ghost cells are ignored;
  /// its layout must match decomposition(), batch() and channels()).
  SpectralView<T> forward(const ShardTensor<T>& field);
  /// Normalized c2r transform: a field on decomposition(), no ghost cells.
  ShardTensor<T> inverse(const SpectralView<T>& spectrum);

  /// Adjoint of forward() for the real inner product <a, b> = sum Re(conj(a) b) over the
  /// stored half spectrum: <forward(x), g> = <x, forward_adjoint(g)>.
  ShardTensor<T> forward_adjoint(const SpectralView<T>& gradient);
  /// Adjoint of inverse(): <inverse(s), y> = <s, inverse_adjoint(y)>.
  SpectralView<T> inverse_adjoint(const ShardTensor<T>& gradient);

  /// Real numbers (a complex value counts two) this rank sends to other ranks per forward,
  /// inverse or adjoint call: the communication volume is this times sizeof(T).
  std::size_t scalars_sent_per_transform() const;

  // Declared public only because CUDA's device lambdas (in Plans' members) cannot be defined
  // in a private nested class; it is defined in the source file and used nowhere else.
  struct Plans;

 private:
  std::unique_ptr<Plans> plans_;
};

extern template class DistributedFFT<float>;
extern template class DistributedFFT<double>;

}  // namespace shardtensor
