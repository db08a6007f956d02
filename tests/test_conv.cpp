// Conv: sharded == single rank (outputs, input and parameter gradients) for 1-D/2-D/3-D
// kernels with strides, dilations, every padding mode and groups, on several process grids
// and uneven splits; finite-difference gradients in double; bad input.

#include <catch2/catch.hpp>

#include "equivalence.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

struct ConvCase {
  const char* name;
  std::vector<Index> extents;
  ConvOptions options;
};

std::vector<ConvCase> conv_cases() {
  auto opts = [](int in, int out, std::vector<int> k, std::vector<int> s, std::vector<int> dil,
                 std::vector<int> pad, PaddingMode mode, int groups, bool bias) {
    ConvOptions o;
    o.in_channels = in;
    o.out_channels = out;
    o.kernel = k;
    o.stride = s;
    o.dilation = dil;
    o.padding = pad;
    o.padding_mode = mode;
    o.groups = groups;
    o.bias = bias;
    return o;
  };
  return {
      {"1-D k3 same zeros", {40}, opts(2, 3, {3}, {}, {}, {1}, PaddingMode::zeros, 1, true)},
      {"1-D k5 dilation 2 periodic",
       {44},
       opts(2, 2, {5}, {}, {2}, {4}, PaddingMode::periodic, 1, true)},
      {"1-D k4 stride 2 valid", {48}, opts(3, 2, {4}, {2}, {}, {0}, PaddingMode::zeros, 1, false)},
      {"2-D k3 same reflect",
       {20, 18},
       opts(2, 3, {3, 3}, {}, {}, {1, 1}, PaddingMode::reflect, 1, true)},
      {"2-D k3x2 stride 2x1 replicate",
       {22, 17},
       opts(2, 2, {3, 2}, {2, 1}, {}, {1, 1}, PaddingMode::replicate, 1, true)},
      {"2-D k3 groups 2 periodic",
       {16, 20},
       opts(4, 6, {3, 3}, {}, {}, {1, 1}, PaddingMode::periodic, 2, true)},
      {"2-D k2 stride 2 downsample",
       {24, 16},
       opts(2, 4, {2, 2}, {2, 2}, {}, {}, PaddingMode::zeros, 1, true)},
      {"3-D k3 same zeros",
       {12, 10, 9},
       opts(2, 2, {3, 3, 3}, {}, {}, {1, 1, 1}, PaddingMode::zeros, 1, true)},
      {"3-D k3 stride 2 periodic",
       {16, 12, 10},
       opts(2, 3, {3, 3, 3}, {2, 2, 2}, {}, {1, 1, 1}, PaddingMode::periodic, 1, true)},
      {"3-D k3 dilation 2 reflect depthwise",
       {16, 14, 12},
       opts(3, 3, {3, 3, 3}, {}, {2, 1, 2}, {2, 1, 2}, PaddingMode::reflect, 3, false)},
  };
}

/// The cases plus wider ones for the float vector kernels (AVX-512 CPUs): channel counts
/// past one tile (8 outputs, 12 taps, 32 gradient channels) and z rows that are not a
/// multiple of 16 cells. Too large for the finite-difference checks.
std::vector<ConvCase> all_conv_cases() {
  std::vector<ConvCase> cases = conv_cases();
  ConvOptions wide;
  wide.in_channels = 20;
  wide.out_channels = 17;
  wide.kernel = {3, 3, 3};
  wide.padding = {1, 1, 1};
  cases.push_back({"3-D k3 same zeros 20->17 channels", {10, 8, 21}, wide});
  ConvOptions periodic = wide;
  periodic.in_channels = 9;
  periodic.out_channels = 35;
  periodic.padding_mode = PaddingMode::periodic;
  cases.push_back({"3-D k3 same periodic 9->35 channels", {8, 6, 19}, periodic});
  // 2-D fields run on the rotated (1, x, y) view, through the same vector kernels.
  ConvOptions wide_2d = wide;
  wide_2d.kernel = {3, 3};
  wide_2d.padding = {1, 1};
  cases.push_back({"2-D k3 same zeros 20->17 channels", {100, 37}, wide_2d});
  return cases;
}

template <class T>
test::ModuleFactory<T> conv_factory(const ConvOptions& options) {
  return [options](const Communicator& comm) {
    return std::make_shared<Conv<T>>(comm, options, "conv");
  };
}

/// Workspace bytes for the 2-D wide case on one rank: enough for the vector kernels when the
/// input gradient's padded source is copied band by band, too little for whole planes.
constexpr std::size_t band_copies_workspace = 200000;

/// Fewest cells a shard needs along an axis for this convolution to split.
Index min_cells(const ConvOptions& o) {
  Index need = 2;
  for (std::size_t d = 0; d < o.kernel.size(); ++d) {
    const int dilation = o.dilation.empty() ? 1 : o.dilation[d];
    const int padding = o.padding.empty() ? 0 : o.padding[d];
    const int stride = o.stride.empty() ? 1 : o.stride[d];
    need = std::max<Index>(need, std::max(dilation * (o.kernel[d] - 1), padding + 1) + stride);
  }
  return need;
}

}  // namespace

TEMPLATE_TEST_CASE("Conv sharded equals Conv on one rank", "[conv][equivalence]", float, double) {
  const int nranks = test::world_size();
  for (const ConvCase& c : all_conv_cases()) {
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(),
                                     c.options.padding_mode == PaddingMode::periodic);
    const auto decompositions =
        test::test_decompositions(c.extents, nranks, periodic, min_cells(c.options));
    for (const Decomposition& d : decompositions)
      test::check_equivalence<TestType>(conv_factory<TestType>(c.options), d, 2,
                                        c.options.in_channels);
  }
}

TEMPLATE_TEST_CASE("the GEMM path and vector kernels equal the direct loop, also in one-row chunks",
                   "[conv]", float, double) {
  const double tolerance = std::is_same<TestType, float>::value ? 2e-6 : 1e-13;
  for (const ConvCase& c : all_conv_cases()) {
    INFO(c.name);
    const Communicator comm;
    const std::vector<bool> periodic(c.extents.size(), false);
    const auto decompositions =
        test::test_decompositions(c.extents, comm.size(), periodic, min_cells(c.options));
    if (decompositions.empty()) continue;
    ConvOptions direct = c.options, chunked = c.options, gemm_only = c.options,
                banded = c.options;
    direct.algorithm = ConvAlgorithm::direct;
    chunked.workspace_bytes = 1;  // one z row of outputs per chunk
    gemm_only.vector_kernels = false;  // the GEMM path also where the vector kernels apply
    banded.workspace_bytes = band_copies_workspace;  // vector kernels, band copies (2-D)
    const auto run = [&](const ConvOptions& o) {
      return test::run_module<TestType>(conv_factory<TestType>(o), comm, decompositions.front(), 2,
                                        c.options.in_channels, test::weighted_sum<TestType>);
    };
    const auto reference = run(direct);
    for (const auto& fast : {run(c.options), run(chunked), run(gemm_only), run(banded)}) {
      CHECK(test::relative_error(fast.output.value().view(), reference.output.value().view()) <=
            tolerance);
      CHECK(test::relative_error(fast.input.grad().view(), reference.input.grad().view()) <=
            tolerance);
      const auto p = fast.module->named_parameters(), q = reference.module->named_parameters();
      for (std::size_t i = 0; i < p.size(); ++i)
        CHECK(test::relative_error(p[i].second.data_grad(), q[i].second.data_grad()) <= tolerance);
    }
  }
}

TEST_CASE("Conv gradients match finite differences", "[conv][gradient]") {
  const int nranks = test::world_size();
  for (const ConvCase& c : conv_cases()) {
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(),
                                     c.options.padding_mode == PaddingMode::periodic);
    const auto decompositions =
        test::test_decompositions(c.extents, nranks, periodic, min_cells(c.options));
    if (decompositions.empty()) continue;
    test::check_gradients_by_finite_differences(conv_factory<double>(c.options),
                                                decompositions.back(), 1, c.options.in_channels);
  }
}

TEST_CASE("Conv rejects bad input naming layer, dim and values", "[conv][errors]") {
  const Communicator comm;
  const int p = comm.size();
  ConvOptions o;
  o.in_channels = 2;
  o.out_channels = 2;
  o.kernel = {3, 3};
  o.padding = {1, 1};
  Conv<float> conv(comm, o, "c1");
  {  // channel mismatch
    const Decomposition d = Decomposition::automatic({16, 16}, p);
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 3));
    CHECK_THROWS_WITH(conv.forward(x),
                      Contains("Conv2d 'c1': input has 3 channels, the layer expects 2"));
  }
  {  // a local extent smaller than the halo (2 cells per rank, halo 3)
    ConvOptions wide = o;
    wide.kernel = {7, 1};
    wide.padding = {3, 0};
    wide.padding_mode = PaddingMode::periodic;
    Conv<float> conv7(comm, wide, "c7");
    const Decomposition d({Index(2 * p), 8}, {p, 1});
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    const std::string message = test::error_message_of([&] { conv7.forward(x); });
    CHECK(test::ranks_with_error(message) == p);
    CHECK_THAT(message, Contains("Conv2d 'c7': HaloExchange: halo width 3 exceeds local extent 2"));
  }
  if (p > 1) {  // stride that leaves a rank with no output
    ConvOptions strided = o;
    strided.kernel = {1, 1};
    strided.padding = {};
    strided.stride = {4, 1};
    Conv<float> conv_s(comm, strided, "s4");
    const Decomposition d =
        Decomposition::from_split_points({[&] {
                                            std::vector<Index> points{0};
                                            for (int r = 0; r < p; ++r)
                                              points.push_back(points.back() + (r == 0 ? 5 : 1));
                                            return points;
                                          }(),
                                          {0, 8}});
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    const std::string message = test::error_message_of([&] { conv_s.forward(x); });
    CHECK(test::ranks_with_error(message) == p);
    CHECK_THAT(message,
               Contains("Conv2d 's4': stride 4 and kernel 1 leave the ranks at grid position"));
  }
  ConvOptions bad_groups = o;
  bad_groups.groups = 3;
  CHECK_THROWS_WITH(Conv<float>(comm, bad_groups, "g"),
                    Contains("groups 3 must divide in_channels 2"));
  ConvOptions bad_stride = o;
  bad_stride.stride = {1};
  CHECK_THROWS_WITH(Conv<float>(comm, bad_stride, "s"),
                    Contains("stride has 1 values for 2 spatial dims"));
}
