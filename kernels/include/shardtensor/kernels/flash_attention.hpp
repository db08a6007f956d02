#pragma once
// The kernels of attention over token blocks (layers/ring_attention.hpp) on the execution space of
// their Views, flash-attention style: per (batch, head) slice, tiles of queries x keys; the
// scores S = scale Q K^T and the outputs by GEMMs (KokkosBlas::gemm), an online softmax (running
// max and sum per query row) in between; backward recomputes P from the saved log-sum-exp.
// Memory: the packed blocks plus one bounded score tile (two in backward).
//
// Packed layout of L tokens: [batch][head][token][head_dim], so each (batch, head) slice is a
// row-major L x head_dim matrix and the products are plain GEMMs on it. A K/V block is the
// packed K followed by the packed V (the unit that travels around the ring). Pointers in this
// interface point into buffers of the default memory space (AttentionBuffer).
//
// Every row kernel writes only its own query row (max, sum, output row, score row) and each
// packing work item its own token: no scatter, the same bits on every run and thread count.
// On host threads the slices of a block run concurrently, one per thread (its GEMMs and rows
// on that thread; slices write disjoint memory); on a GPU every slice of a tile at once
// (batched GEMMs, the batched tiles below).
// The host backend (kernels/backends/host/softmax_rows.cpp) runs the softmax rows with
// AVX-512 exponentials for float where the CPU has them.

#include <Kokkos_Core.hpp>
#include <functional>

#include "shardtensor/core/box.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor::kernels {

/// Packed blocks, softmax states and score tiles: 1-D memory of the default space.
template <class T>
using AttentionBuffer = Kokkos::View<T*, DefaultMemorySpace>;

/// A buffer of one call charged to the memory tracker's `category`; zero-filled only if asked.
template <class T>
AttentionBuffer<T> attention_buffer(const char* label, Index size,
                                    MemoryCategory category = MemoryCategory::workspaces,
                                    bool zero = false);

/// Queries x keys of one score tile: the tile (and dS in backward) stays a few hundred KiB
/// whatever the token count, and the GEMMs on it are large enough to run near sgemm speed.
constexpr Index tile_queries = 256;
constexpr Index tile_keys = 512;
constexpr Index score_tile = tile_queries * tile_keys;

/// Row-major rows x cols matrix at a buffer's memory (no copy).
template <class T>
using Tile = Kokkos::View<T**, Kokkos::LayoutRight, DefaultMemorySpace,
                          Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Batch and heads: a packed block of L tokens holds slices() row-major L x head_dim matrices.
struct Heads {
  Index batch = 0, heads = 0, head_dim = 0;
  KOKKOS_INLINE_FUNCTION Index slices() const { return batch * heads; }
  KOKKOS_INLINE_FUNCTION Index channels() const { return heads * head_dim; }
  /// Elements of one packed Q, K or V block of `tokens` tokens.
  KOKKOS_INLINE_FUNCTION Index block(Index tokens) const { return slices() * tokens * head_dim; }
};

/// Values of the score buffers that callers give fold_block (one) and backward_block (two) for
/// `queries` local queries and K/V blocks of at most `keys` keys: on the host a score tile per
/// slice computed at once (one slice per thread); on a GPU the batched tiles' (below).
Index score_buffer_size(const Heads& a, Index queries, Index keys);

/// Which keys each query may see: all, or (causal) keys at global positions <= the query's.
struct Visibility {
  bool causal = false;
  Index query_offset = 0, key_offset = 0;  // global positions of local query / key 0
  /// Visible keys among [first, first + count) for local query i: always a prefix.
  KOKKOS_INLINE_FUNCTION Index count(Index i, Index first, Index count) const {
    if (!causal) return count;
    const Index n = query_offset + i - key_offset - first + 1;
    return n < 0 ? 0 : n > count ? count : n;
  }
};

/// Running softmax of the query rows of all slices: max, sum of exp(score - max) and the
/// unnormalised output. sum and output share one buffer so one allreduce combines both.
template <class T>
struct OnlineSoftmax {
  Index rows, head_dim;
  AttentionBuffer<T> max, totals;  // rows; rows (sums) + rows x head_dim (outputs)
  /// max (the log-sum-exp saved for backward) is charged to the caller's category; its -inf
  /// fill runs on `space`.
  OnlineSoftmax(const ExecutionSpace& space, Index rows, Index head_dim);
  T* sum() const { return totals.data(); }
  T* out() const { return totals.data() + rows; }
};

/// Called between tiles, so the caller's transfers progress while the kernels compute.
using Progress = std::function<void()>;

/// Folds one K/V block (`keys` tokens, K then V) into the softmax state of `queries` packed
/// queries: per slice and tile, S = scale Q K^T, the online update of each row, O += P V.
/// `bf16`: a bf16 op's (Q, K and V hold bf16 values): on a host with AMX tiles the products
/// run on them, P rounded to bf16 as well (host/amx/amx_tiles.hpp); elsewhere it changes nothing.
template <class T>
void fold_block(const ExecutionSpace& space, const Heads& a, const T* q, Index queries, const T* kv,
                Index keys, const Visibility& visible, T scale, OnlineSoftmax<T>& state, T* scores,
                const Progress& progress, bool tf32 = false, bool bf16 = false);

/// Normalises the outputs (out /= sum) and turns max into the log-sum-exp max + log(sum).
template <class T>
void finish(const ExecutionSpace& space, OnlineSoftmax<T>& state);

/// Rescales a partial state to the rows' global maxima (sum and output times
/// exp(max - global_max)) and takes them as its max: the log-sum-exp combine of the partial
/// states of several ranks, before their sums and outputs are added.
template <class T>
void rescale_to(const ExecutionSpace& space, OnlineSoftmax<T>& state,
                const AttentionBuffer<T>& global_max);

/// What backward needs of the local queries, packed: Q, dO, lse and delta = rowsum(dO * O).
template <class T>
struct QueryGradients {
  AttentionBuffer<T> q, dout, lse, delta;
  Index queries;
};

/// QueryGradients of `queries` packed queries q with output out and output gradient dout.
template <class T>
QueryGradients<T> query_gradients(const ExecutionSpace& space, AttentionBuffer<T> q,
                                  AttentionBuffer<T> dout, const AttentionBuffer<T>& out,
                                  AttentionBuffer<T> lse, Index queries, Index head_dim);

/// Backward of one K/V block `kv` against the local queries: per slice and tile, P = exp(S -
/// lse) recomputed, dV += P^T dO, dS = P (dO V^T - delta), dQ += scale dS K, dK += scale dS^T Q.
/// Adds into dq and the block's dK/dV (`dkv`, dK then dV); either may be null (not needed).
/// `bf16` as fold_block's (P and dS rounded as the tiles read them).
template <class T>
void backward_block(const ExecutionSpace& space, const Heads& a, const QueryGradients<T>& g, T* dq,
                    const T* kv, T* dkv, Index keys, const Visibility& visible, T scale, T* scores,
                    T* dscores, const Progress& progress, bool tf32 = false, bool bf16 = false);

/// Tiles of the batched kernels, per slice: `queries` x `keys`.
struct BatchedTiles {
  Index queries = 0, keys = 0;
};

/// Keys per batched tile, and the score values of one tile of every slice at most: a GPU's
/// GEMMs reach their speed on such tiles, and a block's scores stay 128 MiB (float).
constexpr Index batched_tile_keys = 4096;
constexpr Index batched_score_values = Index(1) << 25;

/// The batched tiles of `queries` queries against blocks of up to `keys` keys: the keys in
/// tiles of batched_tile_keys, as many query rows as batched_score_values allows.
BatchedTiles batched_tiles(const Heads& a, Index queries, Index keys);

/// fold_block and backward_block over every slice of a block at once, what they run on a GPU:
/// per tile, one batched GEMM for the scores of all slices (batched_gemm: cuBLAS's
/// strided-batched GEMM on a GPU), one kernel over every row of every slice's tile (a team per
/// row: its max and sum as team reductions) and one batched GEMM per product. The same
/// operations as the per-slice tiles, in tiles of another size: they agree to rounding
/// (test_ring_attention runs both on the host against plain attention). They replaced fused
/// tiles (one team per 32 queries, scalar products in shared memory): 3115 ms at 16k tokens on
/// an H100, against 100 ms for these on an H200. `scores` (and
/// `dscores`) hold slices x tiles.queries x tiles.keys values. `tf32`: float GEMMs may run on
/// TF32 tensor cores; `bf16` (a bf16 op's): on bf16 tensor cores, every operand rounded to bf16
/// (Q, K, V and dO hold bf16 values already; P and dS round), float sums, as the per-slice
/// tiles take them on the host's AMX tiles.
template <class T>
void fold_block_batched(const ExecutionSpace& space, const Heads& a, const T* q, Index queries,
                        const T* kv, Index keys, const Visibility& visible, T scale,
                        OnlineSoftmax<T>& state, T* scores, const BatchedTiles& tiles, bool tf32,
                        bool bf16, const Progress& progress);
template <class T>
void backward_block_batched(const ExecutionSpace& space, const Heads& a, const QueryGradients<T>& g,
                            T* dq, const T* kv, T* dkv, Index keys, const Visibility& visible,
                            T scale, T* scores, T* dscores, const BatchedTiles& tiles, bool tf32,
                            bool bf16, const Progress& progress);

/// Whether fold_block and backward_block run the batched kernels: where kernels run on a GPU.
constexpr bool attention_runs_batched = !kernels_run_on_host;

/// y[i] += x[i] for i < n (buffers of the default space).
template <class T>
void add_into(const ExecutionSpace& space, T* y, const T* x, Index n);

/// The tokens of a field: its owned cells (`owned`, local indices), in C order. Packs them
/// into `out` (a.block(tokens) values).
template <class T>
void pack_tokens(const ExecutionSpace& space, const FieldView<T>& field, const Box& owned,
                 const Heads& a, T* out);

/// Writes (or, with `add`, adds) a packed block into the owned cells of a field.
template <class T>
void unpack_tokens(const ExecutionSpace& space, const T* in, const FieldView<T>& field,
                   const Box& owned, const Heads& a, bool add);

/// The same for a replicated {batch, tokens, channels} tensor (channels of a token contiguous).
template <class T>
void pack_tokens(const ExecutionSpace& space, const ReplicatedView<T>& r, Index tokens,
                 const Heads& a, T* out);
template <class T>
void unpack_tokens(const ExecutionSpace& space, const T* in, const ReplicatedView<T>& r,
                   Index tokens, const Heads& a, bool add);

}  // namespace shardtensor::kernels
