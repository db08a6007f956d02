#include "shardtensor/kernels/pooling.hpp"

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/window_index.hpp"

namespace shardtensor::kernels {

namespace {

/// The largest value of the window whose first cell is `window` (taps `tap_step` apart along
/// each axis), and in `where` its tap's index. The first maximum wins, as in PyTorch. Selects,
/// not a branch: on random data a branch mispredicts about twice a window.
template <class T>
KOKKOS_INLINE_FUNCTION T window_max(const T* window, const PoolShape& g, const Index tap_step[3],
                                    Index& where) {
  T best = -math::infinity<T>();
  Index tap = 0;
  for (Index a = 0; a < g.k[0]; ++a)
    for (Index b = 0; b < g.k[1]; ++b) {
      const T* row = window + a * tap_step[0] + b * tap_step[1];
      for (Index e = 0; e < g.k[2]; ++e, ++tap) {
        const T v = row[e * tap_step[2]];
        const bool larger = v > best;
        where = larger ? tap : where;
        best = larger ? v : best;
      }
    }
  return best;
}

/// sum[i] += row[2 i], then row[2 i + 1], for i < n: the pairs split by shuffles (restrict:
/// with the arrays possibly overlapping, the compiler loaded each cell alone).
template <class T>
KOKKOS_INLINE_FUNCTION void add_pairs(const T* KOKKOS_RESTRICT row, T* KOKKOS_RESTRICT sum,
                                      Index n) {
  for (Index i = 0; i < n; ++i) {
    sum[i] += row[2 * i];
    sum[i] += row[2 * i + 1];
  }
}

// The padded_flat offset of each tap from its window's first cell (no division per cell).
void fill_tap_offsets(const ExecutionSpace& space, const PoolShape& g,
                      const Kokkos::View<Index*, DefaultMemorySpace>& tap_offset) {
  Kokkos::parallel_for(
      "Pool::tap_offsets", kernel_range(space, tap_offset.extent(0)),
      KOKKOS_LAMBDA(const Index tap) {
        const Index e = tap % g.k[2], b = tap / g.k[2] % g.k[1], a = tap / (g.k[2] * g.k[1]);
        tap_offset(tap) = g.padded_flat(a * g.d[0], b * g.d[1], e * g.d[2]);
      });
}

// Per axis, entry first[a] + i: the output whose window holds padded index i, or -1.
void fill_windows(const ExecutionSpace& space, const PoolShape& g,
                  const Kokkos::View<Index*, DefaultMemorySpace>& window) {
  const Index first[3] = {0, g.padded[0], g.padded[0] + g.padded[1]};
  Kokkos::parallel_for(
      "Pool::windows", kernel_range(space, window.extent(0)), KOKKOS_LAMBDA(const Index e) {
        const int a = e < first[1] ? 0 : e < first[2] ? 1 : 2;
        const Index t = e - first[a] - g.base[a];
        const Index o = t >= 0 ? t / g.s[a] : -1, tap = t - o * g.s[a];
        const bool inside = t >= 0 && o < g.out[a] && tap % g.d[a] == 0 && tap / g.d[a] < g.k[a];
        window(e) = inside ? o : -1;
      });
}

}  // namespace

PoolPlan::PoolPlan(const ExecutionSpace& space, const PoolShape& g, PoolKind kind)
    : shape_(g), kind_(kind) {
  for (int d = 0; d < 3; ++d) disjoint_ = disjoint_ && g.s[d] >= (g.k[d] - 1) * g.d[d] + 1;
  if (!disjoint_) return;
  const MemoryCategoryScope scope(MemoryCategory::workspaces);  // kept with the layer
  const auto no_init = Kokkos::WithoutInitializing;
  if (kind == PoolKind::max) {
    table_ = decltype(table_)(Kokkos::view_alloc(no_init, "Pool::tap_offsets"),
                              g.k[0] * g.k[1] * g.k[2]);
    fill_tap_offsets(space, g, table_);
  } else {
    table_ = decltype(table_)(Kokkos::view_alloc(no_init, "Pool::windows"),
                              g.padded[0] + g.padded[1] + g.padded[2]);
    fill_windows(space, g, table_);
  }
}

template <class T>
void pool_forward(const ExecutionSpace& space, const PoolPlan& plan, const FieldView<T>& xp,
                  const FieldView<T>& y, const PoolArgmax& argmax) {
  const PoolShape g = plan.shape();
  const PoolKind kind = plan.kind();
  const Index extents[3] = {g.out[0], g.out[1], g.out[2]};
  const bool record = argmax.extent(0) > 0;
  // Line by line: a window's taps are fixed offsets from its first cell, which moves by the
  // stride along the line (no 5-D index per tap).
  const Lines lines(y.extent(0), g.channels, extents);
  const int axis = lines.axis;
  const Index length = lines.length, window_step = g.s[axis] * Index(xp.stride(2 + axis)),
              out_step = Index(y.stride(2 + axis)),
              argmax_step = record ? Index(argmax.stride(2 + axis)) : 0;
  const Index tap_step[3] = {g.d[0] * Index(xp.stride(2)), g.d[1] * Index(xp.stride(3)),
                             g.d[2] * Index(xp.stride(4))};
  if (kind == PoolKind::average) {
    // A block of a line's outputs at a time, summed tap by tap: the same additions in the same
    // order per output, but independent of each other (one output's four dependent adds and
    // its division at a time left the core waiting).
    const T divisor = T(g.constant_divisor());  // 0: it varies, per output
    if constexpr (kernels_run_on_host) {
      // Windows of two contiguous cells along the lines, the innermost taps (2x2 pooling): the
      // window step a constant the compiler vectorises (the strides below were scalar loads,
      // 2.5 % of a U-Net's inference); the same sums, tap by tap.
      bool pairs =
          g.k[axis] == 2 && g.s[axis] == 2 && tap_step[axis] == 1 && out_step == 1 && divisor != 0;
      for (int a = axis + 1; a < 3; ++a) pairs = pairs && g.k[a] == 1;
      if (pairs) {
        // The taps across the lines (the pairs' first cells); along them, the pair.
        const Index k0 = axis == 0 ? 1 : g.k[0], k1 = axis == 1 ? 1 : g.k[1];
        for_each_line(
            space, "Pool::forward_average", lines, KOKKOS_LAMBDA(const CellIndex& at) {
              constexpr Index block = 16;
              const T* window = &xp(at.n, at.c, g.base[0] + at.x * g.s[0],
                                    g.base[1] + at.y * g.s[1], g.base[2] + at.z * g.s[2]);
              T* out = &y(at.n, at.c, at.x, at.y, at.z);
              for (Index i0 = 0; i0 < length; i0 += block) {
                const Index count = length - i0 < block ? length - i0 : block;
                T sum[block] = {};
                for (Index a = 0; a < k0; ++a)
                  for (Index b = 0; b < k1; ++b) {
                    const T* taps = window + a * tap_step[0] + b * tap_step[1] + 2 * i0;
                    // A whole block's constant count: the loop the compiler unrolls.
                    add_pairs(taps, sum, count == block ? block : count);
                  }
                for (Index i = 0; i < count; ++i) out[i0 + i] = sum[i] / divisor;
              }
            });
        return;
      }
    }
    for_each_line(
        space, "Pool::forward_average", lines, KOKKOS_LAMBDA(const CellIndex& at) {
          constexpr Index block = 16;
          const T* window = &xp(at.n, at.c, g.base[0] + at.x * g.s[0], g.base[1] + at.y * g.s[1],
                                g.base[2] + at.z * g.s[2]);
          T* out = &y(at.n, at.c, at.x, at.y, at.z);
          for (Index i0 = 0; i0 < length; i0 += block, window += block * window_step) {
            const Index count = length - i0 < block ? length - i0 : block;
            T sum[block];
            for (Index i = 0; i < count; ++i) sum[i] = 0;
            for (Index a = 0; a < g.k[0]; ++a)
              for (Index b = 0; b < g.k[1]; ++b)
                for (Index e = 0; e < g.k[2]; ++e) {
                  const T* tap = window + a * tap_step[0] + b * tap_step[1] + e * tap_step[2];
                  for (Index i = 0; i < count; ++i) sum[i] += tap[i * window_step];
                }
            for (Index i = 0; i < count; ++i) {
              const Index o = i0 + i;
              const T d = divisor != 0 ? divisor
                                       : T(g.divisor(axis == 0 ? o : at.x, axis == 1 ? o : at.y,
                                                     axis == 2 ? o : at.z));
              out[o * out_step] = sum[i] / d;
            }
          }
        });
    return;
  }
  if constexpr (!kernels_run_on_host) {
    // On a GPU one output per work item, neighbours on neighbouring outputs (a line per thread
    // read lines a line apart); the same taps in the same order.
    for_each_cell_by_lines(
        space, "Pool::forward", y.extent(0), g.channels, extents,
        KOKKOS_LAMBDA(const Index n, const Index c, const Index ox, const Index oy,
                      const Index oz) {
          const T* window =
              &xp(n, c, g.base[0] + ox * g.s[0], g.base[1] + oy * g.s[1], g.base[2] + oz * g.s[2]);
          Index where = 0;
          y(n, c, ox, oy, oz) = window_max(window, g, tap_step, where);
          if (record) argmax(n, c, ox, oy, oz) = static_cast<std::uint16_t>(where);
        });
    return;
  }
  for_each_line(
      space, "Pool::forward", lines, KOKKOS_LAMBDA(const CellIndex& at) {
        const T* window = &xp(at.n, at.c, g.base[0] + at.x * g.s[0], g.base[1] + at.y * g.s[1],
                              g.base[2] + at.z * g.s[2]);
        T* out = &y(at.n, at.c, at.x, at.y, at.z);
        for (Index i = 0; i < length; ++i, window += window_step) {
          Index where = 0;
          out[i * out_step] = window_max(window, g, tap_step, where);
          if (record)
            (&argmax(at.n, at.c, at.x, at.y, at.z))[i * argmax_step] =
                static_cast<std::uint16_t>(where);
        }
      });
}

template <class T>
void pool_backward(const ExecutionSpace& space, const PoolPlan& plan, const FieldView<T>& gy,
                   const PoolArgmax& argmax, const FieldView<T>& gxp) {
  const PoolShape g = plan.shape();
  const PoolKind kind = plan.kind();
  const bool disjoint = plan.disjoint();  // every padded cell lies in at most one window
  if (kind == PoolKind::max && disjoint) {
    // Scatter each output's gradient to its window's maximum (gxp is zero on entry): the
    // gather below gives the same values, but tests every (cell, tap) pair with divisions.
    const auto tap_offset = plan.table();
    if constexpr (!kernels_run_on_host) {
      // On a GPU one output per work item (the windows are disjoint: no two add to one cell).
      const Index outputs[3] = {g.out[0], g.out[1], g.out[2]};
      for_each_cell_by_lines(
          space, "Pool::backward_scatter", gy.extent(0), g.channels, outputs,
          KOKKOS_LAMBDA(const Index n, const Index c, const Index ox, const Index oy,
                        const Index oz) {
            T* const cells = &gxp(n, c, 0, 0, 0);  // indexed by padded_flat
            const Index first = g.padded_flat(g.base[0] + ox * g.s[0], g.base[1] + oy * g.s[1],
                                              g.base[2] + oz * g.s[2]);
            cells[first + tap_offset(argmax(n, c, ox, oy, oz))] += gy(n, c, ox, oy, oz);
          });
      return;
    }
    const Index rows = static_cast<Index>(gy.extent(0)) * g.channels * g.out[0] * g.out[1];
    Kokkos::parallel_for(
        "Pool::backward_scatter", kernel_range(space, rows), KOKKOS_LAMBDA(const Index row) {
          const CellIndex r = unflatten(row, g.channels, g.out[0], g.out[1], 1);
          T* const cells = &gxp(r.n, r.c, 0, 0, 0);  // indexed by padded_flat
          const Index first =
              g.padded_flat(g.base[0] + r.x * g.s[0], g.base[1] + r.y * g.s[1], g.base[2]);
          for (Index oz = 0; oz < g.out[2]; ++oz)
            cells[first + oz * g.s[2] + tap_offset(argmax(r.n, r.c, r.x, r.y, oz))] +=
                gy(r.n, r.c, r.x, r.y, oz);
        });
    return;
  }
  const Index extents[3] = {g.padded[0], g.padded[1], g.padded[2]};
  if (kind == PoolKind::average && disjoint) {
    // Each padded cell lies in at most one window: the plan's table per axis names it (the
    // output, or -1), and the cell takes that output's share (the same single term the gather
    // below would add to 0).
    const Index first[3] = {0, g.padded[0], g.padded[0] + g.padded[1]};
    const auto window = plan.table();
    for_each_cell_by_lines(
        space, "Pool::backward_average", gxp.extent(0), g.channels, extents,
        KOKKOS_LAMBDA(const Index n, const Index c, const Index ix, const Index iy,
                      const Index iz) {
          const Index ox = window(first[0] + ix), oy = window(first[1] + iy),
                      oz = window(first[2] + iz);
          gxp(n, c, ix, iy, iz) = ox >= 0 && oy >= 0 && oz >= 0
                                      ? T(0) + gy(n, c, ox, oy, oz) / T(g.divisor(ox, oy, oz))
                                      : T(0);
        });
    return;
  }
  for_each_cell_by_lines(
      space, "Pool::backward", gxp.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ix, const Index iy, const Index iz) {
        T sum = 0;
        for (Index a = 0; a < g.k[0]; ++a) {
          const Index ox = window_output_of(ix, g.base[0], a, g.s[0], g.d[0], g.out[0]);
          if (ox < 0) continue;
          for (Index b = 0; b < g.k[1]; ++b) {
            const Index oy = window_output_of(iy, g.base[1], b, g.s[1], g.d[1], g.out[1]);
            if (oy < 0) continue;
            for (Index e = 0; e < g.k[2]; ++e) {
              const Index oz = window_output_of(iz, g.base[2], e, g.s[2], g.d[2], g.out[2]);
              if (oz < 0) continue;
              if (kind == PoolKind::max) {
                if (argmax(n, c, ox, oy, oz) == (a * g.k[1] + b) * g.k[2] + e)
                  sum += gy(n, c, ox, oy, oz);
              } else {
                sum += gy(n, c, ox, oy, oz) / T(g.divisor(ox, oy, oz));
              }
            }
          }
        }
        gxp(n, c, ix, iy, iz) = sum;
      });
}

#define SHARDTENSOR_INSTANTIATE(T)                                                         \
  template void pool_forward(const ExecutionSpace&, const PoolPlan&, const FieldView<T>&,  \
                             const FieldView<T>&, const PoolArgmax&);                      \
  template void pool_backward(const ExecutionSpace&, const PoolPlan&, const FieldView<T>&, \
                              const PoolArgmax&, const FieldView<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
