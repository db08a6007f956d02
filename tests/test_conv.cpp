// Conv: sharded == single rank (outputs, input and parameter gradients) for 1-D/2-D/3-D
// kernels with strides, dilations, every padding mode and groups, on several process grids
// and uneven splits; every kernel family (direct, GEMM, vector kernels, the convolution
// library where the build has one) against the direct loop; finite-difference gradients in
// double; bad input.

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <random>

#include "equivalence.hpp"
#include "shardtensor/kernels/channels_last.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/kernels/timed_choice.hpp"
#include "shardtensor/kernels/vector_isa.hpp"
#include "shardtensor/layers/concat.hpp"

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
      {"2-D k1 pointwise", {14, 12}, opts(3, 2, {1, 1}, {}, {}, {}, PaddingMode::zeros, 1, true)},
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
  // Rows of 300 cells: a band's planes outgrow L2, so the vector kernels take a band in chunks
  // of output vectors (conv_vector.cpp, vectors_per_chunk).
  cases.push_back({"2-D k3 same zeros 20->17 channels, long rows", {20, 300}, wide_2d});
  // Asymmetric padding (an ONNX file's pads, a Pad node before the conv): a stride-2
  // downsampling that pads only after the field, and reflect padding wider before than after.
  ConvOptions after_only = wide_2d;
  after_only.stride = {2, 2};
  after_only.padding = {0, 0};
  after_only.padding_after = {1, 1};
  cases.push_back({"2-D k3 stride 2 padded 1 after only", {23, 20}, after_only});
  ConvOptions lopsided = wide_2d;
  lopsided.kernel = {4, 3};
  lopsided.padding = {2, 1};
  lopsided.padding_after = {1, 0};
  lopsided.padding_mode = PaddingMode::reflect;
  cases.push_back({"2-D k4x3 reflect padded (2, 1) before, (1, 0) after", {19, 22}, lopsided});
  // Pointwise: the layer reads its input in place (HaloPadding::reads_in_place).
  ConvOptions pointwise = wide;
  pointwise.kernel = {1, 1, 1};
  pointwise.padding = {};
  cases.push_back({"3-D k1 pointwise 20->17 channels", {10, 8, 21}, pointwise});
  // Enough channels and tiles for the weight gradient on Winograd's tiles too
  // (conv_winograd_gradient_pays): at 1, 2 and 4 ranks in 2-D (wrap-around, other ranks'
  // slabs), at every count in 3-D.
  ConvOptions winograd_2d = wide_2d;
  winograd_2d.in_channels = winograd_2d.out_channels = 16;
  winograd_2d.padding_mode = PaddingMode::periodic;
  cases.push_back({"2-D k3 same periodic 16->16 channels", {256, 64}, winograd_2d});
  ConvOptions winograd_3d = wide;
  winograd_3d.in_channels = 16;
  winograd_3d.out_channels = 24;
  cases.push_back({"3-D k3 same zeros 16->24 channels", {16, 16, 24}, winograd_3d});
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
  // Float: 1e-5, the CPU-vs-GPU bound, since on a GPU cuBLAS and cuDNN sum in orders of their
  // own (2.9e-6 seen on an H100); a wrong window or weight is off by far more.
  const double tolerance = std::is_same<TestType, float>::value ? 1e-5 : 1e-13;
  for (const ConvCase& c : all_conv_cases()) {
    INFO(c.name);
    const Communicator comm;
    const std::vector<bool> periodic(c.extents.size(), false);
    const auto decompositions =
        test::test_decompositions(c.extents, comm.size(), periodic, min_cells(c.options));
    if (decompositions.empty()) continue;
    ConvOptions direct = c.options, chunked = c.options, gemm_only = c.options, banded = c.options,
                portable = c.options;
    direct.algorithm = ConvAlgorithm::direct;
    // Where the build has a convolution library, c.options runs it; the others run the
    // portable kernels.
    for (ConvOptions* o : {&chunked, &gemm_only, &banded, &portable}) o->library_kernels = false;
    chunked.workspace_bytes = 1;       // one z row of outputs per chunk
    gemm_only.vector_kernels = false;  // the GEMM path also where the vector kernels apply
    banded.workspace_bytes = band_copies_workspace;  // vector kernels, band copies (2-D)
    const auto run = [&](const ConvOptions& o) {
      return test::run_module<TestType>(conv_factory<TestType>(o), comm, decompositions.front(), 2,
                                        c.options.in_channels, test::weighted_sum<TestType>);
    };
    const auto reference = run(direct);
    const auto check_close = [&](const auto& fast) {
      CHECK(test::relative_error(fast.output.value().view(), reference.output.value().view()) <=
            tolerance);
      CHECK(test::relative_error(fast.input.grad().view(), reference.input.grad().view()) <=
            tolerance);
      const auto p = fast.module->named_parameters(), q = reference.module->named_parameters();
      for (std::size_t i = 0; i < p.size(); ++i)
        CHECK(test::relative_error(p[i].second.data_grad(), q[i].second.data_grad()) <= tolerance);
    };
    for (const auto& fast :
         {run(c.options), run(chunked), run(gemm_only), run(banded), run(portable)})
      check_close(fast);
    // Every vector instruction set this CPU runs (AVX2, AVX-512, NEON): close to the direct
    // loop, and the same bits on every path (each output sums in the same order). Not where
    // the run turned the paths off (SHARDTENSOR_SIMD=off): that run checks the portable kernels.
    const std::string initial = kernels::vector_isa();
    if (initial == "off") continue;
    std::vector<std::vector<double>> first;
    for (const std::string& isa : kernels::vector_isas()) {
      INFO("vector path " << isa);
      kernels::select_vector_isa(isa);
      const ConvOptions* const vector_runs[] = {&c.options, &banded};
      for (const ConvOptions* o : vector_runs) {
        const auto fast = run(*o);
        check_close(fast);
        std::vector<double> bits = test::host_values(fast.output.value().view());
        const auto input_grad = test::host_values(fast.input.grad().view());
        bits.insert(bits.end(), input_grad.begin(), input_grad.end());
        for (const auto& named : fast.module->named_parameters()) {
          const auto g = test::host_values(named.second.data_grad());
          bits.insert(bits.end(), g.begin(), g.end());
        }
        const std::size_t which = o == &c.options ? 0 : 1;
        if (first.size() <= which)
          first.push_back(bits);
        else
          CHECK(bits == first[which]);
      }
    }
    kernels::select_vector_isa(initial);
  }
}

namespace {

template <class View>
void fill_random(const View& v, std::uint64_t seed) {
  const auto host = Kokkos::create_mirror_view(v);
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> uniform(-1, 1);
  for (std::size_t i = 0; i < host.span(); ++i)
    host.data()[i] = static_cast<typename View::value_type>(uniform(engine));
  Kokkos::deep_copy(v, host);
}

}  // namespace

TEMPLATE_TEST_CASE(
    "the convolution library's three directions equal the direct loop on a box of "
    "the padded buffer",
    "[conv][library]", float, double) {
  using T = TestType;
  using kernels::ConvShape;
  const double tolerance = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  struct Case {
    const char* name;
    ConvShape g;
    Index padded[3];  // larger than the windows' box on every side that has room
    bool common;      // a shape the library must take in every direction
  };
  // ConvShape: batch, in, out, in / groups, out / groups, kernel, stride, dilation, base, out.
  const Case cases[] = {
      {"3-D k3, the windows' box is all of the buffer (cuDNN works in place)",
       {1, 4, 4, 4, 4, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {6, 5, 7}},
       {8, 7, 9},
       true},
      {"3-D k3, windows at an offset (cuDNN works on a packed copy)",
       {2, 4, 6, 4, 6, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 2, 0}, {5, 6, 7}},
       {9, 11, 10},
       true},
      {"3-D k3x2x3, 2 groups, strides 2x1x2, dilation 2 along z",
       {1, 4, 6, 2, 3, {3, 2, 3}, {2, 1, 2}, {1, 1, 2}, {2, 0, 1}, {4, 5, 3}},
       {12, 7, 11},
       false},
      {"a rotated 2-D field (1, x, y), k1x3x3",
       {2, 3, 5, 3, 5, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, {1, 12, 9}},
       {1, 16, 13},
       true},
  };
  const ExecutionSpace space;
  for (const Case& c : cases) {
    INFO(c.name);
    const ConvShape& g = c.g;
    for (int a = 0; a < 3; ++a)  // the windows' box lies in the padded buffer
      REQUIRE(g.base[a] + (g.out[a] - 1) * g.s[a] + (g.k[a] - 1) * g.d[a] + 1 <= c.padded[a]);
    const kernels::ConvLibraryPlan<T> plan(g, c.padded, 0.25);
    // Host builds have no library; a CUDA build with cuDNN plans every one of these shapes.
    CHECK(plan.applies() == kernels::conv_library_available());
    if (!plan.applies()) continue;
    const FieldView<T> xp("xp", g.batch, g.in_channels, c.padded[0], c.padded[1], c.padded[2]);
    const FieldView<T> gy("gy", g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]);
    const ReplicatedView<T> w("w", g.out_channels * g.in_per_group * g.k[0] * g.k[1] * g.k[2]);
    const ReplicatedView<T> bias("bias", g.out_channels);
    fill_random(xp, 1), fill_random(gy, 2), fill_random(w, 3), fill_random(bias, 4);
    kernels::ConvWorkspace<T> workspace;
    // Whether the library ran a direction. It must for the common shapes; elsewhere it may
    // decline (no qualifying algorithm), and Conv then runs the portable kernel.
    const auto ran = [&](bool library_ran, const char* direction) {
      if (!library_ran && c.common) {
        std::string report;
        for (const std::string& line : kernels::conv_library_report()) report += line + "\n";
        FAIL_CHECK("the library declined the " << direction << "; its plans:\n" << report);
      }
      if (!library_ran && !c.common)
        WARN("the library has no qualifying algorithm for the " << direction);
      return library_ran;
    };

    const FieldView<T> y("y", g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]);
    const FieldView<T> y_direct("y_direct", g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]);
    if (ran(plan.forward(space, xp, w, bias, y, workspace), "forward")) {
      kernels::conv_direct_forward(space, g, xp, w, bias, y_direct);
      CHECK(test::relative_error(y, y_direct) <= tolerance);
    }

    // The cells no window reads keep their zeros; the direct loop writes zeros there.
    const FieldView<T> gxp("gxp", g.batch, g.in_channels, c.padded[0], c.padded[1], c.padded[2]);
    const FieldView<T> gxp_direct("gxp_direct", g.batch, g.in_channels, c.padded[0], c.padded[1],
                                  c.padded[2]);
    if (ran(plan.backward_data(space, gy, w, gxp, workspace), "data gradient")) {
      kernels::conv_direct_backward_data(space, g, gy, w, gxp_direct);
      CHECK(test::relative_error(gxp, gxp_direct) <= tolerance);
    }

    // The weight gradient adds to what is there.
    const ReplicatedView<T> gw("gw", w.extent(0)), gw_direct("gw_direct", w.extent(0));
    fill_random(gw, 5);
    Kokkos::deep_copy(gw_direct, gw);
    if (ran(plan.backward_weight(space, gy, xp, gw, workspace), "weight gradient")) {
      kernels::conv_backward_parameters(space, g, gy, xp, gw_direct, ReplicatedView<T>());
      CHECK(test::relative_error(gw, gw_direct) <= tolerance);
    }
  }
}

TEST_CASE("the vector weight gradient's passes over x taps change no bit", "[conv]") {
  // A wide layer on a small field (a U-Net's bottom) would need 3x its weights per thread for
  // the weight gradient's sums alone, more than its correlations: it sums one x tap per pass
  // over the bands instead (conv_vector_gradient_x_taps), each weight in the same order.
  using kernels::ConvShape;
  if (!kernels::conv_vector_kernels_available<float>()) return;
  const ExecutionSpace space;
  struct Case {
    const char* name;
    ConvShape g;
    Index padded[3];
    bool wide;  // the weight gradient would set the layer's workspace: passes of one x tap
  };
  // ConvShape: batch, in, out, in / groups, out / groups, kernel, stride, dilation, base, out.
  const Case cases[] = {
      {"32 -> 32, k3, 6x8x9 outputs (in place)",
       {2, 32, 32, 32, 32, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {6, 8, 9}},
       {8, 10, 11},
       true},
      {"24 -> 40, k3x3x2, windows past the source (copied planes)",
       {1, 24, 40, 24, 40, {3, 3, 2}, {1, 1, 1}, {1, 1, 1}, {-1, -1, 0}, {5, 9, 8}},
       {5, 9, 9},
       true},
      {"4 -> 4, k3, 12x40x40 outputs (the output gradient's ring is the most)",
       {1, 4, 4, 4, 4, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {12, 40, 40}},
       {14, 42, 42},
       false},
  };
  const std::string initial = kernels::vector_isa();
  for (const Case& c : cases)
    for (const std::string& isa : kernels::vector_isas())
      for (const bool bf16 : {false, true}) {
        INFO(c.name << ", vector path " << isa << (bf16 ? ", bf16" : ""));
        kernels::select_vector_isa(isa);
        const ConvShape& g = c.g;
        const kernels::PlanePlan plan =
            kernels::plan_planes(g, c.padded, sizeof(float), std::size_t(16) << 20, true, bf16);
        REQUIRE(plan.vector_kernels);
        CHECK(plan.gradient_x_taps == (c.wide ? 1 : g.k[0]));
        const FieldView<float> xp("xp", g.batch, g.in_channels, c.padded[0], c.padded[1],
                                  c.padded[2]);
        const FieldView<float> gy("gy", g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]);
        fill_random(xp, 11), fill_random(gy, 12);
        if (bf16) {  // a bf16 layer's output gradient holds bf16 values
          const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gy);
          for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = round_to_bfloat16(h.data()[i]);
          Kokkos::deep_copy(gy, h);
        }
        // Summing all x taps at once needs at most k[0] times a pass of one tap's workspace.
        const Kokkos::View<float*, DefaultMemorySpace> workspace("workspace", plan.values * g.k[0]);
        std::vector<std::vector<double>> results;
        for (const Index x_taps : {g.k[0], Index(2), Index(1)}) {
          kernels::PlanePlan passes = plan;
          passes.gradient_x_taps = x_taps;
          const ReplicatedView<float> gw(
              "gw", g.out_channels * g.in_per_group * g.k[0] * g.k[1] * g.k[2]);
          fill_random(gw, 13);  // the weight gradient adds to what is there
          kernels::weight_gradient_planes(space, passes, g, xp, gy, gw, workspace.data());
          results.push_back(test::host_values(gw));
        }
        CHECK(results[1] == results[0]);
        CHECK(results[2] == results[0]);
        // And close to the direct loop's sums where its windows lie inside the source (float:
        // a bf16 layer's rounded source differs).
        bool inside = true;
        for (int a = 0; a < 3; ++a)
          inside = inside && g.base[a] >= 0 && g.base[a] + g.out[a] + g.k[a] - 1 <= c.padded[a];
        if (!bf16 && inside) {
          const ReplicatedView<float> direct("direct", results[0].size());
          fill_random(direct, 13);
          kernels::conv_backward_parameters(space, g, gy, xp, direct, ReplicatedView<float>());
          const auto expected = test::host_values(direct);
          for (std::size_t i = 0; i < expected.size(); ++i)
            CHECK(results[0][i] == Approx(expected[i]).epsilon(1e-5).margin(1e-4));
        }
      }
  kernels::select_vector_isa(initial);
}

TEST_CASE("Winograd's tiles give the direct tiles' sums to rounding, the same bits on every path",
          "[conv]") {
  // The forward and the input gradient of 3x3 windows (in y and z) on Winograd's F(2x2, 3x3)
  // tiles, or F(2x4, 3x3) from 64 columns on, and the weight gradient on F(2x2, 3x3) tiles
  // against the direct register tiles: odd
  // extents (a last tile half outside), windows past the source (zeros), x taps with a dilation,
  // groups, output blocks left partly empty, wrap-around (read through band copies), and a filter
  // that keeps some bands only.
  using kernels::ConvShape;
  if (!kernels::conv_vector_kernels_available<float>()) return;
  const ExecutionSpace space;
  struct Case {
    const char* name;
    ConvShape g;
    Index padded[3];
  };
  // ConvShape: batch, in, out, in / groups, out / groups, kernel, stride, dilation, base, out.
  std::vector<Case> cases = {
      {"2-D 16 -> 12, 23x37 outputs, windows past the source",
       {2, 16, 12, 16, 12, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, -1, -1}, {1, 23, 37}},
       {1, 23, 37}},
      {"3-D 9 -> 35, x dilation 2, 6x7x19 outputs",
       {1, 9, 35, 9, 35, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {-2, -1, -1}, {6, 7, 19}},
       {6, 7, 19}},
      {"2-D 32 -> 16 in 2 groups, a padded source read in place",
       {1, 32, 16, 16, 8, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {1, 40, 18}},
       {1, 42, 20}},
      {"3-D 8 -> 8 wrapping around in y and z",
       {1, 8, 8, 8, 8, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {-1, -1, -1}, {4, 9, 10}},
       {4, 9, 10}},
      // Large enough for the weight gradient on Winograd's tiles too.
      {"2-D 16 -> 24, 4 samples of 48x45 outputs, windows past the source",
       {4, 16, 24, 16, 24, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, -1, -1}, {1, 48, 45}},
       {1, 48, 45}},
      {"2-D 32 -> 32 in 2 groups, 4 samples of 52x40 outputs",
       {4, 32, 32, 16, 16, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {1, 52, 40}},
       {1, 54, 42}},
      {"3-D 16 -> 16, x dilation 2, wrapping around in y and z, 10x15x19 outputs",
       {1, 16, 16, 16, 16, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {-2, -1, -1}, {10, 15, 19}},
       {10, 15, 19}},

      // Wide planes: the forward and input gradient on F(2x4, 3x3) tiles (64 columns and more),
      // a last tile of 1 and of 3 columns.
      {"2-D 16 -> 12, 2 samples of 20x65 outputs, windows past the source",
       {2, 16, 12, 16, 12, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, -1, -1}, {1, 20, 65}},
       {1, 20, 65}},
      {"3-D 8 -> 9, 3x7x67 outputs wrapping around in y and z",
       {1, 8, 9, 8, 9, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {-1, -1, -1}, {3, 7, 67}},
       {3, 7, 67}},
      {"2-D 32 -> 16 in 2 groups, a padded source read in place, 19x80 outputs",
       {1, 32, 16, 16, 8, {1, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {1, 19, 80}},
       {1, 21, 82}},
  };
  cases[3].g.wrap[1] = cases[3].g.wrap[2] = true;
  cases[6].g.wrap[1] = cases[6].g.wrap[2] = true;
  cases[8].g.wrap[1] = cases[8].g.wrap[2] = true;
  int winograd_gradients = 0;  // cases whose weight gradient runs on Winograd's tiles
  const std::string initial = kernels::vector_isa();
  for (const Case& c : cases) {
    INFO(c.name);
    const ConvShape& g = c.g;
    const auto plan = [&](bool winograd) {
      return kernels::plan_planes(g, c.padded, sizeof(float), std::size_t(16) << 20, true, false,
                                  winograd);
    };
    REQUIRE(plan(true).winograd);
    REQUIRE(!plan(false).winograd);
    const FieldView<float> xp("xp", g.batch, g.in_channels, c.padded[0], c.padded[1], c.padded[2]);
    const FieldView<float> gy("gy", g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]);
    const ReplicatedView<float> w("w", g.out_channels * g.in_per_group * 27),
        b("b", g.out_channels);
    fill_random(xp, 21), fill_random(gy, 22), fill_random(w, 23), fill_random(b, 24);
    // Forward (with a bias) and input gradient, each run with winograd on and off; `keep`
    // filters output bands; cells not kept stay as filled.
    const auto run = [&](bool winograd, bool data, const kernels::PlaneFilter& keep) {
      const kernels::PlanePlan p = plan(winograd);
      const Kokkos::View<float*, DefaultMemorySpace> workspace("workspace", p.values);
      const FieldView<float> out =
          data ? FieldView<float>("gxp", g.batch, g.in_channels, c.padded[0], c.padded[1],
                                  c.padded[2])
               : FieldView<float>("y", g.batch, g.out_channels, g.out[0], g.out[1], g.out[2]);
      fill_random(out, 25);
      kernels::correlate_planes<float>(space, p, data ? p.data : p.forward, 0, g, data ? gy : xp, w,
                                       data, data ? ReplicatedView<float>() : b, out,
                                       workspace.data(), keep);
      return out;
    };
    const auto all = [](Index, Index, Index) { return true; };
    const auto upper_half = [&](Index x, Index y0, Index) { return x % 2 == 1 || y0 >= 8; };
    for (const bool data : {false, true}) {
      INFO((data ? "input gradient" : "forward"));
      const auto direct = run(false, data, all);
      std::vector<double> first, first_filtered;
      for (const std::string& isa : kernels::vector_isas()) {
        INFO("vector path " << isa);
        kernels::select_vector_isa(isa);
        const auto winograd = run(true, data, all);
        CHECK(test::relative_error(winograd, direct) <= 2e-6);
        CHECK(test::relative_error(winograd, direct) > 0);  // not the direct tiles' sums
        const std::vector<double> bits = test::host_values(winograd);
        if (first.empty()) first = bits;
        CHECK(bits == first);
        // A filtered run writes the kept bands' cells with the same bits, and no other cell.
        const std::vector<double> filtered = test::host_values(run(true, data, upper_half));
        const std::vector<double> untouched =
            test::host_values(run(false, data, [](Index, Index, Index) { return false; }));
        std::size_t kept = 0, wrong = 0;
        for (std::size_t i = 0; i < bits.size(); ++i) {
          kept += filtered[i] == bits[i] && filtered[i] != untouched[i];
          wrong += filtered[i] != bits[i] && filtered[i] != untouched[i];
        }
        CHECK(kept > 0);
        CHECK(kept < bits.size());
        CHECK(wrong == 0);
      }
      kernels::select_vector_isa(initial);
    }
    // The weight gradient (added to what is there), summing all x taps per pass or one.
    const auto weight_gradient = [&](bool winograd, Index x_taps) {
      kernels::PlanePlan p = plan(winograd);
      p.gradient_x_taps = x_taps;
      const Kokkos::View<float*, DefaultMemorySpace> workspace("workspace", p.values * g.k[0]);
      const ReplicatedView<float> gw("gw", w.extent(0));
      fill_random(gw, 26);
      kernels::weight_gradient_planes(space, p, g, xp, gy, gw, workspace.data());
      return gw;
    };
    INFO("weight gradient");
    const bool winograd_gradient = plan(true).winograd_gradient;
    winograd_gradients += winograd_gradient;
    const auto direct = weight_gradient(false, g.k[0]);
    std::vector<double> first;
    for (const std::string& isa : kernels::vector_isas()) {
      INFO("vector path " << isa);
      kernels::select_vector_isa(isa);
      const auto winograd = weight_gradient(true, g.k[0]);
      CHECK(test::relative_error(winograd, direct) <= 2e-6);
      // Not the direct tiles' sums where it runs on Winograd's, else theirs.
      CHECK((test::relative_error(winograd, direct) > 0) == winograd_gradient);
      const std::vector<double> bits = test::host_values(winograd);
      if (first.empty()) first = bits;
      CHECK(bits == first);
      CHECK(test::host_values(weight_gradient(true, 1)) == bits);
    }
    kernels::select_vector_isa(initial);
  }
  CHECK(winograd_gradients == 3);
}

/// body(case, decomposition, its layer's HaloPadding) for every case on every process grid
/// of `world` (periodic ones for periodic padding).
template <class Body>
void for_each_padded_grid(const Communicator& world, const std::vector<ConvCase>& cases,
                          const Body& body) {
  for (const ConvCase& c : cases) {
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(),
                                     c.options.padding_mode == PaddingMode::periodic);
    for (const Decomposition& d :
         test::test_decompositions(c.extents, world.size(), periodic, min_cells(c.options))) {
      const Conv<double> conv(world, c.options, "conv");
      HaloPadding<double> halo(world, conv.geometry(), c.options.padding_mode, 0.0, "conv");
      body(c, d, halo);
    }
  }
}

TEST_CASE("HaloPadding's shell and the input rebuild the padded buffer bit for bit",
          "[conv][padding]") {
  // What Conv keeps for backward instead of the padded buffer: every padding mode, stride and
  // dilation of the cases, on every process grid; the input has ghosts of its own (ignored).
  const Communicator world;
  for_each_padded_grid(
      world, conv_cases(),
      [&](const ConvCase& c, const Decomposition& d, HaloPadding<double>& halo) {
        const ShardTensor<double> x(d, world.rank(), 2, c.options.in_channels,
                                    GhostWidths::uniform(1, d.ndims()), "x");
        test::fill(x, [&](Index n, Index ch, const SpatialIndex&, SpatialIndex g) {
          return hashed_uniform(11, test::global_linear_index(d, c.options.in_channels, n, ch, g));
        });
        const ShardTensor<double> padded = halo.forward(x);
        const ShardTensor<double> rebuilt = halo.rebuild(x, halo.shell(padded, x));
        REQUIRE(rebuilt.view().extent(2) == padded.view().extent(2));
        const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), padded.view());
        const auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rebuilt.view());
        REQUIRE(a.span() == b.span());
        Index differ = 0;
        for (std::size_t i = 0; i < a.span(); ++i) differ += a.data()[i] != b.data()[i];
        CHECK(differ == 0);
      });
}

TEST_CASE("HaloPadding pads an input that carries its ghost cells in place, with a copy's bits",
          "[conv][padding]") {
  // What a producer gets by allocating its output with the layer's ghost cells (a U-Net's
  // concatenation): forward fills them, no copy; rebuild fills them again from the shell
  // whatever another layer left there; the adjoint in place leaves the owned cells a copy's
  // adjoint would write and zero ghosts. Every padding mode, stride and dilation of the
  // cases, on every process grid, ghost cells starting as garbage.
  const Communicator world;
  int padded_cases = 0;
  for_each_padded_grid(
      world, all_conv_cases(),
      [&](const ConvCase& c, const Decomposition& d, HaloPadding<double>& halo) {
        if (halo.ghosts() == GhostWidths{}) return;
        const Index channels = c.options.in_channels;
        const auto value = [&](Index n, Index ch, const SpatialIndex& local, SpatialIndex g) {
          return hashed_uniform(11, test::global_linear_index(d, channels, n, ch, g));
        };
        const ShardTensor<double> x(d, world.rank(), 2, channels);
        test::fill(x, value);
        const ShardTensor<double> copy = halo.forward(x);
        const ShardTensor<double> own(d, world.rank(), 2, channels, halo.ghosts(), "own");
        const auto scramble = [&](const ShardTensor<double>& f) {  // garbage ghosts, x's cells
          test::fill(f, [&](Index n, Index ch, const SpatialIndex& local, SpatialIndex g) {
            return test::is_ghost(f, local) ? -7.5 - double(local[0]) : value(n, ch, local, g);
          });
        };
        scramble(own);
        REQUIRE(halo.pads_in_place(own));
        ++padded_cases;
        // Not the caller's promise: a copy, and the input's ghosts are left as they were.
        const ShardTensor<double> copied = halo.forward(own);
        CHECK(copied.view().data() != own.view().data());
        CHECK(test::relative_error(copied.view(), copy.view()) == 0);
        const ShardTensor<double> padded = halo.forward(own, /*ghosts_are_scratch=*/true);
        CHECK(padded.view().data() == own.view().data());
        CHECK(test::relative_error(padded.view(), copy.view()) == 0);
        const PaddedShell<double> shell = halo.shell(padded, own);
        CHECK(shell.in_place);
        scramble(own);
        const ShardTensor<double> rebuilt = halo.rebuild(own, shell);
        CHECK(rebuilt.view().data() == own.view().data());
        CHECK(test::relative_error(rebuilt.view(), copy.view()) == 0);

        // The adjoint, into a gradient of x's layout and in place.
        const ShardTensor<double> grad(d, world.rank(), 2, channels, halo.ghosts(), "grad");
        test::fill(grad, [&](Index n, Index ch, const SpatialIndex& local, SpatialIndex) {
          const SpatialIndex g = grad.to_global(local);
          return hashed_uniform(
              29, std::uint64_t((((n * channels + ch) * 97 + g[0] + 3) * 89 + g[1] + 3) * 83 +
                                g[2] + 3));
        });
        ShardTensor<double> grad_copy(d, world.rank(), 2, channels, halo.ghosts(), "grad copy");
        Kokkos::deep_copy(grad_copy.view(), grad.view());
        const ShardTensor<double> into(d, world.rank(), 2, channels);
        halo.backward(grad_copy, into, /*overwrite=*/true);
        halo.backward(grad, grad, /*overwrite=*/true);
        const auto expected = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), into.view());
        const Box inner = grad.interior_box();
        const auto ghost = [&](Index, Index, const SpatialIndex& local, const SpatialIndex&,
                               double) { return test::is_ghost(grad, local); };
        const long long ghosts = test::count_cells(grad, ghost);
        const long long nonzero_ghosts = test::count_cells(
            grad, [&](Index n, Index ch, const SpatialIndex& l, const SpatialIndex& g, double v) {
              return ghost(n, ch, l, g, v) && v != 0;
            });
        const long long differ = test::count_cells(
            grad, [&](Index n, Index ch, const SpatialIndex& l, const SpatialIndex&, double v) {
              return !test::is_ghost(grad, l) &&
                     v != expected(n, ch, l[0] - inner.lower[0], l[1] - inner.lower[1],
                                   l[2] - inner.lower[2]);
            });
        CHECK(differ == 0);
        CHECK(ghosts > 0);
        CHECK(nonzero_ghosts == 0);
      });
  CHECK(padded_cases > 0);
  // A caller's array wrapped without a copy is never written: always copied.
  const ConvCase c = all_conv_cases().front();
  const Conv<double> conv(world, c.options, "conv");
  const HaloPadding<double> halo(world, conv.geometry(), c.options.padding_mode, 0.0, "conv");
  const Decomposition d = Decomposition::automatic(c.extents, world.size());
  ShardTensor<double> own(d, world.rank(), 1, c.options.in_channels, halo.ghosts());
  CHECK(halo.pads_in_place(own));
  CHECK(!halo.pads_in_place(ShardTensor<double>::wrap(own.view().data(), d, world.rank(), 1,
                                                      c.options.in_channels, halo.ghosts())));
  CHECK(!halo.pads_in_place(ShardTensor<double>(d, world.rank(), 1, c.options.in_channels)));
}

TEMPLATE_TEST_CASE(
    "a conv after a concatenation with its ghost cells pads it in place, with a copy's bits",
    "[conv][padding][concat]", float, double) {
  // concat_channels(..., conv.padded_input_ghosts(skip)) allocates the output with the ghost
  // cells the conv would copy it into; the conv fills them in place. Output, input and
  // parameter gradients are those of the concatenation without ghost cells, bit for bit.
  const Communicator world;
  int in_place_cases = 0;
  for (const ConvCase& c : all_conv_cases()) {
    if (c.options.in_channels < 2 || c.options.groups != 1) continue;
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(),
                                     c.options.padding_mode == PaddingMode::periodic);
    for (const Decomposition& d :
         test::test_decompositions(c.extents, world.size(), periodic, min_cells(c.options))) {
      const Index first = c.options.in_channels / 2, second = c.options.in_channels - first;
      struct Result {
        ShardTensor<TestType> y, g_first, g_second;
        ReplicatedView<TestType> g_weight;
      };
      const auto run = [&](bool with_ghosts) {
        Conv<TestType> conv(world, c.options, "conv");
        const auto a = Variable<TestType>::field(
            test::random_shard<TestType>(d, world.rank(), 2, first, 5), true, "a");
        const auto b = Variable<TestType>::field(
            test::random_shard<TestType>(d, world.rank(), 2, second, 6), true, "b");
        const GhostWidths ghosts =
            with_ghosts ? conv.padded_input_ghosts(a.value()) : GhostWidths{};
        if (with_ghosts && !ghosts.none()) ++in_place_cases;
        Variable<TestType> a_in = a;
        const Variable<TestType> joined = concat_channels<TestType>(
            world, std::move(a_in), second, [&] { return b; }, ghosts);
        CHECK(joined.value().ghosts() == ghosts);
        CHECK(joined.node()->scratch_ghosts == !ghosts.none());
        const Variable<TestType> y = conv.forward(joined);
        backward(test::weighted_sum<TestType>(world, y));
        return Result{y.value(), a.grad(), b.grad(), conv.weight().data_grad()};
      };
      const Result copied = run(false), in_place = run(true);
      CHECK(test::relative_error(in_place.y.view(), copied.y.view()) == 0);
      CHECK(test::relative_error(in_place.g_first.view(), copied.g_first.view()) == 0);
      CHECK(test::relative_error(in_place.g_second.view(), copied.g_second.view()) == 0);
      CHECK(test::relative_error(in_place.g_weight, copied.g_weight) == 0);
    }
  }
  // Multi-axis splits need ghost cells (slab reads cover x splits only): at 4 ranks and more.
  if (world.size() >= 4) CHECK(in_place_cases > 0);
}

TEMPLATE_TEST_CASE("a conv that reads no ghost cell reads its input in place and leaves it be",
                   "[conv][padding]", float, double) {
  // 1x1 windows: no copy of the input, and backward, whose plane path writes the input
  // gradient over the rebuilt padded buffer, must not write over the input itself; the
  // input's gradient takes the layer's directly unless another op added to it first.
  const Communicator world;
  for (const ConvCase& c : all_conv_cases()) {
    const Conv<TestType> probe(world, c.options, "conv");
    const HaloPadding<TestType> halo(world, probe.geometry(), c.options.padding_mode, 0, "conv");
    const Decomposition d = Decomposition::automatic(c.extents, 1);  // windows cross no shard
    const ShardTensor<TestType> whole(d, 0, 1, c.options.in_channels);
    // (A 2x2 window with stride 2 reads one ghost above a shard that ends at an odd cell.)
    const bool in_place =
        c.options.padding.empty() &&
        std::all_of(c.options.kernel.begin(), c.options.kernel.end(), [](int k) { return k == 1; });
    INFO(c.name);
    CHECK(halo.reads_in_place(whole) == in_place);
    if (!in_place) continue;
    // With ghosts of its own the input is copied.
    CHECK(!halo.reads_in_place(
        ShardTensor<TestType>(d, 0, 1, c.options.in_channels, GhostWidths::uniform(1, d.ndims()))));
    for (const Decomposition& sharded : test::test_decompositions(
             c.extents, world.size(), std::vector<bool>(d.ndims(), false), min_cells(c.options))) {
      const ShardTensor<TestType> x =
          test::random_shard<TestType>(sharded, world.rank(), 2, c.options.in_channels, 4);
      ShardTensor<TestType> before(sharded, world.rank(), 2, c.options.in_channels);
      Kokkos::deep_copy(before.view(), x.view());
      const auto input = Variable<TestType>::field(x, true, "x");
      Conv<TestType> conv(world, c.options, "conv");
      backward(test::weighted_sum<TestType>(world, conv.forward(input)));
      CHECK(test::relative_error(x.view(), before.view()) == 0);
      // Two convolutions of one input: the first backward to run writes the input's gradient
      // directly, the second adds its own into it. Their sum is the two gradients alone.
      Conv<TestType> other(world, c.options, "other");
      const auto alone = Variable<TestType>::field(x, true, "x");
      backward(test::weighted_sum<TestType>(world, other.forward(alone)));
      const auto shared = Variable<TestType>::field(x, true, "x");
      backward(
          test::weighted_sum<TestType>(world, add(conv.forward(shared), other.forward(shared))));
      CHECK(test::relative_error(x.view(), before.view()) == 0);
      const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), input.grad().view());
      const auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), alone.grad().view());
      const auto sum =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), shared.grad().view());
      double diff = 0, scale = 0;
      for (std::size_t i = 0; i < sum.span(); ++i) {
        diff = std::max(diff, std::abs(double(sum.data()[i]) - a.data()[i] - b.data()[i]));
        scale = std::max(scale, std::abs(double(sum.data()[i])));
      }
      CHECK(scale > 0);
      CHECK(diff <= scale * (std::is_same<TestType, float>::value ? 1e-6 : 1e-14));
    }
  }
}

TEMPLATE_TEST_CASE(
    "a conv on one rank reads its input unpadded, zeros or wrapped around, with a padded "
    "copy's bits",
    "[conv][padding]", float, double) {
  // Zeros padding, or periodic on one rank: the plane path reads the input itself (nothing is
  // exchanged). An input with ghost cells of its own is copied into a padded buffer first, so
  // the same layer on the same values runs both ways. The vector kernels sum in the same
  // order either way: the outputs and all gradients are the same bit for bit. Winograd's tiles
  // (ConvOptions::winograd, where a case has 8 channels or more) start at the first output
  // cell: the same for the outputs (bit for bit), but the input gradient's, a padded buffer's
  // cells, shift with it (close). The plane path's GEMMs order their terms by ring slot, which
  // shifts with the buffer: close. The input is left as it was.
  const Communicator self(MPI_COMM_SELF);
  int unpadded_cases = 0;
  for (const ConvCase& c : all_conv_cases()) {
    INFO(c.name);
    const Decomposition d = Decomposition::automatic(c.extents, 1);
    const Conv<TestType> probe(self, c.options, "conv");
    const HaloPadding<TestType> halo(self, probe.geometry(), c.options.padding_mode, 0, "conv");
    std::array<bool, 3> wraps{};
    const bool unpadded =
        halo.reads_input_itself(ShardTensor<TestType>(d, 0, 1, c.options.in_channels), wraps);
    CHECK(unpadded == (c.options.padding_mode == PaddingMode::zeros ||
                       c.options.padding_mode == PaddingMode::periodic));
    CHECK(!halo.reads_input_itself(
        ShardTensor<TestType>(d, 0, 1, c.options.in_channels, GhostWidths::uniform(1, d.ndims())),
        wraps));
    if (!unpadded) continue;
    ++unpadded_cases;
    ConvOptions gemm_planes = c.options, direct_tiles = c.options;
    gemm_planes.vector_kernels = false;  // the plane path's GEMMs (zeros padding only)
    direct_tiles.winograd = false;
    for (const ConvOptions& options : {direct_tiles, c.options, gemm_planes}) {
      INFO((!options.vector_kernels ? "plane GEMMs"
            : options.winograd      ? "vector kernels, Winograd's where they apply"
                                    : "vector kernels"));
      const ShardTensor<TestType> x =
          test::random_shard<TestType>(d, 0, 2, c.options.in_channels, 4);
      ShardTensor<TestType> before(d, 0, 2, c.options.in_channels);
      Kokkos::deep_copy(before.view(), x.view());
      ShardTensor<TestType> ghosted(d, 0, 2, c.options.in_channels,
                                    GhostWidths::uniform(1, d.ndims()));
      Kokkos::deep_copy(ghosted.interior(), x.view());
      // Results: output, parameter gradients, then the input gradient (owned cells), as one
      // array. Periodic: a padded copy's input gradient adds the wrapped windows' part after
      // the rest (the halo adjoint), the unpadded read sums it in tap order: the same to
      // rounding, not bit for bit.
      const bool periodic = c.options.padding_mode == PaddingMode::periodic;
      const bool same_order = options.vector_kernels && std::is_same<TestType, float>::value &&
                              kernels::vector_isa() != "off";
      std::size_t input_gradient_from = 0;
      const auto results = [&](const ShardTensor<TestType>& input_value) {
        Conv<TestType> conv(self, options, "conv");
        const auto input = Variable<TestType>::field(input_value, true, "x");
        const auto y = conv.forward(input);
        backward(test::weighted_sum<TestType>(self, y));
        ShardTensor<TestType> grad(d, 0, 2, c.options.in_channels);
        Kokkos::deep_copy(grad.view(), input.grad().interior());
        std::vector<double> all = test::host_values(y.value().view());
        for (const auto& named : conv.named_parameters()) {
          const auto g = test::host_values(named.second.data_grad());
          all.insert(all.end(), g.begin(), g.end());
        }
        input_gradient_from = all.size();
        const auto g = test::host_values(grad.view());
        all.insert(all.end(), g.begin(), g.end());
        return all;
      };
      const std::vector<double> read_unpadded = results(x), copied = results(ghosted);
      REQUIRE(read_unpadded.size() == copied.size());
      std::size_t differing = 0, first_difference = 0;
      double diff = 0, scale = 0;
      for (std::size_t i = read_unpadded.size(); i-- > 0;) {
        if (!same_order || ((periodic || options.winograd) && i >= input_gradient_from)) {
          diff = std::max(diff, std::abs(read_unpadded[i] - copied[i]));
          scale = std::max(scale, std::abs(copied[i]));
        } else if (read_unpadded[i] != copied[i]) {
          ++differing, first_difference = i;
        }
      }
      INFO("first differing value " << first_difference << " of " << copied.size());
      CHECK(differing == 0);
      // Winograd's input gradients: each within 2e-6 of the direct sums, on tiles of its own.
      const double close = !std::is_same<TestType, float>::value ? 1e-14
                           : options.winograd                    ? 4e-6
                                                                 : 1e-6;
      CHECK(diff <= scale * close);
      CHECK(test::relative_error(x.view(), before.view()) == 0);
    }
    // Two convolutions of one input: the first backward writes the input's gradient, the
    // second adds its own into it.
    const ShardTensor<TestType> x = test::random_shard<TestType>(d, 0, 2, c.options.in_channels, 5);
    Conv<TestType> one(self, c.options, "one"), other(self, c.options, "other");
    const auto first = Variable<TestType>::field(x, true, "x");
    const auto second = Variable<TestType>::field(x, true, "x");
    const auto both = Variable<TestType>::field(x, true, "x");
    backward(test::weighted_sum<TestType>(self, one.forward(first)));
    backward(test::weighted_sum<TestType>(self, other.forward(second)));
    backward(test::weighted_sum<TestType>(self, add(one.forward(both), other.forward(both))));
    const auto a = test::host_values(first.grad().view()),
               b = test::host_values(second.grad().view()),
               sum = test::host_values(both.grad().view());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < sum.size(); ++i) {
      diff = std::max(diff, std::abs(sum[i] - a[i] - b[i]));
      scale = std::max(scale, std::abs(sum[i]));
    }
    CHECK(scale > 0);
    CHECK(diff <= scale * (std::is_same<TestType, float>::value ? 1e-6 : 1e-14));
  }
  CHECK(unpadded_cases >= 4);
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
  ConvOptions greedy = o;
  greedy.library_workspace_share = 1.5;
  CHECK_THROWS_WITH(Conv<float>(comm, greedy, "w"),
                    Contains("Conv2d 'w': library_workspace_share must be a share of free "
                             "memory from 0 to 1, got 1.5"));
}

TEST_CASE("a library's candidate: the least workspace within 5 % of the fastest",
          "[conv][library]") {
  using kernels::least_workspace_near_fastest;
  CHECK(least_workspace_near_fastest({}) == -1);
  CHECK(least_workspace_near_fastest({{3.0f, 100}}) == 0);
  // 17.3 ms without workspace against 58.6 ms with 550 MB (the H200's weight gradient).
  CHECK(least_workspace_near_fastest({{58.6f, 549762064}, {17.3f, 216}}) == 1);
  // Within 5 %: the smaller workspace, even though slower.
  CHECK(least_workspace_near_fastest({{1.00f, 1 << 29}, {1.04f, 0}, {1.20f, 0}}) == 1);
  // More than 5 % faster: the workspace is worth it.
  CHECK(least_workspace_near_fastest({{1.00f, 1 << 29}, {1.06f, 0}}) == 0);
  // Equal workspaces: the faster; the slowest never, whatever its workspace.
  CHECK(least_workspace_near_fastest({{2.0f, 64}, {1.9f, 64}, {9.0f, 0}}) == 1);
}

TEST_CASE("TF32 is a layer's option: allow_tf32 sets it on that layer, not on the process",
          "[conv]") {
  const Communicator comm;
  ConvOptions o;
  o.in_channels = 2;
  o.out_channels = 2;
  o.kernel = {3, 3};
  Conv<float> first(comm, o, "first"), second(comm, o, "second");
  CHECK_FALSE(first.options().tf32);
  first.allow_tf32(true);
  CHECK(first.options().tf32);
  CHECK_FALSE(second.options().tf32);
  first.allow_tf32(false);
  CHECK_FALSE(first.options().tf32);
}

TEST_CASE("the halo overlap is a layer's option and changes no bit", "[conv]") {
  // Interior outputs while the messages travel, then the rest, or all after the exchange.
  const Communicator comm;
  for (const ConvCase& c : conv_cases()) {
    INFO(c.name);
    const std::vector<bool> periodic(c.extents.size(),
                                     c.options.padding_mode == PaddingMode::periodic);
    const auto decompositions =
        test::test_decompositions(c.extents, comm.size(), periodic, min_cells(c.options));
    if (decompositions.empty()) continue;
    ConvOptions overlapped = c.options, after = c.options;
    overlapped.library_kernels = after.library_kernels = false;
    after.overlap_halo = false;
    const auto run = [&](const ConvOptions& o) {
      return test::run_module<float>(conv_factory<float>(o), comm, decompositions.front(), 2,
                                     c.options.in_channels, test::weighted_sum<float>);
    };
    const auto a = run(overlapped), b = run(after);
    CHECK(test::host_values(a.output.value().view()) == test::host_values(b.output.value().view()));
    CHECK(test::host_values(a.input.grad().view()) == test::host_values(b.input.grad().view()));
  }
  Conv<float> layer(comm, conv_cases().front().options, "layer");
  layer.overlap_halo(false);
  CHECK_FALSE(layer.options().overlap_halo);
}

TEST_CASE("a conv's last paths name the kernels its forward chose", "[conv]") {
  // A float 3x3 layer of 16 channels: on the host's vector kernels, Winograd's tiles for the
  // forward and input gradient where the layer asks, and for the weight gradient where the
  // field has 2048 tiles or more (conv_winograd_gradient_pays); elsewhere (a GPU's library,
  // the vector kernels off) none of them.
  const Communicator self(MPI_COMM_SELF);
  ConvOptions o;
  o.in_channels = o.out_channels = 16;
  o.kernel = {3, 3};
  o.padding = {1, 1};
  const bool vector = kernels::conv_vector_kernels_available<float>();
  for (const std::array<Index, 2> extents : {std::array<Index, 2>{128, 64}, {64, 32}})
    for (const bool winograd : {true, false}) {
      INFO(extents[0] << " x " << extents[1] << " cells, winograd " << winograd);
      o.winograd = winograd;
      Conv<float> conv(self, o, "conv");
      const ConvKernelPaths& paths = conv.last_paths();
      CHECK(!(paths.library || paths.vector_kernels || paths.winograd || paths.winograd_gradient));
      const Decomposition d = Decomposition::automatic({extents[0], extents[1]}, 1);
      conv.forward(Variable<float>::field(test::random_shard<float>(d, 0, 1, 16, 7), true, "x"));
      CHECK(paths.vector_kernels == (vector && !paths.library));
      CHECK(paths.winograd == (paths.vector_kernels && winograd));
      // 128 x 64 cells: 64 x 32 = 2048 tiles of 2 x 2; 64 x 32 cells: 512.
      CHECK(paths.winograd_gradient == (paths.winograd && extents[0] == 128));
    }
}

TEST_CASE("a layer's kept packed weights follow its weights and the vector path", "[conv]") {
  // In eval mode the host vector kernels keep a layer's forward weights packed between calls
  // (kernels::PackedWeights): weights changed in place or another instruction set must pack
  // again. Each output is compared with a fresh layer's, bit for bit.
  const Communicator world;
  ConvOptions o;
  o.in_channels = 3;
  o.out_channels = 5;
  o.kernel = {3, 3};
  o.padding = {1, 1};
  o.library_kernels = false;
  const Decomposition d = Decomposition::automatic({12, 10}, world.size());
  const auto x =
      Variable<float>::field(test::random_shard<float>(d, world.rank(), 2, 3, 7), false, "x");
  Conv<float> kept(world, o, "conv");
  kept.eval();
  const auto output_of = [&](Conv<float>& layer) {
    return test::host_values(layer.forward(x).value().view());
  };
  const auto before = output_of(kept);
  for (const auto& [name, p] : kept.named_parameters()) {  // w = 0.5 - w, in place
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.data());
    for (std::size_t i = 0; i < host.span(); ++i) host.data()[i] = 0.5f - host.data()[i];
    Kokkos::deep_copy(p.data(), host);
  }
  const auto fresh_output = [&] {
    Conv<float> fresh(world, o, "conv");
    const auto from = kept.named_parameters(), to = fresh.named_parameters();
    for (std::size_t i = 0; i < from.size(); ++i)
      Kokkos::deep_copy(to[i].second.data(), from[i].second.data());
    return output_of(fresh);
  };
  const auto after = output_of(kept);
  CHECK(after != before);
  CHECK(after == fresh_output());
  const std::string initial = kernels::vector_isa();
  for (const std::string& isa : kernels::vector_isas()) {
    INFO("vector path " << isa);
    kernels::select_vector_isa(isa);
    CHECK(output_of(kept) == fresh_output());
  }
  kernels::select_vector_isa(initial);
}

TEST_CASE("a layer's kept packed weights follow its Winograd tile", "[conv]") {
  // Winograd's forward tile depends on the plane's width (F(2x4, 3x3) from 64 output columns
  // on, F(2x2, 3x3) below), and so does the packed weights' layout: one eval-mode layer on wide,
  // narrow and wide fields again gives a fresh layer's outputs, bit for bit.
  const Communicator world;
  ConvOptions o;
  o.in_channels = 8;
  o.out_channels = 8;
  o.kernel = {3, 3};
  o.padding = {1, 1};
  o.library_kernels = false;
  Conv<float> kept(world, o, "conv");
  kept.eval();
  for (const Index width : {70, 20, 70}) {
    INFO(width << " columns");
    const Decomposition d = Decomposition::automatic({8 * world.size(), width}, world.size());
    const auto x =
        Variable<float>::field(test::random_shard<float>(d, world.rank(), 1, 8, 9), false, "x");
    Conv<float> fresh(world, o, "conv");
    const auto from = kept.named_parameters(), to = fresh.named_parameters();
    for (std::size_t i = 0; i < from.size(); ++i)
      Kokkos::deep_copy(to[i].second.data(), from[i].second.data());
    CHECK(test::host_values(kept.forward(x).value().view()) ==
          test::host_values(fresh.forward(x).value().view()));
  }
}

TEST_CASE("a layer keeps its packed weights in eval mode only", "[conv][memory]") {
  // In training the weights change every step: the vector kernels pack them per call into
  // the shared scratch, and the layer holds no packed copy (nor the weights it came from,
  // together 2x its weights) between calls. In eval mode it keeps them; back in training they go.
  const Communicator world;
  ConvOptions o;
  o.in_channels = 8;
  o.out_channels = 12;
  o.kernel = {3, 3, 3};
  o.padding = {1, 1, 1};
  o.library_kernels = false;
  // Planes of at least 64 cells on every rank count (the plane path's, for the vector kernels).
  const Decomposition d = Decomposition::automatic({16, 16, 16}, world.size());
  const auto x = Variable<float>::field(
      test::random_shard<float>(d, world.rank(), 1, o.in_channels, 17), true, "x");
  Conv<float> layer(world, o, "conv");
  disable_memory_tracking();
  enable_memory_tracking();
  const auto workspaces_after_forward = [&] {
    const std::vector<double> y = test::host_values(layer.forward(x).value().view());
    return std::make_pair(memory_snapshot()[MemoryCategory::workspaces].current, y);
  };
  const auto [training, y_training] = workspaces_after_forward();  // the scratch, grown
  layer.eval();
  const auto [eval, y_eval] = workspaces_after_forward();
  layer.train();
  const auto [training_again, y_again] = workspaces_after_forward();
  disable_memory_tracking();
  CHECK(y_eval == y_training);
  CHECK(y_again == y_training);
  CHECK(training_again == training);
  if (kernels::conv_vector_kernels_available<float>() && kernels::vector_isa() != "off") {
    // The packed weights (padded to whole tiles) and the copy they are checked against.
    const std::uint64_t weights = sizeof(float) * o.out_channels * o.in_channels * 27;
    CHECK(eval >= training + 2 * weights);
  } else {
    CHECK(eval == training);
  }
}

TEMPLATE_TEST_CASE("channels-last packs of a box are the transpose, and unpack inverts them",
                   "[conv][channels_last]", float, double) {
  // The copies around a tensor-core convolution engine (NDHWC): boxes of a padded patch that
  // start inside it and end short of it, in 1-D, 2-D and 3-D shapes.
  const Decomposition d = Decomposition::automatic({Index(6), Index(5), Index(7)}, 1);
  const ShardTensor<TestType> field(d, 0, 2, 3, GhostWidths::uniform(2, 3), "field");
  {  // every cell random, ghosts too
    auto h = Kokkos::create_mirror_view(field.view());
    for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = TestType(hashed_uniform(9, i));
    Kokkos::deep_copy(field.view(), h);
  }
  const auto host = test::host_values(field.view());
  const auto at = [&](Index n, Index c, Index i, Index j, Index k) {
    const auto v = field.view();
    return host[(((n * v.extent(1) + c) * v.extent(2) + i) * v.extent(3) + j) * v.extent(4) + k];
  };
  for (const Box& box :
       {Box{{1, 2, 0}, {5, 3, 11}}, Box{{0, 0, 0}, {10, 9, 11}}, Box{{3, 4, 5}, {1, 1, 4}}}) {
    INFO("box at " << box.lower[0] << "," << box.lower[1] << "," << box.lower[2]);
    const Index cells = box.size(), N = 2, C = 3;
    Kokkos::View<TestType*, DefaultMemorySpace> packed("packed", N * cells * C);
    kernels::pack_channels_last(ExecutionSpace(), field.view(), box, packed);
    Kokkos::fence();
    const auto p = test::host_values(packed);
    std::size_t wrong = 0;
    for (Index n = 0; n < N; ++n)
      for (Index x = 0; x < box.extent[0]; ++x)
        for (Index y = 0; y < box.extent[1]; ++y)
          for (Index z = 0; z < box.extent[2]; ++z)
            for (Index c = 0; c < C; ++c) {
              const Index cell = ((n * box.extent[0] + x) * box.extent[1] + y) * box.extent[2] + z;
              wrong +=
                  p[cell * C + c] != at(n, c, box.lower[0] + x, box.lower[1] + y, box.lower[2] + z);
            }
    CHECK(wrong == 0);

    // Unpack into a zero field: the box holds the values, every other cell stays zero; adding
    // it again doubles the box.
    ShardTensor<TestType> back(d, 0, N, C, GhostWidths::uniform(2, 3), "back");
    kernels::unpack_channels_last(ExecutionSpace(), packed, back.view(), box);
    kernels::unpack_channels_last(ExecutionSpace(), packed, back.view(), box, UnpackMode::add);
    Kokkos::fence();
    const auto b = test::host_values(back.view());
    const auto v = back.view();
    wrong = 0;
    for (Index n = 0; n < N; ++n)
      for (Index c = 0; c < C; ++c)
        for (Index i = 0; i < Index(v.extent(2)); ++i)
          for (Index j = 0; j < Index(v.extent(3)); ++j)
            for (Index k = 0; k < Index(v.extent(4)); ++k) {
              const bool inside = i >= box.lower[0] && i < box.lower[0] + box.extent[0] &&
                                  j >= box.lower[1] && j < box.lower[1] + box.extent[1] &&
                                  k >= box.lower[2] && k < box.lower[2] + box.extent[2];
              const TestType want = inside ? TestType(2) * at(n, c, i, j, k) : TestType(0);
              wrong +=
                  b[(((n * C + c) * v.extent(2) + i) * v.extent(3) + j) * v.extent(4) + k] != want;
            }
    CHECK(wrong == 0);
  }
}
