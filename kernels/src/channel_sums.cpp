#include "shardtensor/kernels/channel_sums.hpp"

#include "shardtensor/kernels/run_sum.hpp"

namespace shardtensor::kernels {

template <class T>
void add_channel_sums(const ExecutionSpace& space, const char* label, const FieldView<T>& gy,
                      Index batch, const Index cells[3], const ReplicatedView<T>& out) {
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
