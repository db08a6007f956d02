#pragma once
// ConvKernels: the one place that chooses which kernels run a convolution call, forward and
// backward: the backend's library (cuDNN) where the build has one and it applies, else the
// plane path where it applies, else im2col + GEMM; or the direct loop (ConvAlgorithm::direct).
// Chosen once per forward call and kept by its backward, so both directions agree. The layer
// holds parameters and options; a new backend's kernels are one more branch here.

#include <memory>

#include "shardtensor/kernels/conv.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/layers/conv.hpp"

namespace shardtensor::impl {

/// Whether the library may run float on TF32 tensor cores: where allowed, and where the
/// operands are bf16 values (ConvOptions::bf16), which TF32 holds exactly (10 mantissa bits),
/// so the products are the same and only the summation order differs.
inline bool tensor_cores_exact_or_allowed(const ConvOptions& options) {
  return options.tf32 || options.bf16;
}

template <class T>
class ConvKernels {
 public:
  /// `shape` in the kernels' (rotated) axes; `padded_extent` the extents of the source its
  /// base indexes (the padded input, or the input itself for the plane path).
  ConvKernels(const kernels::ConvShape& shape, const Index padded_extent[3],
              const ConvOptions& options, std::shared_ptr<kernels::ConvWorkspace<T>> workspace)
      : shape_(shape),
        gemm_(options.algorithm == ConvAlgorithm::gemm),
        workspace_(std::move(workspace)),
        library_(gemm_ && options.library_kernels
                     ? kernels::ConvLibraryPlan<T>(shape, padded_extent,
                                                   options.library_workspace_share,
                                                   tensor_cores_exact_or_allowed(options))
                     : kernels::ConvLibraryPlan<T>()),
        planes_(gemm_ && !library_.applies()
                    ? kernels::plan_planes(
                          shape, padded_extent, sizeof(T), workspace_->budget_bytes,
                          options.vector_kernels && kernels::conv_vector_kernels_available<T>(),
                          options.bf16, options.winograd)
                    : kernels::PlanePlan{}) {}

  /// Whether the backend's library runs the convolution (on a padded buffer).
  bool uses_library() const { return library_.applies(); }
  /// Whether the plane path runs: it reads zeros where a window reaches past its source, so
  /// its source may be the input itself, without a padded copy.
  bool runs_planes() const { return planes_.applies() && !library_.applies(); }
  /// Whether the plane path runs on the host's vector kernels.
  bool runs_vector_kernels() const { return runs_planes() && planes_.vector_kernels; }
  /// Whether they run the forward and the input gradient on Winograd's tiles (each where its
  /// correlation's shape applies), and the weight gradient.
  bool runs_winograd() const { return runs_vector_kernels() && planes_.winograd; }
  bool runs_winograd_gradient() const { return runs_vector_kernels() && planes_.winograd_gradient; }
  /// Whether they take bf16 operands rounding the source as they copy it (AMX tiles, bf16 dot
  /// products or the float tiles), so that the source need not be rounded first.
  bool rounds_bf16_as_it_reads() const { return runs_vector_kernels() && planes_.rounds_source; }
  /// Whether they round a bf16 layer's weights as they pack them, so that the layer hands them
  /// its float weights rather than a rounded copy (the other kernels read the copy).
  bool rounds_bf16_weights() const { return runs_vector_kernels() && planes_.bf16; }
  /// Whether forward can run in chunks of outputs (those reading no exchanged ghost first,
  /// while the halo travels): not the library (one call) nor the direct loop.
  bool runs_in_chunks() const { return gemm_ && !library_.applies(); }
  /// Whether the input gradient is written by the plane path, which runs the weight gradient
  /// first, so the padded input's buffer may take the input gradient.
  bool input_gradient_after_weights() const { return planes_.applies(); }

  /// y = conv(xp, w) + bias, for the outputs `filter` keeps (all unless runs_in_chunks());
  /// `slabs`: xp's, where the shape has a slab axis (runs_vector_kernels() only).
  void forward(const FieldView<T>& xp, const ReplicatedView<T>& w, const ReplicatedView<T>& bias,
               const FieldView<T>& y, const kernels::ChunkFilter& filter = {},
               const kernels::SourceSlabs<T>& slabs = {}) const {
    const ExecutionSpace space;
    if (library_.applies() && library_.forward(space, xp, w, bias, y, *workspace_)) return;
    if (!gemm_) return kernels::conv_direct_forward(space, shape_, xp, w, bias, y);
    if (!planes_.applies())
      return kernels::conv_gemm_forward(space, shape_, xp, w, bias, y, *workspace_, filter);
    const auto keep = [&](Index ox, Index y0, Index y1) {
      return filter(kernels::plane_reads(shape_, ox, y0, y1));
    };
    kernels::correlate_planes<T>(
        space, planes_, planes_.forward, planes_.forward_rows, shape_, xp, w, false, bias, y,
        workspace_->reserve(planes_.values), keep,
        workspace_->keeps_forward_weights ? &workspace_->forward_weights : nullptr, slabs);
  }

  /// The gradients from gy: of the weight (gw), the bias (gb) and the padded input (gxp);
  /// an empty View is not computed. gxp may be xp's own buffer where
  /// input_gradient_after_weights().
  void backward(const FieldView<T>& gy, const FieldView<T>& xp, const ReplicatedView<T>& w,
                const ReplicatedView<T>& gw, const ReplicatedView<T>& gb,
                const FieldView<T>& gxp) const {
    const ExecutionSpace space;
    const ReplicatedView<T> none;
    if (planes_.applies()) {
      backward_parameters(gy, xp, gw, gb);
      if (gxp.extent(0) > 0) backward_input(gy, w, gxp);
      return;
    }
    if (!gemm_) {
      kernels::conv_backward_parameters(space, shape_, gy, xp, gw, gb);
      if (gxp.extent(0) > 0) kernels::conv_direct_backward_data(space, shape_, gy, w, gxp);
      return;
    }
    // The library's directions where it has algorithms, the portable GEMM for the rest.
    const bool data_done =
        gxp.extent(0) == 0 || library_.backward_data(space, gy, w, gxp, *workspace_);
    const bool weight_done =
        gw.extent(0) == 0 || library_.backward_weight(space, gy, xp, gw, *workspace_);
    if (!data_done || !weight_done)
      kernels::conv_gemm_backward(space, shape_, gy, xp, w, weight_done ? none : gw,
                                  data_done ? FieldView<T>() : gxp, *workspace_);
    kernels::conv_backward_parameters(space, shape_, gy, xp, none, gb);  // bias only
  }

  /// The plane path's backward in two calls (runs_planes() only), for a caller whose output
  /// gradient's slabs arrive in between: the weight and bias gradients (`slabs`: xp's),
  /// then the input gradient (`slabs`: gy's).
  void backward_parameters(const FieldView<T>& gy, const FieldView<T>& xp,
                           const ReplicatedView<T>& gw, const ReplicatedView<T>& gb,
                           const kernels::SourceSlabs<T>& slabs = {}) const {
    const ExecutionSpace space;
    if (gw.extent(0) > 0)
      kernels::weight_gradient_planes(space, planes_, shape_, xp, gy, gw,
                                      workspace_->reserve(planes_.values), slabs);
    kernels::conv_backward_parameters(space, shape_, gy, xp, ReplicatedView<T>(), gb);  // bias
  }
  void backward_input(const FieldView<T>& gy, const ReplicatedView<T>& w, const FieldView<T>& gxp,
                      const kernels::SourceSlabs<T>& slabs = {}) const {
    const auto keep_all = [](Index, Index, Index) { return true; };
    kernels::correlate_planes<T>(ExecutionSpace(), planes_, planes_.data, planes_.data_rows, shape_,
                                 gy, w, true, ReplicatedView<T>(), gxp,
                                 workspace_->reserve(planes_.values), keep_all, nullptr, slabs);
  }

 private:
  kernels::ConvShape shape_;
  bool gemm_;
  std::shared_ptr<kernels::ConvWorkspace<T>> workspace_;
  kernels::ConvLibraryPlan<T> library_;
  kernels::PlanePlan planes_;
};

}  // namespace shardtensor::impl
