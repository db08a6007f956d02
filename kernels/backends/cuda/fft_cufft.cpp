#include <cufft.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "shardtensor/core/error.hpp"
#include "shardtensor/kernels/fft.hpp"

// The CUDA backend of LineFft: cuFFT on device memory, on the default Kokkos instance's stream
// (so a transform runs after the kernels that wrote its input, without a fence). cuFFT's
// advanced layout has one batch dimension (a count, a distance) where FFTW's guru interface
// takes any number: the longest loop over lines is cuFFT's batch, the others (at most two)
// are host loops over pointer offsets, one cuFFT launch each. cuFFT, like FFTW, leaves the
// transforms unnormalised, and its forward sign is FFTW's (-1).

namespace shardtensor::kernels {

namespace {

template <class T>
struct Cufft;

template <>
struct Cufft<double> {
  static constexpr cufftType r2c = CUFFT_D2Z, c2r = CUFFT_Z2D, c2c = CUFFT_Z2Z;
  static cufftResult run(cufftHandle p, cufftType type, void* in, void* out, int sign) {
    switch (type) {
      case CUFFT_D2Z:
        return cufftExecD2Z(p, static_cast<cufftDoubleReal*>(in),
                            static_cast<cufftDoubleComplex*>(out));
      case CUFFT_Z2D:
        return cufftExecZ2D(p, static_cast<cufftDoubleComplex*>(in),
                            static_cast<cufftDoubleReal*>(out));
      default:
        return cufftExecZ2Z(p, static_cast<cufftDoubleComplex*>(in),
                            static_cast<cufftDoubleComplex*>(out), sign);
    }
  }
};

template <>
struct Cufft<float> {
  static constexpr cufftType r2c = CUFFT_R2C, c2r = CUFFT_C2R, c2c = CUFFT_C2C;
  static cufftResult run(cufftHandle p, cufftType type, void* in, void* out, int sign) {
    switch (type) {
      case CUFFT_R2C:
        return cufftExecR2C(p, static_cast<cufftReal*>(in), static_cast<cufftComplex*>(out));
      case CUFFT_C2R:
        return cufftExecC2R(p, static_cast<cufftComplex*>(in), static_cast<cufftReal*>(out));
      default:
        return cufftExecC2C(p, static_cast<cufftComplex*>(in), static_cast<cufftComplex*>(out),
                            sign);
    }
  }
};

/// One loop over lines: a count and the distances (in values of the input's and the output's
/// type) between consecutive lines.
struct Loop {
  Index count, in_distance, out_distance;
};

}  // namespace

template <class T>
struct LineFft<T>::Plan {
  cufftHandle handle = 0;
  cufftType type = CUFFT_C2C;
  int sign = CUFFT_FORWARD;
  std::size_t in_bytes = 0, out_bytes = 0;  // of one value of the input and of the output
  std::vector<Loop> host_loops;             // outermost first
  void* in = nullptr;
  void* out = nullptr;
  ~Plan() {
    if (handle) cufftDestroy(handle);
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
                    const void* out, FftPlanning /*planning: cuFFT plans by heuristics*/) {
  SHARDTENSOR_REQUIRE(axis >= 0 && axis < max_spatial_dims && length >= 1 && planes >= 0, "LineFft",
                      "axis " << axis << ", length " << length << ", " << planes << " planes");
  if (planes == 0) return;  // nothing to transform
  // Strides (in values) of the axes of C-order (values, x, y, z) arrays, as in the FFTW backend.
  auto strides = [](const SpatialIndex& e) {
    return std::pair<Index, SpatialIndex>{e[0] * e[1] * e[2], {e[1] * e[2], e[2], 1}};
  };
  const auto [in_sample, in_axis] = strides(in_extents);
  const auto [out_sample, out_axis] = strides(out_extents);
  std::vector<Loop> loops{{planes, in_sample, out_sample}};
  for (int a = 0; a < max_spatial_dims; ++a)
    if (a != axis && in_extents[a] > 1) loops.push_back({in_extents[a], in_axis[a], out_axis[a]});
  // Loops that continue each other (the outer's step is the inner's whole run, in both
  // arrays) are one loop: lines along the innermost axis (the real-to-complex axis) are then
  // a single batch, whatever the field's extents.
  for (std::size_t i = loops.size() - 1; i > 0; --i) {
    const Loop& outer = loops[i - 1];
    const Loop& inner = loops[i];
    if (outer.in_distance == inner.count * inner.in_distance &&
        outer.out_distance == inner.count * inner.out_distance) {
      loops[i - 1] = {outer.count * inner.count, inner.in_distance, inner.out_distance};
      loops.erase(loops.begin() + long(i));
    }
  }
  // The longest loop is cuFFT's batch.
  const auto batch_at = std::max_element(
      loops.begin(), loops.end(), [](const Loop& a, const Loop& b) { return a.count < b.count; });
  const Loop batch = *batch_at;
  loops.erase(batch_at);

  auto plan = std::make_unique<Plan>();
  using C = Cufft<T>;
  const bool real_in = kind == FftKind::real_to_complex,
             real_out = kind == FftKind::complex_to_real;
  plan->type = real_in ? C::r2c : real_out ? C::c2r : C::c2c;
  plan->sign = kind == FftKind::backward ? CUFFT_INVERSE : CUFFT_FORWARD;
  plan->in_bytes = real_in ? sizeof(T) : 2 * sizeof(T);
  plan->out_bytes = real_out ? sizeof(T) : 2 * sizeof(T);
  // cuFFT refuses (CUFFT_INVALID_VALUE) real arrays whose pointer is not aligned to a complex
  // value: a host loop may not start a launch at an odd real offset. Say so instead.
  const std::size_t complex_bytes = 2 * sizeof(T);
  for (const Loop& loop : loops)
    SHARDTENSOR_REQUIRE(
        loop.count == 1 || ((loop.in_distance * plan->in_bytes) % complex_bytes == 0 &&
                            (loop.out_distance * plan->out_bytes) % complex_bytes == 0),
        "LineFft",
        "cuFFT needs every transform's real data aligned to a complex value; lines along axis "
            << axis << " of extents (" << in_extents[0] << ", " << in_extents[1] << ", "
            << in_extents[2] << ") start at odd offsets " << loop.in_distance << " / "
            << loop.out_distance);
  plan->host_loops = std::move(loops);
  plan->in = const_cast<void*>(in);
  plan->out = const_cast<void*>(out);

  constexpr Index int_max = std::numeric_limits<int>::max();
  for (Index v : {length, batch.count, batch.in_distance, batch.out_distance, in_axis[axis],
                  out_axis[axis], in_extents[axis], out_extents[axis]})
    SHARDTENSOR_REQUIRE(v <= int_max, "LineFft",
                        "cuFFT's plan takes int sizes; " << v << " is too large");
  int n = static_cast<int>(length);
  // The embedding extents only switch cuFFT to the advanced layout (ignored for 1-D).
  int in_embed = static_cast<int>(in_extents[axis]),
      out_embed = static_cast<int>(out_extents[axis]);
  const cufftResult made = cufftPlanMany(
      &plan->handle, 1, &n, &in_embed, static_cast<int>(in_axis[axis]),
      static_cast<int>(batch.in_distance), &out_embed, static_cast<int>(out_axis[axis]),
      static_cast<int>(batch.out_distance), plan->type, static_cast<int>(batch.count));
  SHARDTENSOR_REQUIRE(made == CUFFT_SUCCESS, "LineFft",
                      "cuFFT could not build a plan (cufftResult "
                          << int(made) << ") for length " << length << ", batch " << batch.count);
  cufftSetStream(plan->handle, Kokkos::DefaultExecutionSpace().cuda_stream());
  plan_ = std::move(plan);
}

template <class T>
void LineFft<T>::execute() const {
  if (!plan_) return;
  const Plan& p = *plan_;
  // Offsets of every combination of the host loops (none: one launch at offset 0).
  std::vector<std::pair<Index, Index>> offsets{{0, 0}};
  for (const Loop& loop : p.host_loops) {
    std::vector<std::pair<Index, Index>> next;
    next.reserve(offsets.size() * loop.count);
    for (const auto& [i, o] : offsets)
      for (Index k = 0; k < loop.count; ++k)
        next.push_back({i + k * loop.in_distance, o + k * loop.out_distance});
    offsets = std::move(next);
  }
  for (const auto& [i, o] : offsets) {
    const cufftResult ran =
        Cufft<T>::run(p.handle, p.type, static_cast<char*>(p.in) + i * p.in_bytes,
                      static_cast<char*>(p.out) + o * p.out_bytes, p.sign);
    SHARDTENSOR_REQUIRE(ran == CUFFT_SUCCESS, "LineFft",
                        "cuFFT failed to run (cufftResult " << int(ran) << ")");
  }
}

template class LineFft<float>;
template class LineFft<double>;

}  // namespace shardtensor::kernels
