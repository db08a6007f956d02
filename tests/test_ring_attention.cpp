// Attention over sharded tokens (ring_attention, attention_replicated_queries,
// attention_replicated_keys): sharded over all ranks == a plain single-rank attention on the
// gathered tokens (outputs and q/k/v gradients), for 1-D sequences (causal or not, balanced
// and uneven splits, sequences longer than one score tile) and 2-D/3-D fields on 2-D process
// grids with ghost cells in the inputs; finite differences in double; bad input.

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "equivalence.hpp"
#include "shardtensor/kernels/flash_attention.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

/// (batch, channels, tokens) values in C order, in double: a gathered field (its cells
/// flattened in C order) or a replicated {batch, tokens, channels} tensor, transposed.
struct Tokens {
  Index batch = 0, channels = 0, tokens = 0;
  std::vector<double> values;
  double operator()(Index n, Index c, Index t) const {
    return values[(n * channels + c) * tokens + t];
  }
};

template <class T>
Tokens gathered(const Communicator& comm, const ShardTensor<T>& f) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all_gather(comm, f));
  Tokens r{f.batch(), f.channels(), f.decomposition().global_cells(), {}};
  r.values.assign(host.data(), host.data() + host.span());
  return r;
}

template <class T>
Tokens transposed(const ReplicatedView<T>& data, const std::vector<Index>& shape) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), data);
  Tokens r{shape[0], shape[2], shape[1], std::vector<double>(host.span())};
  for (Index n = 0; n < r.batch; ++n)
    for (Index t = 0; t < r.tokens; ++t)
      for (Index c = 0; c < r.channels; ++c)
        r.values[(n * r.channels + c) * r.tokens + t] = host((n * r.tokens + t) * r.channels + c);
  return r;
}

/// The plain reference: full score matrix per (batch, head), softmax, product; backward by
/// the textbook formulas, in double. Queries and keys may differ in number (cross-attention).
struct Reference {
  Tokens out, dq, dk, dv;
};

Reference reference_attention(const Tokens& q, const Tokens& k, const Tokens& v, const Tokens& dout,
                              int heads, bool causal) {
  const Index N = q.batch, C = q.channels, Tq = q.tokens, Tk = k.tokens, D = C / heads;
  const double scale = 1.0 / std::sqrt(double(D));
  Reference r{{N, C, Tq, std::vector<double>(N * C * Tq)},
              {N, C, Tq, std::vector<double>(N * C * Tq)},
              {N, C, Tk, std::vector<double>(N * C * Tk)},
              {N, C, Tk, std::vector<double>(N * C * Tk)}};
  auto at = [&](Index n, Index c, Index t, Index tokens) { return (n * C + c) * tokens + t; };
  std::vector<double> P(Tk), dP(Tk);
  for (Index n = 0; n < N; ++n)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < Tq; ++i) {
        double mx = -INFINITY, sum = 0, rowsum = 0;
        for (Index j = 0; j < Tk; ++j) {
          double s = 0;
          for (Index c = h * D; c < (h + 1) * D; ++c) s += q(n, c, i) * k(n, c, j);
          P[j] = (causal && j > i) ? -INFINITY : s * scale;
          mx = std::max(mx, P[j]);
        }
        for (Index j = 0; j < Tk; ++j) sum += (P[j] = std::exp(P[j] - mx));
        // dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = s dS K, dK = s dS^T Q.
        for (Index j = 0; j < Tk; ++j) {
          P[j] /= sum;
          double s = 0;
          for (Index c = h * D; c < (h + 1) * D; ++c) {
            r.out.values[at(n, c, i, Tq)] += P[j] * v(n, c, j);
            s += dout(n, c, i) * v(n, c, j);
          }
          rowsum += P[j] * (dP[j] = s);
        }
        for (Index j = 0; j < Tk; ++j) {
          const double ds = P[j] * (dP[j] - rowsum);
          for (Index c = h * D; c < (h + 1) * D; ++c) {
            r.dv.values[at(n, c, j, Tk)] += P[j] * dout(n, c, i);
            r.dq.values[at(n, c, i, Tq)] += scale * ds * k(n, c, j);
            r.dk.values[at(n, c, j, Tk)] += scale * ds * q(n, c, i);
          }
        }
      }
  return r;
}

/// max |got - expected| / max |expected|.
double relative_error_to(const Tokens& got, const Tokens& expected) {
  REQUIRE(got.values.size() == expected.values.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < got.values.size(); ++i) {
    diff = std::max(diff, std::abs(got.values[i] - expected.values[i]));
    scale = std::max(scale, std::abs(expected.values[i]));
  }
  return diff / scale;
}

Tokens sum_of(const Tokens& a, const Tokens& b) {
  Tokens r = a;
  for (std::size_t i = 0; i < r.values.size(); ++i) r.values[i] += b.values[i];
  return r;
}

/// Owned cells random per global cell (amplitude x uniform [-1, 1)); ghost cells 1e3, which
/// would spoil every result if they were read.
template <class T>
Variable<T> token_field(const Decomposition& d, Index batch, Index channels, std::uint64_t seed,
                        double amplitude, bool requires_grad, const char* name,
                        const GhostWidths& ghosts = {}) {
  ShardTensor<T> t(d, test::world_rank(), batch, channels, ghosts);
  test::fill(t, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex& g) {
    if (test::is_ghost(t, local)) return 1e3;
    return amplitude * hashed_uniform(seed, test::global_linear_index(d, channels, n, c, g));
  });
  return Variable<T>::field(t, requires_grad, name);
}

/// A replicated {batch, tokens, channels} tensor of random values.
template <class T>
Variable<T> replicated_tokens(Index batch, Index tokens, Index channels, std::uint64_t seed,
                              double amplitude, bool requires_grad, const char* name) {
  ReplicatedView<T> data(std::string(name), batch * tokens * channels);
  auto host = Kokkos::create_mirror_view(data);
  for (std::size_t i = 0; i < host.span(); ++i) host(i) = T(amplitude * hashed_uniform(seed, i));
  Kokkos::deep_copy(data, host);
  return Variable<T>::replicated(data, {batch, tokens, channels}, requires_grad, name);
}

/// sum(x * w) over a replicated tensor, w random (seed 23): the loss of replicated outputs.
template <class T>
Variable<T> weighted_sum_replicated(const Variable<T>& x) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.data());
  std::vector<double> w(host.span());
  double total = 0;
  for (std::size_t i = 0; i < w.size(); ++i) total += (w[i] = hashed_uniform(23, i)) * host(i);
  auto node = impl::scalar_node<T>("weighted_sum_replicated", total, {x.node()});
  if (node->requires_grad)
    node->backward = [in = x.node(), w](impl::Node<T>& self) {
      const double g = impl::scalar_grad(self);
      auto grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), in->grad_data());
      for (std::size_t i = 0; i < w.size(); ++i) grad(i) += T(g * w[i]);
      Kokkos::deep_copy(in->grad_data(), grad);
    };
  return Variable<T>(node);
}

/// The output gradient the losses above give: their weights, as Tokens.
template <class T>
Tokens output_gradient_of(const Communicator& comm, const Variable<T>& out) {
  if (!out.is_field()) {
    ReplicatedView<double> w("w", out.data().extent(0));
    auto host = Kokkos::create_mirror_view(w);
    for (std::size_t i = 0; i < host.span(); ++i) host(i) = hashed_uniform(23, i);
    Kokkos::deep_copy(w, host);
    return transposed(w, out.shape());
  }
  const ShardTensor<T>& y = out.value();
  return gathered(
      comm, test::random_shard<T>(y.decomposition(), comm.rank(), y.batch(), y.channels(), 23));
}

template <class T>
Tokens tokens_of(const Communicator& comm, const Variable<T>& x) {
  return x.is_field() ? gathered(comm, x.value()) : transposed(x.data(), x.shape());
}

template <class T>
Tokens gradient_of(const Communicator& comm, const Variable<T>& x) {
  return x.is_field() ? gathered(comm, x.grad()) : transposed(x.data_grad(), x.shape());
}

enum class Op { ring, replicated_queries, replicated_keys };

template <class T>
Variable<T> attend(Op op, const Communicator& comm, const Variable<T>& q, const Variable<T>& k,
                   const Variable<T>& v, int heads, bool causal) {
  switch (op) {
    case Op::replicated_queries:
      return attention_replicated_queries(comm, q, k, v, heads);
    case Op::replicated_keys:
      return attention_replicated_keys(comm, q, k, v, heads);
    default:
      return ring_attention(comm, q, k, v, heads, causal);
  }
}

template <class T>
Variable<T> loss_of(const Communicator& comm, const Variable<T>& out) {
  return out.is_field() ? test::weighted_sum(comm, out) : weighted_sum_replicated(out);
}

/// Runs `op` forward and backward and compares output and the gradients of q, k and v with
/// the reference on the gathered tokens. q = k = v when `self_attention` (gradients add up).
template <class T>
void check_against_reference(Op op, const Variable<T>& q, const Variable<T>& k,
                             const Variable<T>& v, int heads, bool causal, bool self_attention,
                             const std::string& description) {
  const double tolerance = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  const Communicator world;
  const Variable<T> out = attend(op, world, q, k, v, heads, causal);
  backward(loss_of(world, out));
  const Reference ref =
      reference_attention(tokens_of(world, q), tokens_of(world, k), tokens_of(world, v),
                          output_gradient_of(world, out), heads, causal);
  INFO(description << ", heads " << heads << (causal ? ", causal" : "")
                   << (self_attention ? ", q = k = v" : ""));
  CHECK(relative_error_to(tokens_of(world, out), ref.out) <= tolerance);
  if (self_attention) {
    CHECK(relative_error_to(gradient_of(world, q), sum_of(sum_of(ref.dq, ref.dk), ref.dv)) <=
          tolerance);
  } else {  // inputs without gradients test the paths that skip them
    if (q.requires_grad()) CHECK(relative_error_to(gradient_of(world, q), ref.dq) <= tolerance);
    if (k.requires_grad()) CHECK(relative_error_to(gradient_of(world, k), ref.dk) <= tolerance);
    if (v.requires_grad()) CHECK(relative_error_to(gradient_of(world, v), ref.dv) <= tolerance);
  }
}

/// ring_attention on fields of decomposition d (ghost cells of the given width on q, k, v).
template <class T>
void check_ring(const Decomposition& d, Index batch, int heads, Index head_dim, bool causal,
                bool self_attention, int ghost_width = 0) {
  const Index C = heads * head_dim;
  const GhostWidths ghosts = GhostWidths::uniform(ghost_width, d.ndims());
  const auto q = token_field<T>(d, batch, C, 31, 1.5, true, "q", ghosts);
  const auto k = self_attention ? q : token_field<T>(d, batch, C, 32, 1.5, true, "k", ghosts);
  const auto v = self_attention ? q : token_field<T>(d, batch, C, 33, 1.0, true, "v");
  check_against_reference(Op::ring, q, k, v, heads, causal, self_attention,
                          "ring attention, " + d.describe());
}

}  // namespace

TEMPLATE_TEST_CASE("ring attention: 1-D sequences equal single-rank attention", "[attention]",
                   float, double) {
  const int P = test::world_size();
  for (Index tokens : {Index(13), Index(37)})
    for (const Decomposition& d : test::test_decompositions({tokens}, P, {}, 1))
      for (bool causal : {false, true}) {
        check_ring<TestType>(d, 2, 2, 3, causal, false);
        check_ring<TestType>(d, 1, 3, 2, causal, true);
      }
  // Very uneven: every rank but the last holds one token.
  if (P > 1) {
    std::vector<Index> points;
    for (int r = 0; r < P; ++r) points.push_back(r);
    points.push_back(P + 10);
    const Decomposition d = Decomposition::from_split_points({points});
    for (bool causal : {false, true}) check_ring<TestType>(d, 2, 2, 4, causal, false);
  }
  // Longer than one score tile (256 queries x 512 keys) on few ranks: several query and key
  // tiles per block, tiles cut by the causal diagonal, uneven last tiles.
  for (bool causal : {false, true})
    check_ring<TestType>(Decomposition({1100}, {P}), 1, 2, 3, causal, false);
}

TEMPLATE_TEST_CASE("ring attention: 2-D and 3-D token fields equal single-rank attention",
                   "[attention]", float, double) {
  const int P = test::world_size();
  for (const Decomposition& d : test::test_decompositions({7, 9}, P, {}, 1))
    check_ring<TestType>(d, 2, 2, 3, false, false, 1);
  for (const Decomposition& d : test::test_decompositions({5, 4, 6}, P, {}, 1))
    check_ring<TestType>(d, 1, 2, 4, false, d.process_grid(1) > 1, 2);
}

TEMPLATE_TEST_CASE("attention with replicated queries equals single-rank attention", "[attention]",
                   float, double) {
  const int P = test::world_size();
  std::vector<Decomposition> decompositions = test::test_decompositions({13}, P, {}, 1);
  for (const Decomposition& d : test::test_decompositions({5, 6}, P, {}, 1))
    decompositions.push_back(d);
  for (const Decomposition& d : decompositions) {
    const auto q = replicated_tokens<TestType>(2, 5, 6, 41, 1.5, true, "q");
    const auto k =
        token_field<TestType>(d, 2, 6, 42, 1.5, true, "k", GhostWidths::uniform(1, d.ndims()));
    const auto v = token_field<TestType>(d, 2, 6, 43, 1.0, true, "v");
    check_against_reference(Op::replicated_queries, q, k, v, 3, false, false,
                            "replicated queries, keys " + d.describe());
  }
  // More queries and keys than one score tile.
  const auto q = replicated_tokens<TestType>(1, 300, 4, 44, 1.5, true, "q");
  const auto k = token_field<TestType>(Decomposition({600}, {P}), 1, 4, 45, 1.5, true, "k");
  const auto v = token_field<TestType>(Decomposition({600}, {P}), 1, 4, 46, 1.0, false, "v");
  check_against_reference(Op::replicated_queries, q, k, v, 2, false, false, "300 x 600 tokens");
}

TEMPLATE_TEST_CASE("attention with replicated keys equals single-rank attention", "[attention]",
                   float, double) {
  const int P = test::world_size();
  std::vector<Decomposition> decompositions = test::test_decompositions({13}, P, {}, 1);
  for (const Decomposition& d : test::test_decompositions({5, 6}, P, {}, 1))
    decompositions.push_back(d);
  for (const Decomposition& d : decompositions) {
    const auto q =
        token_field<TestType>(d, 2, 6, 51, 1.5, true, "q", GhostWidths::uniform(1, d.ndims()));
    const auto k = replicated_tokens<TestType>(2, 7, 6, 52, 1.5, true, "k");
    const auto v = replicated_tokens<TestType>(2, 7, 6, 53, 1.0, true, "v");
    check_against_reference(Op::replicated_keys, q, k, v, 2, false, false,
                            "replicated keys, queries " + d.describe());
  }
  const auto q = token_field<TestType>(Decomposition({300}, {P}), 1, 4, 54, 1.5, false, "q");
  const auto k = replicated_tokens<TestType>(1, 600, 4, 55, 1.5, true, "k");
  const auto v = replicated_tokens<TestType>(1, 600, 4, 56, 1.0, true, "v");
  check_against_reference(Op::replicated_keys, q, k, v, 2, false, false, "300 x 600 tokens");
}

namespace {

/// Perturbs one entry of x (a field cell on its owner, or a replicated entry on every rank).
void perturb(const Communicator& world, const Variable<double>& x, Index n, Index c, Index t,
             double delta) {
  if (!x.is_field()) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.data());
    host((n * x.shape()[1] + t) * x.shape()[2] + c) += delta;
    Kokkos::deep_copy(x.data(), host);
    return;
  }
  const Decomposition& d = x.value().decomposition();
  const SpatialIndex e = d.global_extents();
  const SpatialIndex g{t / (e[1] * e[2]), t / e[2] % e[1], t % e[2]};
  if (world.rank() != d.owner(g)) return;
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.value().view());
  const SpatialIndex l = x.value().to_local(g);
  host(n, c, l[0], l[1], l[2]) += delta;
  Kokkos::deep_copy(x.value().view(), host);
}

/// Central differences of the loss against the gradients from backward at a few entries of
/// each of q, k and v.
void check_finite_differences(Op op, const Variable<double>& q, const Variable<double>& k,
                              const Variable<double>& v, int heads, bool causal) {
  const Communicator world;
  backward(loss_of(world, attend(op, world, q, k, v, heads, causal)));
  const Variable<double>* inputs[3] = {&q, &k, &v};
  for (int which = 0; which < 3; ++which) {
    const Variable<double>& x = *inputs[which];
    const Tokens analytic = gradient_of(world, x);
    for (int probe = 0; probe < 3; ++probe) {
      const Index n = probe % analytic.batch, c = (which + probe) % analytic.channels;
      const Index t = hash_bits(which, probe) % std::uint64_t(analytic.tokens);
      auto loss_at = [&](double delta) {
        perturb(world, x, n, c, t, delta);
        const auto as_leaf = [](const Variable<double>& y) {
          return y.is_field() ? Variable<double>::field(y.value())
                              : Variable<double>::replicated(y.data(), y.shape());
        };
        const double loss =
            loss_of(world, attend(op, world, as_leaf(q), as_leaf(k), as_leaf(v), heads, causal))
                .item();
        perturb(world, x, n, c, t, -delta);
        return loss;
      };
      const double eps = 1e-6;
      const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
      INFO("input "
           << "qkv"[which] << " batch " << n << " channel " << c << " token " << t
           << (causal ? " causal" : ""));
      CHECK(numeric == Approx(analytic(n, c, t)).epsilon(1e-6).margin(1e-8));
    }
  }
}

}  // namespace

namespace {

template <class T>
kernels::AttentionBuffer<T> device_copy(const std::vector<double>& values, const char* label) {
  kernels::AttentionBuffer<T> b(std::string(label), values.size());
  auto h = Kokkos::create_mirror_view(b);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = T(values[i]);
  Kokkos::deep_copy(b, h);
  return b;
}

template <class T>
std::vector<double> host_values(const kernels::AttentionBuffer<T>& b) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  return std::vector<double>(h.data(), h.data() + h.span());
}

/// Largest |a - b| over the largest |b|.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 1e-300);
}

}  // namespace

TEMPLATE_TEST_CASE(
    "attention kernels: the per-slice and the batched GEMM tiles match plain attention",
    "[attention]", float, double) {
  // Kernel level, on packed blocks: fold_block / backward_block (per-slice GEMM tiles on the
  // host, the batched tiles on a GPU), the batched tiles called directly (at their own sizes,
  // and at small ones that leave partial tiles of both kinds and several per block), against
  // plain attention in double. Causal cases offset queries and keys.
  using T = TestType;
  const double tolerance = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  const ExecutionSpace space;
  for (const Index D : {Index(3), Index(8)}) {
    for (const bool causal : {false, true}) {
      const kernels::Heads a{2, 2, D};
      const Index queries = 45, keys = 70;
      const kernels::Visibility visible{causal, 50, 10};  // queries at 50.., keys at 10..
      const T scale = T(1 / std::sqrt(double(D)));
      std::vector<double> q(a.block(queries)), kv(2 * a.block(keys)), dout(a.block(queries));
      for (std::size_t i = 0; i < q.size(); ++i) q[i] = 2 * hashed_uniform(1, i) - 1;
      for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = 2 * hashed_uniform(2, i) - 1;
      for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = 2 * hashed_uniform(3, i) - 1;

      // Plain attention in double, slice by slice.
      const Index S = a.slices();
      std::vector<double> out(q.size()), lse(S * queries), dq(q.size(), 0), dkv(kv.size(), 0);
      for (Index s = 0; s < S; ++s) {
        const double* qs = &q[s * queries * D];
        const double* ks = &kv[s * keys * D];
        const double* vs = &kv[a.block(keys) + s * keys * D];
        for (Index i = 0; i < queries; ++i) {
          const Index n = visible.count(i, 0, keys);
          std::vector<double> p(n);
          double m = -INFINITY, total = 0;
          for (Index j = 0; j < n; ++j) {
            double dot = 0;
            for (Index d = 0; d < D; ++d) dot += qs[i * D + d] * ks[j * D + d];
            m = std::max(m, p[j] = double(scale) * dot);
          }
          for (Index j = 0; j < n; ++j) total += (p[j] = std::exp(p[j] - m));
          lse[s * queries + i] = m + std::log(total);
          double* o = &out[(s * queries + i) * D];
          const double* g = &dout[(s * queries + i) * D];
          for (Index j = 0; j < n; ++j)
            for (Index d = 0; d < D; ++d) o[d] += p[j] / total * vs[j * D + d];
          double delta = 0;
          for (Index d = 0; d < D; ++d) delta += g[d] * o[d];
          for (Index j = 0; j < n; ++j) {
            const double pj = p[j] / total;
            double dp = 0;
            for (Index d = 0; d < D; ++d) dp += g[d] * vs[j * D + d];
            const double ds = pj * (dp - delta);
            for (Index d = 0; d < D; ++d) {
              dq[(s * queries + i) * D + d] += double(scale) * ds * ks[j * D + d];
              dkv[(s * keys + j) * D + d] += double(scale) * ds * qs[i * D + d];
              dkv[a.block(keys) + (s * keys + j) * D + d] += pj * g[d];
            }
          }
        }
      }

      enum class Kernels { tiles, batched, batched_small };
      for (const Kernels kind : {Kernels::tiles, Kernels::batched, Kernels::batched_small}) {
        const char* names[] = {"tiles", "batched", "batched, small tiles"};
        INFO("head_dim " << D << (causal ? ", causal" : "") << ", " << names[int(kind)]);
        const kernels::BatchedTiles tiles = kind == Kernels::batched_small
                                                ? kernels::BatchedTiles{16, 24}
                                                : kernels::batched_tiles(a, queries, keys);
        const bool batched = kind == Kernels::batched || kind == Kernels::batched_small;
        const Index values =
            batched ? S * tiles.queries * tiles.keys : kernels::score_buffer_size(a, queries, keys);
        const auto qb = device_copy<T>(q, "q"), kvb = device_copy<T>(kv, "kv");
        kernels::OnlineSoftmax<T> state(space, S * queries, D);
        auto scores = kernels::attention_buffer<T>("scores", values);
        auto dscores = kernels::attention_buffer<T>("dscores", values);
        // Two K/V blocks folded one after the other, as a ring does: the first 30 keys, the rest.
        for (const Index first : {Index(0), Index(30)}) {
          const Index count = first == 0 ? 30 : keys - 30;
          std::vector<double> block(2 * a.block(count));
          for (Index s = 0; s < S; ++s)
            for (Index j = 0; j < count; ++j)
              for (Index d = 0; d < D; ++d) {
                block[(s * count + j) * D + d] = kv[(s * keys + first + j) * D + d];
                block[a.block(count) + (s * count + j) * D + d] =
                    kv[a.block(keys) + (s * keys + first + j) * D + d];
              }
          const auto bb = device_copy<T>(block, "block");
          const kernels::Visibility v{causal, visible.query_offset, visible.key_offset + first};
          if (batched)
            kernels::fold_block_batched(space, a, qb.data(), queries, bb.data(), count, v, scale,
                                        state, scores.data(), tiles, false, false, [] {});
          else
            kernels::fold_block(space, a, qb.data(), queries, bb.data(), count, v, scale, state,
                                scores.data(), [] {});
        }
        kernels::finish(space, state);
        const auto out_b = kernels::attention_buffer<T>("out", a.block(queries));
        Kokkos::deep_copy(
            out_b,
            Kokkos::subview(state.totals, std::make_pair(S * queries, S * queries * (1 + D))));
        CHECK(relative_error(host_values(out_b), out) < tolerance);
        CHECK(relative_error(host_values(state.max), lse) < tolerance);

        const auto g = kernels::query_gradients(space, qb, device_copy<T>(dout, "dout"), out_b,
                                                state.max, queries, D);
        auto dqb = kernels::attention_buffer<T>("dq", q.size(), MemoryCategory::workspaces, true);
        auto dkvb =
            kernels::attention_buffer<T>("dkv", kv.size(), MemoryCategory::workspaces, true);
        if (batched)
          kernels::backward_block_batched(space, a, g, dqb.data(), kvb.data(), dkvb.data(), keys,
                                          visible, scale, scores.data(), dscores.data(), tiles,
                                          false, false, [] {});
        else
          kernels::backward_block(space, a, g, dqb.data(), kvb.data(), dkvb.data(), keys, visible,
                                  scale, scores.data(), dscores.data(), [] {});
        CHECK(relative_error(host_values(dqb), dq) < 10 * tolerance);
        CHECK(relative_error(host_values(dkvb), dkv) < 10 * tolerance);
      }
    }
  }
}

TEST_CASE("attention: finite-difference gradients in double", "[attention]") {
  const int P = test::world_size();
  const Decomposition line({std::max<Index>(5, P)}, {P});
  for (bool causal : {false, true})
    check_finite_differences(Op::ring, token_field<double>(line, 1, 4, 61, 1.5, true, "q"),
                             token_field<double>(line, 1, 4, 62, 1.5, true, "k"),
                             token_field<double>(line, 1, 4, 63, 1.0, true, "v"), 2, causal);
  const Decomposition plane = Decomposition::automatic({3, std::max<Index>(3, P)}, P);
  check_finite_differences(Op::ring, token_field<double>(plane, 2, 4, 64, 1.5, true, "q"),
                           token_field<double>(plane, 2, 4, 65, 1.5, true, "k"),
                           token_field<double>(plane, 2, 4, 66, 1.0, true, "v"), 2, false);
  check_finite_differences(Op::replicated_queries,
                           replicated_tokens<double>(1, 4, 4, 67, 1.5, true, "q"),
                           token_field<double>(plane, 1, 4, 68, 1.5, true, "k"),
                           token_field<double>(plane, 1, 4, 69, 1.0, true, "v"), 2, false);
  check_finite_differences(Op::replicated_keys,
                           token_field<double>(plane, 1, 4, 70, 1.5, true, "q"),
                           replicated_tokens<double>(1, 4, 4, 71, 1.5, true, "k"),
                           replicated_tokens<double>(1, 4, 4, 72, 1.0, true, "v"), 2, false);
}

TEST_CASE("attention: bad input", "[attention][errors]") {
  const Communicator world;
  const int P = world.size();
  const Decomposition d({Index(2 * P + 1)}, {P});
  const auto q = token_field<double>(d, 1, 6, 1, 1.0, true, "q");
  const auto k = token_field<double>(d, 1, 6, 2, 1.0, true, "k");
  const auto q_rep = replicated_tokens<double>(1, 3, 6, 3, 1.0, true, "q_rep");
  const auto k_rep = replicated_tokens<double>(1, 4, 6, 4, 1.0, true, "k_rep");
  auto expect = [&](auto body, const std::string& text) {
    const std::string message = test::error_message_of(body);
    CHECK_THAT(message, Contains(text));
    CHECK(test::ranks_with_error(message) == P);
  };

  SECTION("channels not divisible by heads") {
    const auto q5 = token_field<double>(d, 1, 5, 3, 1.0, false, "q5");
    const auto r5 = replicated_tokens<double>(1, 3, 5, 3, 1.0, false, "r5");
    const std::string text = "channels 5 not divisible by heads 2";
    expect([&] { ring_attention(world, q5, q5, q5, 2, false); }, text);
    expect([&] { attention_replicated_queries(world, r5, q5, q5, 2); }, text);
    expect([&] { attention_replicated_keys(world, q5, r5, r5, 2); }, text);
  }
  SECTION("q, k, v layouts differ") {
    const auto v4 = token_field<double>(d, 1, 4, 3, 1.0, false, "v4");
    expect([&] { ring_attention(world, q, k, v4, 2, false); }, "'v4' has batch 1, channels 4");
    const Decomposition longer({Index(2 * P + 3)}, {P});
    const auto k_long = token_field<double>(longer, 1, 6, 3, 1.0, false, "k_long");
    expect([&] { ring_attention(world, q, k_long, k_long, 2, false); },
           std::to_string(2 * P + 3) + " tokens");
    expect([&] { attention_replicated_queries(world, q_rep, k, k_long, 2); }, "layouts differ");
    expect([&] { attention_replicated_keys(world, q, k_rep, q_rep, 2); }, "shapes differ");
  }
  SECTION("mismatched channels or batch between queries and keys") {
    const auto r4 = replicated_tokens<double>(1, 3, 4, 6, 1.0, false, "r4");
    const auto batch2 = replicated_tokens<double>(2, 3, 6, 7, 1.0, false, "batch2");
    expect([&] { attention_replicated_queries(world, r4, k, k, 2); }, "'r4' has shape {1, 3, 4}");
    expect([&] { attention_replicated_queries(world, batch2, k, k, 2); },
           "'batch2' has shape {2, 3, 6}");
    expect([&] { attention_replicated_keys(world, q, batch2, batch2, 2); }, "differ in batch");
  }
  SECTION("wrong kinds and shapes") {
    expect([&] { attention_replicated_queries(world, q, k, k, 2); },
           "'q' must be a replicated {batch, tokens, channels} tensor");
    expect([&] { attention_replicated_keys(world, q_rep, k_rep, k_rep, 2); },
           "'q_rep' must be a sharded field");
    const auto flat = Variable<double>::replicated(q_rep.data(), {3, 6});
    expect([&] { attention_replicated_keys(world, q, flat, flat, 2); },
           "expected {batch, tokens, channels}");
  }
  SECTION("causal needs a 1-D field") {
    const Decomposition plane = Decomposition::automatic({3, std::max<Index>(3, P)}, P);
    const auto x = token_field<double>(plane, 1, 4, 8, 1.0, false, "x");
    expect([&] { ring_attention(world, x, x, x, 2, true); }, "causal attention needs a 1-D");
  }
  SECTION("fewer tokens than ranks") {
    if (P > 1) {
      // A one-part decomposition of P - 1 tokens, used over all P ranks.
      ShardTensor<double> t(Decomposition({Index(P - 1)}, {1}), 0, 1, 6);
      test::fill(t, [](Index, Index c, const SpatialIndex&, const SpatialIndex& g) {
        return 0.5 + c + g[0];
      });
      const auto few = Variable<double>::field(t, false, "few");
      const std::string text =
          "fewer tokens (" + std::to_string(P - 1) + ") than ranks (" + std::to_string(P) + ")";
      expect([&] { ring_attention(world, few, few, few, 1, false); }, text);
      expect([&] { attention_replicated_queries(world, q_rep, few, few, 2); }, text);
      expect([&] { attention_replicated_keys(world, few, k_rep, k_rep, 2); }, text);
    }
  }
}
