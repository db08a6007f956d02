#include "shardtensor/kernels/normalization.hpp"

#include <string>

namespace shardtensor::kernels {

namespace {

/// Two sums per block at once (the reduction's value type).
struct TwoSums {
  double first = 0, second = 0;
  KOKKOS_INLINE_FUNCTION TwoSums& operator+=(const TwoSums& other) {
    first += other.first;
    second += other.second;
    return *this;
  }
#if KOKKOS_VERSION < 40000  // Kokkos 3's reducers join through volatile references
  KOKKOS_INLINE_FUNCTION void operator+=(const volatile TwoSums& other) volatile {
    first += other.first;
    second += other.second;
  }
#endif
};

}  // namespace
}  // namespace shardtensor::kernels

template <>
struct Kokkos::reduction_identity<shardtensor::kernels::TwoSums> {
  KOKKOS_FORCEINLINE_FUNCTION static shardtensor::kernels::TwoSums sum() { return {}; }
};

namespace shardtensor::kernels {
namespace {

/// out[n * channels + c] = sum over the owned cells of f(n, c, x, y, z) (a double, or TwoSums
/// for two sums of one pass, each in the order a single sum takes): one team per block, its
/// threads over the (x, y) rows, vector lanes along z (no index division per cell).
template <class V, class Cells, class F>
std::vector<V> reduce_per_block(const ExecutionSpace& space, const char* label, const Cells& like,
                                F f) {
  const Index channels = like.extent(1), blocks = Index(like.extent(0)) * channels;
  const Index ey = like.extent(3), ez = like.extent(4);
  const Index rows = Index(like.extent(2)) * ey;
  Kokkos::View<V*, DefaultMemorySpace> out(std::string(label), blocks);
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  Kokkos::parallel_for(
      label, Policy(space, static_cast<int>(blocks), Kokkos::AUTO, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Policy::member_type& team) {
        const Index b = team.league_rank();
        const Index n = b / channels, c = b % channels;
        V s{};
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, rows),
            [&](const Index row, V& acc) {
              const Index i = row / ey, j = row % ey;
              V row_sum{};
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, ez),
                  [&](const Index k, V& partial) { partial += f(n, c, i, j, k); }, row_sum);
              acc += row_sum;
            },
            s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { out(b) = s; });
      });
  space.fence();
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  return std::vector<V>(host.data(), host.data() + blocks);
}

template <class Cells, class F>
std::vector<double> sums_per_block(const ExecutionSpace& space, const char* label,
                                   const Cells& like, F f) {
  return reduce_per_block<double>(space, label, like, f);
}

/// Two sums per block of one pass: out[b] the first ones, out[blocks + b] the second.
template <class Cells, class F>
std::vector<double> two_sums_per_block(const ExecutionSpace& space, const char* label,
                                       const Cells& like, F f) {
  const std::vector<TwoSums> sums = reduce_per_block<TwoSums>(space, label, like, f);
  std::vector<double> out(2 * sums.size());
  for (std::size_t b = 0; b < sums.size(); ++b) {
    out[b] = sums[b].first;
    out[sums.size() + b] = sums[b].second;
  }
  return out;
}

/// Every owned cell of every block, as (block, x, y, z).
template <class Cells>
Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>> cells_of(const ExecutionSpace& space,
                                                                const Cells& x) {
  return Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>>(
      space, {0, 0, 0, 0},
      {Index(x.extent(0) * x.extent(1)), Index(x.extent(2)), Index(x.extent(3)),
       Index(x.extent(4))});
}

}  // namespace

template <class T>
std::vector<double> block_sums(const ExecutionSpace& space, const OwnedCells<const T>& x) {
  return sums_per_block(
      space, "normalization_sum", x, KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
        return static_cast<double>(x(n, c, i, j, k));
      });
}

template <class T>
std::vector<double> block_deviation_sums(const ExecutionSpace& space, const OwnedCells<const T>& x,
                                         const BlockDoubles& mean) {
  const Index channels = x.extent(1);
  return two_sums_per_block(
      space, "normalization_deviation_sums", x,
      KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
        const double d = static_cast<double>(x(n, c, i, j, k)) - mean(n * channels + c);
        return TwoSums{d, d * d};
      });
}

template <class T>
void normalize_forward(const ExecutionSpace& space, const OwnedCells<const T>& x,
                       const BlockDoubles& mean, const BlockDoubles& rstd,
                       const BlockDoubles& scale, const BlockDoubles& shift,
                       const OwnedCells<T>& y) {
  const Index channels = x.extent(1);
  Kokkos::parallel_for(
      "normalization_forward", cells_of(space, x),
      KOKKOS_LAMBDA(const Index b, const Index i, const Index j, const Index k) {
        const Index n = b / channels, c = b % channels;
        const double xhat = (static_cast<double>(x(n, c, i, j, k)) - mean(b)) * rstd(b);
        y(n, c, i, j, k) = static_cast<T>(xhat * scale(c) + shift(c));
      });
}

template <class T>
std::vector<double> normalize_gradient_sums(const ExecutionSpace& space,
                                            const OwnedCells<const T>& dy,
                                            const OwnedCells<const T>& x, const BlockDoubles& mean,
                                            const BlockDoubles& rstd) {
  const Index channels = x.extent(1);
  return two_sums_per_block(
      space, "normalization_backward_sums", dy,
      KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
        const Index b = n * channels + c;
        const double xhat = (static_cast<double>(x(n, c, i, j, k)) - mean(b)) * rstd(b);
        const double g = static_cast<double>(dy(n, c, i, j, k));
        return TwoSums{g, g * xhat};
      });
}

template <class T>
void normalize_backward(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                        const OwnedCells<const T>& x, const BlockDoubles& mean,
                        const BlockDoubles& rstd, const BlockDoubles& c1, const BlockDoubles& c2,
                        const BlockDoubles& c3, const OwnedCells<T>& dx) {
  const Index channels = x.extent(1);
  Kokkos::parallel_for(
      "normalization_backward", cells_of(space, x),
      KOKKOS_LAMBDA(const Index b, const Index i, const Index j, const Index k) {
        const Index n = b / channels, c = b % channels;
        const double xhat = (static_cast<double>(x(n, c, i, j, k)) - mean(b)) * rstd(b);
        dx(n, c, i, j, k) +=
            static_cast<T>(c1(b) * static_cast<double>(dy(n, c, i, j, k)) - c2(b) - c3(b) * xhat);
      });
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                \
  template std::vector<double> block_sums(const ExecutionSpace&, const OwnedCells<const T>&);     \
  template std::vector<double> block_deviation_sums(                                              \
      const ExecutionSpace&, const OwnedCells<const T>&, const BlockDoubles&);                    \
  template void normalize_forward(const ExecutionSpace&, const OwnedCells<const T>&,              \
                                  const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,  \
                                  const BlockDoubles&, const OwnedCells<T>&);                     \
  template std::vector<double> normalize_gradient_sums(                                           \
      const ExecutionSpace&, const OwnedCells<const T>&, const OwnedCells<const T>&,              \
      const BlockDoubles&, const BlockDoubles&);                                                  \
  template void normalize_backward(const ExecutionSpace&, const OwnedCells<const T>&,             \
                                   const OwnedCells<const T>&, const BlockDoubles&,               \
                                   const BlockDoubles&, const BlockDoubles&, const BlockDoubles&, \
                                   const BlockDoubles&, const OwnedCells<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
