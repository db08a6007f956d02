#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#include "blas.hpp"  // kernels/backends: private to kernels

#include "host/conv_vector.hpp"  // kernels/backends: the backends are private to kernels
#include "host/conv_winograd.hpp"
#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/core/view_address.hpp"
#include "shardtensor/kernels/conv.hpp"

// The plane path, for unit strides (the common case): im2col expands only the (y, z) taps,
// one source x-plane at a time, and the x taps become shifts between planes. Output plane o
// under x tap a reads source plane offset + o + a * dilation, whose (y, z)-expanded columns
// are built once into a ring of workspace slots and reused by the next outputs. So the
// column data is 9x (not 27x) the field for a 3x3x3 kernel, and the GEMMs read and write the
// fields in place (no copies of outputs or output gradients). Per output plane and x tap a:
//   out[co, cells] += W_a[co, (ci, b, c)] . columns(plane)[(ci, b, c), cells]
// The input gradient is the same correlation of the output gradient with flipped, transposed
// weights (gather form: every padded cell written once, no col2im); the weight gradient is
// dW_a += dY[co, cells] . columns(plane)^T over the forward's columns.

namespace shardtensor::kernels {

namespace {

/// The weights of one group for every ring rotation r (the slot of the output plane's first
/// tap): packed[r][o][(s, j, b, c)] = weight of x tap a for the slot s = r + a * d (mod slots),
/// zero for slots no tap reads.
template <class T>
void pack_weights(const ExecutionSpace& space, const Correlation& r, const ConvShape& g,
                  const ReplicatedView<T>& w, Index group, bool transposed, T* packed) {
  const Index outs = r.out_per_group, srcs = r.src_per_group, slots = r.slots();
  const Index kx = g.k[0], ky = g.k[1], kz = g.k[2], dx = g.d[0];
  Kokkos::parallel_for(
      "Conv::pack_weights", kernel_range(space, slots * outs * slots * srcs * ky * kz),
      KOKKOS_LAMBDA(const Index flat) {
        const Index taps = srcs * ky * kz, j_b_c = flat % taps;
        const CellIndex cell = unflatten(flat / taps, outs, slots, 1, 1);  // (r, o, s)
        const Index rotation = cell.n, o = cell.c, s = cell.x;
        const Index j = j_b_c / (ky * kz), b = (j_b_c / kz) % ky, c = j_b_c % kz;
        const Index shift = slot_of(s - rotation, slots);  // = a * dx for a tap a
        const Index a = shift / dx;
        packed[flat] = shift % dx == 0 && a < kx
                           ? correlation_weight(g, w, group, transposed, o, j, a, b, c)
                           : T(0);
      });
}
/// columns[(j, b, c), (y - y0) * out_z + z] = src(n, group's channel j, x, offset_y + y + b d_y,
/// offset_z + z + c d_z) for output rows y in [y0, y1) of source plane x (zero outside src).
template <class T>
void plane_im2col(const ExecutionSpace& space, const Correlation& r, const FieldView<T>& src,
                  Index n, Index group, Index x, Index y0, Index y1,
                  const UnmanagedMatrix<T>& columns) {
  const Index rows = y1 - y0;
  Kokkos::parallel_for(
      "Conv::plane_im2col", kernel_range(space, r.column_rows() * rows),
      KOKKOS_LAMBDA(const Index flat) {
        const Index oy = y0 + flat % rows;
        const Index row = flat / rows;  // (j, b, c)
        const Index c = row % r.k[2], b = (row / r.k[2]) % r.k[1], j = row / (r.k[2] * r.k[1]);
        T* out = &columns(row, (oy - y0) * r.out[2]);
        const Index y = r.offset[1] + oy + b * r.d[1];
        const Index shift = r.offset[2] + c * r.d[2];  // source z of output z = 0
        // Output z in [first, last) reads inside the source; the rest is zero.
        const Index first = math::min(r.out[2], math::max<Index>(0, -shift));
        const Index last = math::max(first, math::min(r.out[2], r.src[2] - shift));
        if (x < 0 || x >= r.src[0] || y < 0 || y >= r.src[1]) {  // plane or row outside src
          for (Index z = 0; z < r.out[2]; ++z) out[z] = T(0);
          return;
        }
        const T* in = &src(n, group * r.src_per_group + j, x, y, 0);
        for (Index z = 0; z < first; ++z) out[z] = T(0);
        for (Index z = first; z < last; ++z) out[z] = in[z + shift];
        for (Index z = last; z < r.out[2]; ++z) out[z] = T(0);
      });
}

/// Channels [c0, c0 + count) of output rows [y0, y1) of plane x of a field as a matrix
/// (channels x cells): the rows are contiguous, the channels a stride apart. No copy.
template <class T>
UnmanagedMatrix<T> plane_rows(const FieldView<T>& f, Index n, Index c0, Index count, Index x,
                              Index y0, Index y1) {
  const UnmanagedMatrix<T> whole(address_of(f, n, c0, x, y0, 0), count, f.stride(1));
  return Kokkos::subview(whole, Kokkos::ALL,
                         std::make_pair(Index(0), (y1 - y0) * Index(f.extent(4))));
}

/// Rows of output cells per chunk so that the ring of column slots fits `budget` values;
/// 0 if not even one row fits.
inline Index plane_chunk_rows(const Correlation& r, std::size_t budget) {
  const std::size_t per_row = static_cast<std::size_t>(r.slots() * r.column_rows() * r.out[2]);
  return std::min<Index>(r.out[1], static_cast<Index>(budget / per_row));
}

/// Calls plane(n, group, x, y0, y1, rotation, columns) for every output plane x and chunk of
/// rows [y0, y1) selected by keep(x, y0, y1). `columns` stacks the ring's slots (slots x
/// column rows, cells): the (y, z)-expanded source planes offset + x ... offset + x +
/// (k - 1) d, the one of tap a in slot rotation + a d (mod slots); planes outside src are
/// zero. Each source plane is expanded once per chunk of rows.
template <class T, class Keep, class Plane>
void for_each_plane(const ExecutionSpace& space, const Correlation& r, const FieldView<T>& src,
                    T* ring, Index chunk_rows, const Keep& keep, const Plane& plane) {
  const Index slots = r.slots();
  std::vector<Index> slot_plane(slots);
  for (Index n = 0; n < Index(src.extent(0)); ++n)
    for (Index group = 0; group < r.groups; ++group)
      for (Index y0 = 0; y0 < r.out[1]; y0 += chunk_rows) {
        const Index y1 = std::min(y0 + chunk_rows, r.out[1]), cells = (y1 - y0) * r.out[2];
        std::fill(slot_plane.begin(), slot_plane.end(), std::numeric_limits<Index>::min());
        for (Index x = 0; x < r.out[0]; ++x) {
          if (!keep(x, y0, y1)) continue;
          for (Index sx = r.offset[0] + x; sx < r.offset[0] + x + slots; ++sx) {
            const Index slot = slot_of(sx, slots);
            if (slot_plane[slot] == sx) continue;
            const UnmanagedMatrix<T> columns(ring + slot * r.column_rows() * cells, r.column_rows(),
                                             cells);
            plane_im2col(space, r, src, n, group, sx, y0, y1, columns);
            slot_plane[slot] = sx;
          }
          plane(n, group, x, y0, y1, slot_of(r.offset[0] + x, slots),
                UnmanagedMatrix<T>(ring, slots * r.column_rows(), cells));
        }
      }
}

/// out = the correlation of src (every cell of out written), plus bias when given: the
/// forward (y from the padded input) or the input gradient (padded gradient from dY, with
/// `transposed` flipped weights). One GEMM per output plane (and chunk of rows), written
/// straight into the field. `keep(x, y0, y1)` selects output chunks.
template <class T, class Keep>
void plane_correlate(const ExecutionSpace& space, const Correlation& r, const ConvShape& g,
                     const FieldView<T>& src, const ReplicatedView<T>& w, bool transposed,
                     const ReplicatedView<T>& bias, const FieldView<T>& out, T* workspace,
                     Index chunk_rows, const Keep& keep) {
  const Index width = r.slots() * r.column_rows();  // GEMM depth
  T* const packed = workspace;                      // weights per rotation, then the ring
  T* const ring = workspace + r.slots() * r.out_per_group * width;
  const bool has_bias = bias.extent(0) > 0;
  Index packed_group = -1;
  const auto plane = [&](Index n, Index group, Index x, Index y0, Index y1, Index rotation,
                         const UnmanagedMatrix<T>& columns) {
    if (packed_group != group) pack_weights(space, r, g, w, group, transposed, packed);
    packed_group = group;
    const UnmanagedMatrix<T> weights(packed + rotation * r.out_per_group * width, r.out_per_group,
                                     width);
    const UnmanagedMatrix<T> result =
        plane_rows(out, n, group * r.out_per_group, r.out_per_group, x, y0, y1);
    gemm(space, "N", "N", T(1), weights, columns, T(0), result);
    if (!has_bias) return;
    const Index cells = result.extent(1), c0 = group * r.out_per_group;
    Kokkos::parallel_for(
        "Conv::plane_bias", kernel_range(space, r.out_per_group), KOKKOS_LAMBDA(const Index o) {
          for (Index p = 0; p < cells; ++p) result(o, p) += bias(c0 + o);
        });
  };
  for_each_plane(space, r, src, ring, chunk_rows, keep, plane);
}

/// gw += this rank's weight gradient: per output plane, dW[rotation] += dY plane rows .
/// columns^T, accumulated per group and rotation in packed buffers, then added into gw's
/// (co, ci, a, b, c) order.
template <class T>
void plane_weight_gradient(const ExecutionSpace& space, const Correlation& r, const ConvShape& g,
                           const FieldView<T>& xp, const FieldView<T>& gy,
                           const ReplicatedView<T>& gw, T* workspace, Index chunk_rows) {
  const Index slots = r.slots(), width = slots * r.column_rows();
  const Index packed_size = slots * r.out_per_group * width;
  T* const packed = workspace;  // this group's dW per rotation, then the ring
  T* const ring = workspace + packed_size;
  const Kokkos::View<T*, DefaultMemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> all(
      packed, packed_size);
  Kokkos::deep_copy(space, all, T(0));
  // Every rotation holds a part of each weight's gradient (x tap a of rotation r sits in slot
  // r + a d): each weight gathers its parts over the rotations in a fixed order (a scatter
  // from the packed buffers would have `slots` iterations adding into one weight).
  const auto add_packed = [&](Index group) {
    const Index kx = g.k[0], dx = g.d[0];
    const Index outs = r.out_per_group, taps = r.column_rows();
    Kokkos::parallel_for(
        "Conv::plane_weight_gradient", kernel_range(space, outs * kx * taps),
        KOKKOS_LAMBDA(const Index flat) {
          const Index j_b_c = flat % taps, a = (flat / taps) % kx, o = flat / (taps * kx);
          T sum = 0;
          for (Index rotation = 0; rotation < slots; ++rotation)
            sum += all(((rotation * outs + o) * slots + slot_of(rotation + a * dx, slots)) * taps +
                       j_b_c);
          const Index j = j_b_c / (g.k[1] * g.k[2]), b = (j_b_c / g.k[2]) % g.k[1];
          gw(g.weight_index(group * outs + o, j, a, b, j_b_c % g.k[2])) += sum;
        });
    Kokkos::deep_copy(space, all, T(0));
  };
  Index current_group = 0;
  const auto keep_all = [](Index, Index, Index) { return true; };
  const auto plane = [&](Index n, Index group, Index x, Index y0, Index y1, Index rotation,
                         const UnmanagedMatrix<T>& columns) {
    if (group != current_group) add_packed(current_group);
    current_group = group;
    const UnmanagedMatrix<T> weights(packed + rotation * r.out_per_group * width, r.out_per_group,
                                     width);
    gemm(space, "N", "T", T(1),
         plane_rows(gy, n, group * r.out_per_group, r.out_per_group, x, y0, y1), columns, T(1),
         weights);
  };
  for_each_plane(space, r, xp, ring, chunk_rows, keep_all, plane);
  add_packed(current_group);
}

}  // namespace

Box plane_reads(const ConvShape& g, Index ox, Index y0, Index y1) {
  Box box;
  box.lower = {g.base[0] + ox, g.base[1] + y0, g.base[2]};
  box.extent = {(g.k[0] - 1) * g.d[0] + 1, (y1 - y0 - 1) + (g.k[1] - 1) * g.d[1] + 1,
                (g.out[2] - 1) + (g.k[2] - 1) * g.d[2] + 1};
  return box;
}

PlanePlan plan_planes(const ConvShape& g, const Index padded[3], std::size_t value_size,
                      std::size_t budget_bytes, bool vector_kernels, bool bf16_operands,
                      bool winograd) {
  PlanePlan plan;
  const Index groups = g.out_channels / g.out_per_group;
  Correlation& f = plan.forward;
  Correlation& d = plan.data;
  f = {groups, g.in_per_group, g.out_per_group, {}, {}, {}, {}, {}};
  d = {groups, g.out_per_group, g.in_per_group, {}, {}, {}, {}, {}};
  for (int a = 0; a < 3; ++a) {
    f.k[a] = d.k[a] = g.k[a];
    f.d[a] = d.d[a] = g.d[a];
    f.offset[a] = g.base[a];
    f.out[a] = d.src[a] = g.out[a];
    f.src[a] = d.out[a] = padded[a];
    d.offset[a] = -g.base[a] - (g.k[a] - 1) * g.d[a];
    f.wrap[a] = d.wrap[a] = g.wrap[a];  // the output gradient wraps too: same extent
    f.slab_axis = d.slab_axis = g.slab_axis;  // and comes with slabs where the input does
    // Unit strides only (the planes are shifts of each other); planes of at least 64 cells.
    if (g.s[a] != 1) return plan;
  }
  if (g.out[1] * g.out[2] < 64) return plan;
  const std::size_t budget = budget_bytes / value_size;
  if (vector_kernels) {
    // Whole padded planes in the ring when they fit, else the rows of one band at a time.
    plan.bf16 = bf16_operands;
    plan.band_copies = host::conv_vector_values(f, d, false, plan.bf16) > budget;
    plan.values = host::conv_vector_values(f, d, plan.band_copies, plan.bf16);
    plan.gradient_x_taps = host::conv_vector_gradient_x_taps(f, d, plan.band_copies, plan.bf16);
    plan.vector_kernels = plan.values <= budget;
    const std::size_t winograd_values =
        host::conv_vector_values(f, d, plan.band_copies, plan.bf16, winograd);
    plan.winograd =
        plan.vector_kernels && winograd && !plan.bf16 && winograd_values <= budget &&
        (host::conv_vector_winograd(f, false, true) || host::conv_vector_winograd(d, false, true));
    if (plan.winograd) plan.values = std::max(plan.values, winograd_values);
    plan.winograd_gradient =
        plan.winograd && host::conv_vector_winograd_gradient(f, g.batch, false, true);
    plan.rounds_source = plan.vector_kernels && host::conv_vector_rounds_source(f, plan.bf16);
    if (plan.vector_kernels) return plan;
    plan.bf16 = false;
  }
  if (g.wrap[0] || g.wrap[1] || g.wrap[2] || g.slab_axis >= 0)
    return plan;  // im2col reads zeros only
  const auto weights = [](const Correlation& r) {
    return static_cast<std::size_t>(r.slots() * r.out_per_group * r.slots() * r.column_rows());
  };
  if (budget <= std::max(weights(f), weights(d))) return plan;
  plan.forward_rows = plane_chunk_rows(f, budget - weights(f));
  plan.data_rows = plane_chunk_rows(d, budget - weights(d));
  if (plan.forward_rows < 1 || plan.data_rows < 1) plan.forward_rows = plan.data_rows = 0;
  const auto needs = [&](const Correlation& r, Index rows) {
    return weights(r) + static_cast<std::size_t>(r.slots() * r.column_rows() * rows * r.out[2]);
  };
  plan.values = std::max(needs(f, plan.forward_rows), needs(d, plan.data_rows));
  return plan;
}

namespace {

/// A one-group correlation's weights packed for the vector kernels: the cache's where they
/// were packed from the same weights, bit for bit, in the same layout; else packed into it now.
const float* packed_weights(const Correlation& r, const ConvShape& g,
                            const ReplicatedView<float>& w, bool transposed, bool bf16,
                            bool winograd, PackedWeights<float>& cache) {
  const std::array<Index, 10> layout{
      r.k[0], r.k[1], r.k[2], r.src_per_group, r.out_per_group, Index(transposed),
      Index(w.extent(0)), Index(bf16), Index(host::conv_vector_packing()),
      // Winograd's tile (a layer's fields may differ in width)
      host::conv_vector_winograd(r, bf16, winograd) ? host::conv_winograd_positions(r) : 0};
  const std::size_t n = w.extent(0);  // in the layout: source holds n values where it matches
  if (cache.layout == layout && std::memcmp(cache.source.data(), w.data(), n * sizeof(float)) == 0)
    return cache.packed.data();
  const MemoryCategoryScope scope(MemoryCategory::workspaces);
  const std::size_t values =
      host::conv_vector_packed_values(r, host::conv_vector_winograd(r, bf16, winograd));
  using Values = decltype(cache.source);
  const auto no_init = Kokkos::WithoutInitializing;
  if (cache.source.extent(0) != n)
    cache.source = Values(Kokkos::view_alloc(no_init, "conv.packed_from"), n);
  if (cache.packed.extent(0) != values)
    cache.packed = Values(Kokkos::view_alloc(no_init, "conv.packed_weights"), values);
  cache.layout = {};  // invalid until both are written
  std::memcpy(cache.source.data(), w.data(), n * sizeof(float));
  host::conv_vector_pack_weights(r, g, w, transposed, bf16, winograd, cache.packed.data());
  cache.layout = layout;
  return cache.packed.data();
}

}  // namespace

template <class T>
void correlate_planes(const ExecutionSpace& space, const PlanePlan& plan, const Correlation& r,
                      Index rows, const ConvShape& g, const FieldView<T>& src,
                      const ReplicatedView<T>& w, bool transposed, const ReplicatedView<T>& bias,
                      const FieldView<T>& out, T* workspace, const PlaneFilter& keep,
                      PackedWeights<T>* cache, const SourceSlabs<T>& slabs) {
  if constexpr (std::is_same<T, float>::value)
    if (plan.vector_kernels) {
      const float* packed = cache && r.groups == 1 ? packed_weights(r, g, w, transposed, plan.bf16,
                                                                    plan.winograd, *cache)
                                                   : nullptr;
      return host::conv_vector_correlate(r, g, src, w, transposed, bias, out, workspace,
                                         plan.band_copies, plan.bf16, plan.winograd, keep, packed,
                                         slabs);
    }
  plane_correlate(space, r, g, src, w, transposed, bias, out, workspace, rows, keep);
}

template <class T>
void weight_gradient_planes(const ExecutionSpace& space, const PlanePlan& plan, const ConvShape& g,
                            const FieldView<T>& xp, const FieldView<T>& gy,
                            const ReplicatedView<T>& gw, T* workspace,
                            const SourceSlabs<T>& slabs) {
  if constexpr (std::is_same<T, float>::value)
    if (plan.vector_kernels)
      return host::conv_vector_weight_gradient(plan.forward, g, xp, gy, gw, workspace,
                                               plan.band_copies, plan.bf16, plan.winograd_gradient,
                                               plan.gradient_x_taps, slabs);
  plane_weight_gradient(space, plan.forward, g, xp, gy, gw, workspace, plan.forward_rows);
}

template <class T>
bool conv_vector_kernels_available() {
  return std::is_same<T, float>::value && kernels_run_on_host && host::conv_vector_available();
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                \
  template void correlate_planes(                                                                 \
      const ExecutionSpace&, const PlanePlan&, const Correlation&, Index, const ConvShape&,       \
      const FieldView<T>&, const ReplicatedView<T>&, bool, const ReplicatedView<T>&,              \
      const FieldView<T>&, T*, const PlaneFilter&, PackedWeights<T>*, const SourceSlabs<T>&);     \
  template void weight_gradient_planes(const ExecutionSpace&, const PlanePlan&, const ConvShape&, \
                                       const FieldView<T>&, const FieldView<T>&,                  \
                                       const ReplicatedView<T>&, T*, const SourceSlabs<T>&);      \
  template bool conv_vector_kernels_available<T>();
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
