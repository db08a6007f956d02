// bf16 layers (Module::compute_in_bf16, autocast's semantics): the rounding against an
// independent reference; Conv, ConvTranspose and a U-Net in bf16 sharded against one rank
// (within the bf16 rounding stated per check), against the same layers in float, and their
// outputs bf16 values; their halos on the bfloat16 wire (the same bits, fewer bytes); a
// double model refuses bf16.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "equivalence.hpp"
#include "host/amx/amx_tiles.hpp"  // kernels/backends: the AMX GEMM
#include "model_options.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/core/kernel_counter.hpp"
#include "shardtensor/kernels/bfloat16_rounding.hpp"
#include "shardtensor/kernels/vector_isa.hpp"
#include "shardtensor/layers/saved_field.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;
using models::UNet;
using models::UNetOptions;

namespace {

float float_of_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// Round to nearest even by comparing distances in double (not by bit arithmetic): the two
/// bfloat16 neighbours of x are its upper half and the next one away from zero.
std::uint16_t reference_bits(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint16_t toward_zero = std::uint16_t(u >> 16);
  const std::uint16_t away = std::uint16_t(toward_zero + 1);
  const double below =
      std::abs(double(x) - double(float_of_bits(std::uint32_t(toward_zero) << 16)));
  // The neighbour away from zero past the largest finite value is infinity: its distance is
  // where the rounding boundary would be with one more exponent (2^128 for float).
  const std::uint32_t away_bits = std::uint32_t(away) << 16;
  const double above = (away_bits & 0x7fffffffu) == 0x7f800000u
                           ? std::ldexp(1.0, 128) - std::abs(double(x))
                           : std::abs(double(float_of_bits(away_bits)) - double(x));
  if (below < above) return toward_zero;
  if (above < below) return away;
  return (toward_zero & 1) ? away : toward_zero;
}

/// Every value of a field is a bfloat16 value (its lower 16 bits are zero).
bool holds_bfloat16_values(const ShardTensor<float>& field) {
  for (double v : test::host_values(field.view()))
    if (bits_of(float(v)) & 0xffffu) return false;
  return true;
}

/// x + 0: an op's result with x's values.
template <class T>
Variable<T> plus_zero(const Variable<T>& x) {
  const ShardTensor<T>& v = x.value();
  return add(x, Variable<T>::field(ShardTensor<T>(v.decomposition(), v.rank(), v.batch(),
                                                  v.channels(), v.ghosts(), "zeros")));
}

template <class Layer, class Options>
test::ModuleFactory<float> bf16_factory(const Options& options, bool bf16) {
  return [options, bf16](const Communicator& comm) {
    auto layer = std::make_shared<Layer>(comm, options, "layer");
    layer->compute_in_bf16(bf16);
    return layer;
  };
}

ConvOptions conv_options(int in, int out, std::vector<int> kernel, std::vector<int> padding,
                         PaddingMode mode = PaddingMode::zeros) {
  ConvOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.kernel = std::move(kernel);
  o.padding = std::move(padding);
  o.padding_mode = mode;
  return o;
}

// One bf16 step (7 mantissa bits: at most 2^-7 of the largest value). Where the summation
// order of a shard differs from the whole field's (uneven splits change the GEMM blocking), a
// float sum that lands on the other side of a rounding boundary moves that output by one bf16
// step; elsewhere the outputs are bit-identical. Gradients are float sums of bf16 operands.
constexpr double bf16_step = 1.0 / 128;

}  // namespace

TEST_CASE("bfloat16 rounds to nearest even, as a reference by distances does", "[bf16]") {
  // Specials and boundaries: zeros, the largest float (rounds to infinity), ties both ways.
  for (std::uint32_t u :
       {0x00000000u, 0x80000000u, 0x7f7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u,
        0x00008000u, 0x00018000u, 0x00000001u, 0x7f800000u, 0xff800000u, 0x3f7fffffu}) {
    INFO("bits " << std::hex << u);
    CHECK(bfloat16_bits(float_of_bits(u)) == reference_bits(float_of_bits(u)));
  }
  CHECK(std::isnan(round_to_bfloat16(std::nanf(""))));
  CHECK(std::isnan(bfloat16_value(bfloat16_bits(float_of_bits(0x7f800001u)))));  // no inf
  std::mt19937 generator(5);
  std::vector<float> values;
  for (int i = 0; i < 200000; ++i) {
    const float x = float_of_bits(generator());
    if (std::isfinite(x)) values.push_back(x);
  }
  std::size_t wrong = 0;
  for (float x : values) wrong += bfloat16_bits(x) != reference_bits(x);
  CHECK(wrong == 0);
  // The array kernel (on the default execution space) gives the same bits.
  Kokkos::View<float*> device("values", values.size());
  auto host = Kokkos::create_mirror_view(device);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = values[i];
  Kokkos::deep_copy(device, host);
  kernels::round_to_bfloat16(ExecutionSpace(), device);
  Kokkos::deep_copy(host, device);
  wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    wrong += bits_of(host(i)) != std::uint32_t(reference_bits(values[i])) << 16;
  CHECK(wrong == 0);
}

TEST_CASE("bf16 products on AMX tiles: a GEMM of rounded operands with float sums", "[bf16][amx]") {
  // Every transposition, shapes off the tiles' edges, alpha and beta; operands not yet bf16
  // values (the GEMM rounds them). Against double sums of the reference-rounded products:
  // within the float sums' rounding, far below the 2^-9 that unrounded operands would miss by.
  // C's columns past n (its stride is wider) keep their values; beta 0 never reads C.
  if (!kernels::bf16_matrix_tiles()) {
    WARN("no AMX tiles on this CPU: nothing to test");
    return;
  }
  const auto rounded = [](float x) {
    return float_of_bits(std::uint32_t(reference_bits(x)) << 16);
  };
  std::mt19937 engine(91);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto random_values = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(engine);
    return v;
  };
  struct Shape {
    int m, n, k;
  };
  for (const Shape shape : {Shape{1, 1, 1}, Shape{17, 33, 65}, Shape{256, 64, 512},
                            Shape{40, 16, 100}, Shape{33, 47, 31}})
    for (int transposes = 0; transposes < 4; ++transposes)
      for (const float alpha : {1.0f, 0.125f})
        for (const float beta : {0.0f, 1.0f}) {
          const bool ta = transposes & 1, tb = transposes & 2;
          const int m = shape.m, n = shape.n, k = shape.k;
          CAPTURE(m, n, k, ta, tb, alpha, beta);
          const std::ptrdiff_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
          const std::vector<float> a = random_values((ta ? k : m) * lda),
                                   b = random_values((tb ? n : k) * ldb);
          std::vector<float> c = random_values(m * ldc);
          if (beta == 0.0f)  // never read
            for (int i = 0; i < m; ++i)
              for (int j = 0; j < n; ++j) c[i * ldc + j] = std::nanf("");
          const std::vector<float> before = c;
          kernels::host::amx_gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                                  c.data(), ldc);
          bool within = true, kept = true;
          for (int i = 0; i < m; ++i) {
            for (int j = 0; j < n; ++j) {
              double sum = 0, magnitude = 0;
              for (int l = 0; l < k; ++l) {
                const double product = double(rounded(ta ? a[l * lda + i] : a[i * lda + l])) *
                                       double(rounded(tb ? b[j * ldb + l] : b[l * ldb + j]));
                sum += product;
                magnitude += std::abs(product);
              }
              const double old = beta == 0.0f ? 0.0 : double(before[i * ldc + j]);
              const double expected = alpha * sum + beta * old;
              const double bound = (k / 32 + 40) * std::ldexp(alpha * magnitude, -24) +
                                   std::ldexp(std::abs(beta * old) + std::abs(expected), -23);
              within = within && std::abs(double(c[i * ldc + j]) - expected) <= bound;
            }
            for (std::ptrdiff_t j = n; j < ldc; ++j)
              kept = kept && bits_of(c[i * ldc + j]) == bits_of(before[i * ldc + j]);
          }
          CHECK(within);
          CHECK(kept);
        }
}

TEST_CASE("SavedField packs an op's result into 16 bits where that loses nothing", "[bf16]") {
  const Communicator comm;
  const Decomposition d = Decomposition::automatic({Index(12), Index(10)}, comm.size());
  const ShardTensor<float> values = test::random_shard<float>(d, comm.rank(), 2, 3, 9);
  ShardTensor<float> rounded = kernels::bfloat16_copy(values, "rounded");
  const Variable<float> leaf = Variable<float>::field(rounded, true, "leaf");
  const Variable<float> result = plus_zero(leaf);  // an op's result: the same values
  const Variable<float> inexact = plus_zero(Variable<float>::field(values, true, "x"));
  // A leaf is its creator's: a packed copy would come on top of it.
  CHECK_FALSE(SavedField<float>(leaf, SavedPacking::if_exact, "s").packed());
  // bf16 values pack exactly and come back bit for bit.
  const SavedField<float> exact(result, SavedPacking::if_exact, "s");
  CHECK(exact.packed());
  CHECK(test::host_values(exact.value().view()) == test::host_values(rounded.view()));
  // Other values stay float under if_exact, and come back rounded under `rounded`.
  const SavedField<float> kept(inexact, SavedPacking::if_exact, "s");
  CHECK_FALSE(kept.packed());
  CHECK(test::host_values(kept.value().view()) == test::host_values(values.view()));
  const SavedField<float> lossy(inexact, SavedPacking::rounded, "s");
  CHECK(lossy.packed());
  CHECK(test::host_values(lossy.value().view()) == test::host_values(rounded.view()));
  CHECK_FALSE(SavedField<float>(result, SavedPacking::none, "s").packed());
  // Doubles are kept as they are.
  const ShardTensor<double> wide = test::random_shard<double>(d, comm.rank(), 1, 1, 4);
  const Variable<double> twice = plus_zero(Variable<double>::field(wide, true, "w"));
  CHECK_FALSE(SavedField<double>(twice, SavedPacking::rounded, "s").packed());
}

TEST_CASE("bf16 convolutions: sharded equals one rank, near float, bf16 outputs", "[bf16]") {
  const std::vector<std::pair<std::vector<Index>, ConvOptions>> cases = {
      {{20, 18}, conv_options(2, 3, {3, 3}, {1, 1}, PaddingMode::reflect)},
      {{16, 20}, conv_options(4, 6, {3, 3}, {1, 1}, PaddingMode::periodic)},
      {{10, 8, 21}, conv_options(20, 17, {3, 3, 3}, {1, 1, 1})},  // the vector kernels
      {{10, 8, 21}, conv_options(20, 17, {1, 1, 1}, {})},         // pointwise
  };
  const Communicator world;
  for (const auto& one : cases) {
    const std::vector<Index>& extents = one.first;  // no structured bindings: lambdas capture
    const ConvOptions& options = one.second;        // them only from C++20 (nvcc warns)
    INFO("kernel " << options.kernel.size() << "-D " << options.kernel[0] << ", "
                   << options.in_channels << " -> " << options.out_channels);
    const std::vector<bool> periodic(extents.size(), options.padding_mode == PaddingMode::periodic);
    const auto decompositions = test::test_decompositions(extents, world.size(), periodic, 3);
    const auto bf16 = bf16_factory<Conv<float>>(options, true);
    for (const Decomposition& d : decompositions)
      test::check_equivalence<float>(bf16, d, 2, options.in_channels, test::weighted_sum<float>,
                                     {bf16_step, 1e-5});
    // Against float on the whole field: three roundings (input, weight, output) of 2^-9
    // each, and sums of bf16-rounded gradients.
    const Communicator self(MPI_COMM_SELF);
    const Decomposition whole = test::unsharded(decompositions.front());
    const auto run = [&](bool on) {
      return test::run_module<float>(bf16_factory<Conv<float>>(options, on), self, whole, 2,
                                     options.in_channels, test::weighted_sum<float>);
    };
    const auto low = run(true), full = run(false);
    CHECK(holds_bfloat16_values(low.output.value()));
    const double output_error =
        test::relative_error(low.output.value().view(), full.output.value().view());
    const double gradient_error =
        test::relative_error(low.input.grad().view(), full.input.grad().view());
    CHECK(output_error > 0);  // it did round
    CHECK(output_error <= 1e-2);
    CHECK(gradient_error <= 1e-2);
    CHECK(test::relative_error(low.module->named_parameters()[0].second.data_grad(),
                               full.module->named_parameters()[0].second.data_grad()) <= 1e-2);
  }
}

TEST_CASE(
    "bf16 convolutions on the vector kernels: every path alike, bf16 dot products near "
    "them",
    "[bf16]") {
  // Without bf16 dot products every path runs the float tiles on bf16 values, rounded as they
  // are copied: the same bits. With them (AVX512_BF16; switched on, as Intel CPUs run them
  // only when asked), forward and input gradient add their products channel pair by pair
  // (another order: outputs within a bf16 step, the input gradient within float rounding) and
  // the weight gradient adds the float tiles' products in their order (the same bits). On AMX
  // tiles (where the CPU has them) all three sum in the hardware's order: within a bf16 step,
  // and float rounding. The default ("auto") is one of these. Odd channel counts (5 in, 7 out)
  // pair the last channel with zeros; 40 channels take two chunks of pairs on the tiles.
  const std::string initial = kernels::vector_isa();
  if (initial == "off") return;  // the run turned the vector paths off: nothing to compare
  const std::vector<std::pair<std::vector<Index>, ConvOptions>> cases = {
      {{9, 8, 20}, conv_options(5, 7, {3, 3, 3}, {1, 1, 1})},
      {{24, 40}, conv_options(9, 4, {3, 3}, {1, 1}, PaddingMode::periodic)},
      {{6, 10, 21}, conv_options(40, 36, {3, 3, 3}, {1, 1, 1})},
  };
  const Communicator self(MPI_COMM_SELF);
  for (const auto& one : cases) {
    const ConvOptions& options = one.second;
    INFO(options.kernel.size() << "-D, " << options.in_channels << " -> " << options.out_channels);
    const std::vector<bool> periodic(one.first.size(),
                                     options.padding_mode == PaddingMode::periodic);
    const Decomposition whole =
        test::unsharded(test::test_decompositions(one.first, 1, periodic, 3).front());
    const auto run = [&](const std::string& isa, const std::string& dot, bool tiles) {
      kernels::select_vector_isa(isa);
      kernels::set_bf16_dot_products(dot);
      kernels::allow_bf16_matrix_tiles(tiles);
      return test::run_module<float>(bf16_factory<Conv<float>>(options, true), self, whole, 2,
                                     options.in_channels, test::weighted_sum<float>);
    };
    const auto weight_gradient = [](const auto& r) {
      return test::host_values(r.module->named_parameters()[0].second.data_grad());
    };
    const auto reference = run(kernels::vector_isas().front(), "off", false);
    const auto reference_weight_gradient = weight_gradient(reference);
    for (const std::string& isa : kernels::vector_isas()) {
      INFO("path " << isa);
      const auto plain = run(isa, "off", false);
      CHECK(test::host_values(plain.output.value().view()) ==
            test::host_values(reference.output.value().view()));
      CHECK(test::host_values(plain.input.grad().view()) ==
            test::host_values(reference.input.grad().view()));
      CHECK(weight_gradient(plain) == reference_weight_gradient);
      // The default without AMX: the float tiles' bits where the dot products are not preferred.
      const auto automatic = run(isa, "auto", false);
      if (!kernels::bf16_dot_products())
        CHECK(test::host_values(automatic.output.value().view()) ==
              test::host_values(reference.output.value().view()));
      for (const bool tiles : {false, true}) {
        INFO("AMX tiles allowed " << tiles);
        const auto dot = run(isa, "on", tiles);
        if (!kernels::bf16_dot_products() || (tiles && !kernels::bf16_matrix_tiles())) continue;
        CHECK(test::relative_error(dot.output.value().view(), reference.output.value().view()) <=
              bf16_step);
        CHECK(test::relative_error(dot.input.grad().view(), reference.input.grad().view()) <= 1e-6);
        const auto dot_weight_gradient = weight_gradient(dot);
        if (!tiles) {
          CHECK(dot_weight_gradient == reference_weight_gradient);
          continue;
        }
        double difference = 0, norm = 0;
        for (std::size_t i = 0; i < dot_weight_gradient.size(); ++i) {
          const double d = dot_weight_gradient[i] - reference_weight_gradient[i];
          difference += d * d;
          norm += reference_weight_gradient[i] * reference_weight_gradient[i];
        }
        CHECK(std::sqrt(difference / norm) <= 1e-6);
        CHECK(dot_weight_gradient != reference_weight_gradient);  // the tiles did run
      }
    }
    kernels::set_bf16_dot_products("auto");
    kernels::allow_bf16_matrix_tiles(true);
    kernels::select_vector_isa(initial);
  }
}

TEST_CASE(
    "a bf16 conv on one rank reads its unrounded input unpadded, with a padded copy's "
    "bits",
    "[bf16][padding]") {
  // The vector kernels round a source as they copy it (pair planes, or the float tiles' rows),
  // so a bf16 convolution on one rank reads its input itself (zeros padding, or periodic); an
  // input with ghost cells of its own goes through a padded, rounded copy. Random floats, not
  // bf16 values: the rounding is the kernels'. Periodic: the padded copy's input gradient adds
  // the wrapped windows' part in the halo adjoint, after the rest: close, not the same bits.
  // On the default path, the float tiles (bf16 dot products and AMX off), and the dot products
  // where the CPU has them (AMX off).
  if (!kernels::vector_kernels_on()) return;  // the portable kernels read a rounded copy
  const Communicator self(MPI_COMM_SELF);
  const std::vector<std::pair<std::vector<Index>, ConvOptions>> cases = {
      {{9, 8, 20}, conv_options(5, 7, {3, 3, 3}, {1, 1, 1})},
      {{24, 40}, conv_options(9, 4, {3, 3}, {1, 1}, PaddingMode::periodic)},
  };
  for (const std::string mode : {"auto", "off", "on"})
    for (const auto& one : cases) {
      kernels::set_bf16_dot_products(mode);
      kernels::allow_bf16_matrix_tiles(mode == "auto");
      if (mode == "on" && !kernels::bf16_dot_products()) break;  // the CPU has none
      const ConvOptions& options = one.second;
      const bool periodic = options.padding_mode == PaddingMode::periodic;
      INFO(options.kernel.size() << "-D, periodic " << periodic << ", bf16 dot products " << mode
                                 << " (" << (kernels::bf16_dot_products() ? "run" : "not run")
                                 << "), AMX " << (kernels::bf16_matrix_tiles() ? "on" : "off"));
      const Decomposition d = Decomposition::automatic(one.first, 1);
      const ShardTensor<float> x = test::random_shard<float>(d, 0, 2, options.in_channels, 4);
      ShardTensor<float> ghosted(d, 0, 2, options.in_channels, GhostWidths::uniform(1, d.ndims()));
      Kokkos::deep_copy(ghosted.interior(), x.view());
      std::size_t input_gradient_from = 0;
      const auto results = [&](const ShardTensor<float>& input_value) {
        Conv<float> conv(self, options, "conv");
        conv.compute_in_bf16(true);
        const auto input = Variable<float>::field(input_value, true, "x");
        const auto y = conv.forward(input);
        backward(test::weighted_sum<float>(self, y));
        std::vector<double> all = test::host_values(y.value().view());
        for (const auto& named : conv.named_parameters()) {
          const auto g = test::host_values(named.second.data_grad());
          all.insert(all.end(), g.begin(), g.end());
        }
        input_gradient_from = all.size();
        ShardTensor<float> grad(d, 0, 2, options.in_channels);
        Kokkos::deep_copy(grad.view(), input.grad().interior());
        const auto g = test::host_values(grad.view());
        all.insert(all.end(), g.begin(), g.end());
        return all;
      };
      const std::vector<double> unpadded = results(x), copied = results(ghosted);
      REQUIRE(unpadded.size() == copied.size());
      const std::vector<double> head(unpadded.begin(), unpadded.begin() + input_gradient_from),
          copied_head(copied.begin(), copied.begin() + input_gradient_from);
      CHECK(head == copied_head);
      double diff = 0, scale = 0;
      std::size_t differing = 0;
      for (std::size_t i = input_gradient_from; i < unpadded.size(); ++i) {
        diff = std::max(diff, std::abs(unpadded[i] - copied[i]));
        scale = std::max(scale, std::abs(copied[i]));
        differing += unpadded[i] != copied[i];
      }
      CHECK(diff <= 1e-6 * scale);
      if (!periodic) CHECK(differing == 0);
    }
  kernels::set_bf16_dot_products("auto");
  kernels::allow_bf16_matrix_tiles(true);
}

TEST_CASE("bf16 transposed convolution: sharded equals one rank, bf16 outputs", "[bf16]") {
  ConvTransposeOptions o;
  o.in_channels = 4;
  o.out_channels = 3;
  o.kernel = {3, 3};
  o.stride = {2, 2};
  o.padding = {1, 1};
  o.output_padding = {1, 1};
  const Communicator world;
  const auto bf16 = bf16_factory<ConvTranspose<float>>(o, true);
  const auto decompositions = test::test_decompositions({12, 10}, world.size(), {false, false}, 2);
  for (const Decomposition& d : decompositions)
    test::check_equivalence<float>(bf16, d, 2, o.in_channels, test::weighted_sum<float>,
                                   {bf16_step, 1e-5});
  const Communicator self(MPI_COMM_SELF);
  const auto low = test::run_module<float>(bf16, self, test::unsharded(decompositions.front()), 2,
                                           o.in_channels, test::weighted_sum<float>);
  CHECK(holds_bfloat16_values(low.output.value()));
}

TEST_CASE("a bf16 conv on the vector kernels rounds its weights as it packs them", "[bf16]") {
  // The vector kernels round a bf16 layer's weights as they pack them (the float tiles'
  // weights, the pair planes' weight pairs, the AMX tiles' blocks), so the layer hands them its
  // float weights and allocates no rounded copy: the same bits as a layer whose float weights
  // are bf16 values already (rounding is idempotent), on every vector path and bf16 mode, and
  // the same allocations as a float layer. 3-D, and 2-D in two groups (packed per group).
  const Communicator self(MPI_COMM_SELF);
  std::vector<std::pair<std::vector<Index>, ConvOptions>> cases = {
      {{9, 8, 20}, conv_options(5, 7, {3, 3, 3}, {1, 1, 1})},
      {{24, 40}, conv_options(6, 4, {3, 3}, {1, 1}, PaddingMode::periodic)},
  };
  cases[1].second.groups = 2;
  const std::string initial = kernels::vector_isa();
  const auto rounded_copy = [](const auto& view) {
    auto host = Kokkos::create_mirror(view);
    Kokkos::deep_copy(host, view);
    for (std::size_t i = 0; i < host.span(); ++i)
      host.data()[i] = round_to_bfloat16(host.data()[i]);
    return host;
  };
  // A run with the vector paths off keeps them off (its layers round copies of their weights).
  const std::vector<std::string> isas =
      initial == "off" ? std::vector<std::string>{"off"} : kernels::vector_isas();
  for (const auto& one : cases)
    for (const std::string& isa : isas)
      for (const std::string mode : {"off", "on", "auto"}) {
        kernels::select_vector_isa(isa);
        kernels::set_bf16_dot_products(mode);
        kernels::allow_bf16_matrix_tiles(mode == "auto");
        ConvOptions options = one.second;
        options.seed = 23;
        INFO(options.kernel.size()
             << "-D, groups " << options.groups << ", path " << isa << ", bf16 dot products "
             << mode << ", AMX " << (kernels::bf16_matrix_tiles() ? "on" : "off"));
        const Decomposition d = Decomposition::automatic(one.first, 1);
        const ShardTensor<float> x = test::random_shard<float>(d, 0, 2, options.in_channels, 8);
        const auto results = [&](bool bf16, bool rounded_weights, KernelCounts& forward) {
          Conv<float> conv(self, options, "conv");  // the same seed: the same weights
          conv.compute_in_bf16(bf16);
          if (rounded_weights)
            Kokkos::deep_copy(conv.weight().data(), rounded_copy(conv.weight().data()));
          const auto input = Variable<float>::field(x, true, "x");
          conv.forward(input);  // warm: the shared conv scratch
          KernelCounter counter;
          const auto y = conv.forward(input);
          forward = counter.counts();
          backward(test::weighted_sum<float>(self, y));
          std::vector<double> all = test::host_values(y.value().view());
          for (const auto& named : conv.named_parameters()) {
            const auto g = test::host_values(named.second.data_grad());
            all.insert(all.end(), g.begin(), g.end());
          }
          const auto g = test::host_values(input.grad().view());
          all.insert(all.end(), g.begin(), g.end());
          // In eval mode the layer keeps its packed weights (conv_vector_pack_weights).
          conv.eval();
          const auto kept =
              test::host_values(conv.forward(Variable<float>::field(x, false, "x")).value().view());
          all.insert(all.end(), kept.begin(), kept.end());
          return all;
        };
        KernelCounts unrounded_counts, rounded_counts, float_counts;
        const auto unrounded = results(true, false, unrounded_counts);
        CHECK(unrounded == results(true, true, rounded_counts));
        results(false, false, float_counts);
        // Where the host's vector kernels run the conv; else (the portable kernels, cuDNN) the
        // layer rounds a copy.
        if (kernels::conv_vector_kernels_available<float>())
          CHECK(unrounded_counts.allocations == float_counts.allocations);
      }
  kernels::set_bf16_dot_products("auto");
  kernels::allow_bf16_matrix_tiles(true);
  kernels::select_vector_isa(initial);
}

TEST_CASE("bf16 transposed convolution on its GEMM path rounds its input as it reads it",
          "[bf16][conv_transpose]") {
  // The U-Net's upsampling (kernel = stride): in bf16 the GEMMs round the input as they copy
  // its rows (ConvTransposeShape::round_source), with no rounded copy of it beside the input.
  // The same bits as the float layer on rounded operands, its output rounded: forward, input
  // gradient and weight gradient; and the input itself is left as it was. 3-D, in one chunk
  // and in several (kernels/src/conv_transpose_gemm.cpp), on every rank count.
  const Communicator world;
  for (const std::vector<Index>& extents : {std::vector<Index>{8, 6, 10}, {23, 15, 16}}) {
    ConvTransposeOptions o;
    o.in_channels = 4;
    o.out_channels = 3;
    o.kernel = {2, 2, 2};
    o.stride = {2, 2, 2};
    o.seed = 17;
    const Decomposition d = Decomposition::automatic(extents, world.size());
    INFO(d.describe());
    const ShardTensor<float> x = test::random_shard<float>(d, world.rank(), 2, o.in_channels, 5);
    const std::vector<double> x_before = test::host_values(x.view());
    const auto rounded_copy = [](const auto& view) {  // a copy even of a host View
      auto host = Kokkos::create_mirror(view);
      Kokkos::deep_copy(host, view);
      for (std::size_t i = 0; i < host.span(); ++i)
        host.data()[i] = round_to_bfloat16(host.data()[i]);
      return host;
    };
    ConvTranspose<float> bf16(world, o, "up");
    bf16.compute_in_bf16(true);
    ConvTranspose<float> reference(world, o, "up");  // the same seed: the same weights
    Kokkos::deep_copy(reference.weight().data(), rounded_copy(reference.weight().data()));
    ShardTensor<float> x_rounded(d, world.rank(), 2, o.in_channels);
    Kokkos::deep_copy(x_rounded.view(), rounded_copy(x.view()));
    const auto input = Variable<float>::field(x, true, "x");
    const auto input_rounded = Variable<float>::field(x_rounded, true, "x");
    bf16.forward(input);  // warm: the shared conv scratch
    KernelCounter counter;
    const Variable<float> y = bf16.forward(input);
    // The output and the rounded weights; no rounded copy of the input.
    CHECK(counter.counts().allocations == 2);
    const Variable<float> y_reference = reference.forward(input_rounded);
    CHECK(test::host_values(x.view()) == x_before);
    std::vector<double> expected = test::host_values(y_reference.value().view());
    for (double& v : expected) v = double(round_to_bfloat16(float(v)));
    CHECK(test::host_values(y.value().view()) == expected);
    // A gradient of bf16 values: what the bf16 layer rounds it to anyway.
    ShardTensor<float> g =
        test::random_shard<float>(y.value().decomposition(), world.rank(), 2, o.out_channels, 6);
    Kokkos::deep_copy(g.view(), rounded_copy(g.view()));
    ShardTensor<float> g_copy(y.value().decomposition(), world.rank(), 2, o.out_channels);
    Kokkos::deep_copy(g_copy.view(), g.view());
    backward(y, g);
    backward(y_reference, g_copy);
    CHECK(test::host_values(input.grad().view()) == test::host_values(input_rounded.grad().view()));
    CHECK(test::host_values(bf16.weight().data_grad()) ==
          test::host_values(reference.weight().data_grad()));
  }
}

TEST_CASE("a bf16 U-Net: sharded equals one rank within bf16 rounding", "[bf16][unet]") {
  const UNetOptions o = test::small_unet(2, 2);
  const auto bf16 = [o](const Communicator& comm) {
    auto model = std::make_shared<UNet<float>>(comm, o);
    model->compute_in_bf16(true);
    return std::static_pointer_cast<Module<float>>(model);
  };
  // An output that rounds the other way moves the layers after it by a bf16 step of their
  // values: the whole model stays within a few steps.
  const Communicator world;
  for (const Decomposition& d :
       test::test_decompositions({16, 16}, world.size(), {false, false}, 4))
    test::check_equivalence<float>(bf16, d, 1, 2, test::weighted_sum<float>,
                                   {4 * bf16_step, 4 * bf16_step});
}

TEST_CASE("a bf16 layer's halos on the bfloat16 wire: the same bits in fewer bytes",
          "[bf16][halo]") {
  // A bf16 layer's padded operand holds bfloat16 values, so moving its ghosts as bfloat16
  // (parallel.bf16_wire: on) changes no bit of any output or gradient; each rank with a
  // neighbour sends less (the adjoint's float gradients are the rest).
  const Communicator world;
  const auto on_wire = [&](const test::ModuleFactory<float>& make, const Decomposition& d,
                           Index channels, Bf16Wire halos) {
    CommOptions options;
    options.bf16_wire = halos;
    enable_comm_timers();
    reset_comm_timers();
    auto run = test::run_module<float>(make, world.with_options(options), d, 1, channels,
                                       test::weighted_sum<float>);
    const std::uint64_t bytes = comm_bytes_sent(CommKind::halo);
    enable_comm_timers(false);
    return std::make_pair(run, bytes);
  };
  const auto check = [&](const test::ModuleFactory<float>& make, const Decomposition& d,
                         Index channels) {
    INFO(d.describe());
    const auto on = on_wire(make, d, channels, Bf16Wire::always);
    const auto off = on_wire(make, d, channels, Bf16Wire::never);
    test::check_bit_identical(on.first, off.first);
    if (off.second == 0)
      CHECK(on.second == 0);
    else
      CHECK(on.second < off.second);
  };
  const ConvOptions conv = conv_options(5, 4, {3, 3, 3}, {1, 1, 1});
  for (const Decomposition& d :
       test::test_decompositions({10, 8, 9}, world.size(), {false, false, false}, 3))
    check(bf16_factory<Conv<float>>(conv, true), d, conv.in_channels);
  const ConvOptions reflect = conv_options(3, 2, {3, 3}, {1, 1}, PaddingMode::reflect);
  for (const Decomposition& d :
       test::test_decompositions({12, 10}, world.size(), {false, false}, 3))
    check(bf16_factory<Conv<float>>(reflect, true), d, reflect.in_channels);
  const UNetOptions o = test::small_unet(2, 2);
  const test::ModuleFactory<float> unet = [o](const Communicator& comm) {
    auto model = std::make_shared<UNet<float>>(comm, o);
    model->compute_in_bf16(true);
    return std::static_pointer_cast<Module<float>>(model);
  };
  for (const Decomposition& d : test::test_decompositions({16, 16}, world.size(), {true, false}, 4))
    check(unet, d, 2);
}

TEST_CASE(
    "bf16 attention (ring and neighbourhood): sharded equals one rank, near float, its "
    "K/V on the bfloat16 wire with the same bits",
    "[bf16][attention]") {
  // Q, K, V and the output's gradient rounded, scores, softmax and sums in float, the output
  // rounded. Sharded against one rank: the ring folds the blocks in another order, so an
  // output may round the other way (a bf16 step). The K/V blocks (ring) or halo
  // (neighbourhood) on the bfloat16 wire against float: the same bits, fewer bytes.
  const Communicator world;
  for (const AttentionKind kind : {AttentionKind::global, AttentionKind::neighborhood}) {
    MultiHeadAttentionOptions o;
    o.dims = 2;
    o.channels = 8;
    o.heads = 2;
    o.kind = kind;
    o.window = {3};
    INFO((kind == AttentionKind::global ? "ring" : "neighbourhood") << " attention");
    const auto bf16 = bf16_factory<MultiHeadAttention<float>>(o, true);
    const auto decompositions = test::test_decompositions({10, 9}, world.size(), {false, false}, 2);
    for (const Decomposition& d : decompositions)
      test::check_equivalence<float>(bf16, d, 2, o.channels, test::weighted_sum<float>,
                                     {2 * bf16_step, 2 * bf16_step});
    const Communicator self(MPI_COMM_SELF);
    const Decomposition whole = test::unsharded(decompositions.front());
    const auto run = [&](bool on) {
      return test::run_module<float>(bf16_factory<MultiHeadAttention<float>>(o, on), self, whole, 2,
                                     o.channels, test::weighted_sum<float>);
    };
    const auto low = run(true), full = run(false);
    CHECK(holds_bfloat16_values(low.output.value()));
    const double output_error =
        test::relative_error(low.output.value().view(), full.output.value().view());
    CHECK(output_error > 0);
    CHECK(output_error <= 2e-2);
    CHECK(test::relative_error(low.input.grad().view(), full.input.grad().view()) <= 2e-2);
    // The wire: every rank sends its K/V (ring: CommKind::collective; neighbourhood: halo).
    const CommKind kv_kind = kind == AttentionKind::global ? CommKind::collective : CommKind::halo;
    const auto on_wire = [&](const Decomposition& d, Bf16Wire wire) {
      CommOptions options;
      options.bf16_wire = wire;
      enable_comm_timers();
      reset_comm_timers();
      auto result = test::run_module<float>(bf16, world.with_options(options), d, 2, o.channels,
                                            test::weighted_sum<float>);
      const std::uint64_t bytes = comm_bytes_sent(kv_kind);
      enable_comm_timers(false);
      return std::make_pair(result, bytes);
    };
    for (const Decomposition& d : decompositions) {
      INFO(d.describe());
      const auto on = on_wire(d, Bf16Wire::always), off = on_wire(d, Bf16Wire::never);
      test::check_bit_identical(on.first, off.first);
      if (off.second == 0)
        CHECK(on.second == 0);
      else
        CHECK(on.second < off.second);
    }
  }
  // The ops' numerics: bf16 attention is float attention on the rounded q, k and v, with its
  // output rounded, bit for bit (one rank: the same block order); where ring attention's
  // products run on AMX tiles (P and dS rounded too, the tiles' sums), within a bf16 step of
  // it.
  const Communicator self(MPI_COMM_SELF);
  const Decomposition whole({7, 6}, {1, 1}, {false, false});
  std::vector<ShardTensor<float>> qkv, rounded;
  for (std::uint64_t seed : {3, 4, 5}) {
    qkv.push_back(test::random_shard<float>(whole, 0, 2, 4, seed));
    rounded.push_back(kernels::bfloat16_copy(qkv.back(), "rounded"));
  }
  const auto attend = [&](const std::vector<ShardTensor<float>>& in, bool ring, bool bf16) {
    std::vector<Variable<float>> v;
    for (const ShardTensor<float>& f : in) v.push_back(Variable<float>::field(f, false, "x"));
    NeighborhoodAttentionOptions n;
    n.heads = 2;
    n.window = {3};
    n.bf16 = bf16;
    const Variable<float> out = ring ? ring_attention(self, v[0], v[1], v[2], 2, false, false, bf16)
                                     : neighborhood_attention(self, v[0], v[1], v[2], n);
    return test::host_values(kernels::bfloat16_copy(out.value(), "out").view());
  };
  for (const bool ring : {true, false}) {
    INFO((ring ? "ring" : "neighbourhood") << " attention op");
    const std::vector<double> low = attend(qkv, ring, true),
                              reference = attend(rounded, ring, false);
    if (!ring || !kernels::bf16_matrix_tiles()) {
      CHECK(low == reference);
      continue;
    }
    double largest = 0, difference = 0;
    for (std::size_t i = 0; i < low.size(); ++i) {
      largest = std::max(largest, std::abs(reference[i]));
      difference = std::max(difference, std::abs(low[i] - reference[i]));
    }
    CHECK(difference > 0);  // the tiles ran
    CHECK(difference <= bf16_step * largest);
  }
  // A double layer refuses bf16, naming the problem.
  MultiHeadAttentionOptions o;
  o.channels = 4;
  o.heads = 2;
  MultiHeadAttention<double> wide(world, o, "a");
  CHECK_THROWS_WITH(wide.compute_in_bf16(true), Contains("bf16 operands need a float model"));
}

TEST_CASE("a bf16 ViT (both attentions) and FNO: sharded equals one rank within bf16 rounding",
          "[bf16][vit][fno]") {
  // The projections, MLPs, patch embeddings and heads are bf16 convolutions, attention takes
  // bf16 Q, K, V; its softmax, the token norms and the spectral convolutions stay float.
  const Communicator world;
  const auto in_bf16 = [](std::shared_ptr<Module<float>> model) {
    model->compute_in_bf16(true);
    return model;
  };
  for (const AttentionKind attention : {AttentionKind::global, AttentionKind::neighborhood}) {
    models::ViTOptions o = test::small_vit(2, attention, PositionKind::sincos, {});
    o.final_norm = false;
    const auto vit = [o, in_bf16](const Communicator& comm) {
      return in_bf16(std::make_shared<models::ViT<float>>(comm, o));
    };
    for (const Decomposition& d :
         test::test_decompositions({12, 10}, world.size(), {false, false}, 4))
      test::check_equivalence<float>(vit, d, 1, 3, test::weighted_sum<float>,
                                     {4 * bf16_step, 4 * bf16_step});
  }
  const models::FNOOptions f = test::small_fno(2);
  const auto fno = [f, in_bf16](const Communicator& comm) {
    return in_bf16(std::make_shared<models::FNO<float>>(comm, f, "fno"));
  };
  for (const Decomposition& d : test::test_decompositions({12, 16}, world.size(), {true, true}, 3))
    test::check_equivalence<float>(fno, d, 1, 2, test::weighted_sum<float>,
                                   {4 * bf16_step, 4 * bf16_step});
}

TEST_CASE("bf16 is a float model's option: a double layer refuses it", "[bf16][errors]") {
  const Communicator comm;
  Conv<double> conv(comm, conv_options(2, 2, {3}, {1}), "c");
  CHECK_THROWS_WITH(conv.compute_in_bf16(true), Contains("bf16 operands need a float model"));
  conv.compute_in_bf16(false);  // off is always fine
  ConvTransposeOptions t;
  t.kernel = {2};
  t.stride = {2};
  ConvTranspose<double> up(comm, t, "up");
  CHECK_THROWS_WITH(up.compute_in_bf16(true), Contains("bf16 operands need a float model"));
}
