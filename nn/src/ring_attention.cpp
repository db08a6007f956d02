// Attention over sharded tokens: ring attention and the replicated-queries / replicated-keys
// variants (see ring_attention.hpp and docs/attention.md).
//
// Compute runs on host copies: MPI reads host memory here anyway (no GPU-aware MPI yet).
// Packed layout of L tokens: [batch][head][token][head_dim], so each (batch, head) slice is a
// row-major L x head_dim matrix and the products are plain GEMMs on it. A K/V block is the
// packed K followed by the packed V (the unit that travels around the ring).

#include "shardtensor/nn/ring_attention.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/point_to_point.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/kernels/softmax_rows.hpp"

namespace shardtensor {
namespace {

/// Message tags of ring attention on a communicator: K/V blocks travelling around the ring,
/// then the dK/dV accumulators travelling with them (backward).
int kv_tag(const Communicator& comm) {
  return comm.operation_tags("ring_attention", 2);
}
int grad_tag(const Communicator& comm) {
  return kv_tag(comm) + 1;
}

/// Queries x keys of one score tile: the tile (and dP in backward) stays a few hundred KiB
/// whatever the token count, and the GEMMs on it are large enough to run near sgemm speed.
constexpr Index tile_queries = 256;
constexpr Index tile_keys = 512;

// ---------------------------------------------------------------------------------------
// Host buffers, GEMM, row kernels

template <class T>
using Buffer = Kokkos::View<T*, Kokkos::HostSpace>;

/// A host buffer of one call (packed copies, score tiles, running state), charged to the
/// memory tracker's workspaces; ring buffers to comm_buffers. Zero-filled only if asked.
template <class T>
Buffer<T> scratch(const char* label, Index size,
                  MemoryCategory category = MemoryCategory::workspaces, bool zero = false) {
  MemoryCategoryScope memory(category);
  if (zero) return Buffer<T>(std::string(label), size);
  return Buffer<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), size);
}

template <class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Row-major rows x cols matrix at `data` (no copy).
template <class T>
Matrix<T> matrix(T* data, Index rows, Index cols) {
  return Matrix<T>(data, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
}

// ---------------------------------------------------------------------------------------
// The kernels on one query block and one K/V block, all (batch, head) slices

/// Batch and heads: a packed block of L tokens holds slices() row-major L x head_dim matrices.
struct Heads {
  Index batch = 0, heads = 0, head_dim = 0;
  Index slices() const { return batch * heads; }
  Index channels() const { return heads * head_dim; }
  /// Elements of one packed Q, K or V block of `tokens` tokens.
  Index block(Index tokens) const { return slices() * tokens * head_dim; }
};

/// Which keys each query may see: all, or (causal) keys at global positions <= the query's.
struct Visibility {
  bool causal = false;
  Index query_offset = 0, key_offset = 0;  // global positions of local query / key 0
  /// Visible keys among [first, first + count) for local query i: always a prefix.
  Index count(Index i, Index first, Index count) const {
    if (!causal) return count;
    return std::clamp<Index>(query_offset + i - key_offset - first + 1, 0, count);
  }
};

/// Running softmax of the query rows of all slices: max, sum of exp(score - max) and the
/// unnormalised output. sum and output share one buffer so one allreduce combines both.
template <class T>
struct OnlineSoftmax {
  Index rows, head_dim;
  Buffer<T> max, totals;  // rows; rows (sums) + rows x head_dim (outputs)
  OnlineSoftmax(Index rows, Index head_dim)
      : rows(rows),
        head_dim(head_dim),
        // max becomes the log-sum-exp saved for backward: the caller's (activations) memory
        max(scratch<T>("attention.lse", rows, current_memory_category())),
        totals(scratch<T>("attention.totals", rows * (1 + head_dim), MemoryCategory::workspaces,
                          /*zero=*/true)) {
    Kokkos::deep_copy(max, -std::numeric_limits<T>::infinity());
  }
  T* sum() const { return totals.data(); }
  T* out() const { return totals.data() + rows; }
};

/// Polls pending messages between tiles, so transfers progress while we compute.
using Progress = std::function<void()>;

/// Folds keys/values k, v (keys x D) into the softmax state of queries q (queries x D) of
/// one slice: per tile, S = scale Q K^T (GEMM), the online update of each row, O += P V (GEMM).
template <class T>
void fold_slice(Index D, const T* q, Index queries, const T* k, const T* v, Index keys,
                const Visibility& visible, T scale, T* max, T* sum, T* out, T* scores,
                const Progress& progress) {
  for (Index i0 = 0; i0 < queries; i0 += tile_queries) {
    const Index rows = std::min(tile_queries, queries - i0);
    for (Index j0 = 0; j0 < keys; j0 += tile_keys) {
      const Index cols = std::min(tile_keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;  // all in the future
      KokkosBlas::gemm("N", "T", scale, matrix(q + i0 * D, rows, D), matrix(k + j0 * D, cols, D),
                       T(0), matrix(scores, rows, cols));
      for (Index i = 0; i < rows; ++i) {
        T* s = scores + i * cols;
        const Index n = visible.count(i0 + i, j0, cols);
        std::fill(s + n, s + cols, T(0));  // masked keys get P = 0
        if (n == 0) continue;
        const Index row = i0 + i;
        const T new_max = std::max(max[row], kernels::row_max(s, n));
        // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first tile).
        const T correction = std::exp(max[row] - new_max);
        sum[row] = sum[row] * correction + kernels::exp_row(s, n, new_max);
        max[row] = new_max;
        if (correction != T(1))
          for (Index d = 0; d < D; ++d) out[row * D + d] *= correction;
      }
      KokkosBlas::gemm("N", "N", T(1), matrix<const T>(scores, rows, cols),
                       matrix(v + j0 * D, cols, D), T(1), matrix(out + i0 * D, rows, D));
      progress();
    }
  }
}

/// Backward of one slice: P = exp(S - lse) recomputed per tile, then dV += P^T dO,
/// dS = P (dO V^T - delta), dQ += scale dS K, dK += scale dS^T Q (GEMMs). dq, or dk and dv,
/// may be null (not needed).
template <class T>
void backward_slice(Index D, const T* q, const T* dout, const T* lse, const T* delta, Index queries,
                    const T* k, const T* v, Index keys, const Visibility& visible, T scale, T* dq,
                    T* dk, T* dv, T* scores, T* dscores, const Progress& progress) {
  for (Index i0 = 0; i0 < queries; i0 += tile_queries) {
    const Index rows = std::min(tile_queries, queries - i0);
    const auto q_tile = matrix(q + i0 * D, rows, D), dout_tile = matrix(dout + i0 * D, rows, D);
    for (Index j0 = 0; j0 < keys; j0 += tile_keys) {
      const Index cols = std::min(tile_keys, keys - j0);
      if (visible.count(i0 + rows - 1, j0, cols) == 0) continue;
      const auto k_tile = matrix(k + j0 * D, cols, D), v_tile = matrix(v + j0 * D, cols, D);
      const auto p = matrix(scores, rows, cols), ds = matrix(dscores, rows, cols);
      KokkosBlas::gemm("N", "T", scale, q_tile, k_tile, T(0), p);
      for (Index i = 0; i < rows; ++i) {
        const Index n = visible.count(i0 + i, j0, cols);
        kernels::exp_row(&p(i, 0), n, lse[i0 + i]);
        std::fill(&p(i, 0) + n, &p(i, 0) + cols, T(0));
      }
      if (dv) KokkosBlas::gemm("T", "N", T(1), p, dout_tile, T(1), matrix(dv + j0 * D, cols, D));
      if (dq || dk) {
        KokkosBlas::gemm("N", "T", T(1), dout_tile, v_tile, T(0), ds);
        for (Index i = 0; i < rows; ++i) {
          const T di = delta[i0 + i];
          T* dsi = &ds(i, 0);
          const T* pi = &p(i, 0);
          for (Index j = 0; j < cols; ++j) dsi[j] = pi[j] * (dsi[j] - di);
        }
        if (dq) KokkosBlas::gemm("N", "N", scale, ds, k_tile, T(1), matrix(dq + i0 * D, rows, D));
        if (dk) KokkosBlas::gemm("T", "N", scale, ds, q_tile, T(1), matrix(dk + j0 * D, cols, D));
      }
      progress();
    }
  }
}

/// Folds one K/V block (`keys` tokens, K then V) into the state of `queries` packed queries.
template <class T>
void fold_block(const Heads& a, const T* q, Index queries, const T* kv, Index keys,
                const Visibility& visible, T scale, OnlineSoftmax<T>& state, T* scores,
                const Progress& progress) {
  const Index D = a.head_dim;
  const T* v = kv + a.block(keys);
  for (Index s = 0; s < a.slices(); ++s)
    fold_slice(D, q + s * queries * D, queries, kv + s * keys * D, v + s * keys * D, keys, visible,
               scale, state.max.data() + s * queries, state.sum() + s * queries,
               state.out() + s * queries * D, scores, progress);
}

/// What backward needs of the local queries, packed: Q, dO, lse and delta = rowsum(dO * O).
template <class T>
struct QueryGradients {
  Buffer<T> q, dout, lse, delta;
  Index queries;
};

/// Backward of one K/V block `kv` against the local queries; adds into dq and the block's
/// dK/dV (`dkv`, dK then dV; null if not needed).
template <class T>
void backward_block(const Heads& a, const QueryGradients<T>& g, T* dq, const T* kv, T* dkv,
                    Index keys, const Visibility& visible, T scale, T* scores, T* dscores,
                    const Progress& progress) {
  const Index D = a.head_dim, Lq = g.queries;
  const T* v = kv + a.block(keys);
  for (Index s = 0; s < a.slices(); ++s)
    backward_slice(D, g.q.data() + s * Lq * D, g.dout.data() + s * Lq * D, g.lse.data() + s * Lq,
                   g.delta.data() + s * Lq, Lq, kv + s * keys * D, v + s * keys * D, keys, visible,
                   scale, dq ? dq + s * Lq * D : nullptr, dkv ? dkv + s * keys * D : nullptr,
                   dkv ? dkv + a.block(keys) + s * keys * D : nullptr, scores, dscores, progress);
}

/// Normalises the outputs (out /= sum) and turns max into the log-sum-exp max + log(sum).
template <class T>
void finish(OnlineSoftmax<T>& state) {
  for (Index row = 0; row < state.rows; ++row) {
    const T sum = state.sum()[row];
    for (Index d = 0; d < state.head_dim; ++d) state.out()[row * state.head_dim + d] /= sum;
    state.max(row) += std::log(sum);
  }
}

// ---------------------------------------------------------------------------------------
// Packing between token sets and the [batch][head][token][head_dim] layout

template <class T>
Index tokens_of(const ShardTensor<T>& f) {
  return f.local_extent(0) * f.local_extent(1) * f.local_extent(2);
}

/// Calls move(field value, packed value) for every batch entry, channel and owned cell
/// (token, in C order of the cells) of f. Blocks of 16 tokens, a head's channels inside: the
/// field's channel lines and the packed rows of a block both stay in cache.
template <class HostView, class T, class F>
void for_each_value(const HostView& host, const ShardTensor<T>& f, const Heads& a, T* packed,
                    F move) {
  constexpr Index block = 16;
  const Box b = f.interior_box();
  std::vector<Index> cells;  // offsets of the owned cells from the first allocated one
  cells.reserve(tokens_of(f));
  for (Index x = b.lower[0]; x < b.upper(0); ++x)
    for (Index y = b.lower[1]; y < b.upper(1); ++y)
      for (Index z = b.lower[2]; z < b.upper(2); ++z)
        cells.push_back(x * host.stride(2) + y * host.stride(3) + z * host.stride(4));
  const Index L = tokens_of(f), D = a.head_dim, stride = static_cast<Index>(host.stride(1));
  for (Index n = 0; n < a.batch; ++n)
    for (Index h = 0; h < a.heads; ++h) {
      T* field = &host(n, h * D, 0, 0, 0);
      T* slice = packed + (n * a.heads + h) * L * D;
      for (Index t0 = 0; t0 < L; t0 += block)
        for (Index d = 0; d < D; ++d)
          for (Index t = t0; t < std::min(t0 + block, L); ++t)
            move(field[d * stride + cells[t]], slice[t * D + d]);
    }
}

/// The owned cells of a field, packed into out.
template <class T>
void pack(const ShardTensor<T>& f, const Heads& a, T* out) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.view());
  for_each_value(host, f, a, out, [](const T& value, T& packed) { packed = value; });
}

/// Writes (or, with `add`, adds) a packed block into the owned cells of a field.
template <class T>
void unpack(const T* src, const ShardTensor<T>& f, const Heads& a, bool add) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.view());
  for_each_value(host, f, a, const_cast<T*>(src),
                 [add](T& value, const T& packed) { value = (add ? value : T(0)) + packed; });
  Kokkos::deep_copy(f.view(), host);
}

/// Offset of (n, t, h * head_dim) in a replicated {batch, tokens, channels} tensor and of
/// the same token's row in the packed block.
struct ReplicatedRow {
  Index replicated, packed;
};

template <class F>
void for_each_replicated_token(const Heads& a, Index tokens, F visit) {
  for (Index n = 0; n < a.batch; ++n)
    for (Index t = 0; t < tokens; ++t)
      for (Index h = 0; h < a.heads; ++h)
        visit(ReplicatedRow{(n * tokens + t) * a.channels() + h * a.head_dim,
                            ((n * a.heads + h) * tokens + t) * a.head_dim});
}

/// A replicated {batch, tokens, channels} tensor, packed into out.
template <class T>
void pack(const ReplicatedView<T>& r, const Heads& a, Index tokens, T* out) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r);
  for_each_replicated_token(a, tokens, [&](const ReplicatedRow& row) {
    for (Index d = 0; d < a.head_dim; ++d) out[row.packed + d] = host(row.replicated + d);
  });
}

template <class T>
void unpack(const T* src, const ReplicatedView<T>& r, const Heads& a, Index tokens, bool add) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r);
  for_each_replicated_token(a, tokens, [&](const ReplicatedRow& row) {
    for (Index d = 0; d < a.head_dim; ++d) {
      T& value = host(row.replicated + d);
      value = (add ? value : T(0)) + src[row.packed + d];
    }
  });
  Kokkos::deep_copy(r, host);
}

/// A token set, packed (a copy).
template <class T>
Buffer<T> packed_copy(const ShardTensor<T>& f, const Heads& a) {
  Buffer<T> out = scratch<T>("attention.packed", a.block(tokens_of(f)));
  pack(f, a, out.data());
  return out;
}
template <class T>
Buffer<T> packed_copy(const ReplicatedView<T>& r, const Heads& a, Index tokens) {
  Buffer<T> out = scratch<T>("attention.packed", a.block(tokens));
  pack(r, a, tokens, out.data());
  return out;
}

/// K then V, packed: the block that travels around the ring.
template <class T>
Buffer<T> packed_kv(const ShardTensor<T>& k, const ShardTensor<T>& v, const Heads& a) {
  const Index E = a.block(tokens_of(k));
  Buffer<T> kv = scratch<T>("attention.kv", 2 * E);
  pack(k, a, kv.data());
  pack(v, a, kv.data() + E);
  return kv;
}
template <class T>
Buffer<T> packed_kv(const ReplicatedView<T>& k, const ReplicatedView<T>& v, const Heads& a,
                    Index tokens) {
  const Index E = a.block(tokens);
  Buffer<T> kv = scratch<T>("attention.kv", 2 * E);
  pack(k, a, tokens, kv.data());
  pack(v, a, tokens, kv.data() + E);
  return kv;
}

/// What backward needs of `queries` packed queries: delta = rowsum(dO * O) per row.
template <class T>
QueryGradients<T> query_gradients(Buffer<T> q, Buffer<T> dout, const Buffer<T>& out, Buffer<T> lse,
                                  Index queries, Index head_dim) {
  const Index rows = lse.extent(0);
  Buffer<T> delta = scratch<T>("attention.delta", rows);
  for (Index row = 0; row < rows; ++row) {
    T s = 0;
    for (Index d = 0; d < head_dim; ++d) s += dout(row * head_dim + d) * out(row * head_dim + d);
    delta(row) = s;
  }
  return {std::move(q), std::move(dout), std::move(lse), std::move(delta), queries};
}

/// Zero-filled buffer of a block's gradient, or an empty one when not needed.
template <class T>
Buffer<T> gradient_buffer(bool needed, Index size) {
  return needed ? scratch<T>("attention.grad", size, MemoryCategory::workspaces, /*zero=*/true)
                : Buffer<T>();
}

template <class T>
T* data_or_null(const Buffer<T>& b) {
  return b.extent(0) ? b.data() : nullptr;
}

const Progress no_progress = [] {};

// ---------------------------------------------------------------------------------------
// Checks shared by the three ops

template <class T>
std::string describe(const Variable<T>& x) {
  std::ostringstream s;
  s << "'" << x.name() << "' has ";
  if (x.is_field()) {
    s << "batch " << x.value().batch() << ", channels " << x.value().channels() << ", "
      << x.value().decomposition().global_cells() << " tokens";
  } else {
    s << "shape {";
    for (std::size_t i = 0; i < x.shape().size(); ++i) s << (i ? ", " : "") << x.shape()[i];
    s << "}";
  }
  return s.str();
}

template <class T>
Index batch_of(const Variable<T>& x) {
  return x.is_field() ? x.value().batch() : x.shape()[0];
}
template <class T>
Index channels_of(const Variable<T>& x) {
  return x.is_field() ? x.value().channels() : x.shape()[2];
}

/// A token field sharded over comm: one part per rank, at least one token per rank.
template <class T>
void check_sharded(const char* where, const Communicator& comm, const Variable<T>& x) {
  SHARDTENSOR_REQUIRE(x.is_field(), where,
                      "'" << x.name() << "' must be a sharded field, got a replicated tensor");
  const ShardTensor<T>& f = x.value();
  const Decomposition& d = f.decomposition();
  SHARDTENSOR_REQUIRE(d.global_cells() >= comm.size(), where,
                      "fewer tokens (" << d.global_cells() << ") than ranks (" << comm.size()
                                       << ") in '" << x.name() << "'");
  SHARDTENSOR_REQUIRE(d.nranks() == comm.size() && f.rank() == comm.rank(), where,
                      "decomposition of '" << x.name() << "' has " << d.nranks()
                                           << " parts (shard of rank " << f.rank()
                                           << "), does not match rank " << comm.rank() << " of "
                                           << comm.size());
}

/// A replicated {batch, tokens, channels} tensor.
template <class T>
void check_replicated(const char* where, const Variable<T>& x) {
  SHARDTENSOR_REQUIRE(!x.is_field(), where,
                      "'" << x.name() << "' must be a replicated {batch, tokens, channels} "
                          << "tensor, got a sharded field");
  const auto& s = x.shape();
  SHARDTENSOR_REQUIRE(
      s.size() == 3 && s[0] >= 1 && s[1] >= 1 && s[2] >= 1 &&
          Index(x.data().extent(0)) == s[0] * s[1] * s[2],
      where,
      describe(x) << " (" << x.data().extent(0) << " values), expected {batch, tokens, channels}");
}

/// Batch and channels agree, channels divisible by heads; Heads of the op.
template <class T>
Heads check_heads(const char* where, const Variable<T>& q, const Variable<T>& k,
                  const Variable<T>& v, int heads) {
  for (const Variable<T>* other : {&k, &v})
    SHARDTENSOR_REQUIRE(
        batch_of(*other) == batch_of(q) && channels_of(*other) == channels_of(q), where,
        "q, k and v differ in batch or channels: " << describe(q) << "; " << describe(*other));
  SHARDTENSOR_REQUIRE(heads >= 1, where, "heads must be positive, got " << heads);
  SHARDTENSOR_REQUIRE(channels_of(q) % heads == 0, where,
                      "channels " << channels_of(q) << " not divisible by heads " << heads);
  return Heads{batch_of(q), heads, channels_of(q) / heads};
}

template <class T>
void check_defined(const char* where, const Variable<T>& q, const Variable<T>& k,
                   const Variable<T>& v) {
  SHARDTENSOR_REQUIRE(q.defined() && k.defined() && v.defined(), where,
                      "q, k and v must be defined Variables");
}

// ---------------------------------------------------------------------------------------
// The ring

/// Token counts and positions every rank knows without communication; ring neighbours.
struct Ring {
  int rank = 0, size = 1;
  std::vector<Index> tokens, first;  // per rank: token count, global position (1-D fields)
  Index max_tokens = 0;
  int next() const { return (rank + 1) % size; }
  int prev() const { return (rank + size - 1) % size; }
  /// Owner of the block held at ring step s: blocks move to rank + 1 each step.
  int source(int step) const { return ((rank - step) % size + size) % size; }
};

Ring ring_of(const Communicator& comm, const Decomposition& d) {
  Ring ring;
  ring.rank = comm.rank();
  ring.size = comm.size();
  for (int r = 0; r < ring.size; ++r) {
    const Box b = d.box(r);
    ring.tokens.push_back(b.extent[0] * b.extent[1] * b.extent[2]);
    ring.first.push_back(b.lower[0]);
    ring.max_tokens = std::max(ring.max_tokens, ring.tokens.back());
  }
  return ring;
}

/// The K/V blocks around the ring: step s computes on the block of rank source(s) while the
/// next one arrives. Two buffers alternate, the own block's (overwritten from step 1 on) and
/// one more: a buffer is received into only after its block was sent on.
template <class T>
class BlockRing {
 public:
  BlockRing(const Communicator& comm, const Ring& ring, const Heads& a, Buffer<T> own)
      : comm_(comm), ring_(ring), a_(a) {
    const Index capacity = 2 * a.block(ring.max_tokens);
    impl::mpi_count(static_cast<std::size_t>(capacity), "ring_attention");
    buffers_[0] = own;
    if (ring.size == 1) return;
    if (Index(own.extent(0)) < capacity) {  // a rank with fewer tokens than the largest
      buffers_[0] = scratch<T>("attention.kv_ring", capacity, MemoryCategory::comm_buffers);
      std::copy(own.data(), own.data() + own.extent(0), buffers_[0].data());
    }
    buffers_[1] = scratch<T>("attention.kv_ring", capacity, MemoryCategory::comm_buffers);
  }
  /// The block of ring step `step` (owned by ring.source(step)); starts the next transfer.
  const T* start(int step) {
    T* current = buffers_[step % 2].data();
    if (step + 1 < ring_.size) {
      in_ = post_receive(comm_, buffers_[(step + 1) % 2].data(),
                         2 * a_.block(ring_.tokens[ring_.source(step + 1)]), ring_.prev(),
                         kv_tag(comm_));
      out_ = post_send(comm_, current, 2 * a_.block(ring_.tokens[ring_.source(step)]), ring_.next(),
                       kv_tag(comm_));
    }
    return current;
  }
  void progress() {
    in_.test();
    out_.test();
  }
  /// Waits for the step's transfers.
  void finish() {
    in_.wait();
    out_.wait();
  }

 private:
  Communicator comm_;
  const Ring& ring_;
  Heads a_;
  Buffer<T> buffers_[2];
  PendingMessage in_, out_;
};

/// Forward of ring attention on packed q and the own K/V block (used up as a ring buffer):
/// the softmax state of the queries.
template <class T>
OnlineSoftmax<T> ring_forward(const Communicator& comm, const Ring& ring, const Heads& a,
                              const Buffer<T>& q, Buffer<T> kv, bool causal, T scale) {
  const Index L = ring.tokens[ring.rank];
  OnlineSoftmax<T> state(a.slices() * L, a.head_dim);
  Buffer<T> scores = scratch<T>("attention.scores", tile_queries * tile_keys);
  BlockRing<T> blocks(comm, ring, a, kv);
  const Progress progress = [&] { blocks.progress(); };
  for (int step = 0; step < ring.size; ++step) {
    const int src = ring.source(step);
    const T* block = blocks.start(step);
    const Visibility visible{causal, ring.first[ring.rank], ring.first[src]};
    fold_block(a, q.data(), L, block, ring.tokens[src], visible, scale, state, scores.data(),
               progress);
    blocks.finish();
  }
  finish(state);
  return state;
}

/// Backward of ring attention: K/V ring again; each block's dK/dV accumulator travels with it
/// (after P shifts it is home). A step computes into a fresh buffer while the accumulator
/// of the same block arrives from the previous rank, adds it, and sends the sum on without
/// waiting: both transfers overlap compute. Three accumulator buffers (two computed on in
/// turn, one receiving), because the next receive must be posted before waiting for any send:
/// with two, every rank would wait for a send that needs its neighbour's receive (a ring of
/// rendezvous sends deadlocks). Returns dK then dV of the own block; adds into dq.
template <class T>
Buffer<T> ring_backward(const Communicator& comm, const Ring& ring, const Heads& a,
                        const QueryGradients<T>& g, T* dq, Buffer<T> kv, bool need_dkv, bool causal,
                        T scale) {
  const Index block_max = 2 * a.block(ring.max_tokens);
  Buffer<T> scores = scratch<T>("attention.scores", tile_queries * tile_keys);
  Buffer<T> dscores = scratch<T>("attention.dscores", tile_queries * tile_keys);
  Buffer<T> grads[2], incoming;  // computed on (alternating), received accumulators
  const int buffers = !need_dkv ? 0 : ring.size == 1 ? 1 : 2;
  const MemoryCategory travelling =
      ring.size > 1 ? MemoryCategory::comm_buffers : MemoryCategory::workspaces;
  for (int i = 0; i < buffers; ++i) grads[i] = scratch<T>("attention.dkv", block_max, travelling);
  if (need_dkv && ring.size > 1)
    incoming = scratch<T>("attention.dkv_ring", block_max, MemoryCategory::comm_buffers);
  PendingMessage grad_in, grad_out[2];
  BlockRing<T> blocks(comm, ring, a, kv);
  const Progress progress = [&] {
    blocks.progress();
    grad_in.test();
    grad_out[0].test();
    grad_out[1].test();
  };
  for (int step = 0; step < ring.size; ++step) {
    const int src = ring.source(step);
    const Index count = 2 * a.block(ring.tokens[src]);
    const T* block = blocks.start(step);
    T* mine = need_dkv ? grads[step % 2].data() : nullptr;
    if (mine) {
      grad_out[step % 2].wait();  // sent two steps ago
      std::fill(mine, mine + count, T(0));
    }
    const Visibility visible{causal, ring.first[ring.rank], ring.first[src]};
    backward_block(a, g, dq, block, mine, ring.tokens[src], visible, scale, scores.data(),
                   dscores.data(), progress);
    if (mine && ring.size > 1) {
      if (step > 0) {  // what the ranks before added to this block
        grad_in.wait();
        for (Index i = 0; i < count; ++i) mine[i] += incoming(i);
      }
      grad_in = post_receive(comm, incoming.data(), 2 * a.block(ring.tokens[ring.source(step + 1)]),
                             ring.prev(), grad_tag(comm));
      grad_out[step % 2] = post_send(comm, mine, count, ring.next(), grad_tag(comm));
    }
    blocks.finish();
  }
  if (!need_dkv) return {};
  if (ring.size == 1) return grads[0];
  grad_in.wait();  // the own block's total, back from the last rank it visited
  grad_out[0].wait();
  grad_out[1].wait();
  return incoming;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The ops

template <class T>
Variable<T> ring_attention(const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                           const Variable<T>& v, int heads, bool causal) {
  constexpr const char* where = "ring_attention";
  check_defined(where, q, k, v);
  for (const Variable<T>* x : {&q, &k, &v}) check_sharded(where, comm, *x);
  const ShardTensor<T>& qf = q.value();
  const Decomposition& dec = qf.decomposition();
  for (const Variable<T>* other : {&k, &v}) {
    const ShardTensor<T>& f = other->value();
    SHARDTENSOR_REQUIRE(
        f.decomposition() == dec && f.batch() == qf.batch() && f.channels() == qf.channels(), where,
        "q, k and v layouts differ: " << describe(q) << " (" << dec.describe() << "); "
                                      << describe(*other) << " (" << f.decomposition().describe()
                                      << ")");
  }
  const Heads a = check_heads(where, q, k, v, heads);
  SHARDTENSOR_REQUIRE(!causal || dec.ndims() == 1, where,
                      "causal attention needs a 1-D token field, got " << dec.describe());

  const Ring ring = ring_of(comm, dec);
  const T scale = T(1) / std::sqrt(T(a.head_dim));
  OnlineSoftmax<T> state = ring_forward(comm, ring, a, packed_copy(qf, a),
                                        packed_kv(k.value(), v.value(), a), causal, scale);

  auto node = make_result_node<T>(where, {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>::uninitialized(dec, qf.rank(), qf.batch(), qf.channels(), {}, where);
  unpack(state.out(), node->field, a, /*add=*/false);
  if (!node->requires_grad) return Variable<T>(node);

  // Saved: the log-sum-exp per query row. Q, K, V and O are packed again from the nodes.
  const Buffer<T> lse = state.max;
  node->backward = [comm, a, ring, causal, scale, lse](impl::Node<T>& self) {
    const Index L = ring.tokens[ring.rank], E = a.block(L);
    const auto& inputs = self.inputs;
    const QueryGradients<T> g =
        query_gradients(packed_copy(inputs[0]->field, a), packed_copy(self.grad_field(), a),
                        packed_copy(self.field, a), lse, L, a.head_dim);
    const Buffer<T> kv = packed_kv(inputs[1]->field, inputs[2]->field, a);
    const Buffer<T> dq = gradient_buffer<T>(inputs[0]->requires_grad, E);
    const bool need_dkv = inputs[1]->requires_grad || inputs[2]->requires_grad;
    const Buffer<T> dkv =
        ring_backward(comm, ring, a, g, data_or_null(dq), kv, need_dkv, causal, scale);
    if (inputs[0]->requires_grad) unpack(dq.data(), inputs[0]->grad_field(), a, true);
    if (inputs[1]->requires_grad) unpack(dkv.data(), inputs[1]->grad_field(), a, true);
    if (inputs[2]->requires_grad) unpack(dkv.data() + E, inputs[2]->grad_field(), a, true);
  };
  return Variable<T>(node);
}

template <class T>
Variable<T> attention_replicated_queries(const Communicator& comm, const Variable<T>& q,
                                         const Variable<T>& k, const Variable<T>& v, int heads) {
  constexpr const char* where = "attention_replicated_queries";
  check_defined(where, q, k, v);
  check_replicated(where, q);
  check_sharded(where, comm, k);
  check_sharded(where, comm, v);
  SHARDTENSOR_REQUIRE(k.value().decomposition() == v.value().decomposition(), where,
                      "k and v layouts differ: "
                          << describe(k) << " (" << k.value().decomposition().describe() << "); "
                          << describe(v) << " (" << v.value().decomposition().describe() << ")");
  const Heads a = check_heads(where, q, k, v, heads);
  const T scale = T(1) / std::sqrt(T(a.head_dim));
  const Index queries = q.shape()[1], keys = tokens_of(k.value());

  // Each rank folds its own keys, then the partial softmaxes combine: rescale to the global
  // max of each row, add sums and outputs (log-sum-exp combine).
  OnlineSoftmax<T> state(a.slices() * queries, a.head_dim);
  {
    const Buffer<T> qp = packed_copy(q.data(), a, queries);
    const Buffer<T> kv = packed_kv(k.value(), v.value(), a);
    Buffer<T> scores = scratch<T>("attention.scores", tile_queries * tile_keys);
    fold_block(a, qp.data(), queries, kv.data(), keys, Visibility{}, scale, state, scores.data(),
               no_progress);
  }
  Buffer<T> global_max =  // becomes the saved log-sum-exp
      scratch<T>("attention.lse", state.rows, current_memory_category());
  Kokkos::deep_copy(global_max, state.max);
  allreduce(comm, global_max, ReduceOp::max);
  for (Index row = 0; row < state.rows; ++row) {
    const T correction = std::exp(state.max(row) - global_max(row));
    state.sum()[row] *= correction;
    for (Index d = 0; d < a.head_dim; ++d) state.out()[row * a.head_dim + d] *= correction;
  }
  state.max = global_max;
  allreduce(comm, state.totals, ReduceOp::sum);
  finish(state);

  auto node = make_result_node<T>(where, {q.node(), k.node(), v.node()});
  node->is_field = false;
  node->shape = {a.batch, queries, a.channels()};
  node->data = ReplicatedView<T>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(where)), a.block(queries));
  unpack(state.out(), node->data, a, queries, /*add=*/false);
  if (!node->requires_grad) return Variable<T>(node);

  const Buffer<T> lse = state.max;
  node->backward = [comm, a, queries, keys, scale, lse](impl::Node<T>& self) {
    const auto& inputs = self.inputs;
    const QueryGradients<T> g = query_gradients(
        packed_copy(inputs[0]->data, a, queries), packed_copy(self.grad_data(), a, queries),
        packed_copy(self.data, a, queries), lse, queries, a.head_dim);
    const Buffer<T> kv = packed_kv(inputs[1]->field, inputs[2]->field, a);
    const Buffer<T> dq = gradient_buffer<T>(inputs[0]->requires_grad, a.block(queries));
    const Buffer<T> dkv =
        gradient_buffer<T>(inputs[1]->requires_grad || inputs[2]->requires_grad, 2 * a.block(keys));
    Buffer<T> scores = scratch<T>("attention.scores", tile_queries * tile_keys);
    Buffer<T> dscores = scratch<T>("attention.dscores", tile_queries * tile_keys);
    backward_block(a, g, data_or_null(dq), kv.data(), data_or_null(dkv), keys, Visibility{}, scale,
                   scores.data(), dscores.data(), no_progress);
    // dQ sums over the keys of every rank: this rank's share, added over comm by backward().
    if (inputs[0]->requires_grad)
      unpack(dq.data(), inputs[0]->grad_partial(comm), a, queries, true);
    if (inputs[1]->requires_grad) unpack(dkv.data(), inputs[1]->grad_field(), a, true);
    if (inputs[2]->requires_grad)
      unpack(dkv.data() + a.block(keys), inputs[2]->grad_field(), a, true);
  };
  return Variable<T>(node);
}

template <class T>
Variable<T> attention_replicated_keys(const Communicator& comm, const Variable<T>& q,
                                      const Variable<T>& k, const Variable<T>& v, int heads) {
  constexpr const char* where = "attention_replicated_keys";
  check_defined(where, q, k, v);
  check_sharded(where, comm, q);
  check_replicated(where, k);
  check_replicated(where, v);
  SHARDTENSOR_REQUIRE(k.shape() == v.shape(), where,
                      "k and v shapes differ: " << describe(k) << "; " << describe(v));
  const Heads a = check_heads(where, q, k, v, heads);
  const T scale = T(1) / std::sqrt(T(a.head_dim));
  const ShardTensor<T>& qf = q.value();
  const Index queries = tokens_of(qf), keys = k.shape()[1];

  OnlineSoftmax<T> state(a.slices() * queries, a.head_dim);
  {
    const Buffer<T> qp = packed_copy(qf, a);
    const Buffer<T> kv = packed_kv(k.data(), v.data(), a, keys);
    Buffer<T> scores = scratch<T>("attention.scores", tile_queries * tile_keys);
    fold_block(a, qp.data(), queries, kv.data(), keys, Visibility{}, scale, state, scores.data(),
               no_progress);
  }
  finish(state);

  auto node = make_result_node<T>(where, {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>::uninitialized(qf.decomposition(), qf.rank(), qf.batch(),
                                              qf.channels(), {}, where);
  unpack(state.out(), node->field, a, /*add=*/false);
  if (!node->requires_grad) return Variable<T>(node);

  const Buffer<T> lse = state.max;
  node->backward = [comm, a, queries, keys, scale, lse](impl::Node<T>& self) {
    const auto& inputs = self.inputs;
    const QueryGradients<T> g =
        query_gradients(packed_copy(inputs[0]->field, a), packed_copy(self.grad_field(), a),
                        packed_copy(self.field, a), lse, queries, a.head_dim);
    const Buffer<T> kv = packed_kv(inputs[1]->data, inputs[2]->data, a, keys);
    const Buffer<T> dq = gradient_buffer<T>(inputs[0]->requires_grad, a.block(queries));
    const Buffer<T> dkv =
        gradient_buffer<T>(inputs[1]->requires_grad || inputs[2]->requires_grad, 2 * a.block(keys));
    Buffer<T> scores = scratch<T>("attention.scores", tile_queries * tile_keys);
    Buffer<T> dscores = scratch<T>("attention.dscores", tile_queries * tile_keys);
    backward_block(a, g, data_or_null(dq), kv.data(), data_or_null(dkv), keys, Visibility{}, scale,
                   scores.data(), dscores.data(), no_progress);
    if (inputs[0]->requires_grad) unpack(dq.data(), inputs[0]->grad_field(), a, true);
    // dK, dV sum over the queries of every rank: this rank's share, added over comm.
    if (inputs[1]->requires_grad) unpack(dkv.data(), inputs[1]->grad_partial(comm), a, keys, true);
    if (inputs[2]->requires_grad)
      unpack(dkv.data() + a.block(keys), inputs[2]->grad_partial(comm), a, keys, true);
  };
  return Variable<T>(node);
}

#define SHARDTENSOR_INSTANTIATE(T)                                                                 \
  template Variable<T> ring_attention(const Communicator&, const Variable<T>&, const Variable<T>&, \
                                      const Variable<T>&, int, bool);                              \
  template Variable<T> attention_replicated_queries(const Communicator&, const Variable<T>&,       \
                                                    const Variable<T>&, const Variable<T>&, int);  \
  template Variable<T> attention_replicated_keys(const Communicator&, const Variable<T>&,          \
                                                 const Variable<T>&, const Variable<T>&, int);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor
