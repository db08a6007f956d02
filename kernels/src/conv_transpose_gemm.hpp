#pragma once
// GEMM kernels of the transposed convolutions whose taps tile the output (conv_transpose_gemm.cpp),
// private to kernels/src: conv_transpose.cpp dispatches to them.

#include "shardtensor/kernels/conv_transpose.hpp"

namespace shardtensor::kernels {

/// Kernel = stride, no dilation or padding, one group, and the padded buffer is exactly the
/// input whose outputs this rank owns.
bool conv_transpose_gemm_applies(const ConvTransposeShape& g);

template <class T>
void conv_transpose_gemm_forward(const ExecutionSpace& space, const ConvTransposeShape& g,
                                 const FieldView<T>& xp, const ReplicatedView<T>& w,
                                 const ReplicatedView<T>& bias, const FieldView<T>& y,
                                 const ConvTransposeOutput& at);

/// Weight gradient (added to gw, unless empty) and input gradient (written to gxp, unless
/// empty) from gy.
template <class T>
void conv_transpose_gemm_backward(const ExecutionSpace& space, const ConvTransposeShape& g,
                                  const FieldView<T>& gy, const FieldView<T>& xp,
                                  const ReplicatedView<T>& w, const ReplicatedView<T>& gw,
                                  const FieldView<T>& gxp);

}  // namespace shardtensor::kernels
