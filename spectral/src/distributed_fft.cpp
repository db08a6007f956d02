#include "shardtensor/spectral/distributed_fft.hpp"

#include <vector>

#include "shardtensor/comm/impl/layout_check.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/fft.hpp"
#include "shardtensor/spectral/impl/box_transpose.hpp"

namespace shardtensor {

namespace {

/// Parts of a balanced split of `extent` into `parts` (some empty when parts > extent).
std::vector<Box> slabs(const SpatialIndex& extents, int axis, int parts) {
  const std::vector<Index> points = balanced_split_points(extents[axis], parts);
  std::vector<Box> boxes(parts);
  for (int r = 0; r < parts; ++r) {
    boxes[r].extent = extents;
    boxes[r].lower[axis] = points[r];
    boxes[r].extent[axis] = points[r + 1] - points[r];
  }
  return boxes;
}

SpatialIndex negated(const SpatialIndex& v) {
  return {-v[0], -v[1], -v[2]};
}

}  // namespace

template <class T>
struct DistributedFFT<T>::Plans {
  using Complex = Kokkos::complex<T>;
  using RealArray = Kokkos::View<T*****, Kokkos::LayoutRight, DefaultMemorySpace>;

  Communicator comm;
  Decomposition decomposition;
  Index batch, channels;
  int last;                       // the halved axis: ndims - 1
  SpatialIndex real_extents;      // (n0, n1, n2)
  SpatialIndex spectral_extents;  // (n0, n1, n2/2 + 1) or (n0, n1/2 + 1, 1)
  std::vector<Box> real_slabs, complex_slabs, spectral_slabs;
  impl::BoxTranspose<T> to_slabs, from_slabs;              // field decomposition <-> x-slabs
  impl::BoxTranspose<Complex> to_spectral, from_spectral;  // x-slabs <-> y-slabs (complex)
  RealArray real_work;                                     // x-slab of the field
  SpectralView<T> slab_work, spectral_work;                // x-slab after the last-axis r2c; y-slab
  kernels::LineFft<T> r2c_last, c2r_last;                  // along the last axis
  kernels::LineFft<T> middle_forward, middle_backward;     // along axis 1 in x-slabs (3-D only)
  kernels::LineFft<T> first_forward, first_backward;       // along axis 0 in y-slabs

  const Box& my(const std::vector<Box>& boxes) const { return boxes[comm.rank()]; }

  Plans(const Communicator& c, const Decomposition& d, Index n, Index ch, FftPlanning planning)
      : comm(c), decomposition(d), batch(n), channels(ch), last(d.ndims() - 1) {
    constexpr const char* where = "DistributedFFT";
    SHARDTENSOR_REQUIRE(d.ndims() == 2 || d.ndims() == 3, where,
                        "a " << d.ndims() << "-D field (" << d.describe()
                             << "); the distributed FFT transforms 2-D and 3-D fields");
    SHARDTENSOR_REQUIRE(d.nranks() == comm.size(), where,
                        "decomposition (" << d.describe() << ") has " << d.nranks()
                                          << " ranks, the communicator " << comm.size());
    SHARDTENSOR_REQUIRE(batch >= 1 && channels >= 1, where,
                        "batch " << batch << " and channels " << channels << " must be positive");
    for (int a = 0; a < d.ndims(); ++a)
      SHARDTENSOR_REQUIRE(d.global_extent(a) >= 2, where,
                          "field extent " << d.global_extent(a) << " along axis " << a
                                          << " is too small: every axis needs at least 2 cells");
    comm.require_same(impl::signature(d), where, "decomposition");
    real_extents = d.global_extents();
    spectral_extents = real_extents;
    spectral_extents[last] = real_extents[last] / 2 + 1;
    const int p = comm.size();
    real_slabs = slabs(real_extents, 0, p);
    complex_slabs = slabs(spectral_extents, 0, p);
    spectral_slabs = slabs(spectral_extents, 1, p);
    std::vector<Box> field_boxes(p);
    for (int r = 0; r < p; ++r) field_boxes[r] = d.box(r);
    const Index planes = batch * channels;
    to_slabs = impl::BoxTranspose<T>(comm, field_boxes, real_slabs, planes);
    from_slabs = impl::BoxTranspose<T>(comm, real_slabs, field_boxes, planes);
    to_spectral = impl::BoxTranspose<Complex>(comm, complex_slabs, spectral_slabs, planes);
    from_spectral = impl::BoxTranspose<Complex>(comm, spectral_slabs, complex_slabs, planes);

    const SpatialIndex re = my(real_slabs).extent, ce = my(complex_slabs).extent,
                       se = my(spectral_slabs).extent;
    MemoryCategoryScope memory(MemoryCategory::workspaces);  // FFT work arrays of the plan
    real_work = RealArray("fft_real_slab", batch, channels, re[0], re[1], re[2]);
    slab_work = SpectralView<T>("fft_complex_slab", batch, channels, ce[0], ce[1], ce[2]);
    spectral_work = SpectralView<T>("fft_spectral_slab", batch, channels, se[0], se[1], se[2]);

    // Planning with `measure` overwrites the arrays: fine, they hold nothing yet.
    using kernels::FftKind;
    using kernels::LineFft;
    if (my(real_slabs).size() > 0) {
      r2c_last = LineFft<T>(FftKind::real_to_complex, last, real_extents[last], real_work,
                            slab_work, planning);
      // c2r may overwrite its input (slab_work): it is scratch by then.
      c2r_last = LineFft<T>(FftKind::complex_to_real, last, real_extents[last], slab_work,
                            real_work, planning);
      if (last == 2) {
        middle_forward = LineFft<T>(FftKind::forward, 1, ce[1], slab_work, slab_work, planning);
        middle_backward = LineFft<T>(FftKind::backward, 1, ce[1], slab_work, slab_work, planning);
      }
    }
    if (my(spectral_slabs).size() > 0) {
      first_forward =
          LineFft<T>(FftKind::forward, 0, se[0], spectral_work, spectral_work, planning);
      first_backward =
          LineFft<T>(FftKind::backward, 0, se[0], spectral_work, spectral_work, planning);
    }
  }

  void check_field(const ShardTensor<T>& field, const char* where) const {
    SHARDTENSOR_REQUIRE(field.decomposition() == decomposition && field.batch() == batch &&
                            field.channels() == channels && field.rank() == comm.rank(),
                        where,
                        "field (" << field.decomposition().describe() << ", batch " << field.batch()
                                  << ", " << field.channels()
                                  << " channels) does not match the plan ("
                                  << decomposition.describe() << ", batch " << batch << ", "
                                  << channels << " channels)");
  }
  void check_spectrum(const SpectralView<T>& s, const char* where) const {
    const Box& b = my(spectral_slabs);
    SHARDTENSOR_REQUIRE(Index(s.extent(0)) == batch && Index(s.extent(1)) == channels &&
                            Index(s.extent(2)) == b.extent[0] &&
                            Index(s.extent(3)) == b.extent[1] && Index(s.extent(4)) == b.extent[2],
                        where,
                        "spectrum block of shape (" << s.extent(0) << ", " << s.extent(1) << ", "
                                                    << s.extent(2) << ", " << s.extent(3) << ", "
                                                    << s.extent(4) << ") on rank " << comm.rank()
                                                    << " does not match the local modes " << b);
  }

  /// field -> spectral_work (unnormalized).
  void run_forward(const ShardTensor<T>& field) {
    to_slabs.apply(field.view(), field.to_local(SpatialIndex{0, 0, 0}), real_work,
                   negated(my(real_slabs).lower));
    r2c_last.execute();
    middle_forward.execute();
    to_spectral.apply(slab_work, negated(my(complex_slabs).lower), spectral_work,
                      negated(my(spectral_slabs).lower));
    first_forward.execute();
  }

  /// spectral_work -> a field, times `scale` (destroys spectral_work).
  ShardTensor<T> run_inverse(T scale) {
    first_backward.execute();
    from_spectral.apply(spectral_work, negated(my(spectral_slabs).lower), slab_work,
                        negated(my(complex_slabs).lower));
    middle_backward.execute();
    drop_imaginary_of_real_modes();
    c2r_last.execute();
    const auto real = real_work;
    Kokkos::parallel_for(
        "DistributedFFT::scale", real.span(),
        KOKKOS_LAMBDA(const std::size_t i) { real.data()[i] *= scale; });
    auto out = ShardTensor<T>::uninitialized(decomposition, comm.rank(), batch, channels, {},
                                             "inverse_fft");
    from_slabs.apply(real_work, negated(my(real_slabs).lower), out.view(),
                     out.to_local(SpatialIndex{0, 0, 0}));
    return out;
  }

  /// The c2r along the last axis reads only the real parts of its frequency-0 and (even
  /// length) n/2 modes; zeroing the imaginary parts makes that explicit for FFTW. The last
  /// axis is whole and innermost in the x-slabs: lines of spectral_extents[last] values.
  void drop_imaginary_of_real_modes() {
    const Index length = spectral_extents[last];
    const Index lines = Index(slab_work.span()) / length;
    const Index nyquist = real_extents[last] % 2 == 0 ? real_extents[last] / 2 : 0;
    auto* data = slab_work.data();
    Kokkos::parallel_for(
        "DistributedFFT::real_modes", lines, KOKKOS_LAMBDA(const Index line) {
          data[line * length].imag(T(0));
          data[line * length + nyquist].imag(T(0));
        });
  }

  /// Multiplies a spectrum block by `inner` at the modes of the last axis that stand for two
  /// (frequencies k and -k: every mode but 0 and, for even lengths, n/2). In the y-slabs the
  /// last axis is innermost: whole in 3-D, this rank's slab of it in 2-D.
  void weight_paired_modes(const SpectralView<T>& s, T inner) const {
    const Box& b = my(spectral_slabs);
    const Index length = b.extent[last], first_mode = b.lower[last];
    if (length == 0) return;
    const Index lines = Index(s.span()) / length;
    const Index nyquist = real_extents[last] % 2 == 0 ? real_extents[last] / 2 : -1;
    auto* data = s.data();
    Kokkos::parallel_for(
        "DistributedFFT::weight_paired_modes",
        Kokkos::MDRangePolicy<RightRank<2>>({0, 0}, {lines, length}),
        KOKKOS_LAMBDA(const Index line, const Index j) {
          const Index k = first_mode + j;
          if (k != 0 && k != nyquist) data[line * length + j] *= inner;
        });
  }

  SpectralView<T> copy_out(const char* label) const {
    SpectralView<T> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                        spectral_work.layout());
    Kokkos::deep_copy(out, spectral_work);
    return out;
  }
};

template <class T>
DistributedFFT<T>::DistributedFFT(const Communicator& comm, const Decomposition& decomposition,
                                  Index batch, Index channels, FftPlanning planning)
    : plans_(std::make_unique<Plans>(comm, decomposition, batch, channels, planning)) {}

template <class T>
DistributedFFT<T>::~DistributedFFT() = default;

template <class T>
const Decomposition& DistributedFFT<T>::decomposition() const {
  return plans_->decomposition;
}
template <class T>
Index DistributedFFT<T>::batch() const {
  return plans_->batch;
}
template <class T>
Index DistributedFFT<T>::channels() const {
  return plans_->channels;
}
template <class T>
SpatialIndex DistributedFFT<T>::spectral_extents() const {
  return plans_->spectral_extents;
}
template <class T>
Box DistributedFFT<T>::spectral_box(int rank) const {
  return plans_->spectral_slabs.at(rank);
}
template <class T>
Box DistributedFFT<T>::local_spectral_box() const {
  return plans_->my(plans_->spectral_slabs);
}
template <class T>
SpectralView<T> DistributedFFT<T>::allocate_spectrum(const std::string& label) const {
  return SpectralView<T>(label, plans_->spectral_work.layout());
}
template <class T>
std::size_t DistributedFFT<T>::scalars_sent_per_transform() const {
  return plans_->to_slabs.scalars_sent() + plans_->to_spectral.scalars_sent();
}

template <class T>
SpectralView<T> DistributedFFT<T>::forward(const ShardTensor<T>& field) {
  plans_->check_field(field, "DistributedFFT::forward");
  plans_->run_forward(field);
  return plans_->copy_out("forward_fft");
}

template <class T>
ShardTensor<T> DistributedFFT<T>::inverse(const SpectralView<T>& spectrum) {
  plans_->check_spectrum(spectrum, "DistributedFFT::inverse");
  Kokkos::deep_copy(plans_->spectral_work, spectrum);
  const SpatialIndex e = plans_->real_extents;
  return plans_->run_inverse(T(1) / T(e[0] * e[1] * e[2]));
}

// forward = transposes, c2c along the full axes, r2c along the last. The adjoint of an
// unnormalized c2c is the unnormalized c2c of the opposite sign; the adjoint of a transpose is
// the transpose back; the adjoint of the 1-D r2c is the c2r of the spectrum with its paired
// modes halved (c2r counts them twice: for k and for -k). So the adjoint of forward is the
// unnormalized inverse of the spectrum with its paired modes halved.
template <class T>
ShardTensor<T> DistributedFFT<T>::forward_adjoint(const SpectralView<T>& gradient) {
  plans_->check_spectrum(gradient, "DistributedFFT::forward_adjoint");
  Kokkos::deep_copy(plans_->spectral_work, gradient);
  plans_->weight_paired_modes(plans_->spectral_work, T(0.5));
  return plans_->run_inverse(T(1));
}

// Conversely, the adjoint of inverse is the forward transform, divided by n0 n1 n2, with its
// paired modes doubled; the modes 0 and n/2 come out real, as the adjoint of dropping their
// imaginary parts requires.
template <class T>
SpectralView<T> DistributedFFT<T>::inverse_adjoint(const ShardTensor<T>& gradient) {
  plans_->check_field(gradient, "DistributedFFT::inverse_adjoint");
  plans_->run_forward(gradient);
  const SpatialIndex e = plans_->real_extents;
  const T scale = T(1) / T(e[0] * e[1] * e[2]);
  const auto s = plans_->spectral_work;
  Kokkos::parallel_for(
      "DistributedFFT::inverse_adjoint_scale", s.span(),
      KOKKOS_LAMBDA(const std::size_t i) { s.data()[i] *= scale; });
  plans_->weight_paired_modes(s, T(2));
  return plans_->copy_out("inverse_fft_adjoint");
}

template class DistributedFFT<float>;
template class DistributedFFT<double>;

}  // namespace shardtensor
