// Fused tiled attention kernels (flash_attention.hpp, fold_block_fused / backward_block_fused):
// one team per tile of queries (or keys), the tiles it reads in team scratch (shared memory
// on a GPU), every step of a tile in the same kernel. The phases of a tile are separated by
// team barriers and each writes values that only it writes: (query row, key) scores,
// per-row softmax updates, (row, channel) accumulations. No atomics: the same bits on every
// run, whatever the team size.

#include <algorithm>

#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/kernels/flash_attention.hpp"

namespace shardtensor::kernels {

namespace {

using TeamPolicy = Kokkos::TeamPolicy<ExecutionSpace>;
using Member = TeamPolicy::member_type;
template <class T>
using Scratch = Kokkos::View<T**, Kokkos::LayoutRight, ExecutionSpace::scratch_memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Team scratch of one kernel: `matrices` row-major blocks of the given sizes. Shared memory
/// (level 0) where it fits, else the team's slice of global memory (level 1).
struct ScratchPlan {
  std::size_t bytes = 0;
  int level = 0;
  template <class T>
  static std::size_t matrix(Index rows, Index cols) {
    return Scratch<T>::shmem_size(rows, cols);
  }
  TeamPolicy policy(const ExecutionSpace& space, Index league) {
    level = bytes <= static_cast<std::size_t>(TeamPolicy::scratch_size_max(0)) ? 0 : 1;
    return TeamPolicy(space, static_cast<int>(league), Kokkos::AUTO)
        .set_scratch_size(level, Kokkos::PerTeam(bytes));
  }
};

/// rows x D values at `from` (row-major, D per row) into scratch, by the whole team.
template <class T>
KOKKOS_INLINE_FUNCTION void load_rows(const Member& team, const Scratch<T>& to, const T* from,
                                      Index rows, Index D) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * D),
                       [&](const Index e) { to(e / D, e % D) = from[e]; });
}

template <class T>
KOKKOS_INLINE_FUNCTION T dot(const Scratch<T>& a, Index i, const Scratch<T>& b, Index j, Index D) {
  T s = 0;
  for (Index d = 0; d < D; ++d) s += a(i, d) * b(j, d);
  return s;
}

/// Forward: the team of (slice s, query tile i0) folds every key tile of the block into its
/// rows' softmax state (max, sum, unnormalised output), as OnlineSoftmaxRow does per tile.
template <class T>
struct FoldTiles {
  Index D, queries, keys, query_tiles;
  int level;
  const T *q, *k, *v;
  Visibility visible;
  T scale;
  T *max, *sum, *out;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const Index s = team.league_rank() / query_tiles;
    const Index i0 = team.league_rank() % query_tiles * fused_tile_queries;
    const Index rows = math::min(fused_tile_queries, queries - i0);
    const Scratch<T> qs(team.team_scratch(level), fused_tile_queries, D);
    const Scratch<T> ks(team.team_scratch(level), fused_tile_keys, D);
    const Scratch<T> vs(team.team_scratch(level), fused_tile_keys, D);
    const Scratch<T> p(team.team_scratch(level), fused_tile_queries, fused_tile_keys);
    const Scratch<T> correction(team.team_scratch(level), fused_tile_queries, 1);
    const Index row0 = s * queries + i0;  // the team's first row in the state
    load_rows(team, qs, q + row0 * D, rows, D);
    for (Index j0 = 0; j0 < keys; j0 += fused_tile_keys) {
      const Index cols = math::min(fused_tile_keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;  // all in the future
      team.team_barrier();                                        // the previous tile is consumed
      load_rows(team, ks, k + (s * keys + j0) * D, cols, D);
      load_rows(team, vs, v + (s * keys + j0) * D, cols, D);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * cols), [&](const Index e) {
        const Index i = e / cols, j = e % cols;
        p(i, j) = scale * dot(qs, i, ks, j, D);
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](const Index i) {
        const Index n = visible.count(i0 + i, j0, cols);
        T tile_max = -math::infinity<T>();
        for (Index j = 0; j < n; ++j) tile_max = math::max(tile_max, p(i, j));
        for (Index j = n; j < cols; ++j) p(i, j) = T(0);
        correction(i, 0) = T(1);
        if (n == 0) return;
        T& row_max = max[row0 + i];
        const T new_max = math::max(row_max, tile_max);
        correction(i, 0) = math::exp(row_max - new_max);  // 0 on the row's first tile
        T total = 0;
        for (Index j = 0; j < n; ++j) total += (p(i, j) = math::exp(p(i, j) - new_max));
        sum[row0 + i] = sum[row0 + i] * correction(i, 0) + total;
        row_max = new_max;
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * D), [&](const Index e) {
        const Index i = e / D, d = e % D;
        T acc = 0;
        for (Index j = 0; j < cols; ++j) acc += p(i, j) * vs(j, d);
        T& o = out[(row0 + i) * D + d];
        o = o * correction(i, 0) + acc;
      });
    }
  }
};

/// The team scratch of both backward kernels: Q and dO tiles, K and V tiles, P and dS tiles.
template <class T>
struct BackwardTiles {
  Scratch<T> qs, dos, ks, vs, p, ds;
  KOKKOS_INLINE_FUNCTION BackwardTiles(const Member& team, int level, Index D)
      : qs(team.team_scratch(level), fused_tile_queries, D),
        dos(team.team_scratch(level), fused_tile_queries, D),
        ks(team.team_scratch(level), fused_tile_keys, D),
        vs(team.team_scratch(level), fused_tile_keys, D),
        p(team.team_scratch(level), fused_tile_queries, fused_tile_keys),
        ds(team.team_scratch(level), fused_tile_queries, fused_tile_keys) {}
  static std::size_t bytes(Index D) {
    return 2 * ScratchPlan::matrix<T>(fused_tile_queries, D) +
           2 * ScratchPlan::matrix<T>(fused_tile_keys, D) +
           2 * ScratchPlan::matrix<T>(fused_tile_queries, fused_tile_keys);
  }

  /// For the (query i, key j) pairs of a tile: P = exp(scale q.k - lse) of the visible keys
  /// (0 for the others) into p, and dS = P (dO.v - delta) into ds.
  KOKKOS_INLINE_FUNCTION void score_gradients(const Member& team, const T* lse, const T* delta,
                                              Index i0, Index rows, Index j0, Index cols, Index D,
                                              const Visibility& visible, T scale) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * cols), [&](const Index e) {
      const Index i = e / cols, j = e % cols;
      const bool seen = j < visible.count(i0 + i, j0, cols);
      const T pij = seen ? math::exp(scale * dot(qs, i, ks, j, D) - lse[i]) : T(0);
      p(i, j) = pij;
      ds(i, j) = seen ? pij * (dot(dos, i, vs, j, D) - delta[i]) : T(0);
    });
  }
};

/// dQ: the team of (slice s, query tile i0) adds scale dS K over every key tile to its rows.
template <class T>
struct QueryGradientTiles {
  Index D, queries, keys, query_tiles;
  int level;
  const T *q, *dout, *lse, *delta, *k, *v;
  Visibility visible;
  T scale;
  T* dq;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const Index s = team.league_rank() / query_tiles;
    const Index i0 = team.league_rank() % query_tiles * fused_tile_queries;
    const Index rows = math::min(fused_tile_queries, queries - i0);
    const BackwardTiles<T> t(team, level, D);
    const Index row0 = s * queries + i0;
    load_rows(team, t.qs, q + row0 * D, rows, D);
    load_rows(team, t.dos, dout + row0 * D, rows, D);
    for (Index j0 = 0; j0 < keys; j0 += fused_tile_keys) {
      const Index cols = math::min(fused_tile_keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;
      team.team_barrier();
      load_rows(team, t.ks, k + (s * keys + j0) * D, cols, D);
      load_rows(team, t.vs, v + (s * keys + j0) * D, cols, D);
      team.team_barrier();
      t.score_gradients(team, lse + row0, delta + row0, i0, rows, j0, cols, D, visible, scale);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * D), [&](const Index e) {
        const Index i = e / D, d = e % D;
        T acc = 0;
        for (Index j = 0; j < cols; ++j) acc += t.ds(i, j) * t.ks(j, d);
        dq[(row0 + i) * D + d] += scale * acc;
      });
    }
  }
};

/// dK and dV: the team of (slice s, key tile j0) adds P^T dO and scale dS^T Q over every
/// query tile to its keys.
template <class T>
struct KeyGradientTiles {
  Index D, queries, keys, key_tiles;
  int level;
  const T *q, *dout, *lse, *delta, *k, *v;
  Visibility visible;
  T scale;
  T *dk, *dv;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const Index s = team.league_rank() / key_tiles;
    const Index j0 = team.league_rank() % key_tiles * fused_tile_keys;
    const Index cols = math::min(fused_tile_keys, keys - j0);
    const BackwardTiles<T> t(team, level, D);
    const Index key0 = s * keys + j0;
    load_rows(team, t.ks, k + key0 * D, cols, D);
    load_rows(team, t.vs, v + key0 * D, cols, D);
    for (Index i0 = 0; i0 < queries; i0 += fused_tile_queries) {
      const Index rows = math::min(fused_tile_queries, queries - i0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;  // no query of it sees these
      const Index row0 = s * queries + i0;
      team.team_barrier();
      load_rows(team, t.qs, q + row0 * D, rows, D);
      load_rows(team, t.dos, dout + row0 * D, rows, D);
      team.team_barrier();
      t.score_gradients(team, lse + row0, delta + row0, i0, rows, j0, cols, D, visible, scale);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols * D), [&](const Index e) {
        const Index j = e / D, d = e % D;
        T dv_acc = 0, dk_acc = 0;
        for (Index i = 0; i < rows; ++i) {
          dv_acc += t.p(i, j) * t.dos(i, d);
          dk_acc += t.ds(i, j) * t.qs(i, d);
        }
        if (dv) dv[(key0 + j) * D + d] += dv_acc;
        if (dk) dk[(key0 + j) * D + d] += scale * dk_acc;
      });
    }
  }
};

Index tiles(Index n, Index tile) {
  return (n + tile - 1) / tile;
}

}  // namespace

template <class T>
void fold_block_fused(const ExecutionSpace& space, const Heads& a, const T* q, Index queries,
                      const T* kv, Index keys, const Visibility& visible, T scale,
                      OnlineSoftmax<T>& state) {
  if (queries == 0 || keys == 0 || a.slices() == 0) return;
  const Index D = a.head_dim, query_tiles = tiles(queries, fused_tile_queries);
  ScratchPlan plan;
  plan.bytes = 2 * ScratchPlan::matrix<T>(fused_tile_keys, D) +
               ScratchPlan::matrix<T>(fused_tile_queries, D) +
               ScratchPlan::matrix<T>(fused_tile_queries, fused_tile_keys) +
               ScratchPlan::matrix<T>(fused_tile_queries, 1);
  const TeamPolicy policy = plan.policy(space, a.slices() * query_tiles);
  Kokkos::parallel_for(
      "flash_attention::fold_fused", policy,
      FoldTiles<T>{D, queries, keys, query_tiles, plan.level, q, kv, kv + a.block(keys), visible,
                   scale, state.max.data(), state.sum(), state.out()});
}

template <class T>
void backward_block_fused(const ExecutionSpace& space, const Heads& a, const QueryGradients<T>& g,
                          T* dq, const T* kv, T* dkv, Index keys, const Visibility& visible,
                          T scale) {
  const Index D = a.head_dim, queries = g.queries;
  if (queries == 0 || keys == 0 || a.slices() == 0) return;
  const T* v = kv + a.block(keys);
  ScratchPlan plan;
  plan.bytes = BackwardTiles<T>::bytes(D);
  if (dq) {
    const Index query_tiles = tiles(queries, fused_tile_queries);
    const TeamPolicy policy = plan.policy(space, a.slices() * query_tiles);
    Kokkos::parallel_for(
        "flash_attention::dq_fused", policy,
        QueryGradientTiles<T>{D, queries, keys, query_tiles, plan.level, g.q.data(), g.dout.data(),
                              g.lse.data(), g.delta.data(), kv, v, visible, scale, dq});
  }
  if (dkv) {
    const Index key_tiles = tiles(keys, fused_tile_keys);
    const TeamPolicy policy = plan.policy(space, a.slices() * key_tiles);
    Kokkos::parallel_for("flash_attention::dkv_fused", policy,
                         KeyGradientTiles<T>{D, queries, keys, key_tiles, plan.level, g.q.data(),
                                             g.dout.data(), g.lse.data(), g.delta.data(), kv, v,
                                             visible, scale, dkv, dkv + a.block(keys)});
  }
}

#define SHARDTENSOR_INSTANTIATE(T)                                                             \
  template void fold_block_fused<T>(const ExecutionSpace&, const Heads&, const T*, Index,      \
                                    const T*, Index, const Visibility&, T, OnlineSoftmax<T>&); \
  template void backward_block_fused<T>(const ExecutionSpace&, const Heads&,                   \
                                        const QueryGradients<T>&, T*, const T*, T*, Index,     \
                                        const Visibility&, T);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor::kernels
