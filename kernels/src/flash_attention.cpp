#include "shardtensor/kernels/flash_attention.hpp"

#include <algorithm>
#include <string>
#include <type_traits>
#include "blas.hpp"  // kernels/backends: private to kernels

#include "host/amx/amx_tiles.hpp"  // kernels/backends: the backends are private to kernels
#include "host/host_threads.hpp"
#include "host/softmax_rows.hpp"
#include "shardtensor/core/cell_index.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/kernels/vector_isa.hpp"

namespace shardtensor::kernels {

namespace {

const Progress no_progress = [] {};

template <class T>
Tile<T> tile(T* data, Index rows, Index cols) {
  return Tile<T>(data, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
}

// ---------------------------------------------------------------------------------------
// Row kernels of a score tile: one work item per query row, which it alone writes. They run
// as Kokkos kernels over the rows, or (inline_rows) as a loop on the calling host thread when
// each host thread computes whole slices (for_each_slice).

/// Runs row(i) for i < rows: a Kokkos kernel, or a loop on this thread.
template <class Row>
void for_each_row(const ExecutionSpace& space, const char* label, Index rows, bool inline_rows,
                  const Row& row) {
  if (inline_rows) {
    for (Index i = 0; i < rows; ++i) row(i);
    return;
  }
  Kokkos::parallel_for(label, kernel_range(space, rows), row);
}

/// The online-softmax update of tile s's rows (local query rows i0 + i, keys j0 + j): masked
/// keys get P = 0; the row's max moves to include the tile, what was accumulated under the old
/// max (sum, output row) is rescaled, and s becomes exp(s - new max).
template <class T>
struct OnlineSoftmaxRow {
  Tile<T> s;
  Visibility visible;
  Index i0, j0, D;
  T *max, *sum, *out;
  KOKKOS_INLINE_FUNCTION void operator()(const Index i) const {
    const Index cols = s.extent(1);
    const Index n = visible.count(i0 + i, j0, cols);
    T tile_max = -math::infinity<T>();
    for (Index j = 0; j < n; ++j) tile_max = math::max(tile_max, s(i, j));
    for (Index j = n; j < cols; ++j) s(i, j) = T(0);
    if (n == 0) return;
    const T new_max = math::max(max[i], tile_max);
    // exp(-inf) = 0 on the row's first tile: nothing accumulated yet.
    const T correction = math::exp(max[i] - new_max);
    T total = 0;
    for (Index j = 0; j < n; ++j) total += (s(i, j) = math::exp(s(i, j) - new_max));
    sum[i] = sum[i] * correction + total;
    max[i] = new_max;
    if (correction != T(1))
      for (Index d = 0; d < D; ++d) out[i * D + d] *= correction;
  }
};

template <class T>
void online_softmax_rows(const ExecutionSpace& space, const Tile<T>& s, const Visibility& visible,
                         Index i0, Index j0, T* max, T* sum, T* out, Index D, bool inline_rows) {
  if constexpr (std::is_same<T, float>::value)
    if (host::online_softmax_rows(s, visible, i0, j0, max, sum, out, D, inline_rows)) return;
  for_each_row(space, "flash_attention::online_softmax", s.extent(0), inline_rows,
               OnlineSoftmaxRow<T>{s, visible, i0, j0, D, max, sum, out});
}

/// P = exp(S - lse) of the visible keys, 0 for the others, for the rows of tile p.
template <class T>
struct ProbabilityRow {
  Tile<T> p;
  Visibility visible;
  Index i0, j0;
  const T* lse;
  KOKKOS_INLINE_FUNCTION void operator()(const Index i) const {
    const Index cols = p.extent(1);
    const Index n = visible.count(i0 + i, j0, cols);
    for (Index j = 0; j < cols; ++j) p(i, j) = j < n ? math::exp(p(i, j) - lse[i]) : T(0);
  }
};

template <class T>
void softmax_probabilities(const ExecutionSpace& space, const Tile<T>& p, const Visibility& visible,
                           Index i0, Index j0, const T* lse, bool inline_rows) {
  if constexpr (std::is_same<T, float>::value)
    if (host::softmax_probabilities(p, visible, i0, j0, lse, inline_rows)) return;
  for_each_row(space, "flash_attention::probabilities", p.extent(0), inline_rows,
               ProbabilityRow<T>{p, visible, i0, j0, lse});
}

/// dS = P (dP - delta) row by row (ds holds dP = dO V^T on entry).
template <class T>
struct ScoreGradientRow {
  Tile<T> ds, p;
  const T* delta;
  KOKKOS_INLINE_FUNCTION void operator()(const Index i) const {
    const Index cols = ds.extent(1);
    const T di = delta[i];
    for (Index j = 0; j < cols; ++j) ds(i, j) = p(i, j) * (ds(i, j) - di);
  }
};

/// C = alpha op(A) op(B) + beta C on a slice's tiles: on AMX tiles where `bf16` (a bf16 op's
/// products: each operand rounded to bf16, P and dS too, as they are packed; float sums) and
/// the CPU has them, on the calling thread; else the BLAS (float products of the operands as
/// they are: Q, K, V and dO hold bf16 values already, P and dS float ones).
template <class T, class A, class B>
void tile_product(const ExecutionSpace& space, bool bf16, const char* ta, const char* tb, T alpha,
                  const A& a, const B& b, T beta, const Tile<T>& c) {
  if constexpr (std::is_same<T, float>::value && kernels_run_on_host)
    if (bf16 && bf16_matrix_tiles()) {
      const bool trans_a = ta[0] == 'T', trans_b = tb[0] == 'T';
      host::amx_gemm(trans_a, trans_b, int(c.extent(0)), int(c.extent(1)),
                     int(trans_a ? a.extent(0) : a.extent(1)), alpha, a.data(), a.stride(0),
                     b.data(), b.stride(0), beta, c.data(), c.stride(0));
      return;
    }
  gemm(space, ta, tb, alpha, a, b, beta, c);
}

// ---------------------------------------------------------------------------------------
// One (batch, head) slice, and the slices of a block

/// Folds keys/values k, v (keys x D) into the softmax state of queries q (queries x D) of
/// one slice: per tile, S = scale Q K^T (GEMM), the online update of each row, O += P V (GEMM).
template <class T>
void fold_slice(const ExecutionSpace& space, Index D, const T* q, Index queries, const T* k,
                const T* v, Index keys, const Visibility& visible, T scale, T* max, T* sum, T* out,
                T* scores, bool inline_rows, bool bf16, const Progress& progress) {
  for (Index i0 = 0; i0 < queries; i0 += tile_queries) {
    const Index rows = std::min(tile_queries, queries - i0);
    for (Index j0 = 0; j0 < keys; j0 += tile_keys) {
      const Index cols = std::min(tile_keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;  // all in the future
      const Tile<T> s = tile(scores, rows, cols);
      tile_product(space, bf16, "N", "T", scale, tile(q + i0 * D, rows, D),
                   tile(k + j0 * D, cols, D), T(0), s);
      online_softmax_rows(space, s, visible, i0, j0, max + i0, sum + i0, out + i0 * D, D,
                          inline_rows);
      tile_product(space, bf16, "N", "N", T(1), tile<const T>(scores, rows, cols),
                   tile(v + j0 * D, cols, D), T(1), tile(out + i0 * D, rows, D));
      progress();
    }
  }
}

/// Backward of one slice: P = exp(S - lse) recomputed per tile, then dV += P^T dO,
/// dS = P (dO V^T - delta), dQ += scale dS K, dK += scale dS^T Q (GEMMs). dq, or dk and dv,
/// may be null (not needed).
template <class T>
void backward_slice(const ExecutionSpace& space, Index D, const T* q, const T* dout, const T* lse,
                    const T* delta, Index queries, const T* k, const T* v, Index keys,
                    const Visibility& visible, T scale, T* dq, T* dk, T* dv, T* scores, T* dscores,
                    bool inline_rows, bool bf16, const Progress& progress) {
  for (Index i0 = 0; i0 < queries; i0 += tile_queries) {
    const Index rows = std::min(tile_queries, queries - i0);
    const auto q_tile = tile(q + i0 * D, rows, D), dout_tile = tile(dout + i0 * D, rows, D);
    for (Index j0 = 0; j0 < keys; j0 += tile_keys) {
      const Index cols = std::min(tile_keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;
      const auto k_tile = tile(k + j0 * D, cols, D), v_tile = tile(v + j0 * D, cols, D);
      const Tile<T> p = tile(scores, rows, cols), ds = tile(dscores, rows, cols);
      tile_product(space, bf16, "N", "T", scale, q_tile, k_tile, T(0), p);
      softmax_probabilities(space, p, visible, i0, j0, lse + i0, inline_rows);
      if (dv)
        tile_product(space, bf16, "T", "N", T(1), p, dout_tile, T(1), tile(dv + j0 * D, cols, D));
      if (dq || dk) {
        tile_product(space, bf16, "N", "T", T(1), dout_tile, v_tile, T(0), ds);
        for_each_row(space, "flash_attention::score_gradients", rows, inline_rows,
                     ScoreGradientRow<T>{ds, p, delta + i0});
        if (dq)
          tile_product(space, bf16, "N", "N", scale, ds, k_tile, T(1), tile(dq + i0 * D, rows, D));
        if (dk)
          tile_product(space, bf16, "T", "N", scale, ds, q_tile, T(1), tile(dk + j0 * D, cols, D));
      }
      progress();
    }
  }
}

/// Host threads that compute separate slices at once, each with its own score tiles, where
/// the kernels run on the host (1 on a GPU, whose kernels spread each tile instead).
int slice_lanes() {
  return kernels_run_on_host ? host::host_threads() : 1;
}

/// Calls slice(s, scores, dscores, inline_rows) for every slice s of a block. With several
/// host threads (and head_dim > 1: KokkosBlas turns a one-column GEMM into a GEMV that
/// dispatches a kernel, which may not run inside another) the slices go out `lanes` at a
/// time, one per thread with its own score tiles, GEMMs and rows all on that thread; progress
/// runs on the calling thread between rounds. Otherwise one slice at a time with the tile's
/// rows spread over the execution space, and progress between tiles. Either way a slice is
/// computed in the same order with the same operations: the same bits.
template <class T, class Slice>
void for_each_slice(const Heads& a, T* scores, T* dscores, const Progress& progress,
                    const Slice& slice) {
  const Index slices = a.slices();
  const int lanes = a.head_dim > 1 ? static_cast<int>(std::min<Index>(slice_lanes(), slices)) : 1;
  if (lanes == 1) {
    for (Index s = 0; s < slices; ++s) slice(s, scores, dscores, false, progress);
    return;
  }
  for (Index first = 0; first < slices; first += lanes) {
    const Index round = std::min<Index>(lanes, slices - first);
    host::split_over_threads(static_cast<int>(round), round, [&](int t, Index b, Index e) {
      for (Index s = first + b; s < first + e; ++s)
        slice(s, scores + t * score_tile, dscores ? dscores + t * score_tile : nullptr, true,
              no_progress);
    });
    progress();
  }
}

/// The cells of a box as plain integers (kernels capture no std::array).
struct TokenBox {
  Index lower[3], extent[3];
  explicit TokenBox(const Box& b)
      : lower{b.lower[0], b.lower[1], b.lower[2]}, extent{b.extent[0], b.extent[1], b.extent[2]} {}
  Index tokens() const { return extent[0] * extent[1] * extent[2]; }
};

/// Calls move(field value, packed row of head h) for every batch entry, owned cell and head of
/// a field: one work item per (batch entry, token), its channels in a loop.
template <class T, class Move>
void for_each_field_token(const ExecutionSpace& space, const char* label, const FieldView<T>& field,
                          const Box& owned, const Heads& a, T* packed, const Move& move) {
  const TokenBox b(owned);
  const Index L = b.tokens(), H = a.heads, D = a.head_dim;
  if constexpr (kernels_run_on_host) {
    // Blocks of 16 tokens, channel by channel: a channel's 16 values are a line (or a few),
    // where token by token every value lay in another channel plane, the planes a power of two
    // apart, so that a token's values shared a few cache sets (15 % of a bf16 attention step
    // for packing and unpacking, about ten times the memory's time).
    constexpr Index block = 16;
    const Index blocks = (L + block - 1) / block;
    const std::ptrdiff_t channel_stride = field.stride(1);
    host::split_over_threads(
        host::host_threads(), a.batch * blocks, [&](int, Index first, Index last) {
          std::ptrdiff_t offset[block];  // of a token's cell in channel 0
          for (Index item = first; item < last; ++item) {
            const Index n = item / blocks, t0 = item % blocks * block;
            const Index count = std::min(block, L - t0);
            for (Index i = 0; i < count; ++i) {
              const Index t = t0 + i, z = t % b.extent[2], y = t / b.extent[2] % b.extent[1],
                          x = t / (b.extent[2] * b.extent[1]);
              offset[i] =
                  &field(n, 0, b.lower[0] + x, b.lower[1] + y, b.lower[2] + z) - field.data();
            }
            for (Index h = 0; h < H; ++h)
              for (Index d = 0; d < D; ++d) {
                T* const plane = field.data() + (h * D + d) * channel_stride;
                T* const rows = packed + ((n * H + h) * L + t0) * D + d;
                for (Index i = 0; i < count; ++i) move(plane[offset[i]], rows[i * D]);
              }
          }
        });
    return;
  }
  Kokkos::parallel_for(
      label, kernel_range(space, a.batch * L), KOKKOS_LAMBDA(const Index flat) {
        const CellIndex c = unflatten(flat, 1, b.extent[0], b.extent[1], b.extent[2]);
        const Index x = b.lower[0] + c.x, y = b.lower[1] + c.y, z = b.lower[2] + c.z;
        const Index t = flat - c.n * L;
        for (Index h = 0; h < H; ++h) {
          T* row = packed + ((c.n * H + h) * L + t) * D;
          for (Index d = 0; d < D; ++d) move(field(c.n, h * D + d, x, y, z), row[d]);
        }
      });
}

/// The same over a replicated {batch, tokens, channels} tensor.
template <class T, class Move>
void for_each_replicated_token(const ExecutionSpace& space, const char* label,
                               const ReplicatedView<T>& r, Index tokens, const Heads& a, T* packed,
                               const Move& move) {
  const Index H = a.heads, D = a.head_dim, C = a.channels();
  Kokkos::parallel_for(
      label, kernel_range(space, a.batch * tokens), KOKKOS_LAMBDA(const Index flat) {
        const Index n = flat / tokens, t = flat - n * tokens;
        for (Index h = 0; h < H; ++h) {
          T* row = packed + ((n * H + h) * tokens + t) * D;
          for (Index d = 0; d < D; ++d) move(r(flat * C + h * D + d), row[d]);
        }
      });
}

/// Packing: the packed value takes the tensor's.
struct Pack {
  template <class T>
  KOKKOS_INLINE_FUNCTION void operator()(const T& value, T& packed) const {
    packed = value;
  }
};
/// Unpacking: the tensor's value takes (or, with add, gains) the packed one.
struct Unpack {
  bool add;
  template <class T>
  KOKKOS_INLINE_FUNCTION void operator()(T& value, const T& packed) const {
    value = (add ? value : T(0)) + packed;
  }
};

}  // namespace

template <class T>
AttentionBuffer<T> attention_buffer(const char* label, Index size, MemoryCategory category,
                                    bool zero) {
  MemoryCategoryScope memory(category);
  if (zero) return AttentionBuffer<T>(std::string(label), size);
  return AttentionBuffer<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                            size);
}

template <class T>
OnlineSoftmax<T>::OnlineSoftmax(const ExecutionSpace& space, Index rows, Index head_dim)
    : rows(rows),
      head_dim(head_dim),
      max(attention_buffer<T>("attention.lse", rows, current_memory_category())),
      totals(attention_buffer<T>("attention.totals", rows * (1 + head_dim),
                                 MemoryCategory::workspaces, /*zero=*/true)) {
  Kokkos::deep_copy(space, max, -math::infinity<T>());
}

template <class T>
void fold_block(const ExecutionSpace& space, const Heads& a, const T* q, Index queries, const T* kv,
                Index keys, const Visibility& visible, T scale, OnlineSoftmax<T>& state, T* scores,
                const Progress& progress, bool tf32, bool bf16) {
  if constexpr (attention_runs_batched) {
    fold_block_batched(space, a, q, queries, kv, keys, visible, scale, state, scores,
                       batched_tiles(a, queries, keys), tf32, bf16, progress);
    return;
  }
  const Index D = a.head_dim;
  const T* v = kv + a.block(keys);
  for_each_slice(
      a, scores, static_cast<T*>(nullptr), progress,
      [&](Index s, T* tile_scores, T*, bool inline_rows, const Progress& between) {
        fold_slice(space, D, q + s * queries * D, queries, kv + s * keys * D, v + s * keys * D,
                   keys, visible, scale, state.max.data() + s * queries, state.sum() + s * queries,
                   state.out() + s * queries * D, tile_scores, inline_rows, bf16, between);
      });
}

template <class T>
void finish(const ExecutionSpace& space, OnlineSoftmax<T>& state) {
  const Index D = state.head_dim;
  const auto max = state.max;
  T* sum = state.sum();
  T* out = state.out();
  Kokkos::parallel_for(
      "flash_attention::finish", kernel_range(space, state.rows), KOKKOS_LAMBDA(const Index row) {
        for (Index d = 0; d < D; ++d) out[row * D + d] /= sum[row];
        max(row) += math::log(sum[row]);
      });
}

template <class T>
void rescale_to(const ExecutionSpace& space, OnlineSoftmax<T>& state,
                const AttentionBuffer<T>& global_max) {
  const Index D = state.head_dim;
  const auto max = state.max;
  T* sum = state.sum();
  T* out = state.out();
  Kokkos::parallel_for(
      "flash_attention::rescale", kernel_range(space, state.rows), KOKKOS_LAMBDA(const Index row) {
        const T correction = math::exp(max(row) - global_max(row));
        sum[row] *= correction;
        for (Index d = 0; d < D; ++d) out[row * D + d] *= correction;
      });
  state.max = global_max;
}

template <class T>
QueryGradients<T> query_gradients(const ExecutionSpace& space, AttentionBuffer<T> q,
                                  AttentionBuffer<T> dout, const AttentionBuffer<T>& out,
                                  AttentionBuffer<T> lse, Index queries, Index head_dim) {
  const Index rows = lse.extent(0), D = head_dim;
  AttentionBuffer<T> delta = attention_buffer<T>("attention.delta", rows);
  Kokkos::parallel_for(
      "flash_attention::delta", kernel_range(space, rows), KOKKOS_LAMBDA(const Index row) {
        T s = 0;
        for (Index d = 0; d < D; ++d) s += dout(row * D + d) * out(row * D + d);
        delta(row) = s;
      });
  return {std::move(q), std::move(dout), std::move(lse), std::move(delta), queries};
}

template <class T>
void backward_block(const ExecutionSpace& space, const Heads& a, const QueryGradients<T>& g, T* dq,
                    const T* kv, T* dkv, Index keys, const Visibility& visible, T scale, T* scores,
                    T* dscores, const Progress& progress, bool tf32, bool bf16) {
  if constexpr (attention_runs_batched) {
    backward_block_batched(space, a, g, dq, kv, dkv, keys, visible, scale, scores, dscores,
                           batched_tiles(a, g.queries, keys), tf32, bf16, progress);
    return;
  }
  const Index D = a.head_dim, Lq = g.queries;
  const T* v = kv + a.block(keys);
  for_each_slice(
      a, scores, dscores, progress,
      [&](Index s, T* tile_scores, T* tile_dscores, bool inline_rows, const Progress& between) {
        backward_slice(space, D, g.q.data() + s * Lq * D, g.dout.data() + s * Lq * D,
                       g.lse.data() + s * Lq, g.delta.data() + s * Lq, Lq, kv + s * keys * D,
                       v + s * keys * D, keys, visible, scale, dq ? dq + s * Lq * D : nullptr,
                       dkv ? dkv + s * keys * D : nullptr,
                       dkv ? dkv + a.block(keys) + s * keys * D : nullptr, tile_scores,
                       tile_dscores, inline_rows, bf16, between);
      });
}

Index score_buffer_size(const Heads& a, Index queries, Index keys) {
  if (attention_runs_batched) {
    const BatchedTiles tiles = batched_tiles(a, queries, keys);
    return a.slices() * tiles.queries * tiles.keys;
  }
  return slice_lanes() * score_tile;
}

template <class T>
void add_into(const ExecutionSpace& space, T* y, const T* x, Index n) {
  Kokkos::parallel_for(
      "flash_attention::add", kernel_range(space, n),
      KOKKOS_LAMBDA(const Index i) { y[i] += x[i]; });
}

template <class T>
void pack_tokens(const ExecutionSpace& space, const FieldView<T>& field, const Box& owned,
                 const Heads& a, T* out) {
  for_each_field_token(space, "flash_attention::pack", field, owned, a, out, Pack{});
}

template <class T>
void unpack_tokens(const ExecutionSpace& space, const T* in, const FieldView<T>& field,
                   const Box& owned, const Heads& a, bool add) {
  for_each_field_token(space, "flash_attention::unpack", field, owned, a, const_cast<T*>(in),
                       Unpack{add});
}

template <class T>
void pack_tokens(const ExecutionSpace& space, const ReplicatedView<T>& r, Index tokens,
                 const Heads& a, T* out) {
  for_each_replicated_token(space, "flash_attention::pack", r, tokens, a, out, Pack{});
}

template <class T>
void unpack_tokens(const ExecutionSpace& space, const T* in, const ReplicatedView<T>& r,
                   Index tokens, const Heads& a, bool add) {
  for_each_replicated_token(space, "flash_attention::unpack", r, tokens, a, const_cast<T*>(in),
                            Unpack{add});
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                 \
  template AttentionBuffer<T> attention_buffer(const char*, Index, MemoryCategory, bool);          \
  template struct OnlineSoftmax<T>;                                                                \
  template void fold_block(const ExecutionSpace&, const Heads&, const T*, Index, const T*, Index,  \
                           const Visibility&, T, OnlineSoftmax<T>&, T*, const Progress&, bool,     \
                           bool);                                                                  \
  template void finish(const ExecutionSpace&, OnlineSoftmax<T>&);                                  \
  template void rescale_to(const ExecutionSpace&, OnlineSoftmax<T>&, const AttentionBuffer<T>&);   \
  template QueryGradients<T> query_gradients(const ExecutionSpace&, AttentionBuffer<T>,            \
                                             AttentionBuffer<T>, const AttentionBuffer<T>&,        \
                                             AttentionBuffer<T>, Index, Index);                    \
  template void backward_block(const ExecutionSpace&, const Heads&, const QueryGradients<T>&, T*,  \
                               const T*, T*, Index, const Visibility&, T, T*, T*, const Progress&, \
                               bool, bool);                                                        \
  template void add_into(const ExecutionSpace&, T*, const T*, Index);                              \
  template void pack_tokens(const ExecutionSpace&, const FieldView<T>&, const Box&, const Heads&,  \
                            T*);                                                                   \
  template void unpack_tokens(const ExecutionSpace&, const T*, const FieldView<T>&, const Box&,    \
                              const Heads&, bool);                                                 \
  template void pack_tokens(const ExecutionSpace&, const ReplicatedView<T>&, Index, const Heads&,  \
                            T*);                                                                   \
  template void unpack_tokens(const ExecutionSpace&, const T*, const ReplicatedView<T>&, Index,    \
                              const Heads&, bool);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
