#include "shardtensor/optim/grad_clip.hpp"

#include <cmath>
#include <vector>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

template <class T>
double clip_grad_norm(const NamedParameters<T>& parameters, double max_norm) {
  SHARDTENSOR_REQUIRE(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm",
                      "max_norm must be a finite number > 0, got " << max_norm);
  // Gradients are replicated and complete: the local sum is the global one, no allreduce.
  // Each parameter's sum of squares goes to its own entry of a device array (a reduction into
  // a View does not wait); the host reads them once, and adds them in parameter order.
  std::vector<ReplicatedView<T>> grads;
  for (const auto& named : parameters)
    if (named.second.requires_grad()) grads.push_back(named.second.data_grad());
  Kokkos::View<double*, DefaultMemorySpace> per_parameter(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "clip_grad_norm::squares"), grads.size());
  for (std::size_t p = 0; p < grads.size(); ++p) {
    const ReplicatedView<T> grad = grads[p];
    // Eight values per work item, summed as a tree: one dependent addition per eight values
    // (one per value was 3 % of the main job's step on one core).
    constexpr std::size_t block = 8;
    const std::size_t count = grad.extent(0);
    Kokkos::parallel_reduce(
        "clip_grad_norm::sum_of_squares", (count + block - 1) / block,
        KOKKOS_LAMBDA(const std::size_t b, double& sum) {
          double squares[block];
          for (std::size_t j = 0; j < block; ++j) {
            const std::size_t i = b * block + j;
            const double g = i < count ? static_cast<double>(grad(i)) : 0.0;
            squares[j] = g * g;
          }
          sum += ((squares[0] + squares[1]) + (squares[2] + squares[3])) +
                 ((squares[4] + squares[5]) + (squares[6] + squares[7]));
        },
        Kokkos::subview(per_parameter, p));
  }
  const auto host_squares = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), per_parameter);
  double sum_of_squares = 0;
  for (std::size_t p = 0; p < grads.size(); ++p) sum_of_squares += host_squares(p);
  const double norm = std::sqrt(sum_of_squares);
  // PyTorch's formula: scale by max_norm / (norm + 1e-6), clamped to at most 1.
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1 || !std::isfinite(norm)) {
    const T scale = static_cast<T>(coefficient);
    for (const ReplicatedView<T>& grad : grads)
      Kokkos::parallel_for(
          "clip_grad_norm::scale", grad.extent(0),
          KOKKOS_LAMBDA(const std::size_t i) { grad(i) *= scale; });
  }
  return norm;
}

template double clip_grad_norm(const NamedParameters<float>&, double);
template double clip_grad_norm(const NamedParameters<double>&, double);

}  // namespace shardtensor
