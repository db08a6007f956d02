#include <mutex>

#include "shardtensor/kernels/conv.hpp"

namespace shardtensor::kernels {

namespace {

template <class T>
Kokkos::View<T*, DefaultMemorySpace> scratch;  // empty until a convolution reserves it

}  // namespace

template <class T>
T* shared_conv_scratch(std::size_t count) {
  static std::once_flag release_at_finalize;  // views must not outlive Kokkos
  std::call_once(release_at_finalize, [] { Kokkos::push_finalize_hook(release_conv_scratch); });
  if (scratch<T>.extent(0) < count) {
    MemoryCategoryScope memory(MemoryCategory::workspaces);
    scratch<T> = {};  // free the old buffer before the larger one is allocated
    scratch<T> = Kokkos::View<T*, DefaultMemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("conv_workspace")), count);
  }
  return scratch<T>.data();
}

void release_conv_scratch() {
  scratch<float> = {};
  scratch<double> = {};
}

template float* shared_conv_scratch<float>(std::size_t);
template double* shared_conv_scratch<double>(std::size_t);

}  // namespace shardtensor::kernels
