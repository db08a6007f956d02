#pragma once
// ConvLibraryPlan<T>: a convolution's local compute (forward, data gradient, weight gradient)
// through the backend's convolution library: cuDNN in a CUDA build that found it
// (kernels/backends/cuda/conv_cudnn.cpp, SHARDTENSOR_HAVE_CUDNN). Host builds have none: there
// the plan is always empty and Conv runs the portable kernels (kernels/conv.hpp), which are
// also the fallback for the shapes the library does not take.
//
// The library convolves the same padded buffer as the portable kernels: the windows of this
// rank's outputs, a strided box of the padded patch starting at ConvShape::base, with no
// padding of the library's own (the halo exchange and the padding mode have filled the
// ghosts). The interface carries no cuDNN or CUDA type.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels {

/// Whether this build convolves through a library (cuDNN in a CUDA build that found it).
bool conv_library_available();

/// One line per convolution shape the library has planned in this process: the shape and, per
/// direction (forward, data gradient, weight gradient), the algorithm chosen, "none" where the
/// library took none (the portable kernel ran) or "not run". Empty without a library.
std::vector<std::string> conv_library_report();

template <class T>
class ConvLibraryPlan {
 public:
  /// An empty plan: applies() is false.
  ConvLibraryPlan() = default;
  /// The plan for a convolution of shape `g` (axes as the kernels see them) whose padded input
  /// has extents `padded`, or an empty one where the build has no library or the shape has
  /// no local output. Plans are cached per shape for the process: the algorithms are chosen
  /// on a direction's first run, by timing the library's deterministic algorithms whose
  /// workspace fits `workspace_share` (0 to 1) of the memory the device has free when the
  /// plan is made (and of the room left under the memory budget, if one is set); among those
  /// within 5 % of the fastest, the one with the least workspace. `tf32`: float may use TF32 tensor
  /// cores (products of 10-bit mantissas, about 1e-3 relative error, several times faster); off,
  /// float keeps FMA math and matches the CPU to 1e-5. The layer's option (ConvOptions::tf32), so
  /// two models in one process may differ.
  ConvLibraryPlan(const ConvShape& g, const Index padded[3], double workspace_share,
                  bool tf32 = false);

  bool applies() const { return plan_ != nullptr; }

  /// y = the convolution of xp with w, plus bias when given. Returns false (nothing written)
  /// where the library has no algorithm for the shape: the caller runs a portable kernel.
  bool forward(const ExecutionSpace& space, const FieldView<T>& xp, const ReplicatedView<T>& w,
               const ReplicatedView<T>& bias, const FieldView<T>& y,
               ConvWorkspace<T>& workspace) const;
  /// The gradient of the padded input: the cells the windows read are overwritten, the others
  /// left as they are (zero, in Conv). Returns false as forward does.
  bool backward_data(const ExecutionSpace& space, const FieldView<T>& gy,
                     const ReplicatedView<T>& w, const FieldView<T>& gxp,
                     ConvWorkspace<T>& workspace) const;
  /// gw += this rank's partial weight gradient. Returns false as forward does.
  bool backward_weight(const ExecutionSpace& space, const FieldView<T>& gy, const FieldView<T>& xp,
                       const ReplicatedView<T>& gw, ConvWorkspace<T>& workspace) const;

  struct Plan;  // the backend's

 private:
  std::shared_ptr<Plan> plan_;
};

extern template class ConvLibraryPlan<float>;
extern template class ConvLibraryPlan<double>;

}  // namespace shardtensor::kernels
