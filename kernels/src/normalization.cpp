#include "shardtensor/kernels/normalization.hpp"

#include <string>
#include <type_traits>

#include "host/host_threads.hpp"  // kernels/backends: the backends are private to kernels
#include "host/vector_kernels.hpp"
#include "shardtensor/kernels/vector_isa.hpp"

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

/// The normalized value of cell x of block b, rounded to T as normalize_forward writes it.
template <class T>
KOKKOS_INLINE_FUNCTION T normalized(T x, double mean, double rstd, double scale, double shift) {
  return static_cast<T>((static_cast<double>(x) - mean) * rstd * scale + shift);
}

/// The owned cells as lines for the host's vector rows: along z, or along y where z has one
/// cell (2-D fields); `contiguous` where every view has unit stride along them.
template <class T>
struct CellLines {
  bool along_y, contiguous;
  Index length, per_block, count;
  CellLines(const OwnedCells<const T>& x, const OwnedCells<const T>& dy, const OwnedCells<T>& dn) {
    along_y = x.extent(4) == 1;
    const int axis = along_y ? 3 : 4;
    length = Index(x.extent(axis));
    per_block = Index(x.extent(2)) * (along_y ? 1 : Index(x.extent(3)));
    count = Index(x.extent(0) * x.extent(1)) * per_block;
    contiguous = x.stride(axis) == 1 && dy.stride(axis) == 1 && dn.stride(axis) == 1;
  }
};

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
        y(n, c, i, j, k) = normalized(x(n, c, i, j, k), mean(b), rstd(b), scale(c), shift(c));
      });
}

template <class T>
void normalize_activation_gradient(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                                   const OwnedCells<const T>& x, const BlockDoubles& mean,
                                   const BlockDoubles& rstd, const BlockDoubles& scale,
                                   const BlockDoubles& shift, const ActivationFunction<T>& f,
                                   const OwnedCells<T>& dn) {
  const Index channels = x.extent(1);
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host) {
    const CellLines<T> lines(x, dy, dn);
    if (f.kind == Activation::gelu && vector_kernels_on() &&
        lines.contiguous) {
      // The activation's backward on chunks of a line: n into a buffer, its gradient added
      // to zeros (the activation's own input gradient starts at zero), then stored.
      space.fence();
      const auto mean_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mean);
      const auto rstd_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rstd);
      const auto scale_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), scale);
      const auto shift_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), shift);
      constexpr Index chunk = 64;
      host::split_over_threads(
          std::min<Index>(host::host_threads(), lines.count), lines.count,
          [&](int, Index first, Index last) {
            float n[chunk], g[chunk];
            for (Index line = first; line < last; ++line) {
              const Index b = line / lines.per_block, r = line % lines.per_block;
              const Index s = b / channels, c = b % channels;
              const Index i = lines.along_y ? r : r / x.extent(3);
              const Index j = lines.along_y ? 0 : r % x.extent(3);
              const float* xs = &x(s, c, i, j, 0);
              const float* gs = &dy(s, c, i, j, 0);
              float* out = &dn(s, c, i, j, 0);
              for (Index k0 = 0; k0 < lines.length; k0 += chunk) {
                const Index m = std::min(chunk, lines.length - k0);
                for (Index k = 0; k < m; ++k) {
                  n[k] = normalized(xs[k0 + k], mean_h(b), rstd_h(b), scale_h(c), shift_h(c));
                  g[k] = 0;
                }
                host::gelu_backward_rows(n, gs + k0, g, std::size_t(m));
                for (Index k = 0; k < m; ++k) out[k0 + k] = g[k];
              }
            }
          });
      return;
    }
  }
  Kokkos::parallel_for(
      "normalization_activation_gradient", cells_of(space, x),
      KOKKOS_LAMBDA(const Index b, const Index i, const Index j, const Index k) {
        const Index n = b / channels, c = b % channels;
        T g = 0;  // as the activation's backward: added to its zero input gradient
        g += dy(n, c, i, j, k) *
             f.derivative(normalized(x(n, c, i, j, k), mean(b), rstd(b), scale(c), shift(c)));
        dn(n, c, i, j, k) = g;
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
  template void normalize_activation_gradient(                                                     \
      const ExecutionSpace&, const OwnedCells<const T>&, const OwnedCells<const T>&,              \
      const BlockDoubles&, const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,         \
      const ActivationFunction<T>&, const OwnedCells<T>&);                                        \
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
