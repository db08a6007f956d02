#include "shardtensor/kernels/neighborhood_attention.hpp"

#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"

namespace shardtensor::kernels {

namespace {

/// Dot product over n values with 8 independent partial sums (vectorisable without
/// reassociating: the order is fixed).
template <class T>
KOKKOS_INLINE_FUNCTION T dot(const T* KOKKOS_RESTRICT a, const T* KOKKOS_RESTRICT b, Index n) {
  T s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  Index i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/// y += alpha x over n values (x and y do not overlap).
template <class T>
KOKKOS_INLINE_FUNCTION void axpy(T alpha, const T* KOKKOS_RESTRICT x, T* KOKKOS_RESTRICT y,
                                 Index n) {
  for (Index i = 0; i < n; ++i) y[i] += alpha * x[i];
}

/// y *= alpha over n values.
template <class T>
KOKKOS_INLINE_FUNCTION void scale(T alpha, T* KOKKOS_RESTRICT y, Index n) {
  for (Index i = 0; i < n; ++i) y[i] *= alpha;
}

/// A box's lower corner and extents as plain integers (kernels capture no std::array).
struct BoxIndex {
  Index lower[3], extent[3];
  explicit BoxIndex(const Box& b)
      : lower{b.lower[0], b.lower[1], b.lower[2]}, extent{b.extent[0], b.extent[1], b.extent[2]} {}
  KOKKOS_INLINE_FUNCTION Index size() const { return extent[0] * extent[1] * extent[2]; }
};

/// The work item `flat` of (batch, cells of a box, heads), as (n, x, y, z, h) with (x, y, z)
/// in the box's indices.
struct CellHead {
  Index n, x, y, z, h;
};
KOKKOS_INLINE_FUNCTION CellHead cell_head(Index flat, const BoxIndex& box, Index heads) {
  CellHead c;
  c.h = flat % heads;
  const CellIndex cell = unflatten(flat / heads, 1, box.extent[0], box.extent[1], box.extent[2]);
  c.n = cell.n;
  c.x = box.lower[0] + cell.x;
  c.y = box.lower[1] + cell.y;
  c.z = box.lower[2] + cell.z;
  return c;
}

}  // namespace

template <class T>
void pack_rows(const ExecutionSpace& space, const FieldView<T>& src, const Box& box, Index src_c0,
               Index count, const PackedRows<T>& dst, const SpatialIndex& grid,
               const SpatialIndex& shift, Index dst_c0) {
  const BoxIndex b(box);
  const Index g1 = grid[1], g2 = grid[2], cells = grid[0] * grid[1] * grid[2];
  const Index s0 = shift[0], s1 = shift[1], s2 = shift[2];
  // One work item per cell (its channels in a loop): one index decomposition per cell, and
  // the row written contiguously.
  Kokkos::parallel_for(
      "neighborhood_attention::pack", kernel_range(space, Index(src.extent(0)) * b.size()),
      KOKKOS_LAMBDA(const Index flat) {
        const CellIndex i = unflatten(flat, 1, b.extent[0], b.extent[1], b.extent[2]);
        const Index x = b.lower[0] + i.x, y = b.lower[1] + i.y, z = b.lower[2] + i.z;
        const Index row = i.n * cells + ((x + s0) * g1 + y + s1) * g2 + z + s2;
        for (Index c = 0; c < count; ++c) dst(row, dst_c0 + c) = src(i.n, src_c0 + c, x, y, z);
      });
}

template <class T>
void unpack_rows(const ExecutionSpace& space, const PackedRows<T>& src, const SpatialIndex& grid,
                 const SpatialIndex& shift, Index src_c0, Index count, const FieldView<T>& dst,
                 const Box& box, Index dst_c0, bool add) {
  const BoxIndex b(box);
  const Index g1 = grid[1], g2 = grid[2], cells = grid[0] * grid[1] * grid[2];
  const Index s0 = shift[0], s1 = shift[1], s2 = shift[2];
  // One work item per cell (its channels in a loop); walking the field's lines instead (one
  // channel at a time, the field written contiguously) measured slower here.
  Kokkos::parallel_for(
      "neighborhood_attention::unpack", kernel_range(space, Index(dst.extent(0)) * b.size()),
      KOKKOS_LAMBDA(const Index flat) {
        const CellIndex i = unflatten(flat, 1, b.extent[0], b.extent[1], b.extent[2]);
        const Index x = b.lower[0] + i.x, y = b.lower[1] + i.y, z = b.lower[2] + i.z;
        const Index row = i.n * cells + ((x + s0) * g1 + y + s1) * g2 + z + s2;
        for (Index c = 0; c < count; ++c) {
          T& cell = dst(i.n, dst_c0 + c, x, y, z);
          const T value = src(row, src_c0 + c);
          cell = add ? cell + value : value;
        }
      });
}

template <class T>
void neighborhood_forward(const ExecutionSpace& space, const NeighborhoodGrid& g,
                          const Box& queries, const PackedRows<T>& q, const PackedRows<T>& kv,
                          const PackedRows<T>& out, const PackedRows<T>& lse) {
  const BoxIndex b(queries);
  if (b.size() == 0) return;
  const Index C = g.channels, D = g.head_dim, H = g.heads;
  const T inverse_sqrt_d = T(1) / math::sqrt(T(D));
  Kokkos::parallel_for(
      "neighborhood_attention::forward", kernel_range(space, g.batch * b.size() * H),
      KOKKOS_LAMBDA(const Index flat) {
        const CellHead c = cell_head(flat, b, H);
        const Index row = c.n * g.cells() + (c.x * g.local[1] + c.y) * g.local[2] + c.z;
        const T* qh = &q(row, c.h * D);
        T* oh = &out(row, c.h * D);
        for (Index d = 0; d < D; ++d) oh[d] = 0;
        // Online softmax over the keys in window order: running max m and sum l; the output
        // is rescaled when the max grows.
        T m = -math::infinity<T>(), l = 0;
        for (Index ox = g.first(0, c.x); ox < g.last(0, c.x); ++ox) {
          const Index px = c.x + g.dilation[0] * ox;
          for (Index oy = g.first(1, c.y); oy < g.last(1, c.y); ++oy) {
            const Index py = c.y + g.dilation[1] * oy;
            for (Index oz = g.first(2, c.z); oz < g.last(2, c.z); ++oz) {
              const Index pz = c.z + g.dilation[2] * oz;
              const Index key = c.n * g.padded_cells() + (px * g.padded[1] + py) * g.padded[2] + pz;
              const T* kh = &kv(key, c.h * D);
              const T* vh = &kv(key, C + c.h * D);
              const T s = inverse_sqrt_d * dot(qh, kh, D);
              if (s > m) {
                const T rescale = math::exp(m - s);
                l *= rescale;
                scale(rescale, oh, D);
                m = s;
              }
              const T p = math::exp(s - m);
              l += p;
              axpy(p, vh, oh, D);
            }
          }
        }
        scale(T(1) / l, oh, D);
        lse(row, c.h) = m + math::log(l);
      });
}

template <class T>
void neighborhood_delta(const ExecutionSpace& space, const NeighborhoodGrid& g,
                        const PackedRows<T>& dout, const PackedRows<T>& out,
                        const PackedRows<T>& delta) {
  const Index D = g.head_dim, H = g.heads;
  Kokkos::parallel_for(
      "neighborhood_attention::delta", kernel_range(space, g.batch * g.cells() * H),
      KOKKOS_LAMBDA(const Index flat) {
        const Index row = flat / H, h = flat % H;
        delta(row, h) = dot(&dout(row, h * D), &out(row, h * D), D);
      });
}

template <class T>
void neighborhood_backward_queries(const ExecutionSpace& space, const NeighborhoodGrid& g,
                                   const PackedRows<T>& q, const PackedRows<T>& kv,
                                   const PackedRows<T>& dout, const PackedRows<T>& lse,
                                   const PackedRows<T>& delta, const PackedRows<T>& dq) {
  const BoxIndex b(Box{{0, 0, 0}, {g.local[0], g.local[1], g.local[2]}});
  const Index C = g.channels, D = g.head_dim, H = g.heads;
  const T inverse_sqrt_d = T(1) / math::sqrt(T(D));
  Kokkos::parallel_for(
      "neighborhood_attention::backward_queries", kernel_range(space, g.batch * b.size() * H),
      KOKKOS_LAMBDA(const Index flat) {
        const CellHead c = cell_head(flat, b, H);
        const Index row = c.n * g.cells() + (c.x * g.local[1] + c.y) * g.local[2] + c.z;
        const T* qh = &q(row, c.h * D);
        const T* doh = &dout(row, c.h * D);
        T* dqh = &dq(row, c.h * D);
        const T row_lse = lse(row, c.h), row_delta = delta(row, c.h);
        for (Index d = 0; d < D; ++d) dqh[d] = 0;
        for (Index ox = g.first(0, c.x); ox < g.last(0, c.x); ++ox) {
          const Index px = c.x + g.dilation[0] * ox;
          for (Index oy = g.first(1, c.y); oy < g.last(1, c.y); ++oy) {
            const Index py = c.y + g.dilation[1] * oy;
            for (Index oz = g.first(2, c.z); oz < g.last(2, c.z); ++oz) {
              const Index pz = c.z + g.dilation[2] * oz;
              const Index key = c.n * g.padded_cells() + (px * g.padded[1] + py) * g.padded[2] + pz;
              const T* kh = &kv(key, c.h * D);
              const T p = math::exp(inverse_sqrt_d * dot(qh, kh, D) - row_lse);
              const T ds = inverse_sqrt_d * p * (dot(doh, &kv(key, C + c.h * D), D) - row_delta);
              axpy(ds, kh, dqh, D);
            }
          }
        }
      });
}

template <class T>
void neighborhood_backward_keys(const ExecutionSpace& space, const NeighborhoodGrid& g,
                                const Box& keys, const PackedRows<T>& q, const PackedRows<T>& kv,
                                const PackedRows<T>& dout, const PackedRows<T>& lse,
                                const PackedRows<T>& delta, const PackedRows<T>& dkv) {
  const BoxIndex b(keys);
  if (b.size() == 0) return;
  const Index C = g.channels, D = g.head_dim, H = g.heads;
  const T inverse_sqrt_d = T(1) / math::sqrt(T(D));
  Kokkos::parallel_for(
      "neighborhood_attention::backward_keys", kernel_range(space, g.batch * b.size() * H),
      KOKKOS_LAMBDA(const Index flat) {
        const CellHead c = cell_head(flat, b, H);  // (c.x, c.y, c.z): the key's padded cell
        const Index key = c.n * g.padded_cells() + (c.x * g.padded[1] + c.y) * g.padded[2] + c.z;
        const T* kh = &kv(key, c.h * D);
        const T* vh = &kv(key, C + c.h * D);
        T* dkh = &dkv(key, c.h * D);
        T* dvh = &dkv(key, C + c.h * D);
        for (Index d = 0; d < D; ++d) dkh[d] = dvh[d] = 0;
        // The queries x whose window position o reads this key: x = key - dilation * o, an
        // owned index whose window keeps position o (first <= o < last).
        for (Index ox = 0; ox < g.window[0]; ++ox) {
          const Index x = c.x - g.dilation[0] * ox;
          if (x < 0 || x >= g.local[0] || ox < g.first(0, x) || ox >= g.last(0, x)) continue;
          for (Index oy = 0; oy < g.window[1]; ++oy) {
            const Index y = c.y - g.dilation[1] * oy;
            if (y < 0 || y >= g.local[1] || oy < g.first(1, y) || oy >= g.last(1, y)) continue;
            for (Index oz = 0; oz < g.window[2]; ++oz) {
              const Index z = c.z - g.dilation[2] * oz;
              if (z < 0 || z >= g.local[2] || oz < g.first(2, z) || oz >= g.last(2, z)) continue;
              const Index row = c.n * g.cells() + (x * g.local[1] + y) * g.local[2] + z;
              const T* qh = &q(row, c.h * D);
              const T* doh = &dout(row, c.h * D);
              const T p = math::exp(inverse_sqrt_d * dot(qh, kh, D) - lse(row, c.h));
              const T ds = inverse_sqrt_d * p * (dot(doh, vh, D) - delta(row, c.h));
              axpy(p, doh, dvh, D);
              axpy(ds, qh, dkh, D);
            }
          }
        }
      });
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                 \
  template void pack_rows(const ExecutionSpace&, const FieldView<T>&, const Box&, Index, Index,    \
                          const PackedRows<T>&, const SpatialIndex&, const SpatialIndex&, Index);  \
  template void unpack_rows(const ExecutionSpace&, const PackedRows<T>&, const SpatialIndex&,      \
                            const SpatialIndex&, Index, Index, const FieldView<T>&, const Box&,    \
                            Index, bool);                                                          \
  template void neighborhood_forward(const ExecutionSpace&, const NeighborhoodGrid&, const Box&,   \
                                     const PackedRows<T>&, const PackedRows<T>&,                   \
                                     const PackedRows<T>&, const PackedRows<T>&);                  \
  template void neighborhood_delta(const ExecutionSpace&, const NeighborhoodGrid&,                 \
                                   const PackedRows<T>&, const PackedRows<T>&,                     \
                                   const PackedRows<T>&);                                          \
  template void neighborhood_backward_queries(                                                     \
      const ExecutionSpace&, const NeighborhoodGrid&, const PackedRows<T>&, const PackedRows<T>&,  \
      const PackedRows<T>&, const PackedRows<T>&, const PackedRows<T>&, const PackedRows<T>&);     \
  template void neighborhood_backward_keys(const ExecutionSpace&, const NeighborhoodGrid&,         \
                                           const Box&, const PackedRows<T>&, const PackedRows<T>&, \
                                           const PackedRows<T>&, const PackedRows<T>&,             \
                                           const PackedRows<T>&, const PackedRows<T>&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
