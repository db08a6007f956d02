// The vision-transformer pieces (TokenLayerNorm, PositionalEmbedding, PatchEmbedding and
// PatchUnembedding, MultiHeadAttention) and the ViT model: sharded equals one rank on 1-D,
// 2-D and 3-D fields with uneven splits (outputs, input and parameter gradients), finite
// differences in double, direct references, the config builder and bad input.

#include <catch2/catch.hpp>
#include <cmath>

#include "equivalence.hpp"
#include "model_options.hpp"
#include "shardtensor/models.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

constexpr Index batch = 2;

/// Decompositions of `extents` over all ranks whose parts hold at least `min_cells` cells
/// along every axis (a multiple-of-patch condition: every rank owns a patch origin).
std::vector<Decomposition> decompositions_of(const std::vector<Index>& extents, Index min_cells,
                                             bool periodic = false) {
  return test::test_decompositions(extents, test::world_size(),
                                   std::vector<bool>(extents.size(), periodic), min_cells);
}

/// Every parameter of `m` set to base + spread * U(-1, 1), so no weight is 1 or 0.
template <class T>
void randomize_parameters(const Module<T>& m, double base, double spread) {
  std::uint64_t seed = 101;
  for (const auto& [name, p] : m.named_parameters()) {
    auto host = Kokkos::create_mirror_view(p.data());
    for (std::size_t i = 0; i < host.extent(0); ++i)
      host(i) = static_cast<T>(base + spread * hashed_uniform(seed, i));
    Kokkos::deep_copy(p.data(), host);
    ++seed;
  }
}

/// PatchEmbedding followed by PatchUnembedding back onto the input's decomposition.
template <class T>
class PatchRoundTrip : public Module<T> {
 public:
  PatchRoundTrip(const Communicator& comm, int dims, int channels, int patch, int overlap,
                 PaddingMode padding) {
    PatchEmbeddingOptions e;
    e.in_channels = channels;
    e.embed_dim = 5;
    e.patch.assign(dims, patch);
    e.overlap.assign(dims, overlap);
    e.padding_mode = padding;
    e.seed = 3;
    embed_ = std::make_shared<PatchEmbedding<T>>(comm, e, "embed");
    PatchUnembeddingOptions u;
    u.embed_dim = 5;
    u.out_channels = 2;
    u.patch.assign(dims, patch);
    u.seed = 4;
    unembed_ = std::make_shared<PatchUnembedding<T>>(comm, u, "unembed");
    this->register_module("embed", embed_);
    this->register_module("unembed", unembed_);
  }
  Variable<T> forward(const Variable<T>& x) override {
    return unembed_->forward(activate((*embed_)(x), Activation::tanh), x.value().decomposition());
  }

 private:
  std::shared_ptr<PatchEmbedding<T>> embed_;
  std::shared_ptr<PatchUnembedding<T>> unembed_;
};


}  // namespace

TEMPLATE_TEST_CASE("TokenLayerNorm: sharded equals one rank", "[vit][norm]", float, double) {
  for (const auto& extents : std::vector<std::vector<Index>>{{13}, {9, 7}, {6, 5, 4}})
    for (const Decomposition& d : decompositions_of(extents, 1)) {
      test::check_equivalence<TestType>(
          [](const Communicator& comm) {
            auto m = std::make_shared<TokenLayerNorm<TestType>>(comm, 5, 1e-5, "ln");
            randomize_parameters(*m, 1.0, 0.5);
            return m;
          },
          d, batch, 5);
    }
}

TEST_CASE("TokenLayerNorm matches a direct reference and finite differences", "[vit][norm]") {
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({9, 6}, comm.size());
  TokenLayerNorm<double> ln(comm, 4, 1e-5, "ln");
  randomize_parameters(ln, 0.5, 0.4);
  const ShardTensor<double> x = test::random_shard<double>(d, comm.rank(), batch, 4, 5);
  const ShardTensor<double> y = ln(Variable<double>::field(x)).value();
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.view());
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
  auto w = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ln.weight().data());
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ln.bias().data());
  double worst = 0;
  for (Index n = 0; n < batch; ++n)
    for (Index i = 0; i < x.local_extent(0); ++i)
      for (Index j = 0; j < x.local_extent(1); ++j) {
        double mean = 0, var = 0;
        for (Index c = 0; c < 4; ++c) mean += hx(n, c, i, j, 0) / 4;
        for (Index c = 0; c < 4; ++c)
          var += (hx(n, c, i, j, 0) - mean) * (hx(n, c, i, j, 0) - mean) / 4;
        for (Index c = 0; c < 4; ++c) {
          const double expect = (hx(n, c, i, j, 0) - mean) / std::sqrt(var + 1e-5) * w(c) + b(c);
          worst = std::max(worst, std::abs(hy(n, c, i, j, 0) - expect));
        }
      }
  CHECK(worst <= 1e-13);
  test::check_gradients_by_finite_differences(
      [](const Communicator& c) {
        auto m = std::make_shared<TokenLayerNorm<double>>(c, 4, 1e-5, "ln");
        randomize_parameters(*m, 1.0, 0.5);
        return m;
      },
      decompositions_of({9, 7}, 1).back(), batch, 4);
}

TEMPLATE_TEST_CASE("PositionalEmbedding: sharded equals one rank", "[vit][position]", float,
                   double) {
  for (const auto& extents : std::vector<std::vector<Index>>{{11}, {6, 9}, {4, 5, 6}})
    for (PositionKind kind : {PositionKind::sincos, PositionKind::learned})
      for (const Decomposition& d : decompositions_of(extents, 1))
        test::check_equivalence<TestType>(
            [&](const Communicator& comm) {
              return std::make_shared<PositionalEmbedding<TestType>>(comm, kind, 7, extents, 5,
                                                                     "pos");
            },
            d, batch, 7);
}

TEST_CASE("PositionalEmbedding values and gradients", "[vit][position]") {
  const Communicator comm;
  // sincos: channel 2f of axis a is sin(10000^(-f / F) t_a), 2f + 1 the cosine; 9 channels
  // in 2-D give 4 per axis (F = 2) and one zero channel.
  const Decomposition d = Decomposition::automatic({6, 9}, comm.size());
  PositionalEmbedding<double> pos(comm, PositionKind::sincos, 9);
  const ShardTensor<double> zero(d, comm.rank(), 1, 9);
  const ShardTensor<double> y = pos(Variable<double>::field(zero)).value();
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
  double worst = 0;
  for (Index i = 0; i < y.local_extent(0); ++i)
    for (Index j = 0; j < y.local_extent(1); ++j) {
      const double t[2] = {double(y.to_global(0, i)), double(y.to_global(1, j))};
      for (Index c = 0; c < 9; ++c) {
        double expect = 0;
        if (c < 8) {
          const double w = std::pow(10000.0, -double((c % 4) / 2) / 2.0);
          expect = c % 2 == 0 ? std::sin(w * t[c / 4]) : std::cos(w * t[c / 4]);
        }
        worst = std::max(worst, std::abs(hy(0, c, i, j, 0) - expect));
      }
    }
  CHECK(worst <= 1e-15);
  test::check_gradients_by_finite_differences(
      [](const Communicator& c) {
        return std::make_shared<PositionalEmbedding<double>>(c, PositionKind::learned, 3,
                                                             std::vector<Index>{7, 6}, 9, "pos");
      },
      decompositions_of({7, 6}, 1).back(), batch, 3);
}

TEMPLATE_TEST_CASE("PatchEmbedding and PatchUnembedding: sharded equals one rank", "[vit][patch]",
                   float, double) {
  struct Case {
    std::vector<Index> extents;
    int patch, overlap;
    bool periodic;
  };
  for (const Case& c : std::vector<Case>{{{16}, 2, 0, false},
                                         {{12, 8}, 2, 0, false},
                                         {{12, 8}, 2, 1, false},
                                         {{12, 9}, 3, 1, true},
                                         {{8, 4, 6}, 2, 1, false}})
    for (const Decomposition& d : decompositions_of(c.extents, c.patch, c.periodic)) {
      INFO(c.extents.size() << "-D, patch " << c.patch << ", overlap " << c.overlap);
      test::check_equivalence<TestType>(
          [&](const Communicator& comm) {
            return std::make_shared<PatchRoundTrip<TestType>>(
                comm, int(c.extents.size()), 3, c.patch, c.overlap,
                c.periodic ? PaddingMode::periodic : PaddingMode::zeros);
          },
          d, batch, 3);
    }
}

TEST_CASE("PatchEmbedding is a strided convolution; gradients by finite differences",
          "[vit][patch]") {
  const Communicator comm;
  // A token is the sum over its patch of weight * field + bias.
  const Decomposition d = Decomposition::automatic({16, 6}, comm.size(), {}, {0, 1});
  PatchEmbeddingOptions o;
  o.in_channels = 2;
  o.embed_dim = 3;
  o.patch = {2, 3};
  PatchEmbedding<double> embed(comm, o, "pe");
  const ShardTensor<double> x = test::random_shard<double>(d, comm.rank(), 1, 2, 8);
  const auto full = all_gather(comm, x);
  const ShardTensor<double> tokens = embed(Variable<double>::field(x)).value();
  CHECK(tokens.decomposition().global_extent(0) == 8);
  CHECK(tokens.decomposition().global_extent(1) == 2);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
  auto ht = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens.view());
  const auto params = embed.named_parameters();
  auto w = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), params[0].second.data());
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), params[1].second.data());
  double worst = 0;
  for (Index e = 0; e < 3; ++e)
    for (Index i = 0; i < tokens.local_extent(0); ++i)
      for (Index j = 0; j < tokens.local_extent(1); ++j) {
        const Index ti = tokens.to_global(0, i), tj = tokens.to_global(1, j);
        double expect = b(e);
        for (Index c = 0; c < 2; ++c)
          for (Index a = 0; a < 2; ++a)
            for (Index bb = 0; bb < 3; ++bb)
              expect += w(((e * 2 + c) * 2 + a) * 3 + bb) * hx(0, c, 2 * ti + a, 3 * tj + bb, 0);
        worst = std::max(worst, std::abs(ht(0, e, i, j, 0) - expect));
      }
  CHECK(worst <= 1e-14);
  test::check_gradients_by_finite_differences(
      [](const Communicator& c) {
        return std::make_shared<PatchRoundTrip<double>>(c, 2, 2, 2, 1, PaddingMode::zeros);
      },
      decompositions_of({8, 12}, 2).back(), batch, 2);
}

TEMPLATE_TEST_CASE("MultiHeadAttention: sharded equals one rank", "[vit][attention]", float,
                   double) {
  struct Case {
    std::vector<Index> extents;
    AttentionKind kind;
  };
  for (const Case& c : std::vector<Case>{{{13}, AttentionKind::global},
                                         {{6, 5}, AttentionKind::global},
                                         {{4, 3, 4}, AttentionKind::global},
                                         {{12}, AttentionKind::neighborhood},
                                         {{7, 6}, AttentionKind::neighborhood},
                                         {{4, 4, 5}, AttentionKind::neighborhood}})
    for (const Decomposition& d : decompositions_of(c.extents, 2)) {
      INFO(c.extents.size() << "-D, " << (c.kind == AttentionKind::global ? "global" : "window"));
      test::check_equivalence<TestType>(
          [&](const Communicator& comm) {
            MultiHeadAttentionOptions o;
            o.dims = int(c.extents.size());
            o.channels = 6;
            o.heads = 2;
            o.kind = c.kind;
            o.window = {3};
            o.seed = 5;
            return std::make_shared<MultiHeadAttention<TestType>>(comm, o, "mha");
          },
          d, batch, 6);
    }
}

TEMPLATE_TEST_CASE("ViT: sharded equals one rank", "[vit][model]", float, double) {
  struct Case {
    std::vector<Index> extents;
    AttentionKind attention;
    PositionKind position;
    bool input_skip;
  };
  for (const Case& c :
       std::vector<Case>{{{24}, AttentionKind::global, PositionKind::learned, false},
                         {{8, 12}, AttentionKind::global, PositionKind::sincos, true},
                         {{8, 12}, AttentionKind::neighborhood, PositionKind::learned, false},
                         {{8, 8, 6}, AttentionKind::neighborhood, PositionKind::sincos, true}})
    for (const Decomposition& d : decompositions_of(c.extents, 2)) {
      INFO(c.extents.size() << "-D");
      test::check_equivalence<TestType>(
          [&](const Communicator& comm) {
            return std::make_shared<models::ViT<TestType>>(
                comm,
                test::small_vit(int(c.extents.size()), c.attention, c.position, c.extents,
                                    c.input_skip),
                "vit");
          },
          d, batch, 3);
    }
}

TEST_CASE("ViT gradients match finite differences", "[vit][model][gradient]") {
  for (AttentionKind attention : {AttentionKind::global, AttentionKind::neighborhood})
    test::check_gradients_by_finite_differences(
        [&](const Communicator& comm) {
          return std::make_shared<models::ViT<double>>(
              comm, test::small_vit(2, attention, PositionKind::learned, {8, 12}, true), "vit");
        },
        decompositions_of({8, 12}, 2).back(), batch, 3);
}

TEST_CASE("ViT from config and bad input", "[vit][errors]") {
  const Communicator comm;
  const models::ModelShape shape{2, 3, 1, {32, 8}};
  const auto model = models::build_model<float>(YAML::Load(R"(
type: vit
patch: [4, 2]
embed_dim: 16
depth: 1
heads: 4
attention: neighborhood
window: 3
position: learned
seed: 3
)"),
                                                comm, shape);
  const auto& vit = dynamic_cast<const models::ViT<float>&>(*model);
  CHECK(vit.options().patch == std::vector<int>{4, 2});
  CHECK(vit.options().mlp_channels == 64);
  const Decomposition d = Decomposition::automatic({32, 8}, comm.size(), {}, {0, 1});
  const auto y =
      (*model)(Variable<float>::field(test::random_shard<float>(d, comm.rank(), 1, 3, 2)));
  CHECK(y.value().decomposition() == d);
  CHECK(y.value().channels() == 1);

  auto build_error = [&](const std::string& text, const models::ModelShape& s) {
    return test::error_message_of([&] { models::build_model<float>(YAML::Load(text), comm, s); });
  };
  CHECK_THAT(build_error("{type: vit, embed_dim: 10, heads: 4}", shape),
             Contains("model.heads") && Contains("heads 4 does not divide embed_dim 10"));
  CHECK_THAT(build_error("{type: vit, window: 3}", shape),
             Contains("model.window") && Contains("attention: neighborhood"));
  CHECK_THAT(build_error("{type: vit, position: learned}", {2, 3, 1}),
             Contains("model.position") && Contains("needs the field extents"));
  CHECK_THAT(build_error("{type: vit, attention: ring}", shape),
             Contains("model.attention") && Contains("accepted: global, neighborhood"));
  CHECK_THAT(build_error("{type: vit, patchs: 2}", shape), Contains("did you mean 'patch'"));

  // A field extent that is not a multiple of the patch, on every rank.
  models::ViTOptions o = test::small_vit(2, AttentionKind::global, PositionKind::sincos, {});
  o.patch = {4};
  models::ViT<float> bad(comm, o, "vit");
  const Decomposition odd = Decomposition::automatic({10, 8}, comm.size(), {}, {0, 1});
  const std::string message = test::error_message_of(
      [&] { bad(Variable<float>::field(test::random_shard<float>(odd, comm.rank(), 1, 3, 2))); });
  CHECK_THAT(message,
             Contains("field extent 10 along dim 0 is not a multiple of the patch size 4"));
  CHECK(test::ranks_with_error(message) == comm.size());
  // A learned table is for one grid only.
  models::ViT<float> learned(
      comm, test::small_vit(2, AttentionKind::global, PositionKind::learned, {8, 8}), "vit");
  const Decomposition other = Decomposition::automatic({16, 12}, comm.size(), {}, {0, 1});
  CHECK_THROWS_WITH(
      learned(Variable<float>::field(test::random_shard<float>(other, comm.rank(), 1, 3, 2))),
      Contains("learned table is for a token grid"));
  CHECK_THROWS_WITH(models::ViT<float>(comm,
                                       [] {
                                         auto o = test::small_vit(2, AttentionKind::global,
                                                                   PositionKind::sincos, {});
                                         o.heads = 3;
                                         return o;
                                       }()),
                    Contains("embed_dim 8 not divisible by heads 3"));
}
