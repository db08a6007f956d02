// Ring attention (see ring_attention.hpp and docs/attention.md).
//
// All compute runs on host copies of the local blocks: MPI reads host memory here anyway
// (no GPU-aware MPI yet), and the loops are plain so the numerics are easy to follow.
// Packed layout of a block of L tokens: [batch][head][token][head_dim], contiguous.

#include "shardtensor/layers/ring_attention.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "shardtensor/comm/impl/mpi_type.hpp"
#include "shardtensor/core/error.hpp"

namespace shardtensor {
namespace {

constexpr int kv_tag = 7301;    // K/V blocks travelling around the ring
constexpr int grad_tag = 7302;  // dK/dV accumulators travelling with them (backward)

/// Everything about the token layout every rank knows without communication.
struct Geometry {
  Index batch = 0, heads = 0, head_dim = 0;
  int rank = 0, size = 1;
  std::vector<Index> offset, extent;  // per rank: first global token, token count
  Index local() const { return extent[rank]; }
  /// Elements of one packed Q, K or V block of rank `r`.
  Index block(int r) const { return batch * heads * extent[r] * head_dim; }
  int next() const { return (rank + 1) % size; }
  int prev() const { return (rank + size - 1) % size; }
  /// Owner of the block held at ring step s: blocks move to rank + 1 each step.
  int source(int step) const { return ((rank - step) % size + size) % size; }
};

template <class T>
std::vector<T> pack(const ShardTensor<T>& f, const Geometry& g) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.view());
  const Index x0 = f.ghosts().lower[0], y0 = f.ghosts().lower[1], z0 = f.ghosts().lower[2];
  const Index L = g.local();
  std::vector<T> out(g.block(g.rank));
  for (Index n = 0; n < g.batch; ++n)
    for (Index h = 0; h < g.heads; ++h)
      for (Index t = 0; t < L; ++t)
        for (Index d = 0; d < g.head_dim; ++d)
          out[((n * g.heads + h) * L + t) * g.head_dim + d] =
              host(n, h * g.head_dim + d, x0 + t, y0, z0);
  return out;
}

/// Adds a packed local block into the owned cells of `f` (gradients accumulate).
template <class T>
void unpack_add(const T* src, const ShardTensor<T>& f, const Geometry& g) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.view());
  const Index x0 = f.ghosts().lower[0], y0 = f.ghosts().lower[1], z0 = f.ghosts().lower[2];
  const Index L = g.local();
  for (Index n = 0; n < g.batch; ++n)
    for (Index h = 0; h < g.heads; ++h)
      for (Index t = 0; t < L; ++t)
        for (Index d = 0; d < g.head_dim; ++d)
          host(n, h * g.head_dim + d, x0 + t, y0, z0) +=
              src[((n * g.heads + h) * L + t) * g.head_dim + d];
  Kokkos::deep_copy(f.view(), host);
}

/// Number of keys of a block starting at global token k_off (k_len tokens) that query at
/// global position qi may see.
inline Index visible_keys(bool causal, Index qi, Index k_off, Index k_len) {
  if (!causal) return k_len;
  return std::max<Index>(0, std::min<Index>(k_len, qi - k_off + 1));
}

template <class T>
T dot(const T* a, const T* b, Index n) {
  T s = 0;
  for (Index i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// Online-softmax update of the local queries with one K/V block (K then V in `kv`):
/// running max m, running sum l and unnormalised output acc per query row.
template <class T>
void forward_block(const Geometry& g, const std::vector<T>& q, const T* kv, int src, bool causal,
                   T scale, std::vector<T>& m, std::vector<T>& l, std::vector<T>& acc,
                   std::vector<T>& scores) {
  const Index Lq = g.local(), Lk = g.extent[src], D = g.head_dim;
  const T* K = kv;
  const T* V = kv + g.block(src);
  for (Index n = 0; n < g.batch; ++n)
    for (Index h = 0; h < g.heads; ++h) {
      const Index nh = n * g.heads + h;
      for (Index i = 0; i < Lq; ++i) {
        const Index jmax = visible_keys(causal, g.offset[g.rank] + i, g.offset[src], Lk);
        if (jmax == 0) continue;
        const Index row = nh * Lq + i;
        const T* qi = &q[row * D];
        T block_max = -std::numeric_limits<T>::infinity();
        for (Index j = 0; j < jmax; ++j) {
          scores[j] = scale * dot(qi, K + (nh * Lk + j) * D, D);
          block_max = std::max(block_max, scores[j]);
        }
        // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first block).
        const T m_new = std::max(m[row], block_max);
        const T correction = std::exp(m[row] - m_new);
        T* a = &acc[row * D];
        l[row] *= correction;
        for (Index d = 0; d < D; ++d) a[d] *= correction;
        for (Index j = 0; j < jmax; ++j) {
          const T p = std::exp(scores[j] - m_new);
          l[row] += p;
          const T* vj = V + (nh * Lk + j) * D;
          for (Index d = 0; d < D; ++d) a[d] += p * vj[d];
        }
        m[row] = m_new;
      }
    }
}

/// Flash-attention backward for one K/V block: P is recomputed from the saved log-sum-exp,
/// dQ accumulates locally, dK/dV into the travelling accumulator `dkv` (dK then dV).
template <class T>
void backward_block(const Geometry& g, const std::vector<T>& q, const std::vector<T>& dout,
                    const std::vector<T>& lse, const std::vector<T>& delta, const T* kv, T* dkv,
                    int src, bool causal, T scale, std::vector<T>& dq) {
  const Index Lq = g.local(), Lk = g.extent[src], D = g.head_dim;
  const T* K = kv;
  const T* V = kv + g.block(src);
  T* dK = dkv;
  T* dV = dkv + g.block(src);
  for (Index n = 0; n < g.batch; ++n)
    for (Index h = 0; h < g.heads; ++h) {
      const Index nh = n * g.heads + h;
      for (Index i = 0; i < Lq; ++i) {
        const Index jmax = visible_keys(causal, g.offset[g.rank] + i, g.offset[src], Lk);
        const Index row = nh * Lq + i;
        const T* qi = &q[row * D];
        const T* doi = &dout[row * D];
        T* dqi = &dq[row * D];
        for (Index j = 0; j < jmax; ++j) {
          const Index key = (nh * Lk + j) * D;
          const T p = std::exp(scale * dot(qi, K + key, D) - lse[row]);
          const T ds = p * (dot(doi, V + key, D) - delta[row]);  // dSoftmax
          for (Index d = 0; d < D; ++d) {
            dV[key + d] += p * doi[d];
            dqi[d] += scale * ds * K[key + d];
            dK[key + d] += scale * ds * qi[d];
          }
        }
      }
    }
}

/// K then V of the local block, the unit that travels around the ring.
template <class T>
std::vector<T> concat(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out(a);
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

/// Starts the non-blocking ring step: send `send` (block of rank `src`) to the next rank,
/// receive the block of the rank before `src` from the previous rank.
template <class T>
void start_shift(const Communicator& comm, const Geometry& g, int step, std::vector<T>& send,
                 std::vector<T>& recv, int tag, MPI_Request (&requests)[2]) {
  const int src = g.source(step), incoming = g.source(step + 1);
  MPI_Irecv(recv.data(), static_cast<int>(2 * g.block(incoming)), impl::mpi_type<T>(), g.prev(),
            tag, comm.get(), &requests[0]);
  MPI_Isend(send.data(), static_cast<int>(2 * g.block(src)), impl::mpi_type<T>(), g.next(), tag,
            comm.get(), &requests[1]);
}

}  // namespace

template <class T>
Variable<T> ring_attention(const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                           const Variable<T>& v, int heads, bool causal) {
  constexpr const char* where = "ring_attention";
  SHARDTENSOR_REQUIRE(q.defined() && k.defined() && v.defined(), where,
                      "q, k and v must be defined Variables");
  SHARDTENSOR_REQUIRE(q.is_field() && k.is_field() && v.is_field(), where,
                      "q, k and v must be sharded fields, got '" << q.name() << "', '"
                                                                 << k.name() << "', '" << v.name()
                                                                 << "'");
  const ShardTensor<T>& qf = q.value();
  const Decomposition& dec = qf.decomposition();
  SHARDTENSOR_REQUIRE(dec.ndims() == 1, where,
                      "tokens must be a 1-D field, got a " << dec.ndims() << "-D decomposition");
  SHARDTENSOR_REQUIRE(heads >= 1, where, "heads must be positive, got " << heads);
  SHARDTENSOR_REQUIRE(qf.channels() % heads == 0, where,
                      "channels " << qf.channels() << " not divisible by heads " << heads);
  SHARDTENSOR_REQUIRE(dec.global_extent(0) >= comm.size(), where,
                      "fewer tokens (" << dec.global_extent(0) << ") than ranks (" << comm.size()
                                       << ")");
  SHARDTENSOR_REQUIRE(dec.nranks() == comm.size() && qf.rank() == comm.rank(), where,
                      "decomposition of " << dec.nranks() << " parts (shard of rank " << qf.rank()
                                          << ") does not match rank " << comm.rank() << " of "
                                          << comm.size());
  for (const auto* other : {&k, &v}) {
    const ShardTensor<T>& f = other->value();
    SHARDTENSOR_REQUIRE(f.decomposition() == dec && f.batch() == qf.batch() &&
                            f.channels() == qf.channels() && f.rank() == qf.rank(),
                        where,
                        "q, k and v layouts differ: '"
                            << q.name() << "' has batch " << qf.batch() << ", channels "
                            << qf.channels() << ", " << dec.global_extent(0) << " tokens; '"
                            << other->name() << "' has batch " << f.batch() << ", channels "
                            << f.channels() << ", " << f.decomposition().global_extent(0)
                            << " tokens" << (f.decomposition() == dec ? "" : " (other split)"));
  }

  auto g = std::make_shared<Geometry>();
  g->batch = qf.batch();
  g->heads = heads;
  g->head_dim = qf.channels() / heads;
  g->rank = comm.rank();
  g->size = comm.size();
  for (int r = 0; r < g->size; ++r) {
    g->offset.push_back(dec.offset(r, 0));
    g->extent.push_back(dec.extent(r, 0));
  }
  const T scale = T(1) / std::sqrt(T(g->head_dim));
  const Index rows = g->batch * g->heads * g->local();
  const Index max_tokens = *std::max_element(g->extent.begin(), g->extent.end());
  const Index max_block = 2 * g->batch * g->heads * g->head_dim * max_tokens;  // K + V

  auto qp = std::make_shared<std::vector<T>>(pack(qf, *g));
  auto kvp = std::make_shared<std::vector<T>>(concat(pack(k.value(), *g), pack(v.value(), *g)));

  // Forward ring: P steps, P - 1 shifts. Two K/V buffers: one computed on, one filling.
  std::vector<T> m(rows, -std::numeric_limits<T>::infinity()), l(rows, T(0));
  std::vector<T> acc(rows * g->head_dim, T(0)), scores(max_tokens);  // one score row
  std::vector<T> current = *kvp, incoming(max_block);
  current.resize(max_block);
  for (int step = 0; step < g->size; ++step) {
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (step + 1 < g->size) start_shift(comm, *g, step, current, incoming, kv_tag, requests);
    forward_block(*g, *qp, current.data(), g->source(step), causal, scale, m, l, acc, scores);
    MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
    std::swap(current, incoming);
  }
  // Normalise; keep log-sum-exp per row so backward can recompute P without the matrix.
  auto out = std::make_shared<std::vector<T>>(acc);
  auto lse = std::make_shared<std::vector<T>>(rows);
  for (Index row = 0; row < rows; ++row) {
    for (Index d = 0; d < g->head_dim; ++d) (*out)[row * g->head_dim + d] /= l[row];
    (*lse)[row] = m[row] + std::log(l[row]);
  }

  auto node = make_result_node<T>("ring_attention", {q.node(), k.node(), v.node()});
  node->field = ShardTensor<T>(dec, qf.rank(), qf.batch(), qf.channels(), {}, "ring_attention");
  unpack_add(out->data(), node->field, *g);
  if (!node->requires_grad) return Variable<T>(node);

  node->backward = [comm, g, qp, kvp, out, lse, causal, scale,
                    max_block](impl::Node<T>& self) {
    const Index D = g->head_dim, rows = g->batch * g->heads * g->local();
    const std::vector<T> dout = pack(self.grad_field(), *g);
    std::vector<T> delta(rows), dq(qp->size(), T(0));  // delta_i = dO_i . O_i
    for (Index row = 0; row < rows; ++row)
      delta[row] = dot(&dout[row * D], &(*out)[row * D], D);

    // K/V ring as in forward (prefetching the next block); dK/dV travel with their block,
    // shifted after each step once computed on, so after P steps they are back home.
    std::vector<T> current = *kvp, incoming(max_block);
    std::vector<T> grads(max_block, T(0)), grads_in(max_block);
    current.resize(max_block);
    for (int step = 0; step < g->size; ++step) {
      const int src = g->source(step);
      MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      if (step + 1 < g->size) start_shift(comm, *g, step, current, incoming, kv_tag, requests);
      backward_block(*g, *qp, dout, *lse, delta, current.data(), grads.data(), src, causal,
                     scale, dq);
      MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
      MPI_Request grad_requests[2];
      start_shift(comm, *g, step, grads, grads_in, grad_tag, grad_requests);
      MPI_Waitall(2, grad_requests, MPI_STATUSES_IGNORE);
      std::swap(current, incoming);
      std::swap(grads, grads_in);
    }
    const Index E = g->block(g->rank);
    const T* home[3] = {dq.data(), grads.data(), grads.data() + E};  // dQ, dK, dV
    for (int i = 0; i < 3; ++i)
      if (self.inputs[i]->requires_grad) unpack_add(home[i], self.inputs[i]->grad_field(), *g);
  };
  return Variable<T>(node);
}

template Variable<float> ring_attention(const Communicator&, const Variable<float>&,
                                        const Variable<float>&, const Variable<float>&, int,
                                        bool);
template Variable<double> ring_attention(const Communicator&, const Variable<double>&,
                                         const Variable<double>&, const Variable<double>&, int,
                                         bool);

}  // namespace shardtensor
