#include "shardtensor/kernels/channel_sums.hpp"

#include <algorithm>
#include <string>

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/kernels/run_sum.hpp"

namespace shardtensor::kernels {

namespace {

/// add_channel_sums on a GPU: each channel's cells (all samples) in parts of about 4096 cells,
/// one team per part, its threads on neighbouring cells; then a thread per channel adds its
/// parts in order. (A team per channel with a thread per row left the device mostly idle and
/// read rows a row apart.)
template <class T>
void add_channel_sums_in_parts(const ExecutionSpace& space, const char* label,
                               const FieldView<T>& gy, Index batch, const Index cells[3],
                               const ReplicatedView<T>& out) {
  const Index ex = cells[0], ey = cells[1], ez = cells[2];
  const Index total = batch * ex * ey * ez, channels = out.extent(0);
  const Index parts = std::max<Index>(1, (total + 4095) / 4096);
  Kokkos::View<double*, DefaultMemorySpace> partial(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label) + ".parts"),
      channels * parts);
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  Kokkos::parallel_for(
      label, Policy(space, static_cast<int>(channels * parts), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Policy::member_type& team) {
        const Index c = team.league_rank() / parts, part = team.league_rank() % parts;
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, part * total / parts, (part + 1) * total / parts),
            [&](const Index cell, double& acc) {
              Index rest = cell;
              const Index z = impl::take_remainder(rest, ez), y = impl::take_remainder(rest, ey),
                          x = impl::take_remainder(rest, ex);
              acc += static_cast<double>(gy(rest, c, x, y, z));
            },
            sum);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { partial(team.league_rank()) = sum; });
      });
  Kokkos::parallel_for(
      label, kernel_range(space, channels), KOKKOS_LAMBDA(const Index c) {
        double sum = 0;
        for (Index part = 0; part < parts; ++part) sum += partial(c * parts + part);
        out(c) += static_cast<T>(sum);
      });
}

}  // namespace

template <class T>
void add_channel_sums(const ExecutionSpace& space, const char* label, const FieldView<T>& gy,
                      Index batch, const Index cells[3], const ReplicatedView<T>& out) {
  if constexpr (!kernels_run_on_host) {
    add_channel_sums_in_parts(space, label, gy, batch, cells, out);
    return;
  }
  const Index ex = cells[0], ey = cells[1], ez = cells[2];
  const Index rows = batch * ex * ey;
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  Kokkos::parallel_for(
      label, Policy(space, static_cast<int>(out.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Policy::member_type& team) {
        const Index c = team.league_rank();
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, rows),
            [&](const Index row, double& acc) {
              const Index n = row / (ex * ey), x = (row / ey) % ex, y = row % ey;
              acc += impl::run_sum(&gy(n, c, x, y, 0), ez);
            },
            sum);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { out(c) += static_cast<T>(sum); });
      });
}

template void add_channel_sums(const ExecutionSpace&, const char*, const FieldView<float>&, Index,
                               const Index[3], const ReplicatedView<float>&);
template void add_channel_sums(const ExecutionSpace&, const char*, const FieldView<double>&, Index,
                               const Index[3], const ReplicatedView<double>&);

}  // namespace shardtensor::kernels
