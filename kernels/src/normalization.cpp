#include "shardtensor/kernels/normalization.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "host/host_threads.hpp"  // kernels/backends: the backends are private to kernels
#include "host/vector_kernels.hpp"
#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"
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

/// Stores a block's sums: out(b) for one sum, out(b) and out(blocks + b) for two.
KOKKOS_INLINE_FUNCTION void store_sums(const BlockDoubles& out, Index, Index b, double s) {
  out(b) = s;
}
KOKKOS_INLINE_FUNCTION void store_sums(const BlockDoubles& out, Index blocks, Index b,
                                       const TwoSums& s) {
  out(b) = s.first;
  out(blocks + b) = s.second;
}

/// reduce_per_block on a GPU (below): parts of about 4096 cells per block, one team each,
/// then each block's parts added in order.
template <class V, class Cells, class F>
void reduce_per_block_parts(const ExecutionSpace& space, const char* label, const Cells& like, F f,
                            const BlockDoubles& out) {
  const Index channels = like.extent(1), blocks = Index(like.extent(0)) * channels;
  const Index ex = like.extent(2), ey = like.extent(3), ez = like.extent(4);
  const Index cells = ex * ey * ez;
  const Index parts = std::max<Index>(1, (cells + 4095) / 4096);
  Kokkos::View<V*, DefaultMemorySpace> part_sums(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), blocks * parts);
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  Kokkos::parallel_for(
      label, Policy(space, static_cast<int>(blocks * parts), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Policy::member_type& team) {
        const Index b = team.league_rank() / parts, part = team.league_rank() % parts;
        const Index n = b / channels, c = b % channels;
        V s{};
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, part * cells / parts, (part + 1) * cells / parts),
            [&](const Index cell, V& acc) {
              Index rest = cell;
              const Index k = impl::take_remainder(rest, ez), j = impl::take_remainder(rest, ey);
              acc += f(n, c, rest, j, k);
            },
            s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { part_sums(team.league_rank()) = s; });
      });
  Kokkos::parallel_for(
      "normalization_add_parts", kernel_range(space, blocks), KOKKOS_LAMBDA(const Index b) {
        V s{};
        for (Index part = 0; part < parts; ++part) s += part_sums(b * parts + part);
        store_sums(out, blocks, b, s);
      });
}

/// The sums over the owned cells of f(n, c, x, y, z) per block b = n * channels + c (a
/// double, or TwoSums for two sums of one pass, each in the order a single sum takes), into
/// out as store_sums lays them out. On a host one team per block, its threads over the (x, y)
/// rows, vector lanes along z (no index division per cell). On a GPU each block's cells are
/// split into parts of about 4096 cells, one team per part with its threads on neighbouring
/// cells, so that the teams fill the device (a team per block, its threads a row apart, read
/// 60 GB/s on an H200); the parts' sums are added in order, so the result does not depend on
/// the schedule.
template <class V, class Cells, class F>
void reduce_per_block(const ExecutionSpace& space, const char* label, const Cells& like, F f,
                      const BlockDoubles& out) {
  const Index channels = like.extent(1), blocks = Index(like.extent(0)) * channels;
  const Index ey = like.extent(3), ez = like.extent(4);
  const Index rows = Index(like.extent(2)) * ey;
  if constexpr (!kernels_run_on_host) {
    reduce_per_block_parts<V>(space, label, like, f, out);
    return;
  }
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
        Kokkos::single(Kokkos::PerTeam(team), [&]() { store_sums(out, blocks, b, s); });
      });
}

/// Every owned cell of every block, as (block, x, y, z).
template <class Cells>
Kokkos::MDRangePolicy<ExecutionSpace, RightRank<4>> cells_of(const ExecutionSpace& space,
                                                             const Cells& x) {
  return Kokkos::MDRangePolicy<ExecutionSpace, RightRank<4>>(
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
/// cell (2-D fields); `contiguous` where every view has unit stride along them. Line r of
/// block b (sample b / channels, channel b % channels) starts at line(view, b, r).
struct CellLines {
  bool along_y, contiguous = true;
  Index channels, ey, length, per_block, blocks, count;
  template <class View, class... Views>
  explicit CellLines(const View& x, const Views&... others) {
    along_y = x.extent(4) == 1;
    const int axis = along_y ? 3 : 4;
    channels = Index(x.extent(1));
    ey = Index(x.extent(3));
    length = Index(x.extent(axis));
    per_block = Index(x.extent(2)) * (along_y ? 1 : ey);
    blocks = Index(x.extent(0)) * channels;
    count = blocks * per_block;
    for (const std::size_t stride :
         {std::size_t(x.stride(axis)), std::size_t(others.stride(axis))...})
      contiguous = contiguous && stride == 1;
  }
  template <class View>
  auto* line(const View& v, Index b, Index r) const {
    return &v(b / channels, b % channels, along_y ? r : r / ey, along_y ? 0 : r % ey, 0);
  }
};

/// Whether float cells on a host backend go through the host's vector rows
/// (vector_kernels.hpp): its vector paths on, every view contiguous along the lines.
inline bool on_vector_rows(const CellLines& lines) {
  return vector_kernels_on() && lines.contiguous;
}

/// The host's vector rows' sums per block, out(s * blocks + b) for S sums: row(b, r, sums)
/// gives line r's, added line by line in order as reduce_per_block adds its rows; each
/// thread takes whole blocks.
template <int S, class Row>
void host_sums_per_block(const ExecutionSpace& space, const CellLines& lines, const Row& row,
                         const BlockDoubles& out) {
  space.fence();
  host::split_over_threads(std::min<Index>(host::host_threads(), lines.blocks), lines.blocks,
                           [&](int, Index first, Index last) {
                             for (Index b = first; b < last; ++b) {
                               double total[S] = {}, sums[S];
                               for (Index r = 0; r < lines.per_block; ++r) {
                                 row(b, r, sums);
                                 for (int s = 0; s < S; ++s) total[s] += sums[s];
                               }
                               for (int s = 0; s < S; ++s) out(s * lines.blocks + b) = total[s];
                             }
                           });
}

/// The host's vector rows over every line: row(b, r) for lines [first, last) of each thread.
template <class Row>
void host_rows(const ExecutionSpace& space, const CellLines& lines, const Row& row) {
  space.fence();
  host::split_over_threads(std::min<Index>(host::host_threads(), lines.count), lines.count,
                           [&](int, Index first, Index last) {
                             for (Index line = first; line < last; ++line)
                               row(line / lines.per_block, line % lines.per_block);
                           });
}

}  // namespace

template <class T>
void block_sums(const ExecutionSpace& space, const OwnedCells<const T>& x,
                const BlockDoubles& sums) {
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host) {
    const CellLines lines(x);
    if (on_vector_rows(lines)) {
      host_sums_per_block<1>(
          space, lines,
          [&](Index b, Index r, double* row_sums) {
            row_sums[0] = host::sum_row(lines.line(x, b, r), std::size_t(lines.length));
          },
          sums);
      return;
    }
  }
  reduce_per_block<double>(
      space, "normalization_sum", x,
      KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
        return static_cast<double>(x(n, c, i, j, k));
      },
      sums);
}

template <class T>
void block_deviation_sums(const ExecutionSpace& space, const OwnedCells<const T>& x,
                          const BlockDoubles& mean, const BlockDoubles& sums) {
  const Index channels = x.extent(1);
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host) {
    const CellLines lines(x);
    if (on_vector_rows(lines)) {
      host_sums_per_block<2>(
          space, lines,
          [&](Index b, Index r, double* row_sums) {
            host::deviation_sums_row(lines.line(x, b, r), std::size_t(lines.length), mean(b),
                                     row_sums);
          },
          sums);
      return;
    }
  }
  reduce_per_block<TwoSums>(
      space, "normalization_deviation_sums", x,
      KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
        const double d = static_cast<double>(x(n, c, i, j, k)) - mean(n * channels + c);
        return TwoSums{d, d * d};
      },
      sums);
}

template <class T>
void normalize_forward(const ExecutionSpace& space, const OwnedCells<const T>& x,
                       const BlockDoubles& mean, const BlockDoubles& rstd,
                       const BlockDoubles& scale, const BlockDoubles& shift,
                       const OwnedCells<T>& y) {
  const Index channels = x.extent(1);
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host) {
    const CellLines lines(x, y);
    if (on_vector_rows(lines)) {
      host_rows(space, lines, [&](Index b, Index r) {
        host::normalize_row(lines.line(x, b, r), lines.line(y, b, r), std::size_t(lines.length),
                            mean(b), rstd(b), scale(b % channels), shift(b % channels));
      });
      return;
    }
  }
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
    const CellLines lines(x, dy, dn);
    if (f.kind == Activation::gelu && on_vector_rows(lines)) {
      // The activation's backward on chunks of a line: n into a buffer, its gradient added
      // to zeros (the activation's own input gradient starts at zero), then stored.
      host_rows(space, lines, [&](Index b, Index r) {
        constexpr Index chunk = 64;
        float n[chunk], g[chunk];
        const Index c = b % channels;
        const float* xs = lines.line(x, b, r);
        const float* gs = lines.line(dy, b, r);
        float* out = lines.line(dn, b, r);
        for (Index k0 = 0; k0 < lines.length; k0 += chunk) {
          const std::size_t m = std::size_t(std::min(chunk, lines.length - k0));
          host::normalize_row(xs + k0, n, m, mean(b), rstd(b), scale(c), shift(c));
          std::fill(g, g + m, 0.0f);
          host::gelu_backward_rows(n, gs + k0, g, m);
          std::copy(g, g + m, out + k0);
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
void normalize_gradient_sums(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                             const OwnedCells<const T>& x, const BlockDoubles& mean,
                             const BlockDoubles& rstd, const BlockDoubles& sums) {
  const Index channels = x.extent(1);
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host) {
    const CellLines lines(x, dy);
    if (on_vector_rows(lines)) {
      host_sums_per_block<2>(
          space, lines,
          [&](Index b, Index r, double* row_sums) {
            host::gradient_sums_row(lines.line(dy, b, r), lines.line(x, b, r),
                                    std::size_t(lines.length), mean(b), rstd(b), row_sums);
          },
          sums);
      return;
    }
  }
  reduce_per_block<TwoSums>(
      space, "normalization_backward_sums", dy,
      KOKKOS_LAMBDA(Index n, Index c, Index i, Index j, Index k) {
        const Index b = n * channels + c;
        const double xhat = (static_cast<double>(x(n, c, i, j, k)) - mean(b)) * rstd(b);
        const double g = static_cast<double>(dy(n, c, i, j, k));
        return TwoSums{g, g * xhat};
      },
      sums);
}

template <class T>
void normalize_backward(const ExecutionSpace& space, const OwnedCells<const T>& dy,
                        const OwnedCells<const T>& x, const BlockDoubles& mean,
                        const BlockDoubles& rstd, const BlockDoubles& c1, const BlockDoubles& c2,
                        const BlockDoubles& c3, const OwnedCells<T>& dx, bool overwrite) {
  const Index channels = x.extent(1);
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host) {
    const CellLines lines(x, dy, dx);
    if (on_vector_rows(lines)) {
      host_rows(space, lines, [&](Index b, Index r) {
        host::normalize_backward_row(lines.line(dy, b, r), lines.line(x, b, r),
                                     lines.line(dx, b, r), std::size_t(lines.length), mean(b),
                                     rstd(b), c1(b), c2(b), c3(b), overwrite);
      });
      return;
    }
  }
  Kokkos::parallel_for(
      "normalization_backward", cells_of(space, x),
      KOKKOS_LAMBDA(const Index b, const Index i, const Index j, const Index k) {
        const Index n = b / channels, c = b % channels;
        const double xhat = (static_cast<double>(x(n, c, i, j, k)) - mean(b)) * rstd(b);
        const T g =
            static_cast<T>(c1(b) * static_cast<double>(dy(n, c, i, j, k)) - c2(b) - c3(b) * xhat);
        if (overwrite)
          dx(n, c, i, j, k) = g;
        else
          dx(n, c, i, j, k) += g;
      });
}

// The statistics' arithmetic: tiny kernels over blocks, statistics or channels, each sum in
// block (or sample) order, the same operations the host made when it did this (every rank
// and every run gets the same bits).

namespace {

/// The sum over the blocks of statistic s of values(offset + block), in block order.
KOKKOS_INLINE_FUNCTION double sum_over_stat(const StatLayout& layout, const BlockDoubles& values,
                                            Index offset, Index s) {
  double sum = 0;
  for (Index i = 0; i < layout.blocks_per_stat(); ++i)
    sum += values(offset + layout.block_of_stat(s, i));
  return sum;
}

}  // namespace

void statistic_block_means(const ExecutionSpace& space, const StatLayout& layout,
                           const BlockDoubles& sums, double count, const BlockDoubles& block_mean) {
  Kokkos::parallel_for(
      "normalization_block_means", kernel_range(space, layout.blocks()),
      KOKKOS_LAMBDA(const Index b) {
        block_mean(b) = sum_over_stat(layout, sums, 0, layout.stat_of_block(b)) / count;
      });
}

void statistic_moments(const ExecutionSpace& space, const StatLayout& layout,
                       const BlockDoubles& block_mean, const BlockDoubles& deviations, double count,
                       const BlockDoubles& mean, const BlockDoubles& var) {
  const Index blocks = layout.blocks();
  Kokkos::parallel_for(
      "normalization_moments", kernel_range(space, layout.stats()), KOKKOS_LAMBDA(const Index s) {
        const double d = sum_over_stat(layout, deviations, 0, s);
        const double d2 = sum_over_stat(layout, deviations, blocks, s);
        mean(s) = block_mean(layout.block_of_stat(s, 0)) + d / count;
        const double v = (d2 - d * d / count) / count;
        var(s) = v > 0 ? v : 0.0;
      });
}

template <class S, class T>
void block_coefficients(const ExecutionSpace& space, const StatLayout& layout,
                        const Kokkos::View<const S*, DefaultMemorySpace>& stat_mean,
                        const Kokkos::View<const S*, DefaultMemorySpace>& stat_var, double eps,
                        const Kokkos::View<const T*, DefaultMemorySpace>& weight,
                        const Kokkos::View<const T*, DefaultMemorySpace>& bias,
                        const BlockDoubles& mean, const BlockDoubles& rstd,
                        const BlockDoubles& scale, const BlockDoubles& shift) {
  const Index channels = layout.channels;
  const bool has_weight = weight.extent(0) != 0, has_bias = bias.extent(0) != 0;
  Kokkos::parallel_for(
      "normalization_coefficients", kernel_range(space, layout.blocks()),
      KOKKOS_LAMBDA(const Index b) {
        const Index s = layout.stat_of_block(b);
        mean(b) = static_cast<double>(stat_mean(s));
        rstd(b) = 1.0 / math::sqrt(static_cast<double>(stat_var(s)) + eps);
        if (b < channels) {
          scale(b) = has_weight ? static_cast<double>(weight(b)) : 1.0;
          shift(b) = has_bias ? static_cast<double>(bias(b)) : 0.0;
        }
      });
}

template <class T>
void update_running_statistics(const ExecutionSpace& space, const BlockDoubles& stat_mean,
                               const BlockDoubles& stat_var, double momentum, double unbias,
                               const Kokkos::View<T*, DefaultMemorySpace>& running_mean,
                               const Kokkos::View<T*, DefaultMemorySpace>& running_var) {
  Kokkos::parallel_for(
      "normalization_running_statistics", kernel_range(space, Index(running_mean.extent(0))),
      KOKKOS_LAMBDA(const Index c) {
        running_mean(c) = static_cast<T>((1 - momentum) * static_cast<double>(running_mean(c)) +
                                         momentum * stat_mean(c));
        running_var(c) = static_cast<T>((1 - momentum) * static_cast<double>(running_var(c)) +
                                        momentum * stat_var(c) * unbias);
      });
}

template <class T>
void add_channel_sums(const ExecutionSpace& space, const StatLayout& layout,
                      const BlockDoubles& per_block,
                      const Kokkos::View<T*, DefaultMemorySpace>& grad) {
  const Index channels = layout.channels, batch = layout.batch;
  Kokkos::parallel_for(
      "normalization_channel_sums", kernel_range(space, channels), KOKKOS_LAMBDA(const Index c) {
        double s = 0;
        for (Index n = 0; n < batch; ++n) s += per_block(n * channels + c);
        grad(c) += static_cast<T>(s);
      });
}

void backward_coefficients(const ExecutionSpace& space, const StatLayout& layout,
                           const BlockDoubles& rstd, const BlockDoubles& scale,
                           const BlockDoubles& sums, double count, bool batch_stats,
                           const BlockDoubles& c1, const BlockDoubles& c2, const BlockDoubles& c3) {
  const Index channels = layout.channels, blocks = layout.blocks();
  Kokkos::parallel_for(
      "normalization_backward_coefficients", kernel_range(space, blocks),
      KOKKOS_LAMBDA(const Index b) {
        c1(b) = rstd(b) * scale(b % channels);
        double g = 0, gx = 0;
        if (batch_stats) {
          const Index s = layout.stat_of_block(b);
          for (Index i = 0; i < layout.blocks_per_stat(); ++i) {
            const Index other = layout.block_of_stat(s, i);
            g += scale(other % channels) * sums(other);
            gx += scale(other % channels) * sums(blocks + other);
          }
        }
        c2(b) = rstd(b) * g / count;
        c3(b) = rstd(b) * gx / count;
      });
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                 \
  template void block_sums(const ExecutionSpace&, const OwnedCells<const T>&,                      \
                           const BlockDoubles&);                                                   \
  template void block_deviation_sums(const ExecutionSpace&, const OwnedCells<const T>&,            \
                                     const BlockDoubles&, const BlockDoubles&);                    \
  template void block_coefficients(const ExecutionSpace&, const StatLayout&,                       \
                                   const Kokkos::View<const double*, DefaultMemorySpace>&,         \
                                   const Kokkos::View<const double*, DefaultMemorySpace>&, double, \
                                   const Kokkos::View<const T*, DefaultMemorySpace>&,              \
                                   const Kokkos::View<const T*, DefaultMemorySpace>&,              \
                                   const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,  \
                                   const BlockDoubles&);                                           \
  template void update_running_statistics(                                                         \
      const ExecutionSpace&, const BlockDoubles&, const BlockDoubles&, double, double,             \
      const Kokkos::View<T*, DefaultMemorySpace>&, const Kokkos::View<T*, DefaultMemorySpace>&);   \
  template void add_channel_sums(const ExecutionSpace&, const StatLayout&, const BlockDoubles&,    \
                                 const Kokkos::View<T*, DefaultMemorySpace>&);                     \
  template void normalize_forward(const ExecutionSpace&, const OwnedCells<const T>&,               \
                                  const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,   \
                                  const BlockDoubles&, const OwnedCells<T>&);                      \
  template void normalize_activation_gradient(                                                     \
      const ExecutionSpace&, const OwnedCells<const T>&, const OwnedCells<const T>&,               \
      const BlockDoubles&, const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,          \
      const ActivationFunction<T>&, const OwnedCells<T>&);                                         \
  template void normalize_gradient_sums(const ExecutionSpace&, const OwnedCells<const T>&,         \
                                        const OwnedCells<const T>&, const BlockDoubles&,           \
                                        const BlockDoubles&, const BlockDoubles&);                 \
  template void normalize_backward(const ExecutionSpace&, const OwnedCells<const T>&,              \
                                   const OwnedCells<const T>&, const BlockDoubles&,                \
                                   const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,  \
                                   const BlockDoubles&, const OwnedCells<T>&, bool);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE
// BatchNorm in evaluation: its running statistics in float.
template void block_coefficients(const ExecutionSpace&, const StatLayout&,
                                 const Kokkos::View<const float*, DefaultMemorySpace>&,
                                 const Kokkos::View<const float*, DefaultMemorySpace>&, double,
                                 const Kokkos::View<const float*, DefaultMemorySpace>&,
                                 const Kokkos::View<const float*, DefaultMemorySpace>&,
                                 const BlockDoubles&, const BlockDoubles&, const BlockDoubles&,
                                 const BlockDoubles&);

}  // namespace shardtensor::kernels
