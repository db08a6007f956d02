#include <fftw3.h>

#include <utility>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/kernels/fft.hpp"

// The host backend of LineFft: FFTW's guru interface, one plan per transform, in float
// (fftw3f) and double (fftw3). FFTW plans on the arrays they run on.

namespace shardtensor::kernels {

namespace {

template <class T>
struct Fftw;

template <>
struct Fftw<double> {
  using plan_type = fftw_plan;
  using complex_type = fftw_complex;
  static plan_type dft(int rank, const fftw_iodim64* dims, int howmany, const fftw_iodim64* loops,
                       complex_type* in, complex_type* out, int sign, unsigned flags) {
    return fftw_plan_guru64_dft(rank, dims, howmany, loops, in, out, sign, flags);
  }
  static plan_type r2c(int rank, const fftw_iodim64* dims, int howmany, const fftw_iodim64* loops,
                       double* in, complex_type* out, unsigned flags) {
    return fftw_plan_guru64_dft_r2c(rank, dims, howmany, loops, in, out, flags);
  }
  static plan_type c2r(int rank, const fftw_iodim64* dims, int howmany, const fftw_iodim64* loops,
                       complex_type* in, double* out, unsigned flags) {
    return fftw_plan_guru64_dft_c2r(rank, dims, howmany, loops, in, out, flags);
  }
  static void execute(plan_type p) { fftw_execute(p); }
  static void destroy(plan_type p) { fftw_destroy_plan(p); }
};

template <>
struct Fftw<float> {
  using plan_type = fftwf_plan;
  using complex_type = fftwf_complex;
  static plan_type dft(int rank, const fftw_iodim64* dims, int howmany, const fftw_iodim64* loops,
                       complex_type* in, complex_type* out, int sign, unsigned flags) {
    return fftwf_plan_guru64_dft(rank, dims, howmany, loops, in, out, sign, flags);
  }
  static plan_type r2c(int rank, const fftw_iodim64* dims, int howmany, const fftw_iodim64* loops,
                       float* in, complex_type* out, unsigned flags) {
    return fftwf_plan_guru64_dft_r2c(rank, dims, howmany, loops, in, out, flags);
  }
  static plan_type c2r(int rank, const fftw_iodim64* dims, int howmany, const fftw_iodim64* loops,
                       complex_type* in, float* out, unsigned flags) {
    return fftwf_plan_guru64_dft_c2r(rank, dims, howmany, loops, in, out, flags);
  }
  static void execute(plan_type p) { fftwf_execute(p); }
  static void destroy(plan_type p) { fftwf_destroy_plan(p); }
};

/// Strides (in values) of the axes (n*c, x, y, z) of a C-order (batch, channel, x, y, z) array.
struct Strides {
  Index sample = 0;  // one (batch, channel) plane
  SpatialIndex axis{0, 0, 0};
  explicit Strides(const SpatialIndex& e)
      : sample(e[0] * e[1] * e[2]), axis{e[1] * e[2], e[2], 1} {}
};

/// FFTW guru dimensions of 1-D transforms along `axis` of every line of a (values, x, y, z)
/// array: the transform dimension (logical length `length`) and loops over the (batch x
/// channel) planes and the other spatial axes. `in` and `out` are the arrays' extents (they
/// differ along `axis` for r2c and c2r).
struct LineLoops {
  fftw_iodim64 transform{};
  std::vector<fftw_iodim64> loops;
  LineLoops(int axis, Index length, Index planes, const SpatialIndex& in, const SpatialIndex& out) {
    const Strides si(in), so(out);
    transform = {length, si.axis[axis], so.axis[axis]};
    loops.push_back({planes, si.sample, so.sample});
    for (int a = 0; a < max_spatial_dims; ++a)
      if (a != axis && in[a] > 1) loops.push_back({in[a], si.axis[a], so.axis[a]});
  }
};

}  // namespace

template <class T>
struct LineFft<T>::Plan {
  typename Fftw<T>::plan_type plan = nullptr;
  ~Plan() {
    if (plan) Fftw<T>::destroy(plan);
  }
};

template <class T>
LineFft<T>::LineFft() = default;
template <class T>
LineFft<T>::LineFft(LineFft&&) noexcept = default;
template <class T>
LineFft<T>& LineFft<T>::operator=(LineFft&&) noexcept = default;
template <class T>
LineFft<T>::~LineFft() = default;

template <class T>
LineFft<T>::LineFft(FftKind kind, int axis, Index length, Index planes,
                    const SpatialIndex& in_extents, const SpatialIndex& out_extents, const void* in,
                    const void* out, FftPlanning planning) {
  using F = Fftw<T>;
  using Complex = typename F::complex_type;
  SHARDTENSOR_REQUIRE(axis >= 0 && axis < max_spatial_dims && length >= 1 && planes >= 0, "LineFft",
                      "axis " << axis << ", length " << length << ", " << planes << " planes");
  if (planes == 0) return;  // nothing to transform
  const LineLoops lines(axis, length, planes, in_extents, out_extents);
  // FFTW_MEASURE overwrites the arrays while planning (documented in fft.hpp).
  const unsigned flags = planning == FftPlanning::measure ? FFTW_MEASURE : FFTW_ESTIMATE;
  const int loops = static_cast<int>(lines.loops.size());
  void* const src = const_cast<void*>(in);
  void* const dst = const_cast<void*>(out);
  typename F::plan_type plan = nullptr;
  switch (kind) {
    case FftKind::real_to_complex:
      plan = F::r2c(1, &lines.transform, loops, lines.loops.data(), static_cast<T*>(src),
                    static_cast<Complex*>(dst), flags);
      break;
    case FftKind::complex_to_real:
      plan = F::c2r(1, &lines.transform, loops, lines.loops.data(), static_cast<Complex*>(src),
                    static_cast<T*>(dst), flags);
      break;
    case FftKind::forward:
    case FftKind::backward:
      plan = F::dft(1, &lines.transform, loops, lines.loops.data(), static_cast<Complex*>(src),
                    static_cast<Complex*>(dst),
                    kind == FftKind::forward ? FFTW_FORWARD : FFTW_BACKWARD, flags);
      break;
  }
  SHARDTENSOR_REQUIRE(plan != nullptr, "LineFft", "FFTW could not build a plan");
  plan_ = std::make_unique<Plan>();
  plan_->plan = plan;
}

template <class T>
void LineFft<T>::execute() const {
  // FFTW reads what Kokkos kernels wrote: they must have finished (asynchronous backends).
  Kokkos::fence();
  if (plan_) Fftw<T>::execute(plan_->plan);
}

template class LineFft<float>;
template class LineFft<double>;

}  // namespace shardtensor::kernels
