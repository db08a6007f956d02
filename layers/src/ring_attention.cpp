// Attention over sharded tokens: ring attention and the replicated-queries / replicated-keys
// variants (see ring_attention.hpp and docs/attention.md).
//
// The compute is kernels/flash_attention.hpp's, on packed blocks in the default memory space;
// this file checks the arguments, moves the K/V blocks (and their dK/dV) around the ring of
// ranks through comm/point_to_point.hpp, and records the autograd nodes. The messages read
// and write the blocks in place: host memory on the host backends (a device backend needs
// GPU-aware MPI or a host staging buffer here; see docs/architecture.md).

#include "shardtensor/layers/ring_attention.hpp"

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
#include "shardtensor/kernels/bfloat16_rounding.hpp"
#include "shardtensor/kernels/flash_attention.hpp"

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

using kernels::attention_buffer;
using kernels::AttentionBuffer;
using kernels::Heads;
using kernels::OnlineSoftmax;
using kernels::Progress;
using kernels::QueryGradients;
using kernels::Visibility;

template <class T>
Index tokens_of(const ShardTensor<T>& f) {
  return f.local_extent(0) * f.local_extent(1) * f.local_extent(2);
}

/// A token set, packed (a copy).
template <class T>
AttentionBuffer<T> packed_copy(const ShardTensor<T>& f, const Heads& a) {
  AttentionBuffer<T> out = attention_buffer<T>("attention.packed", a.block(tokens_of(f)));
  kernels::pack_tokens(ExecutionSpace(), f.view(), f.interior_box(), a, out.data());
  return out;
}
template <class T>
AttentionBuffer<T> packed_copy(const ReplicatedView<T>& r, const Heads& a, Index tokens) {
  AttentionBuffer<T> out = attention_buffer<T>("attention.packed", a.block(tokens));
  kernels::pack_tokens(ExecutionSpace(), r, tokens, a, out.data());
  return out;
}

/// K then V, packed: the block that travels around the ring.
template <class T>
AttentionBuffer<T> packed_kv(const ShardTensor<T>& k, const ShardTensor<T>& v, const Heads& a) {
  const Index E = a.block(tokens_of(k));
  AttentionBuffer<T> kv = attention_buffer<T>("attention.kv", 2 * E);
  kernels::pack_tokens(ExecutionSpace(), k.view(), k.interior_box(), a, kv.data());
  kernels::pack_tokens(ExecutionSpace(), v.view(), v.interior_box(), a, kv.data() + E);
  return kv;
}
template <class T>
AttentionBuffer<T> packed_kv(const ReplicatedView<T>& k, const ReplicatedView<T>& v, const Heads& a,
                             Index tokens) {
  const Index E = a.block(tokens);
  AttentionBuffer<T> kv = attention_buffer<T>("attention.kv", 2 * E);
  kernels::pack_tokens(ExecutionSpace(), k, tokens, a, kv.data());
  kernels::pack_tokens(ExecutionSpace(), v, tokens, a, kv.data() + E);
  return kv;
}

/// Writes (or, with `add`, adds) a packed block into the owned cells of a field.
template <class T>
void unpack(const T* packed, const ShardTensor<T>& f, const Heads& a, bool add) {
  kernels::unpack_tokens(ExecutionSpace(), packed, f.view(), f.interior_box(), a, add);
}
template <class T>
void unpack(const T* packed, const ReplicatedView<T>& r, const Heads& a, Index tokens, bool add) {
  kernels::unpack_tokens(ExecutionSpace(), packed, r, tokens, a, add);
}

/// `b` rounded to bfloat16 in place where `bf16` (a bf16 op's operands: Q, K, V, the output
/// and its gradient), and returned.
template <class T>
AttentionBuffer<T> rounded_if(bool bf16, AttentionBuffer<T> b) {
  if (bf16) kernels::round_to_bfloat16(ExecutionSpace(), b.data(), b.data(), b.extent(0));
  return b;
}

/// Zero-filled buffer of a block's gradient, or an empty one when not needed.
template <class T>
AttentionBuffer<T> gradient_buffer(bool needed, Index size) {
  return needed ? attention_buffer<T>("attention.grad", size, MemoryCategory::workspaces,
                                      /*zero=*/true)
                : AttentionBuffer<T>();
}

template <class T>
T* data_or_null(const AttentionBuffer<T>& b) {
  return b.extent(0) ? b.data() : nullptr;
}

/// Zeroes n values at data (default memory space).
template <class T>
void zero(T* data, Index n) {
  Kokkos::deep_copy(Kokkos::View<T*, DefaultMemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                        data, static_cast<std::size_t>(n)),
                    T(0));
}

const Progress no_progress = [] {};

/// Folds one whole K/V block (no ring: the replicated ops) into `state`, with its own score
/// tiles.
template <class T>
void fold_whole_block(const Heads& a, const T* q, Index queries, const T* kv, Index keys, T scale,
                      OnlineSoftmax<T>& state) {
  AttentionBuffer<T> scores =
      attention_buffer<T>("attention.scores", kernels::score_buffer_size(a, queries, keys));
  kernels::fold_block(ExecutionSpace(), a, q, queries, kv, keys, Visibility{}, scale, state,
                      scores.data(), no_progress);
}

/// Backward of one whole K/V block against the queries of g (no ring), with its own score
/// tiles; dq or dkv may be null.
template <class T>
void backward_whole_block(const Heads& a, const QueryGradients<T>& g, T* dq, const T* kv, T* dkv,
                          Index keys, T scale) {
  const Index values = kernels::score_buffer_size(a, g.queries, keys);
  AttentionBuffer<T> scores = attention_buffer<T>("attention.scores", values);
  AttentionBuffer<T> dscores = attention_buffer<T>("attention.dscores", values);
  kernels::backward_block(ExecutionSpace(), a, g, dq, kv, dkv, keys, Visibility{}, scale,
                          scores.data(), dscores.data(), no_progress);
}

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
/// one more: a buffer is received into only after its block was sent on. With `bfloat16`
/// (the blocks hold bfloat16 values: a bf16 op's), the blocks travel as their 16-bit bits,
/// two such buffers alternating, and each is widened into the own block's buffer to be
/// computed on: half the bytes, the same values, the same memory.
template <class T>
class BlockRing {
 public:
  BlockRing(const Communicator& comm, const Ring& ring, const Heads& a, AttentionBuffer<T> own,
            bool bfloat16)
      : comm_(comm), ring_(ring), a_(a), bfloat16_(bfloat16 && ring.size > 1) {
    const Index capacity = 2 * a.block(ring.max_tokens);
    impl::mpi_count(static_cast<std::size_t>(capacity), "ring_attention");
    buffers_[0] = own;
    if (ring.size == 1) return;
    if (Index(own.extent(0)) < capacity) {  // a rank with fewer tokens than the largest
      buffers_[0] =
          attention_buffer<T>("attention.kv_ring", capacity, MemoryCategory::comm_buffers);
      Kokkos::deep_copy(
          Kokkos::subview(buffers_[0], std::make_pair(Index(0), Index(own.extent(0)))), own);
    }
    if (!bfloat16_) {
      buffers_[1] =
          attention_buffer<T>("attention.kv_ring", capacity, MemoryCategory::comm_buffers);
      return;
    }
    if constexpr (std::is_same<T, float>::value) {
      const MemoryCategoryScope memory(MemoryCategory::comm_buffers);
      for (auto& bits : bits_)
        bits = Kokkos::View<std::uint16_t*, DefaultMemorySpace>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, "attention.kv_ring_bf16"), capacity);
      kernels::store_bfloat16_bits(ExecutionSpace(), own.data(), bits_[0].data(), own.extent(0));
    }
  }
  /// The block of ring step `step` (owned by ring.source(step)); starts the next transfer.
  const T* start(int step) {
    const Index count = 2 * a_.block(ring_.tokens[ring_.source(step)]);
    const bool more = step + 1 < ring_.size;
    const Index next_count = more ? 2 * a_.block(ring_.tokens[ring_.source(step + 1)]) : 0;
    if (bfloat16_) {
      const std::uint16_t* bits = bits_[step % 2].data();
      if (step > 0) kernels::unpack_bfloat16(ExecutionSpace(), bits, buffers_[0].data(), count);
      if (more)
        transfer_ =
            post_exchange(comm_, bits, count, ring_.next(), bits_[(step + 1) % 2].data(),
                          next_count, ring_.prev(), kv_tag(comm_), impl::WireType::bfloat16);
      return buffers_[0].data();
    }
    T* current = buffers_[step % 2].data();
    if (more)
      transfer_ =
          post_exchange(comm_, static_cast<const T*>(current), count, ring_.next(),
                        buffers_[(step + 1) % 2].data(), next_count, ring_.prev(), kv_tag(comm_));
    return current;
  }
  void progress() { transfer_.test(); }
  /// Waits for the step's transfers.
  void finish() { transfer_.wait(); }

 private:
  Communicator comm_;
  const Ring& ring_;
  Heads a_;
  bool bfloat16_;
  AttentionBuffer<T> buffers_[2];
  Kokkos::View<std::uint16_t*, DefaultMemorySpace> bits_[2];  // the bfloat16 wire's
  PendingExchange transfer_;  // last: waited for before the buffers go
};

/// Forward of ring attention on packed q and the own K/V block (used up as a ring buffer):
/// the softmax state of the queries.
template <class T>
OnlineSoftmax<T> ring_forward(const Communicator& comm, const Ring& ring, const Heads& a,
                              const AttentionBuffer<T>& q, AttentionBuffer<T> kv, bool causal,
                              T scale, bool tf32, bool bf16, bool bfloat16_wire) {
  const Index L = ring.tokens[ring.rank];
  OnlineSoftmax<T> state(ExecutionSpace(), a.slices() * L, a.head_dim);
  AttentionBuffer<T> scores =
      attention_buffer<T>("attention.scores", kernels::score_buffer_size(a, L, ring.max_tokens));
  BlockRing<T> blocks(comm, ring, a, kv, bfloat16_wire);
  const Progress progress = [&] { blocks.progress(); };
  for (int step = 0; step < ring.size; ++step) {
    const int src = ring.source(step);
    const T* block = blocks.start(step);
    const Visibility visible{causal, ring.first[ring.rank], ring.first[src]};
    kernels::fold_block(ExecutionSpace(), a, q.data(), L, block, ring.tokens[src], visible, scale,
                        state, scores.data(), progress, tf32, bf16);
    blocks.finish();
  }
  kernels::finish(ExecutionSpace(), state);
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
AttentionBuffer<T> ring_backward(const Communicator& comm, const Ring& ring, const Heads& a,
                                 const QueryGradients<T>& g, T* dq, AttentionBuffer<T> kv,
                                 bool need_dkv, bool causal, T scale, bool tf32, bool bf16,
                                 bool bfloat16_wire) {
  const Index block_max = 2 * a.block(ring.max_tokens);
  const Index values = kernels::score_buffer_size(a, g.queries, ring.max_tokens);
  AttentionBuffer<T> scores = attention_buffer<T>("attention.scores", values);
  AttentionBuffer<T> dscores = attention_buffer<T>("attention.dscores", values);
  AttentionBuffer<T> grads[2], incoming;  // computed on (alternating), received accumulators
  const int buffers = !need_dkv ? 0 : ring.size == 1 ? 1 : 2;
  const MemoryCategory travelling =
      ring.size > 1 ? MemoryCategory::comm_buffers : MemoryCategory::workspaces;
  for (int i = 0; i < buffers; ++i)
    grads[i] = attention_buffer<T>("attention.dkv", block_max, travelling);
  if (need_dkv && ring.size > 1)
    incoming = attention_buffer<T>("attention.dkv_ring", block_max, MemoryCategory::comm_buffers);
  // Step s sends this step's dK/dV (grads[s % 2]) on and receives the previous rank's into
  // `incoming`; it is waited for at step s + 1, before `incoming` is added and reposted.
  PendingExchange grad_ring[2];
  BlockRing<T> blocks(comm, ring, a, kv, bfloat16_wire);
  const Progress progress = [&] {
    blocks.progress();
    grad_ring[0].test();
    grad_ring[1].test();
  };
  for (int step = 0; step < ring.size; ++step) {
    const int src = ring.source(step);
    const Index count = 2 * a.block(ring.tokens[src]);
    const T* block = blocks.start(step);
    T* mine = need_dkv ? grads[step % 2].data() : nullptr;
    if (mine) {
      grad_ring[step % 2].wait();  // sent two steps ago
      zero(mine, count);
    }
    const Visibility visible{causal, ring.first[ring.rank], ring.first[src]};
    kernels::backward_block(ExecutionSpace(), a, g, dq, block, mine, ring.tokens[src], visible,
                            scale, scores.data(), dscores.data(), progress, tf32, bf16);
    if (mine && ring.size > 1) {
      if (step > 0) {  // what the ranks before added to this block
        grad_ring[(step + 1) % 2].wait();
        kernels::add_into(ExecutionSpace(), mine, incoming.data(), count);
      }
      grad_ring[step % 2] = post_exchange(
          comm, static_cast<const T*>(mine), count, ring.next(), incoming.data(),
          2 * a.block(ring.tokens[ring.source(step + 1)]), ring.prev(), grad_tag(comm));
    }
    blocks.finish();
  }
  if (!need_dkv) return {};
  if (ring.size == 1) return grads[0];
  // The own block's total, back from the last rank it visited.
  grad_ring[0].wait();
  grad_ring[1].wait();
  return incoming;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The ops

template <class T>
Variable<T> ring_attention(const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                           const Variable<T>& v, int heads, bool causal, bool tf32, bool bf16) {
  constexpr const char* where = "ring_attention";
  check_defined(where, q, k, v);
  SHARDTENSOR_REQUIRE(!bf16 || (std::is_same<T, float>::value), where,
                      "bf16 operands need a float model, this one is double");
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
  // bf16: Q, K and V rounded, their K/V blocks on the bfloat16 wire unless the options say
  // float (the same values either way); scores, softmax and sums in float; output rounded.
  // Widening a block is one pass beside its attention products: it pays.
  const bool bfloat16_wire = bf16 && bfloat16_on_the_wire(comm.options().bf16_wire, true);
  OnlineSoftmax<T> state = ring_forward(comm, ring, a, rounded_if(bf16, packed_copy(qf, a)),
                                        rounded_if(bf16, packed_kv(k.value(), v.value(), a)),
                                        causal, scale, tf32, bf16, bfloat16_wire);

  auto node = make_result_node<T>(where, {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>::uninitialized(dec, qf.rank(), qf.batch(), qf.channels(), {}, where);
  if (bf16)
    kernels::round_to_bfloat16(ExecutionSpace(), state.out(), state.out(),
                               std::size_t(a.block(ring.tokens[ring.rank])));
  unpack(state.out(), node->field, a, /*add=*/false);
  if (!node->requires_grad) return Variable<T>(node);

  // Saved: the log-sum-exp per query row, and the values of Q, K, V and the output (the graph
  // keeps no values; backward packs them again).
  const AttentionBuffer<T> lse = state.max;
  const ShardTensor<T> output = node->field, qv = qf, kv_k = k.value(), kv_v = v.value();
  node->backward = [comm, a, ring, causal, tf32, bf16, bfloat16_wire, scale, lse, output, qv, kv_k,
                    kv_v](impl::Node<T>& self) {
    const Index L = ring.tokens[ring.rank], E = a.block(L);
    const auto& inputs = self.inputs;
    // bf16: the output gradient is an operand too (of dV = P^T dO and dP = dO V^T).
    const QueryGradients<T> g =
        kernels::query_gradients(ExecutionSpace(), rounded_if(bf16, packed_copy(qv, a)),
                                 rounded_if(bf16, packed_copy(self.grad_field(), a)),
                                 packed_copy(output, a), lse, L, a.head_dim);
    const AttentionBuffer<T> kv = rounded_if(bf16, packed_kv(kv_k, kv_v, a));
    const AttentionBuffer<T> dq = gradient_buffer<T>(inputs[0]->requires_grad, E);
    const bool need_dkv = inputs[1]->requires_grad || inputs[2]->requires_grad;
    const AttentionBuffer<T> dkv = ring_backward(comm, ring, a, g, data_or_null(dq), kv, need_dkv,
                                                 causal, scale, tf32, bf16, bfloat16_wire);
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
  OnlineSoftmax<T> state(ExecutionSpace(), a.slices() * queries, a.head_dim);
  {
    const AttentionBuffer<T> qp = packed_copy(q.data(), a, queries);
    const AttentionBuffer<T> kv = packed_kv(k.value(), v.value(), a);
    fold_whole_block(a, qp.data(), queries, kv.data(), keys, scale, state);
  }
  AttentionBuffer<T> global_max =  // becomes the saved log-sum-exp
      attention_buffer<T>("attention.lse", state.rows, current_memory_category());
  Kokkos::deep_copy(global_max, state.max);
  allreduce(comm, global_max, ReduceOp::max);
  kernels::rescale_to(ExecutionSpace(), state, global_max);
  allreduce(comm, state.totals, ReduceOp::sum);
  kernels::finish(ExecutionSpace(), state);

  auto node = make_result_node<T>(where, {q.node(), k.node(), v.node()});
  node->is_field = false;
  node->shape = {a.batch, queries, a.channels()};
  node->data = ReplicatedView<T>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(where)), a.block(queries));
  unpack(state.out(), node->data, a, queries, /*add=*/false);
  if (!node->requires_grad) return Variable<T>(node);

  const AttentionBuffer<T> lse = state.max;
  const ShardTensor<T> kv_k = k.value(), kv_v = v.value();  // the graph keeps no field values
  node->backward = [comm, a, queries, keys, scale, lse, kv_k, kv_v](impl::Node<T>& self) {
    const auto& inputs = self.inputs;
    const QueryGradients<T> g =
        kernels::query_gradients(ExecutionSpace(), packed_copy(inputs[0]->data, a, queries),
                                 packed_copy(self.grad_data(), a, queries),
                                 packed_copy(self.data, a, queries), lse, queries, a.head_dim);
    const AttentionBuffer<T> kv = packed_kv(kv_k, kv_v, a);
    const AttentionBuffer<T> dq = gradient_buffer<T>(inputs[0]->requires_grad, a.block(queries));
    const AttentionBuffer<T> dkv =
        gradient_buffer<T>(inputs[1]->requires_grad || inputs[2]->requires_grad, 2 * a.block(keys));
    backward_whole_block(a, g, data_or_null(dq), kv.data(), data_or_null(dkv), keys, scale);
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

  OnlineSoftmax<T> state(ExecutionSpace(), a.slices() * queries, a.head_dim);
  {
    const AttentionBuffer<T> qp = packed_copy(qf, a);
    const AttentionBuffer<T> kv = packed_kv(k.data(), v.data(), a, keys);
    fold_whole_block(a, qp.data(), queries, kv.data(), keys, scale, state);
  }
  kernels::finish(ExecutionSpace(), state);

  auto node = make_result_node<T>(where, {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>::uninitialized(qf.decomposition(), qf.rank(), qf.batch(),
                                              qf.channels(), {}, where);
  unpack(state.out(), node->field, a, /*add=*/false);
  if (!node->requires_grad) return Variable<T>(node);

  const AttentionBuffer<T> lse = state.max;
  const ShardTensor<T> output = node->field, qv = qf;  // the graph keeps no field values
  node->backward = [comm, a, queries, keys, scale, lse, output, qv](impl::Node<T>& self) {
    const auto& inputs = self.inputs;
    const QueryGradients<T> g = kernels::query_gradients(
        ExecutionSpace(), packed_copy(qv, a), packed_copy(self.grad_field(), a),
        packed_copy(output, a), lse, queries, a.head_dim);
    const AttentionBuffer<T> kv = packed_kv(inputs[1]->data, inputs[2]->data, a, keys);
    const AttentionBuffer<T> dq = gradient_buffer<T>(inputs[0]->requires_grad, a.block(queries));
    const AttentionBuffer<T> dkv =
        gradient_buffer<T>(inputs[1]->requires_grad || inputs[2]->requires_grad, 2 * a.block(keys));
    backward_whole_block(a, g, data_or_null(dq), kv.data(), data_or_null(dkv), keys, scale);
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
                                      const Variable<T>&, int, bool, bool, bool);                  \
  template Variable<T> attention_replicated_queries(const Communicator&, const Variable<T>&,       \
                                                    const Variable<T>&, const Variable<T>&, int);  \
  template Variable<T> attention_replicated_keys(const Communicator&, const Variable<T>&,          \
                                                 const Variable<T>&, const Variable<T>&, int);
SHARDTENSOR_INSTANTIATE(float)
SHARDTENSOR_INSTANTIATE(double)
#undef SHARDTENSOR_INSTANTIATE

}  // namespace shardtensor
