// Batched attention tiles (flash_attention.hpp, fold_block_batched / backward_block_batched):
// every (batch, head) slice of a block at once. Per tile, the products are batched GEMMs over
// the slices (batched_gemm: cuBLAS on a GPU) and the row steps one kernel over every row of
// every slice's tile: the online softmax a team per row (its max and sum as team reductions,
// so a row of thousands of keys is read by many threads side by side), the elementwise steps
// a work item per score. Each kernel writes only its own row or score: no atomics, the same
// bits on every run.

#include <algorithm>

#include "batched_gemm.hpp"  // kernels/backends: private to kernels
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/kernels/flash_attention.hpp"

namespace shardtensor::kernels {

namespace {

using TeamPolicy = Kokkos::TeamPolicy<ExecutionSpace>;
using Member = TeamPolicy::member_type;

/// Where the rows of a batched tile sit: slice s's tile is rows x cols values at
/// scores + s * rows * cols, its row i belongs to local query i0 + i (state row
/// s * queries + i0 + i) and its column j to key j0 + j.
struct TileRows {
  Index rows, cols, queries, i0, j0;
  Visibility visible;
  /// The state row of tile row r (r = s * rows + i over all slices).
  KOKKOS_INLINE_FUNCTION Index state_row(Index r) const {
    const Index s = r / rows;
    return s * queries + i0 + (r - s * rows);
  }
  /// Visible keys of tile row r: a prefix of its columns.
  KOKKOS_INLINE_FUNCTION Index visible_keys(Index r) const {
    return visible.count(i0 + r % rows, j0, cols);
  }
};

/// The online-softmax update of one row of every slice's tile (OnlineSoftmaxRow's, with the
/// row's max and sum reduced by a team): masked keys get P = 0, the row's max moves to include
/// the tile, the sum and output row are rescaled, and the scores become exp(s - new max).
template <class T>
struct OnlineSoftmaxTeamRow {
  T* scores;
  TileRows at;
  T *max, *sum, *out;
  Index D;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const Index r = team.league_rank();
    T* row = scores + r * at.cols;
    const Index n = at.visible_keys(r), state = at.state_row(r);
    T tile_max = -math::infinity<T>();
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, n), [&](const Index j, T& m) { m = math::max(m, row[j]); },
        Kokkos::Max<T>(tile_max));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n, at.cols),
                         [&](const Index j) { row[j] = T(0); });
    if (n == 0) return;  // the same n for the whole team
    const T old_max = max[state];
    const T new_max = math::max(old_max, tile_max);
    const T correction = math::exp(old_max - new_max);  // 0 on the row's first tile
    T total = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, n),
        [&](const Index j, T& t) { t += (row[j] = math::exp(row[j] - new_max)); }, total);
    team.team_barrier();  // every thread has read the old max
    Kokkos::single(Kokkos::PerTeam(team), [&] {
      sum[state] = sum[state] * correction + total;
      max[state] = new_max;
    });
    if (correction != T(1))
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, D),
                           [&](const Index d) { out[state * D + d] *= correction; });
  }
};

/// P = exp(S - lse) of the visible keys, 0 for the others, one work item per score.
template <class T>
struct ProbabilityScore {
  T* p;
  TileRows at;
  const T* lse;
  KOKKOS_INLINE_FUNCTION void operator()(const Index e) const {
    const Index r = e / at.cols, j = e - r * at.cols;
    p[e] = j < at.visible_keys(r) ? math::exp(p[e] - lse[at.state_row(r)]) : T(0);
  }
};

/// dS = P (dP - delta), one work item per score (ds holds dP = dO V^T on entry).
template <class T>
struct ScoreGradient {
  T* ds;
  const T* p;
  TileRows at;
  const T* delta;
  KOKKOS_INLINE_FUNCTION void operator()(const Index e) const {
    const Index r = e / at.cols;
    ds[e] = p[e] * (ds[e] - delta[at.state_row(r)]);
  }
};

/// Calls tile(i0, rows, j0, cols) for the tiles of `queries` x `keys` that hold a visible key.
template <class Tile>
void for_each_tile(const BatchedTiles& tiles, Index queries, Index keys, const Visibility& visible,
                   const Tile& tile) {
  for (Index i0 = 0; i0 < queries; i0 += tiles.queries) {
    const Index rows = std::min(tiles.queries, queries - i0);
    for (Index j0 = 0; j0 < keys; j0 += tiles.keys) {
      const Index cols = std::min(tiles.keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;  // all in the future
      tile(i0, rows, j0, cols);
    }
  }
}

}  // namespace

BatchedTiles batched_tiles(const Heads& a, Index queries, Index keys) {
  const Index rows = batched_score_values / (std::max<Index>(a.slices(), 1) * batched_tile_keys);
  return {std::clamp<Index>(rows, 1, std::max<Index>(queries, 1)),
          std::clamp<Index>(keys, 1, batched_tile_keys)};
}

template <class T>
void fold_block_batched(const ExecutionSpace& space, const Heads& a, const T* q, Index queries,
                        const T* kv, Index keys, const Visibility& visible, T scale,
                        OnlineSoftmax<T>& state, T* scores, const BatchedTiles& tiles, bool tf32,
                        bool bf16, const Progress& progress) {
  const Index D = a.head_dim, S = a.slices();
  const T *k = kv, *v = kv + a.block(keys);
  T *max = state.max.data(), *sum = state.sum(), *out = state.out();
  for_each_tile(tiles, queries, keys, visible, [&](Index i0, Index rows, Index j0, Index cols) {
    const Index tile = rows * cols;
    batched_gemm(space, false, true, rows, cols, D, scale, q + i0 * D, queries * D, k + j0 * D,
                 keys * D, T(0), scores, tile, S, tf32, bf16);
    Kokkos::parallel_for(
        "flash_attention::online_softmax_batched",
        TeamPolicy(space, static_cast<int>(S * rows), Kokkos::AUTO),
        OnlineSoftmaxTeamRow<T>{scores, {rows, cols, queries, i0, j0, visible}, max, sum, out, D});
    batched_gemm(space, false, false, rows, D, cols, T(1), scores, tile, v + j0 * D, keys * D, T(1),
                 out + i0 * D, queries * D, S, tf32, bf16);
    progress();
  });
}

template <class T>
void backward_block_batched(const ExecutionSpace& space, const Heads& a, const QueryGradients<T>& g,
                            T* dq, const T* kv, T* dkv, Index keys, const Visibility& visible,
                            T scale, T* scores, T* dscores, const BatchedTiles& tiles, bool tf32,
                            bool bf16, const Progress& progress) {
  const Index D = a.head_dim, S = a.slices(), Lq = g.queries;
  const T *k = kv, *v = kv + a.block(keys), *q = g.q.data(), *dout = g.dout.data();
  T* dk = dkv;
  T* dv = dkv ? dkv + a.block(keys) : nullptr;
  for_each_tile(tiles, Lq, keys, visible, [&](Index i0, Index rows, Index j0, Index cols) {
    const Index tile = rows * cols;
    const TileRows at{rows, cols, Lq, i0, j0, visible};
    batched_gemm(space, false, true, rows, cols, D, scale, q + i0 * D, Lq * D, k + j0 * D, keys * D,
                 T(0), scores, tile, S, tf32, bf16);
    Kokkos::parallel_for("flash_attention::probabilities_batched", kernel_range(space, S * tile),
                         ProbabilityScore<T>{scores, at, g.lse.data()});
    if (dv)  // dV += P^T dO
      batched_gemm(space, true, false, cols, D, rows, T(1), scores, tile, dout + i0 * D, Lq * D,
                   T(1), dv + j0 * D, keys * D, S, tf32, bf16);
    if (dq || dk) {  // dS = P (dO V^T - delta)
      batched_gemm(space, false, true, rows, cols, D, T(1), dout + i0 * D, Lq * D, v + j0 * D,
                   keys * D, T(0), dscores, tile, S, tf32, bf16);
      Kokkos::parallel_for("flash_attention::score_gradients_batched",
                           kernel_range(space, S * tile),
                           ScoreGradient<T>{dscores, scores, at, g.delta.data()});
      if (dq)  // dQ += scale dS K
        batched_gemm(space, false, false, rows, D, cols, scale, dscores, tile, k + j0 * D, keys * D,
                     T(1), dq + i0 * D, Lq * D, S, tf32, bf16);
      if (dk)  // dK += scale dS^T Q
        batched_gemm(space, true, false, cols, D, rows, scale, dscores, tile, q + i0 * D, Lq * D,
                     T(1), dk + j0 * D, keys * D, S, tf32, bf16);
    }
    progress();
  });
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                 \
  template void fold_block_batched(const ExecutionSpace&, const Heads&, const T*, Index, const T*, \
                                   Index, const Visibility&, T, OnlineSoftmax<T>&, T*,             \
                                   const BatchedTiles&, bool, bool, const Progress&);              \
  template void backward_block_batched(                                                            \
      const ExecutionSpace&, const Heads&, const QueryGradients<T>&, T*, const T*, T*, Index,      \
      const Visibility&, T, T*, T*, const BatchedTiles&, bool, bool, const Progress&);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
