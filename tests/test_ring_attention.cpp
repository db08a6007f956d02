// Ring attention: sharded over all ranks == a plain single-rank attention on the gathered
// sequence (outputs and q/k/v gradients), with and without causal masking, uneven token
// splits; finite differences in double; bad input.

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

/// The plain reference: full score matrix per (batch, head), softmax, product; backward by
/// the textbook formulas. Computed in double on host from gathered (N, C, T) arrays.
struct Reference {
  std::vector<double> out, dq, dk, dv;  // (N, C, T) C order, like a gathered field
};

template <class V>
Reference reference_attention(const V& q, const V& k, const V& v, const V& dout, int heads,
                              bool causal) {
  const Index N = q.extent(0), C = q.extent(1), T = q.extent(2), D = C / heads;
  const double scale = 1.0 / std::sqrt(double(D));
  auto at = [&](Index n, Index c, Index t) { return (n * C + c) * T + t; };
  Reference r;
  r.out.assign(N * C * T, 0);
  r.dq = r.dk = r.dv = r.out;
  std::vector<double> P(T * T), dP(T * T);
  for (Index n = 0; n < N; ++n)
    for (Index h = 0; h < heads; ++h) {
      auto ch = [&](Index d) { return h * D + d; };
      for (Index i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (Index j = 0; j < T; ++j) {
          double s = 0;
          for (Index d = 0; d < D; ++d) s += double(q(n, ch(d), i, 0, 0)) * k(n, ch(d), j, 0, 0);
          P[i * T + j] = (causal && j > i) ? -INFINITY : s * scale;
          mx = std::max(mx, P[i * T + j]);
        }
        double sum = 0;
        for (Index j = 0; j < T; ++j) sum += (P[i * T + j] = std::exp(P[i * T + j] - mx));
        for (Index j = 0; j < T; ++j) P[i * T + j] /= sum;
      }
      for (Index i = 0; i < T; ++i)
        for (Index d = 0; d < D; ++d)
          for (Index j = 0; j < T; ++j) r.out[at(n, ch(d), i)] += P[i * T + j] * v(n, ch(d), j, 0, 0);
      // dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = s dS K, dK = s dS^T Q.
      for (Index i = 0; i < T; ++i) {
        double rowsum = 0;
        for (Index j = 0; j < T; ++j) {
          double s = 0;
          for (Index d = 0; d < D; ++d) s += double(dout(n, ch(d), i, 0, 0)) * v(n, ch(d), j, 0, 0);
          dP[i * T + j] = s;
          rowsum += P[i * T + j] * s;
        }
        for (Index j = 0; j < T; ++j) {
          const double ds = P[i * T + j] * (dP[i * T + j] - rowsum);
          for (Index d = 0; d < D; ++d) {
            r.dv[at(n, ch(d), j)] += P[i * T + j] * dout(n, ch(d), i, 0, 0);
            r.dq[at(n, ch(d), i)] += scale * ds * k(n, ch(d), j, 0, 0);
            r.dk[at(n, ch(d), j)] += scale * ds * q(n, ch(d), i, 0, 0);
          }
        }
      }
    }
  return r;
}

template <class V>
double relative_error_to(const V& gathered, const std::vector<double>& ref) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gathered);
  REQUIRE(host.span() == ref.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(double(host.data()[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / scale;
}

template <class T>
Variable<T> token_field(const Decomposition& d, Index batch, Index channels, std::uint64_t seed,
                        double amplitude, bool requires_grad, const char* name) {
  ShardTensor<T> t(d, test::world_rank(), batch, channels);
  test::fill(t, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
    return amplitude * hashed_uniform(seed, test::global_linear_index(d, channels, n, c, g));
  });
  return Variable<T>::field(t, requires_grad, name);
}

template <class T>
void check_against_reference(const Decomposition& d, Index batch, int heads, Index head_dim,
                             bool causal, bool self_attention) {
  const double tolerance = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  const Communicator world;
  const Index C = heads * head_dim;
  const auto q = token_field<T>(d, batch, C, 31, 1.5, true, "q");
  const auto k = self_attention ? q : token_field<T>(d, batch, C, 32, 1.5, true, "k");
  const auto v = self_attention ? q : token_field<T>(d, batch, C, 33, 1.0, true, "v");
  const Variable<T> out = ring_attention(world, q, k, v, heads, causal);
  const Variable<T> loss = test::weighted_sum(world, out);  // dO = random weights (seed 23)
  backward(loss);

  const auto weights =
      test::random_shard<T>(out.value().decomposition(), world.rank(), batch, C, 23);
  const auto gq = all_gather(world, q.value()), gk = all_gather(world, k.value()),
             gv = all_gather(world, v.value()), gw = all_gather(world, weights);
  const auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gq);
  const auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gk);
  const auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gv);
  const auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gw);
  Reference ref = reference_attention(hq, hk, hv, hw, heads, causal);

  INFO("decomposition " << d.describe() << ", heads " << heads << ", head_dim " << head_dim
                        << (causal ? ", causal" : "") << (self_attention ? ", q = k = v" : ""));
  CHECK(relative_error_to(all_gather(world, out.value()), ref.out) <= tolerance);
  if (self_attention) {
    std::vector<double> total(ref.dq.size());
    for (std::size_t i = 0; i < total.size(); ++i) total[i] = ref.dq[i] + ref.dk[i] + ref.dv[i];
    CHECK(relative_error_to(all_gather(world, q.grad()), total) <= tolerance);
  } else {
    CHECK(relative_error_to(all_gather(world, q.grad()), ref.dq) <= tolerance);
    CHECK(relative_error_to(all_gather(world, k.grad()), ref.dk) <= tolerance);
    CHECK(relative_error_to(all_gather(world, v.grad()), ref.dv) <= tolerance);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("ring attention: sharded equals single-rank attention", "[attention]", float,
                   double) {
  const int P = test::world_size();
  for (Index tokens : {Index(13), Index(37)})
    for (const Decomposition& d : test::test_decompositions({tokens}, P, {}, 1))
      for (bool causal : {false, true}) {
        check_against_reference<TestType>(d, 2, 2, 3, causal, false);
        check_against_reference<TestType>(d, 1, 3, 2, causal, true);
      }
  // Very uneven: every rank but the last holds one token.
  if (P > 1) {
    std::vector<Index> points;
    for (int r = 0; r < P; ++r) points.push_back(r);
    points.push_back(P + 10);
    const Decomposition d = Decomposition::from_split_points({points});
    for (bool causal : {false, true}) check_against_reference<TestType>(d, 2, 2, 4, causal, false);
  }
}

TEST_CASE("ring attention: finite-difference gradients in double", "[attention]") {
  const Communicator world;
  const int P = world.size();
  const Decomposition d({std::max<Index>(5, P)}, {P});
  const Index batch = 1, heads = 2, C = 4;
  for (bool causal : {false, true}) {
    const auto q = token_field<double>(d, batch, C, 41, 1.5, true, "q");
    const auto k = token_field<double>(d, batch, C, 42, 1.5, true, "k");
    const auto v = token_field<double>(d, batch, C, 43, 1.0, true, "v");
    backward(test::weighted_sum(world, ring_attention(world, q, k, v, heads, causal)));
    const Variable<double>* inputs[3] = {&q, &k, &v};
    for (int which = 0; which < 3; ++which)
      for (int probe = 0; probe < 3; ++probe) {
        const Index t = hash_bits(which, probe) % std::uint64_t(d.global_extent(0));
        const Index c = (which + probe) % C;
        const int owner = d.owner({t, 0, 0});
        const ShardTensor<double>& x = inputs[which]->value();
        auto loss_at = [&](double delta) {
          auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.view());
          if (world.rank() == owner) host(0, c, x.to_local(0, t), 0, 0) += delta;
          Kokkos::deep_copy(x.view(), host);
          const auto qn = Variable<double>::field(q.value()), kn = Variable<double>::field(k.value()),
                     vn = Variable<double>::field(v.value());
          const double loss =
              test::weighted_sum(world, ring_attention(world, qn, kn, vn, heads, causal)).item();
          if (world.rank() == owner) host(0, c, x.to_local(0, t), 0, 0) -= delta;
          Kokkos::deep_copy(x.view(), host);
          return loss;
        };
        const double eps = 1e-6;
        const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
        double analytic = 0;
        if (world.rank() == owner) {
          auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                       inputs[which]->grad().view());
          analytic = g(0, c, inputs[which]->grad().to_local(0, t), 0, 0);
        }
        MPI_Bcast(&analytic, 1, MPI_DOUBLE, owner, MPI_COMM_WORLD);
        INFO("input " << "qkv"[which] << " channel " << c << " token " << t
                      << (causal ? " causal" : ""));
        CHECK(numeric == Approx(analytic).epsilon(1e-6).margin(1e-8));
      }
  }
}

TEST_CASE("ring attention: bad input", "[attention][errors]") {
  const Communicator world;
  const int P = world.size();
  const Decomposition d({Index(2 * P + 1)}, {P});
  const auto q = token_field<double>(d, 1, 6, 1, 1.0, true, "q");
  const auto k = token_field<double>(d, 1, 6, 2, 1.0, true, "k");

  SECTION("channels not divisible by heads") {
    const auto q5 = token_field<double>(d, 1, 5, 3, 1.0, false, "q5");
    const std::string message =
        test::error_message_of([&] { ring_attention(world, q5, q5, q5, 2, false); });
    CHECK_THAT(message, Contains("channels 5 not divisible by heads 2"));
    CHECK(test::ranks_with_error(message) == P);
  }
  SECTION("q, k, v layouts differ") {
    const auto v4 = token_field<double>(d, 1, 4, 3, 1.0, false, "v4");
    std::string message = test::error_message_of([&] { ring_attention(world, q, k, v4, 2, false); });
    CHECK_THAT(message, Contains("layouts differ"));
    CHECK_THAT(message, Contains("'v4' has batch 1, channels 4"));
    CHECK(test::ranks_with_error(message) == P);
    const Decomposition longer({Index(2 * P + 3)}, {P});
    const auto k_long = token_field<double>(longer, 1, 6, 3, 1.0, false, "k_long");
    message = test::error_message_of([&] { ring_attention(world, q, k_long, k_long, 2, false); });
    CHECK_THAT(message, Contains(std::to_string(2 * P + 3) + " tokens"));
    CHECK(test::ranks_with_error(message) == P);
  }
  SECTION("fewer tokens than ranks") {
    if (P > 1) {
      // A one-part decomposition of P - 1 tokens, used over all P ranks.
      const Decomposition small({Index(P - 1)}, {1});
      ShardTensor<double> t(small, 0, 1, 2);
      test::fill(t, [](Index, Index c, const SpatialIndex&, const SpatialIndex& g) {
        return 0.5 + c + g[0];
      });
      const auto x = Variable<double>::field(t);
      const std::string message =
          test::error_message_of([&] { ring_attention(world, x, x, x, 1, false); });
      CHECK_THAT(message, Contains("fewer tokens (" + std::to_string(P - 1) + ") than ranks (" +
                                   std::to_string(P) + ")"));
      CHECK(test::ranks_with_error(message) == P);
    }
  }
}
