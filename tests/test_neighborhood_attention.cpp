// Neighbourhood attention: sharded over all ranks == a plain single-rank window attention on
// the gathered field (outputs and q/k/v gradients) for 1-D, 2-D and 3-D fields, balanced and
// uneven splits, periodic and open axes, odd and even windows, dilation, several heads and
// q = k = v; finite differences in double; bad input.

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

/// The plain reference, in double on host, from gathered (N, C, X, Y, Z) arrays: for every
/// query cell the list of its keys (wrapped along periodic axes, dropped past open
/// boundaries), softmax of the scaled scores, weighted sum; backward by the textbook formulas.
struct Reference {
  std::vector<double> out, dq, dk, dv;  // (N, C, X, Y, Z) C order, like a gathered field
};

template <class V>
Reference reference_attention(const V& q, const V& k, const V& v, const V& dout,
                              const Decomposition& d, const NeighborhoodAttentionOptions& o) {
  const Index N = q.extent(0), C = q.extent(1), D = C / o.heads;
  const Index X = q.extent(2), Y = q.extent(3), Z = q.extent(4);
  const double scale = 1.0 / std::sqrt(double(D));
  auto option = [&](const std::vector<Index>& values, int a) {
    return a >= d.ndims() ? Index(1) : values.size() == 1 ? values[0] : values[a];
  };
  Reference r;
  r.out.assign(N * C * X * Y * Z, 0);
  r.dq = r.dk = r.dv = r.out;
  auto at = [&](Index n, Index c, const SpatialIndex& g) {
    return (((n * C + c) * X + g[0]) * Y + g[1]) * Z + g[2];
  };
  const SpatialIndex extent{X, Y, Z};
  for (Index n = 0; n < N; ++n)
    for (Index gx = 0; gx < X; ++gx)
      for (Index gy = 0; gy < Y; ++gy)
        for (Index gz = 0; gz < Z; ++gz) {
          const SpatialIndex query{gx, gy, gz};
          // The keys of this query.
          std::vector<SpatialIndex> keys;
          SpatialIndex w;
          for (w[0] = 0; w[0] < option(o.window, 0); ++w[0])
            for (w[1] = 0; w[1] < option(o.window, 1); ++w[1])
              for (w[2] = 0; w[2] < option(o.window, 2); ++w[2]) {
                SpatialIndex key;
                bool inside = true;
                for (int a = 0; a < 3; ++a) {
                  const Index window = option(o.window, a), dilation = option(o.dilation, a);
                  key[a] = query[a] + dilation * (w[a] - (window - 1) / 2);
                  if (d.periodic(a))
                    key[a] = ((key[a] % extent[a]) + extent[a]) % extent[a];
                  else if (key[a] < 0 || key[a] >= extent[a])
                    inside = false;
                }
                if (inside) keys.push_back(key);
              }
          const std::size_t K = keys.size();
          for (Index h = 0; h < o.heads; ++h) {
            auto ch = [&](Index j) { return h * D + j; };
            std::vector<double> P(K), dP(K);
            double mx = -INFINITY;
            for (std::size_t j = 0; j < K; ++j) {
              double s = 0;
              for (Index c = 0; c < D; ++c)
                s += double(q(n, ch(c), gx, gy, gz)) *
                     k(n, ch(c), keys[j][0], keys[j][1], keys[j][2]);
              P[j] = scale * s;
              mx = std::max(mx, P[j]);
            }
            double sum = 0;
            for (std::size_t j = 0; j < K; ++j) sum += (P[j] = std::exp(P[j] - mx));
            for (std::size_t j = 0; j < K; ++j) P[j] /= sum;
            double rowsum = 0;
            for (std::size_t j = 0; j < K; ++j) {
              double s = 0;
              for (Index c = 0; c < D; ++c) {
                const double vj = v(n, ch(c), keys[j][0], keys[j][1], keys[j][2]);
                r.out[at(n, ch(c), query)] += P[j] * vj;
                s += double(dout(n, ch(c), gx, gy, gz)) * vj;
              }
              dP[j] = s;
              rowsum += P[j] * s;
            }
            for (std::size_t j = 0; j < K; ++j) {
              const double ds = P[j] * (dP[j] - rowsum);
              for (Index c = 0; c < D; ++c) {
                r.dv[at(n, ch(c), keys[j])] += P[j] * dout(n, ch(c), gx, gy, gz);
                r.dq[at(n, ch(c), query)] +=
                    scale * ds * k(n, ch(c), keys[j][0], keys[j][1], keys[j][2]);
                r.dk[at(n, ch(c), keys[j])] += scale * ds * q(n, ch(c), gx, gy, gz);
              }
            }
          }
        }
  return r;
}

template <class V>
double relative_error_to(const V& gathered, const std::vector<double>& ref) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gathered);
  CHECK(host.span() == ref.size());
  if (host.span() != ref.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(double(host.data()[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / scale;
}

/// Random field (never zeros); with `ghost_width`, ghost cells hold junk the op must ignore.
template <class T>
Variable<T> random_field(const Decomposition& d, Index batch, Index channels, std::uint64_t seed,
                         double amplitude, bool requires_grad, const char* name,
                         int ghost_width = 0) {
  ShardTensor<T> t(d, test::world_rank(), batch, channels,
                   GhostWidths::uniform(ghost_width, d.ndims()));
  test::fill(t, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex& g) {
    if (test::is_ghost(t, local)) return 1e3;
    return amplitude * hashed_uniform(seed, test::global_linear_index(d, channels, n, c, g));
  });
  return Variable<T>::field(t, requires_grad, name);
}

std::string describe(const NeighborhoodAttentionOptions& o) {
  std::ostringstream os;
  auto list = [&](const std::vector<Index>& values) {
    for (std::size_t i = 0; i < values.size(); ++i) os << (i ? "x" : "") << values[i];
  };
  os << "heads " << o.heads << ", window ";
  list(o.window);
  os << ", dilation ";
  list(o.dilation);
  return os.str();
}

template <class T>
void check_against_reference(const Decomposition& d, Index batch, Index head_dim,
                             const NeighborhoodAttentionOptions& options, bool self_attention,
                             int ghost_width = 0) {
  const double tolerance = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  const Communicator world;
  const Index C = options.heads * head_dim;
  const auto q = random_field<T>(d, batch, C, 31, 1.5, true, "q", ghost_width);
  const auto k = self_attention ? q : random_field<T>(d, batch, C, 32, 1.5, true, "k");
  const auto v = self_attention ? q : random_field<T>(d, batch, C, 33, 1.0, true, "v", ghost_width);
  const Variable<T> out = neighborhood_attention(world, q, k, v, options);
  const Variable<T> loss = test::weighted_sum(world, out);  // dO = random weights (seed 23)
  backward(loss);

  const auto weights =
      test::random_shard<T>(out.value().decomposition(), world.rank(), batch, C, 23);
  const auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                      all_gather(world, q.value()));
  const auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                      all_gather(world, k.value()));
  const auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                      all_gather(world, v.value()));
  const auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                      all_gather(world, weights));
  const Reference ref = reference_attention(hq, hk, hv, hw, d, options);

  INFO("decomposition " << d.describe() << ", " << describe(options) << ", head_dim " << head_dim
                        << ", batch " << batch << (self_attention ? ", q = k = v" : "")
                        << (ghost_width ? ", inputs with ghosts" : ""));
  CHECK(out.value().ghosts().none());
  CHECK(out.value().decomposition() == d);
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

NeighborhoodAttentionOptions options_of(int heads, std::vector<Index> window,
                                        std::vector<Index> dilation) {
  NeighborhoodAttentionOptions o;
  o.heads = heads;
  o.window = std::move(window);
  o.dilation = std::move(dilation);
  return o;
}

/// Largest halo width of the options: decompositions with fewer cells per rank are skipped.
Index halo_width(const NeighborhoodAttentionOptions& o, int ndims) {
  Index widest = 0;
  for (int a = 0; a < ndims; ++a) {
    const Index w = o.window.size() == 1 ? o.window[0] : o.window[a];
    const Index dil = o.dilation.size() == 1 ? o.dilation[0] : o.dilation[a];
    widest = std::max(widest, dil * (w - 1 - (w - 1) / 2));
  }
  return std::max<Index>(widest, 1);
}

/// Decompositions of a field of `extents` over `nranks` ranks to test: up to three process
/// grids (the automatic one first) whose balanced split leaves every rank at least
/// `min_cells` cells per axis (the halo width), each balanced and uneven (the first part along
/// every split axis exactly `min_cells` long).
std::vector<Decomposition> decompositions(const std::vector<Index>& extents, int nranks,
                                          const std::vector<bool>& periodic, Index min_cells) {
  const int ndims = static_cast<int>(extents.size());
  auto fits = [&](const std::vector<int>& grid) {
    for (int a = 0; a < ndims; ++a)
      if (extents[a] / grid[a] < min_cells) return false;
    return true;
  };
  std::vector<std::vector<int>> grids;
  try {
    const std::vector<int> automatic = choose_process_grid(extents, nranks);
    if (fits(automatic)) grids.push_back(automatic);
  } catch (const Error&) {
  }
  for (const auto& grid : test::process_grids(nranks, ndims))
    if (grids.size() < 3 && fits(grid) && std::find(grids.begin(), grids.end(), grid) == grids.end())
      grids.push_back(grid);
  std::vector<Decomposition> out;
  for (const auto& grid : grids) {
    const Decomposition balanced(extents, grid, periodic);
    out.push_back(balanced);
    std::vector<std::vector<Index>> points;
    bool possible = true;
    for (int a = 0; a < ndims; ++a) {
      if (grid[a] == 1) {
        points.push_back({0, extents[a]});
        continue;
      }
      std::vector<Index> p{0};
      for (Index r : balanced_split_points(extents[a] - min_cells, grid[a] - 1))
        p.push_back(min_cells + r);
      possible = possible && (extents[a] - min_cells) / (grid[a] - 1) >= min_cells;
      points.push_back(p);
    }
    if (!possible) continue;
    const Decomposition uneven = Decomposition::from_split_points(points, periodic);
    if (uneven != balanced) out.push_back(uneven);
  }
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("neighborhood attention 1-D: sharded equals single-rank reference",
                   "[attention][neighborhood]", float, double) {
  const int P = test::world_size();
  const Index extent = 23;
  for (bool periodic : {false, true}) {
    // Odd window; even window (one more key above); dilation 2.
    for (const auto& o : {options_of(2, {5}, {1}), options_of(1, {4}, {1}),
                          options_of(2, {3}, {2})}) {
      for (const Decomposition& d :
           decompositions({extent}, P, {periodic}, halo_width(o, 1)))
        check_against_reference<TestType>(d, 2, 3, o, false);
    }
  }
  // Very uneven: every rank but the last holds 2 cells (the halo width), open and periodic.
  if (P > 1) {
    std::vector<Index> points;
    for (int r = 0; r < P; ++r) points.push_back(2 * r);
    points.push_back(2 * P + 9);
    for (bool periodic : {false, true})
      check_against_reference<TestType>(Decomposition::from_split_points({points}, {periodic}), 1,
                                        4, options_of(2, {4}, {1}), true);
  }
}

TEMPLATE_TEST_CASE("neighborhood attention 2-D: sharded equals single-rank reference",
                   "[attention][neighborhood]", float, double) {
  const int P = test::world_size();
  const std::vector<Index> extents{11, 10};
  struct Case {
    NeighborhoodAttentionOptions options;
    std::vector<bool> periodic;
    bool self_attention;
    int ghost_width;
  };
  const std::vector<Case> cases{
      {options_of(2, {3}, {1}), {false, false}, false, 1},          // odd, open, inputs with ghosts
      {options_of(2, {4, 3}, {1, 2}), {true, false}, false, 0},     // even x dilated, mixed axes
      {options_of(1, {2, 5}, {2, 1}), {false, true}, true, 0},      // q = k = v
      {options_of(2, {5}, {2}), {true, true}, false, 0},            // fully periodic, dilated
  };
  for (const Case& c : cases)
    for (const Decomposition& d :
         decompositions(extents, P, c.periodic, halo_width(c.options, 2)))
      check_against_reference<TestType>(d, 1, 2, c.options, c.self_attention, c.ghost_width);
}

TEMPLATE_TEST_CASE("neighborhood attention 3-D: sharded equals single-rank reference",
                   "[attention][neighborhood]", float, double) {
  const int P = test::world_size();
  const std::vector<Index> extents{7, 6, 5};
  struct Case {
    NeighborhoodAttentionOptions options;
    std::vector<bool> periodic;
    bool self_attention;
  };
  const std::vector<Case> cases{
      {options_of(2, {3}, {1}), {false, true, false}, false},
      {options_of(2, {2, 3, 4}, {2, 1, 1}), {true, false, true}, true},
  };
  for (const Case& c : cases)
    for (const Decomposition& d :
         decompositions(extents, P, c.periodic, halo_width(c.options, 3)))
      check_against_reference<TestType>(d, 1, 2, c.options, c.self_attention);
}

TEST_CASE("neighborhood attention: finite-difference gradients in double",
          "[attention][neighborhood]") {
  const Communicator world;
  const int P = world.size();
  const auto grid = test::process_grids(P, 2).front();  // 1 x P: split the second axis
  const Decomposition d({Index(7), Index(std::max(4 * P, 6))}, {grid[0], grid[1]},
                        {true, false});
  const auto options = options_of(2, {3, 4}, {2, 1});
  const Index batch = 1, C = 4;
  const auto q = random_field<double>(d, batch, C, 41, 1.5, true, "q");
  const auto k = random_field<double>(d, batch, C, 42, 1.5, true, "k");
  const auto v = random_field<double>(d, batch, C, 43, 1.0, true, "v");
  backward(test::weighted_sum(world, neighborhood_attention(world, q, k, v, options)));
  const Variable<double>* inputs[3] = {&q, &k, &v};
  for (int which = 0; which < 3; ++which)
    for (int probe = 0; probe < 3; ++probe) {
      const SpatialIndex g{Index(hash_bits(which, probe) % 7),
                           Index(hash_bits(probe, which + 10) % std::uint64_t(d.global_extent(1))),
                           0};
      const Index c = (which + probe) % C;
      const int owner = d.owner(g);
      const ShardTensor<double>& x = inputs[which]->value();
      auto loss_at = [&](double delta) {
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.view());
        const SpatialIndex l = x.to_local(g);
        if (world.rank() == owner) host(0, c, l[0], l[1], l[2]) += delta;
        Kokkos::deep_copy(x.view(), host);
        const auto qn = Variable<double>::field(q.value()), kn = Variable<double>::field(k.value()),
                   vn = Variable<double>::field(v.value());
        const double loss =
            test::weighted_sum(world, neighborhood_attention(world, qn, kn, vn, options)).item();
        if (world.rank() == owner) host(0, c, l[0], l[1], l[2]) -= delta;
        Kokkos::deep_copy(x.view(), host);
        return loss;
      };
      const double eps = 1e-6;
      const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
      double analytic = 0;
      if (world.rank() == owner) {
        const ShardTensor<double>& grad = inputs[which]->grad();
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad.view());
        const SpatialIndex l = grad.to_local(g);
        analytic = host(0, c, l[0], l[1], l[2]);
      }
      MPI_Bcast(&analytic, 1, MPI_DOUBLE, owner, MPI_COMM_WORLD);
      INFO("input " << "qkv"[which] << " channel " << c << " cell (" << g[0] << ", " << g[1]
                    << ")");
      CHECK(numeric == Approx(analytic).epsilon(1e-6).margin(1e-8));
    }
}

TEST_CASE("neighborhood attention: bad input", "[attention][neighborhood][errors]") {
  const Communicator world;
  const int P = world.size();
  const Decomposition d({Index(3 * P + 2)}, {P});
  const auto q = random_field<double>(d, 1, 6, 1, 1.0, true, "q");
  const auto k = random_field<double>(d, 1, 6, 2, 1.0, true, "k");
  auto error_of = [&](const Variable<double>& a, const Variable<double>& b,
                      const Variable<double>& c, const NeighborhoodAttentionOptions& o) {
    return test::error_message_of([&] { neighborhood_attention(world, a, b, c, o); });
  };
  auto expect = [&](const std::string& message, const std::string& part) {
    CHECK_THAT(message, Contains("neighborhood_attention: "));
    CHECK_THAT(message, Contains(part));
    CHECK(test::ranks_with_error(message) == P);
  };

  SECTION("channels not divisible by heads") {
    const auto q5 = random_field<double>(d, 1, 5, 3, 1.0, false, "q5");
    expect(error_of(q5, q5, q5, options_of(2, {3}, {1})), "channels 5 not divisible by heads 2");
    expect(error_of(q, q, q, options_of(0, {3}, {1})), "heads must be at least 1, got 0");
  }
  SECTION("window and dilation below 1, wrong number of entries") {
    expect(error_of(q, k, k, options_of(2, {0}, {1})), "window 0 along axis 0 must be at least 1");
    expect(error_of(q, k, k, options_of(2, {3}, {0})),
           "dilation 0 along axis 0 must be at least 1");
    expect(error_of(q, k, k, options_of(2, {3, 3}, {1})),
           "window has 2 entries; give one (every axis) or one per axis of the 1-D field");
  }
  SECTION("window wider than the field") {
    const Index extent = 3 * P + 2;
    expect(error_of(q, k, k, options_of(2, {extent + 1}, {1})),
           "window " + std::to_string(extent + 1) + " with dilation 1 spans " +
               std::to_string(extent + 1) + " cells along axis 0, more than the global extent " +
               std::to_string(extent));
    // Dilated: (3 - 1) * dilation + 1 > extent.
    const Index dilation = extent / 2 + 1;
    expect(error_of(q, k, k, options_of(2, {3}, {dilation})),
           "spans " + std::to_string(2 * dilation + 1) + " cells along axis 0");
    const Decomposition periodic({extent}, {P}, {true});
    const auto qp = random_field<double>(periodic, 1, 2, 4, 1.0, false, "qp");
    expect(error_of(qp, qp, qp, options_of(1, {extent + 2}, {1})), "(periodic)");
  }
  SECTION("local extent smaller than the halo width") {
    if (P > 1) {
      // Rank 0 owns 1 cell; a window of 5 needs 2 from it.
      std::vector<Index> points{0, 1};
      for (Index p : balanced_split_points(4 * (P - 1), P - 1)) points.push_back(1 + p);
      points.erase(points.begin() + 2);  // the duplicate 1 (balanced points start at 0)
      const Decomposition uneven = Decomposition::from_split_points({points});
      const auto x = random_field<double>(uneven, 1, 2, 5, 1.0, false, "x");
      expect(error_of(x, x, x, options_of(1, {5}, {1})),
             "halo width 2 (window 5, dilation 1) along axis 0 exceeds the local extent 1 of "
             "rank 0");
    }
  }
  SECTION("q, k, v layouts differ") {
    const auto v4 = random_field<double>(d, 1, 4, 3, 1.0, false, "v4");
    std::string message = error_of(q, k, v4, options_of(2, {3}, {1}));
    expect(message, "layouts differ");
    CHECK_THAT(message, Contains("'v4' has batch 1, channels 4"));
    const Decomposition longer({Index(3 * P + 4)}, {P});
    const auto k_long = random_field<double>(longer, 1, 6, 3, 1.0, false, "k_long");
    message = error_of(q, k_long, k_long, options_of(2, {3}, {1}));
    expect(message, "layouts differ");
    CHECK_THAT(message, Contains(std::to_string(3 * P + 4)));
  }
  SECTION("batch differs between ranks") {
    if (P > 1) {
      const Index batch = world.rank() == P - 1 ? 2 : 1;
      const auto x = random_field<double>(d, batch, 2, 6, 1.0, false, "x");
      expect(error_of(x, x, x, options_of(1, {3}, {1})),
             "(batch, channels) differs between ranks: rank 0 has (1,2), rank " +
                 std::to_string(P - 1) + " has (2,2)");
    }
  }
  SECTION("wrong rank count") {
    if (P > 1) {
      const Decomposition one({Index(9)}, {1});
      ShardTensor<double> t(one, 0, 1, 2);
      test::fill(t, [](Index, Index c, const SpatialIndex&, const SpatialIndex& g) {
        return 0.5 + c + g[0];
      });
      const auto x = Variable<double>::field(t);
      expect(error_of(x, x, x, options_of(1, {3}, {1})),
             "has 1 parts and this is the shard of rank 0, but the communicator has " +
                 std::to_string(P) + " ranks");
    }
  }
}
