#include "shardtensor/optim/grad_clip.hpp"

#include <cmath>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

/// clip_grad_norm over a table of gradients (the slots' grad and size). Gradients are
/// replicated and complete: the local sum is the global one, no allreduce. One team per
/// parameter writes its sum of squares to its own entry of a device array (a reduction into a
/// View does not wait; one team of one thread on the host, so the bits do not depend on the
/// thread count); the host reads them once and adds them in parameter order.
template <class T>
double clip_table(const Kokkos::View<const impl::ParameterSlot<T>*, DefaultMemorySpace>& table,
                  double max_norm) {
  SHARDTENSOR_REQUIRE(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm",
                      "max_norm must be a finite number > 0, got " << max_norm);
  const int count = static_cast<int>(table.extent(0));
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  const auto teams = [count] {
    if constexpr (kernels_run_on_host)
      return Policy(count, 1);
    else
      return Policy(count, Kokkos::AUTO);
  };
  Kokkos::View<double*, DefaultMemorySpace> per_parameter(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "clip_grad_norm::squares"), count);
  Kokkos::parallel_for(
      "clip_grad_norm::sum_of_squares", teams(), KOKKOS_LAMBDA(const Policy::member_type& team) {
        const T* const grad = table(team.league_rank()).grad;
        const std::size_t size = table(team.league_rank()).size;
        // Eight values per work item, summed as a tree: one dependent addition per eight
        // values (one per value was 3 % of the main job's step on one core).
        constexpr std::size_t block = 8;
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, (size + block - 1) / block),
            [&](const std::size_t b, double& partial) {
              double squares[block];
              for (std::size_t j = 0; j < block; ++j) {
                const std::size_t i = b * block + j;
                const double g = i < size ? static_cast<double>(grad[i]) : 0.0;
                squares[j] = g * g;
              }
              partial += ((squares[0] + squares[1]) + (squares[2] + squares[3])) +
                         ((squares[4] + squares[5]) + (squares[6] + squares[7]));
            },
            sum);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { per_parameter(team.league_rank()) = sum; });
      });
  const auto host_squares = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), per_parameter);
  double sum_of_squares = 0;
  for (int p = 0; p < count; ++p) sum_of_squares += host_squares(p);
  const double norm = std::sqrt(sum_of_squares);
  // PyTorch's formula: scale by max_norm / (norm + 1e-6), clamped to at most 1.
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1 || !std::isfinite(norm)) {
    const T scale = static_cast<T>(coefficient);
    Kokkos::parallel_for(
        "clip_grad_norm::scale", teams(), KOKKOS_LAMBDA(const Policy::member_type& team) {
          T* const grad = table(team.league_rank()).grad;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, table(team.league_rank()).size),
                               [&](const std::size_t i) { grad[i] *= scale; });
        });
  }
  return norm;
}

}  // namespace

template <class T>
double clip_grad_norm(const NamedParameters<T>& parameters, double max_norm) {
  std::size_t count = 0;
  for (const auto& named : parameters) count += named.second.requires_grad();
  Kokkos::View<impl::ParameterSlot<T>*, Kokkos::HostSpace> table("clip_grad_norm::table", count);
  std::size_t p = 0;
  for (const auto& named : parameters) {
    if (!named.second.requires_grad()) continue;
    table(p).grad = named.second.data_grad().data();
    table(p).size = named.second.data_grad().extent(0);
    ++p;
  }
  // On a host backend the table itself; on a GPU a copy.
  return clip_table<T>(Kokkos::create_mirror_view_and_copy(DefaultMemorySpace(), table), max_norm);
}

template <class T>
double clip_grad_norm(Optimizer<T>& optimizer, double max_norm) {
  return clip_table<T>(optimizer.parameter_table(), max_norm);
}

template double clip_grad_norm(const NamedParameters<float>&, double);
template double clip_grad_norm(const NamedParameters<double>&, double);
template double clip_grad_norm(Optimizer<float>&, double);
template double clip_grad_norm(Optimizer<double>&, double);

}  // namespace shardtensor
