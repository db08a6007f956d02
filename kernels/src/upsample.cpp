#include "shardtensor/kernels/upsample.hpp"

#include <algorithm>

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/memory_tracker.hpp"

namespace shardtensor::kernels {

namespace {

/// Linear interpolation per axis, computed once per plan instead of once per cell (and per
/// candidate output in the backward): entry first[a] + o holds output o's lower and upper
/// sources along axis a (buffer indices) and the lower's weight. The same values
/// linear_source gives, so the same sums.
template <class T>
struct LinearTable {
  Kokkos::View<Index*, DefaultMemorySpace> lower, upper;
  Kokkos::View<T*, DefaultMemorySpace> weight;
  Index first[3] = {0, 0, 0};

  LinearTable() = default;  // empty: a nearest plan's
  LinearTable(const ExecutionSpace& space, const UpsampleShape& g)
      : lower(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::table.lower"),
              g.out[0] + g.out[1] + g.out[2]),
        upper(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::table.upper"),
              g.out[0] + g.out[1] + g.out[2]),
        weight(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::table.weight"),
               g.out[0] + g.out[1] + g.out[2]),
        first{0, g.out[0], g.out[0] + g.out[1]} {
    fill(space, g);
  }

  // Apart from the constructor: CUDA's device lambdas cannot live in one.
  void fill(const ExecutionSpace& space, const UpsampleShape& g) const {
    const auto l = lower;
    const auto u = upper;
    const auto w = weight;
    const Index second = first[1], third = first[2];
    Kokkos::parallel_for(
        "Upsample::table", kernel_range(space, l.extent(0)), KOKKOS_LAMBDA(const Index i) {
          const int axis = i < second ? 0 : i < third ? 1 : 2;
          g.linear_source(axis, i - (axis == 0 ? 0 : axis == 1 ? second : third), l(i), u(i), w(i));
        });
  }
};

/// Weight of input buffer index i in output o along axis a (0 for the outputs that do not
/// read it; 1 along unused axes). A clamped source read twice (its lower and upper at a
/// field's end) adds both weights.
template <class T>
KOKKOS_INLINE_FUNCTION T axis_weight(const UpsampleShape& g, UpsampleMode mode,
                                     const LinearTable<T>& table, int a, Index o, Index i) {
  if (mode == UpsampleMode::nearest)
    return (g.out_offset[a] + o) / g.scale[a] - g.in_offset[a] + g.ghost[a] == i ? T(1) : T(0);
  if (g.in[a] == 1) return T(1);  // unused axis
  const Index entry = table.first[a] + o;
  const Index lower = table.lower(entry), upper = table.upper(entry);
  const T w = table.weight(entry);
  if (lower == upper) return lower == i ? w + (1 - w) : T(0);
  return lower == i ? w : (upper == i ? 1 - w : T(0));
}

}  // namespace

/// Nearest mode's source cell per output index, per axis (entry first[a] + o: the input buffer
/// index output o reads along axis a): computed once per plan, so the copy does no integer
/// division per cell.
struct NearestTable {
  Kokkos::View<Index*, DefaultMemorySpace> source;
  Index first[3] = {0, 0, 0};

  NearestTable() = default;  // empty: a linear plan's
  NearestTable(const ExecutionSpace& space, const UpsampleShape& g)
      : source(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::nearest_table"),
               g.out[0] + g.out[1] + g.out[2]),
        first{0, g.out[0], g.out[0] + g.out[1]} {
    fill(space, g);
  }

  void fill(const ExecutionSpace& space, const UpsampleShape& g) const {
    const auto s = source;
    const Index second = first[1], third = first[2];
    Kokkos::parallel_for(
        "Upsample::nearest_table", kernel_range(space, s.extent(0)), KOKKOS_LAMBDA(const Index i) {
          const int a = i < second ? 0 : i < third ? 1 : 2;
          const Index o = i - (a == 0 ? 0 : a == 1 ? second : third);
          s(i) = (g.out_offset[a] + o) / g.scale[a] - g.in_offset[a] + g.ghost[a];
        });
  }
};

/// Planar linear interpolation as the 2-D form reads (x's weight outside, y's inside), with
/// weight w across the line and wa along it; lines along y (`along_y`) or along x.
template <bool along_y, class T>
KOKKOS_INLINE_FUNCTION T planar_linear(T w, T wa, T ll, T lh, T hl, T hh) {
  if (along_y) return w * (wa * ll + (1 - wa) * lh) + (1 - w) * (wa * hl + (1 - wa) * hh);
  return wa * (w * ll + (1 - w) * hl) + (1 - wa) * (w * lh + (1 - w) * hh);
}

/// A line of scale-2 outputs from the lines `low` and `high` across it: even outputs read
/// sources even_first + j and the next with weight w_even, odd ones odd_first + j likewise.
template <bool along_y, class T>
KOKKOS_INLINE_FUNCTION void planar_linear_pairs(const T* low, const T* high, T* out, Index length,
                                                T w, Index even_first, T w_even, Index odd_first,
                                                T w_odd) {
  // Restricted (the output is not the input) and without table lookups: a loop the compiler
  // vectorises.
  const T* KOKKOS_RESTRICT const le = low + even_first;
  const T* KOKKOS_RESTRICT const he = high + even_first;
  const T* KOKKOS_RESTRICT const lo = low + odd_first;
  const T* KOKKOS_RESTRICT const ho = high + odd_first;
  T* KOKKOS_RESTRICT const to = out;
  const Index half = length / 2;
  for (Index j = 0; j < half; ++j) {
    to[2 * j] = planar_linear<along_y>(w, w_even, le[j], le[j + 1], he[j], he[j + 1]);
    to[2 * j + 1] = planar_linear<along_y>(w, w_odd, lo[j], lo[j + 1], ho[j], ho[j + 1]);
  }
  if (length % 2 != 0)
    to[length - 1] =
        planar_linear<along_y>(w, w_even, le[half], le[half + 1], he[half], he[half + 1]);
}

/// a[i] = w * s[first + j] + (1 - w) * s[first + j + 1] at i = 2j, and likewise at odd i with
/// `second` and v: `count` outputs of scale-2 linear interpolation along a contiguous row,
/// the first of them at `first`'s parity. Restricted, no table lookups: it vectorises.
template <class T>
KOKKOS_INLINE_FUNCTION void along_pairs(const T* KOKKOS_RESTRICT s, T* KOKKOS_RESTRICT a,
                                        Index count, Index first, T w, Index second, T v) {
  const Index half = count / 2;
  for (Index j = 0; j < half; ++j) {
    a[2 * j] = w * s[first + j] + (1 - w) * s[first + j + 1];
    a[2 * j + 1] = v * s[second + j] + (1 - v) * s[second + j + 1];
  }
  if (count % 2 != 0) a[count - 1] = w * s[first + half] + (1 - w) * s[first + half + 1];
}

/// The 2-D linear forward on the host, y lines contiguous: separable. A work item is a
/// chunk of columns of one plane. Each source row it reads is interpolated along y once
/// (wa * s[la] + (1 - wa) * s[ha]: by pairs between pairs_begin and pairs_end, the rest from
/// the table) for the two to four output rows that read it; an output row then combines its
/// two source rows across x (w * low + (1 - w) * high). planar_linear's operations in its
/// order, so the same values, with half its multiplications and no per-line set-up.
template <class T>
void forward_planar_separable(const ExecutionSpace& space, const UpsampleShape& g,
                              const LinearTable<T>& table, Index pairs_begin, Index pairs_end,
                              const FieldView<T>& x, const FieldView<T>& y) {
  constexpr Index chunk = 64;  // outputs along y per work item: two rows of them on its stack
  const Index rows = g.out[0], length = g.out[1], channels = g.channels;
  const Index chunks = (length + chunk - 1) / chunk;
  const auto lower = table.lower;
  const auto upper = table.upper;
  const auto weight = table.weight;
  const Index across = table.first[0], along = table.first[1];
  const Index in_row = x.stride(2), out_row = y.stride(2);
  Kokkos::parallel_for(
      "Upsample::forward_separable", kernel_range(space, Index(y.extent(0)) * channels * chunks),
      KOKKOS_LAMBDA(const Index item) {
        const Index plane = item / chunks, o0 = item % chunks * chunk;
        const Index cells = math::min(chunk, length - o0);
        const T* const source = &x(plane / channels, plane % channels, 0, 0, 0);
        T* const out = &y(plane / channels, plane % channels, 0, o0, 0);
        T along_rows[2][chunk];
        Index row_of[2] = {-1, -1};  // the source row each holds
        const auto interpolate = [&](Index r, T* a) {
          const T* const s = source + r * in_row;
          for (Index i = 0; i < cells; ++i) {
            const Index o = o0 + i;
            if (o == math::max(o0, pairs_begin) && o < pairs_end) {
              const Index count = math::min(o0 + cells, pairs_end) - o, k = o - pairs_begin;
              const Index at = along + pairs_begin;
              if (k % 2 == 0)
                along_pairs(s, a + i, count, lower(at) + k / 2, weight(at), lower(at + 1) + k / 2,
                            weight(at + 1));
              else
                along_pairs(s, a + i, count, lower(at + 1) + k / 2, weight(at + 1),
                            lower(at) + k / 2 + 1, weight(at));
              i += count - 1;
              continue;
            }
            const T wa = weight(along + o);
            a[i] = wa * s[lower(along + o)] + (1 - wa) * s[upper(along + o)];
          }
        };
        // The interpolated source row r, made now if neither slot holds it (into the slot
        // not holding `keep`, the other row the output row reads).
        const auto row = [&](Index r, Index keep) -> const T* {
          for (int k = 0; k < 2; ++k)
            if (row_of[k] == r) return along_rows[k];
          const int k = row_of[0] == keep ? 1 : 0;
          interpolate(r, along_rows[k]);
          row_of[k] = r;
          return along_rows[k];
        };
        for (Index ox = 0; ox < rows; ++ox) {
          const Index l = lower(across + ox), h = upper(across + ox);
          const T w = weight(across + ox);
          const T* KOKKOS_RESTRICT const low = row(l, h);
          const T* KOKKOS_RESTRICT const high = row(h, l);
          T* KOKKOS_RESTRICT const to = out + ox * out_row;
          for (Index i = 0; i < cells; ++i) to[i] = w * low[i] + (1 - w) * high[i];
        }
      });
}

/// Input-buffer gradient's ranges: per axis and input index (entry in_first[a] + i, in_first
/// = {0, in[0], in[0] + in[1]}), the outputs with a nonzero weight in its cell (begin, end: a
/// contiguous range, a few of the 3 x scale candidates) and their weights, `room` apart.
template <class T>
struct InputRanges {
  Kokkos::View<Index*, DefaultMemorySpace> begin, end;
  Kokkos::View<T*, DefaultMemorySpace> weights;
  Index room = 0;

  InputRanges() = default;
  InputRanges(const ExecutionSpace& space, const UpsampleShape& g, UpsampleMode mode,
              const LinearTable<T>& table)
      : begin(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::range.begin"),
              g.in[0] + g.in[1] + g.in[2]),
        end(Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::range.end"),
            g.in[0] + g.in[1] + g.in[2]),
        // A range holds at most 2 x scale outputs (linear), scale (nearest).
        room(2 * std::max({g.scale[0], g.scale[1], g.scale[2]}) + 1) {
    weights = decltype(weights)(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "Upsample::range.weights"),
        begin.extent(0) * room);
    fill(space, g, mode, table);
  }

  void fill(const ExecutionSpace& space, const UpsampleShape& g, UpsampleMode mode,
            const LinearTable<T>& table) const {
    const Index in_first[3] = {0, g.in[0], g.in[0] + g.in[1]};
    const auto b_of = begin;
    const auto e_of = end;
    const auto w_of = weights;
    const Index r = room;
    Kokkos::parallel_for(
        "Upsample::ranges", kernel_range(space, b_of.extent(0)), KOKKOS_LAMBDA(const Index e) {
          const int a = e < in_first[1] ? 0 : e < in_first[2] ? 1 : 2;
          const Index i = e - in_first[a];
          const Index global = i - g.ghost[a] + g.in_offset[a];
          const Index first = math::max<Index>((global - 1) * g.scale[a] - g.out_offset[a], 0);
          const Index last =
              math::min<Index>((global + 2) * g.scale[a] - g.out_offset[a], g.out[a]);
          Index b = last, f = last;
          for (Index o = first; o < last; ++o)
            if (axis_weight(g, mode, table, a, o, i) != T(0)) {
              if (b == last) b = o;
              f = o + 1;
            }
          b_of(e) = b;
          e_of(e) = b == last ? b : f;
          for (Index o = b; o < e_of(e); ++o)
            w_of(e * r + o - b) = axis_weight(g, mode, table, a, o, i);
        });
  }
};

template <class T>
struct UpsamplePlan<T>::Tables {
  LinearTable<T> linear;  // linear mode
  NearestTable nearest;   // nearest mode
  InputRanges<T> ranges;
};

template <class T>
UpsamplePlan<T>::UpsamplePlan(const ExecutionSpace& space, const UpsampleShape& g,
                              UpsampleMode mode)
    : shape_(g), mode_(mode) {
  const MemoryCategoryScope scope(MemoryCategory::workspaces);  // kept with the layer
  auto tables = std::make_shared<Tables>();
  if (mode == UpsampleMode::linear)
    tables->linear = LinearTable<T>(space, g);
  else
    tables->nearest = NearestTable(space, g);
  tables->ranges = InputRanges<T>(space, g, mode, tables->linear);
  tables_ = std::move(tables);
}

template <class T>
void upsample_forward(const ExecutionSpace& space, const UpsamplePlan<T>& plan,
                      const FieldView<T>& x, const FieldView<T>& y) {
  const UpsampleShape g = plan.shape();
  const Index extents[3] = {g.out[0], g.out[1], g.out[2]};
  if (plan.mode() == UpsampleMode::nearest) {
    // A copy along lines: per line its source line's start, then one table entry per cell.
    const NearestTable& table = plan.tables().nearest;
    const auto source = table.source;
    const Index f0 = table.first[0], f1 = table.first[1], f2 = table.first[2];
    const Lines lines(y.extent(0), g.channels, extents);
    const int axis = lines.axis;
    const Index length = lines.length, along = table.first[axis];
    const Index in_step = x.stride(2 + axis), out_step = y.stride(2 + axis);
    for_each_line(
        space, "Upsample::forward_nearest", lines, KOKKOS_LAMBDA(const CellIndex& c) {
          Index from[3] = {source(f0 + c.x), source(f1 + c.y), source(f2 + c.z)};
          from[axis] = 0;
          const T* in = &x(c.n, c.c, from[0], from[1], from[2]);
          T* out = &y(c.n, c.c, c.x, c.y, c.z);
          for (Index i = 0; i < length; ++i) out[i * out_step] = in[source(along + i) * in_step];
        });
    return;
  }
  const LinearTable<T>& table = plan.tables().linear;
  const auto lower = table.lower;
  const auto upper = table.upper;
  const auto weight = table.weight;
  const Index f0 = table.first[0], f1 = table.first[1], f2 = table.first[2];
  if (g.in[2] == 1 && g.out[2] == 1) {
    // 1-D and 2-D fields: z is unused (weight 1 on its one cell), so the four sources of the
    // x-y plane are all there is; the trilinear form below reads each twice and adds
    // 1 * v + 0 * v, the same value for every finite v. One line at a time along
    // the line axis (y in 2-D, x in 1-D): the other axis's sources and weight once per line.
    const Lines lines(y.extent(0), g.channels, extents);
    const int axis = lines.axis;
    const Index length = lines.length;
    const Index along = table.first[axis], across = table.first[1 - axis];
    const Index in_steps[2] = {Index(x.stride(2)), Index(x.stride(3))},
                out_step = y.stride(2 + axis);
    const Index step = in_steps[axis], across_step = in_steps[1 - axis];
    // Scale 2 along contiguous lines (the U-Net's upsampling): even outputs all have one
    // weight and odd ones another, and each pair's sources are one cell on from the last
    // pair's. Then the outputs [pairs_begin, pairs_end) of a line (all of them, but the
    // clamped ones at a field's ends) are pairs with no table lookups, a loop the compiler
    // vectorises: the same values and operations, so the same sums.
    Index pairs_begin = 0, pairs_end = 0;
    Index lower_even = 0, lower_odd = 0;
    T weight_even = 0, weight_odd = 0;
    if constexpr (kernels_run_on_host) {
      if (step == 1 && out_step == 1) {
        const auto next_cell = [&](Index i) { return upper(along + i) == lower(along + i) + 1; };
        while (pairs_begin < length && !next_cell(pairs_begin)) ++pairs_begin;
        const auto regular = [&](Index i) {
          return next_cell(i) &&
                 (i < pairs_begin + 2 || (lower(along + i) == lower(along + i - 2) + 1 &&
                                          weight(along + i) == weight(along + i - 2)));
        };
        pairs_end = pairs_begin;
        while (pairs_end < length && regular(pairs_end)) ++pairs_end;
        if (pairs_end - pairs_begin < 2) pairs_end = pairs_begin;  // no pair: cell by cell
      }
      if (pairs_end > pairs_begin) {
        lower_even = lower(along + pairs_begin), lower_odd = lower(along + pairs_begin + 1);
        weight_even = weight(along + pairs_begin), weight_odd = weight(along + pairs_begin + 1);
      }
    }
    if constexpr (kernels_run_on_host)
      if (axis == 1 && step == 1 && out_step == 1)
        return forward_planar_separable(space, g, table, pairs_begin, pairs_end, x, y);
    for_each_line(
        space, "Upsample::forward_planar", lines, KOKKOS_LAMBDA(const CellIndex& c) {
          const Index o_across = axis == 1 ? c.x : c.y;
          const Index l = lower(across + o_across), h = upper(across + o_across);
          const T w = weight(across + o_across);
          const T* const p = &x(c.n, c.c, 0, 0, 0);
          const T* const low = p + l * across_step;  // the lines of the two sources across
          const T* const high = p + h * across_step;
          T* const out = &y(c.n, c.c, c.x, c.y, 0);
          for (Index i = 0; i < length; ++i) {
            if (i == pairs_begin && pairs_end > pairs_begin) {
              if (axis == 1)
                planar_linear_pairs<true>(low, high, out + i, pairs_end - i, w, lower_even,
                                          weight_even, lower_odd, weight_odd);
              else
                planar_linear_pairs<false>(low, high, out + i, pairs_end - i, w, lower_even,
                                           weight_even, lower_odd, weight_odd);
              i = pairs_end - 1;
              continue;
            }
            const Index la = lower(along + i), ha = upper(along + i);
            const T wa = weight(along + i);
            const T ll = low[la * step], lh = low[ha * step];
            const T hl = high[la * step], hh = high[ha * step];
            out[i * out_step] = axis == 1 ? planar_linear<true>(w, wa, ll, lh, hl, hh)
                                          : planar_linear<false>(w, wa, ll, lh, hl, hh);
          }
        });
    return;
  }
  for_each_cell_by_lines(
      space, "Upsample::forward", y.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ox, const Index oy, const Index oz) {
        const Index lx = lower(f0 + ox), ly = lower(f1 + oy), lz = lower(f2 + oz);
        const T wx = weight(f0 + ox), wy = weight(f1 + oy), wz = weight(f2 + oz);
        // Unused axes have scale 1: source = o exactly, weight 1 on the lower cell (the upper
        // is the same cell).
        const Index hx = upper(f0 + ox), hy = upper(f1 + oy), hz = upper(f2 + oz);
        // The eight sources through one base pointer (5-D indexing per load cost more than the
        // interpolation).
        const T* p = &x(n, c, 0, 0, 0);
        const Index sx = x.stride(2), sy = x.stride(3);
        const T* lxly = p + lx * sx + ly * sy;
        const T* lxhy = p + lx * sx + hy * sy;
        const T* hxly = p + hx * sx + ly * sy;
        const T* hxhy = p + hx * sx + hy * sy;
        y(n, c, ox, oy, oz) = wx * (wy * (wz * lxly[lz] + (1 - wz) * lxly[hz]) +
                                    (1 - wy) * (wz * lxhy[lz] + (1 - wz) * lxhy[hz])) +
                              (1 - wx) * (wy * (wz * hxly[lz] + (1 - wz) * hxly[hz]) +
                                          (1 - wy) * (wz * hxhy[lz] + (1 - wz) * hxhy[hz]));
      });
}

/// Input-buffer gradient: each input cell gathers from the outputs that read it, visiting
/// only those of nonzero weight (the plan's ranges).
template <class T>
void upsample_backward(const ExecutionSpace& space, const UpsamplePlan<T>& plan,
                       const FieldView<T>& gy, const FieldView<T>& gx) {
  const UpsampleShape g = plan.shape();
  const UpsampleMode mode = plan.mode();
  const InputRanges<T>& ranges = plan.tables().ranges;
  const auto begin = ranges.begin;
  const auto end = ranges.end;
  const auto weights = ranges.weights;
  const Index room = ranges.room;
  const Index in_first[3] = {0, g.in[0], g.in[0] + g.in[1]};
  const Index extents[3] = {g.in[0], g.in[1], g.in[2]};
  if (g.in[2] == 1 && g.out[2] == 1) {
    // 1-D and 2-D fields: z is unused (one output, weight 1), so its loop and its factor go
    // (w * 1 * g is w * g: the same sums). One input line at a time along the line axis
    // (y in 2-D, x in 1-D): the across axis's range and weights once per line.
    const Lines lines(gx.extent(0), g.channels, extents);
    const int axis = lines.axis;
    const Index length = lines.length;
    const Index along_first = in_first[axis], across_first = in_first[1 - axis];
    const Index steps[2] = {Index(gy.stride(2)), Index(gy.stride(3))};
    const Index along_step = steps[axis], across_step = steps[1 - axis];
    const Index in_step = gx.stride(2 + axis);
    // Scale 2 along contiguous y lines (the 2-D U-Net's linear upsampling), on the host: the
    // input cells [regular_begin, regular_end) of a line each read the 4 outputs from two on
    // from the last cell's, with the same 4 weights (all but the cells next to a line's ends).
    // Their sums run side by side, a chunk of cells at a time (a loop the compiler
    // vectorises), each cell's terms in the same order and operations: the same sums.
    constexpr Index regular_reads = 4;
    Index regular_begin = 0, regular_end = 0;
    T regular_weights[regular_reads] = {};
    if constexpr (kernels_run_on_host) {
      const auto reads = [&](Index i) { return end(along_first + i) - begin(along_first + i); };
      if (axis == 1 && along_step == 1 && in_step == 1) {
        while (regular_begin < length && reads(regular_begin) != regular_reads) ++regular_begin;
        const Index e0 = along_first + regular_begin;
        regular_end = regular_begin;
        const auto regular = [&](Index i) {
          const Index e = along_first + i;
          bool same = reads(i) == regular_reads && begin(e) == begin(e0) + 2 * (i - regular_begin);
          for (Index k = 0; same && k < regular_reads; ++k)
            same = weights(e * room + k) == weights(e0 * room + k);
          return same;
        };
        while (regular_end < length && regular(regular_end)) ++regular_end;
        for (Index k = 0; regular_end > regular_begin && k < regular_reads; ++k)
          regular_weights[k] = weights(e0 * room + k);
      }
    }
    for_each_line(
        space, "Upsample::backward_planar", lines, KOKKOS_LAMBDA(const CellIndex& c) {
          const Index e_across = across_first + (axis == 1 ? c.x : c.y);
          const Index b_across = begin(e_across), n_across = end(e_across) - b_across;
          const T* w_across = weights.data() + e_across * room;
          const T* const g_line = &gy(c.n, c.c, 0, 0, 0) + b_across * across_step;
          T* const out = &gx(c.n, c.c, c.x, c.y, 0);
          for (Index i = 0; i < length; ++i) {
            if (i == regular_begin && regular_begin < regular_end) {  // along y: steps of 1
              constexpr Index chunk = 32;
              for (Index i0 = regular_begin; i0 < regular_end; i0 += chunk) {
                const Index cells = math::min(chunk, regular_end - i0);
                T sums[chunk];
                for (Index q = 0; q < cells; ++q) sums[q] = T(0);
                const T* const g0 = g_line + begin(along_first + i0);
                for (Index p = 0; p < n_across; ++p) {
                  const T weight_x = T(1) * w_across[p];
                  const T* const row = g0 + p * across_step;
                  for (Index k = 0; k < regular_reads; ++k) {
                    const T weight = weight_x * regular_weights[k];
                    for (Index q = 0; q < cells; ++q) sums[q] += weight * row[2 * q + k];
                  }
                }
                for (Index q = 0; q < cells; ++q) out[i0 + q] += sums[q];
              }
              i = regular_end - 1;
              continue;
            }
            const Index e = along_first + i;
            const Index b = begin(e), count = end(e) - b;
            const T* w = weights.data() + e * room;
            const T* g0 = g_line + b * along_step;
            // The sum in x-major order, as the 3-D loops take it: x's weight outside.
            T sum = 0;
            if (axis == 1) {
              for (Index p = 0; p < n_across; ++p) {
                const T weight_x = T(1) * w_across[p];
                for (Index q = 0; q < count; ++q)
                  sum += weight_x * w[q] * g0[p * across_step + q * along_step];
              }
            } else {
              for (Index p = 0; p < count; ++p) {
                const T weight_x = T(1) * w[p];
                for (Index q = 0; q < n_across; ++q)
                  sum += weight_x * w_across[q] * g0[p * along_step + q * across_step];
              }
            }
            out[i * in_step] += sum;
          }
        });
    return;
  }
  if (mode == UpsampleMode::nearest && g.in[2] > 1) {  // lines along z
    // Nearest: each input cell sums its outputs (weights 1: 1 * 1 * g is g), in x, y, z
    // order. Per cell, that sum is a chain of dependent adds (latency-bound: 0.39x PyTorch);
    // here a line's cells are summed side by side, a chunk of them per (x, y) output row,
    // each cell's terms still in the same order: the same sums.
    const Lines lines(gx.extent(0), g.channels, extents);
    const Index length = lines.length;
    const Index sx = gy.stride(2), sy = gy.stride(3);
    Kokkos::parallel_for(
        "Upsample::backward_nearest", kernel_range(space, lines.count),
        KOKKOS_LAMBDA(const Index line) {
          constexpr Index chunk = 32;
          const CellIndex c = lines.start(line);
          const Index ex = in_first[0] + c.x, ey = in_first[1] + c.y;
          const Index bx = begin(ex), nx = end(ex) - bx, by = begin(ey), ny = end(ey) - by;
          const T* const g_plane = &gy(c.n, c.c, 0, 0, 0);
          T* const out = &gx(c.n, c.c, c.x, c.y, 0);
          for (Index z0 = 0; z0 < length; z0 += chunk) {
            const Index cells = z0 + chunk < length ? chunk : length - z0;
            T sums[chunk];
            Index first[chunk], count[chunk];
            // Regular: every cell of the chunk reads `scale` outputs, each cell's right after
            // the one before (all but the cells at a shard's odd split points).
            const Index scale = g.scale[2], b0 = begin(in_first[2] + z0);
            bool regular = true;
            for (Index q = 0; q < cells; ++q) {
              const Index ez = in_first[2] + z0 + q;
              first[q] = begin(ez);
              count[q] = end(ez) - first[q];
              regular = regular && count[q] == scale && first[q] == b0 + q * scale;
              sums[q] = T(0);
            }
            for (Index i = 0; i < nx; ++i)
              for (Index j = 0; j < ny; ++j) {
                const T* const row = g_plane + (bx + i) * sx + (by + j) * sy;
                if (regular) {  // k outside: each cell still takes its terms in k order
                  for (Index k = 0; k < scale; ++k)
                    for (Index q = 0; q < cells; ++q) sums[q] += row[b0 + q * scale + k];
                  continue;
                }
                for (Index q = 0; q < cells; ++q) {
                  T sum = sums[q];
                  for (Index k = 0; k < count[q]; ++k) sum += row[first[q] + k];
                  sums[q] = sum;
                }
              }
            for (Index q = 0; q < cells; ++q) out[z0 + q] += sums[q];
          }
        });
    return;
  }
  for_each_cell_by_lines(
      space, "Upsample::backward", gx.extent(0), g.channels, extents,
      KOKKOS_LAMBDA(const Index n, const Index c, const Index ix, const Index iy, const Index iz) {
        const Index ex = in_first[0] + ix, ey = in_first[1] + iy, ez = in_first[2] + iz;
        // Everything the loops read, in locals: the compiler cannot keep View reads out of
        // the loops itself (the store to gx might alias them).
        const Index bx = begin(ex), by = begin(ey), bz = begin(ez);
        const Index nx = end(ex) - bx, ny = end(ey) - by, nz = end(ez) - bz;
        const T* wx = weights.data() + ex * room;  // wx[i]: the weight of output bx + i
        const T* wy = weights.data() + ey * room;
        const T* wz = weights.data() + ez * room;
        const T* g = &gy(n, c, 0, 0, 0);
        const Index sx = gy.stride(2), sy = gy.stride(3);
        T sum = 0;
        for (Index i = 0; i < nx; ++i) {
          const T weight_x = T(1) * wx[i];
          for (Index j = 0; j < ny; ++j) {
            const T weight_xy = weight_x * wy[j];
            const T* row = g + (bx + i) * sx + (by + j) * sy + bz;
            for (Index k = 0; k < nz; ++k) sum += weight_xy * wz[k] * row[k];
          }
        }
        gx(n, c, ix, iy, iz) += sum;  // accumulates: nearest mode writes the input gradient
      });
}

#define SHARDTENSOR_INSTANTIATE(T)                                               \
  template class UpsamplePlan<T>;                                                \
  template void upsample_forward(const ExecutionSpace&, const UpsamplePlan<T>&,  \
                                 const FieldView<T>&, const FieldView<T>&);      \
  template void upsample_backward(const ExecutionSpace&, const UpsamplePlan<T>&, \
                                  const FieldView<T>&, const FieldView<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
