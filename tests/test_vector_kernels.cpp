// The host vector kernels (kernels/backends/host/vector_kernels.hpp) on every instruction set
// this build and CPU run, against scalar references that sum in the same order (so the
// convolution tiles must match bit for bit) and against each other (every path the same bits).
// No MPI, no Kokkos: the aarch64 cross-test (scripts/test-arm64.sh) builds this file with
// vector_kernels.cpp and normalization_rows.cpp alone and runs it under qemu, on NEON.

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "host/vector_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace host = shardtensor::kernels::host;
using shardtensor::kernels::select_vector_isa;
using shardtensor::kernels::vector_isa;
using shardtensor::kernels::vector_isas;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float low = -1,
                                 float high = 1) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(engine);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Runs `run` on every path; each result must be the first path's, bit for bit (an empty
/// result: the case itself depends on the path's tile shape, nothing to compare).
template <class Run>
void on_every_path(const Run& run) {
  const std::vector<std::string> paths = vector_isas();
  if (paths.empty()) {
    WARN("no vector path on this CPU and build: nothing to test");
    return;
  }
  std::vector<float> first;
  for (const std::string& path : paths) {
    INFO("path " << path);
    select_vector_isa(path);
    REQUIRE(vector_isa() == path);
    const std::vector<float> result = run();
    if (first.empty())
      first = result;
    else if (!result.empty())
      CHECK(same_bits(result, first));
  }
  select_vector_isa("best");
}

/// A tile's output vectors as output_vectors makes them: whole ones within row 0, or (`mixed`)
/// one whole vector, one that runs from the end of row 0 (`row` cells, a source `stride` and an
/// output `out_row` apart) into row 1, and padding (no lanes).
std::vector<host::OutputVector> tile_vectors(bool mixed, int row, int stride, int out_row) {
  const host::ConvTileShape shape = host::conv_tile_shape();
  const int lanes = shape.lanes;
  std::vector<host::OutputVector> vectors;
  const unsigned all = lanes >= 32 ? ~0u : (1u << lanes) - 1u;
  for (int v = 0; v < shape.tile_vectors; ++v) {
    const int z = v * lanes;
    if (!mixed || v == 0) {
      vectors.push_back({z, z, 0, all, 0});
    } else if (v == 1) {  // the end of row 0 and the start of row 1
      const int z0 = row - lanes / 2;
      unsigned mask = 0, next = 0;
      for (int i = 0; i < lanes; ++i) {
        if (z0 + i < row) mask |= 1u << i;
        if (z0 + i - stride >= 0 && z0 + i - stride < row) next |= 1u << i;
      }
      vectors.push_back({z0, z0, out_row + z0 - stride, mask, next});
    } else {
      vectors.push_back({0, 0, 0, 0, 0});
    }
  }
  return vectors;
}

/// What a correlate tile writes: for each of its `rows` rows and each lane a vector reads,
/// sum(row, source offset of the lane) + bias[row], added to the old value when `accumulate`.
template <class Sum>
void expect_tile(const std::vector<host::OutputVector>& vectors, int rows,
                 std::ptrdiff_t out_stride, const std::vector<float>& bias, bool accumulate,
                 std::vector<float>& expected, const Sum& sum) {
  const int lanes = host::conv_tile_shape().lanes;
  for (int r = 0; r < rows; ++r)
    for (const host::OutputVector& v : vectors)
      for (int i = 0; i < lanes; ++i) {
        const bool here = v.mask >> i & 1u, next = v.next_mask >> i & 1u;
        if (!here && !next) continue;
        float& cell = expected[r * out_stride + (here ? v.output : v.next_output) + i];
        const float total = sum(r, v.source + i) + bias[r];
        cell = accumulate ? total + cell : total;
      }
}

/// a + b rounded to odd (truncated, then the last bit set where inexact), as Arm's BFDOT
/// rounds: s = a + b and its error e (exact, Knuth's two-sum) give the exact sum s + e.
float round_to_odd_sum(float a, float b) {
  const float s = a + b, bb = s - a, e = (a - (s - bb)) + (b - bb);
  if (e == 0) return s;
  const float truncated = (s > 0) == (e < 0) ? std::nextafter(s, 0.0f) : s;
  std::uint32_t u;
  std::memcpy(&u, &truncated, sizeof u);
  u |= 1u;
  float odd;
  std::memcpy(&odd, &u, sizeof odd);
  return odd;
}

/// acc + one bf16 pair's two products as the path's dot-product instruction adds them (the
/// products are exact; no subnormal values here): vdpbf16ps adds the upper product, then the
/// lower, each add rounded to nearest even; Arm's BFDOT adds the products' sum, both adds
/// rounded to odd.
float dot_pair_step(float acc, float a_upper, float b_upper, float a_lower, float b_lower) {
  if (vector_isa() == "neon")
    return round_to_odd_sum(acc, round_to_odd_sum(a_upper * b_upper, a_lower * b_lower));
  acc = std::fma(a_upper, b_upper, acc);
  return std::fma(a_lower, b_lower, acc);
}

std::uint32_t bf16_upper(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u & 0xFFFF0000u;  // truncated: a bf16 value
}
float value_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// Runs body(channels, taps, tap offsets) for a whole weight-gradient tile and the narrow ones
/// (one vector of channels or narrow_lanes of them, tap_padding taps); the taps' offsets within
/// a 3-row window of rows `stride` apart.
template <class Body>
void for_each_gradient_tile(int stride, const Body& body) {
  const host::ConvTileShape shape = host::conv_tile_shape();
  const int whole = shape.gradient_vectors * shape.lanes;
  for (const int channels : {whole, shape.lanes, shape.narrow_lanes}) {
    const int T = channels == whole ? shape.gradient_taps : host::tap_padding;
    CAPTURE(channels);
    std::vector<std::ptrdiff_t> offsets;
    for (int t = 0; t < T; ++t) offsets.push_back((t % 3) * stride + t / 3);
    body(channels, T, offsets);
  }
}

double gelu_exact(double x) {
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
double gelu_derivative_exact(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

}  // namespace

TEST_CASE("the paths on offer and their selection") {
  const std::vector<std::string> paths = vector_isas();
  std::string names;
  for (const std::string& path : paths) names += (names.empty() ? "" : ", ") + path;
  std::printf("test_vector_kernels: paths on this CPU: %s\n", names.empty() ? "none" : names.c_str());
  select_vector_isa("best");
  std::printf(
      "test_vector_kernels: bf16 dot products on the best path: %s (convolutions use "
      "them: %s)\n",
      host::pair_tiles_use_dot() ? "yes" : "no",
      shardtensor::kernels::bf16_dot_products() ? "yes" : "no");
  for (const std::string& path : paths) {
    select_vector_isa(path);
    CHECK(vector_isa() == path);
    CHECK(shardtensor::kernels::vector_kernels_on());
    CHECK(shardtensor::kernels::vector_lanes() == host::conv_tile_shape().lanes);
    // The multiply-add ceiling's loop runs on the path's own vectors: 12 chains of `lanes`.
    CHECK(shardtensor::kernels::run_multiply_add_chains(1000) ==
          2.0 * 1000 * 12 * shardtensor::kernels::vector_lanes());
    // The correlate tile's ceiling runs the path's own tile: rows x vectors x lanes outputs,
    // 32 channels x 9 taps each.
    const host::ConvTileShape shape = host::conv_tile_shape();
    CHECK(shardtensor::kernels::run_correlate_tiles(10) ==
          2.0 * 10 * shape.tile_rows * shape.tile_vectors * shape.lanes * 288);
  }
  select_vector_isa("off");
  CHECK(vector_isa() == "off");
  CHECK_FALSE(shardtensor::kernels::vector_kernels_on());
  CHECK(shardtensor::kernels::vector_lanes() == 0);
  CHECK(shardtensor::kernels::run_correlate_tiles(10) == 0.0);
  select_vector_isa("best");
  CHECK(vector_isa() == (paths.empty() ? "off" : paths.front()));
  CHECK_THROWS_WITH(select_vector_isa("avx1024"),
                    Catch::Contains("instruction set 'avx1024'") && Catch::Contains("best, off"));
  // The bf16 dot products' mode: a wrong one names itself and the choices, and changes nothing.
  const bool dots = shardtensor::kernels::bf16_dot_products();
  CHECK_THROWS_WITH(shardtensor::kernels::set_bf16_dot_products("sometimes"),
                    Catch::Contains("set_bf16_dot_products") &&
                        Catch::Contains("'sometimes' is not auto, on or off"));
  CHECK(shardtensor::kernels::bf16_dot_products() == dots);
  shardtensor::kernels::set_bf16_dot_products("off");
  CHECK_FALSE(shardtensor::kernels::bf16_dot_products());
  shardtensor::kernels::set_bf16_dot_products("auto");
  CHECK(shardtensor::kernels::bf16_dot_products() == dots);
}

TEST_CASE("GELU and its derivative on every path: within 2e-6 of the exact values, same bits") {
  // Every tail length, the far tails included.
  for (std::size_t n : {1, 7, 16, 37, 1000}) {
    INFO("n = " << n);
    const std::vector<float> x = random_floats(n, 11 + n, -10, 10);
    const std::vector<float> gy = random_floats(n, 12 + n);
    const std::vector<float> gx0 = random_floats(n, 13 + n);
    on_every_path([&] {
      std::vector<float> y(n), gx = gx0;
      host::gelu_rows(x.data(), y.data(), n);
      host::gelu_backward_rows(x.data(), gy.data(), gx.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        const double exact = gelu_exact(x[i]);
        CHECK(std::abs(y[i] - exact) <= 2e-6 * std::abs(exact) + 1e-37);
        const double exact_gradient = gx0[i] + gy[i] * gelu_derivative_exact(x[i]);
        CHECK(std::abs(gx[i] - exact_gradient) <=
              2e-6 * (std::abs(gx0[i]) + std::abs(gy[i] * gelu_derivative_exact(x[i]))) + 1e-30);
      }
      y.insert(y.end(), gx.begin(), gx.end());
      return y;
    });
  }
}

TEST_CASE("softmax rows on every path: max exact, exp within 2 ulp, sum in one fixed order") {
  for (std::size_t n : {1, 5, 16, 33, 200}) {
    INFO("n = " << n);
    const std::vector<float> x = random_floats(n, 21 + n, -30, 5);
    on_every_path([&] {
      float expected_max = x[0];
      for (float v : x) expected_max = std::max(expected_max, v);
      CHECK(host::row_max(x.data(), n) == expected_max);
      std::vector<float> p = x;
      const float sum = host::exp_row(p.data(), n, expected_max);
      double exact_sum = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const double exact = std::exp(double(x[j] - expected_max));  // the float difference
        CHECK(std::abs(p[j] - exact) <= 2.4e-7 * exact);
        exact_sum += exact;
      }
      CHECK(std::abs(sum - exact_sum) <= 1e-6 * exact_sum);
      p.push_back(sum);
      return p;
    });
  }
}

TEST_CASE("normalization rows: the portable kernels' bits per cell, sums in one fixed order") {
  // Each cell in double as kernels/src/normalization.cpp computes it (the same bits); a row's
  // sums: cell j into partial sum j mod 8, in order, then the fixed tree below.
  const auto tree = [](const std::vector<double>& s) {
    double q[4];
    for (int i = 0; i < 4; ++i) q[i] = s[i + 4] + s[i];
    return (q[0] + q[2]) + (q[1] + q[3]);
  };
  const auto fixed_order = [&](std::size_t n, auto term) {
    std::vector<double> partial(8, 0.0);
    for (std::size_t j = 0; j < n; ++j) partial[j % 8] += term(j);
    return tree(partial);
  };
  const double mean = 0.37, rstd = 1.9, scale = -0.8, shift = 0.25, c1 = 1.3, c2 = -0.02, c3 = 0.6;
  for (std::size_t n : {1, 5, 8, 13, 16, 64, 203}) {
    INFO("n = " << n);
    // Values far from their mean and of mixed magnitudes: the order of the sums shows.
    std::vector<float> x = random_floats(n, 61 + n, -3, 5), dy = random_floats(n, 62 + n);
    for (std::size_t j = 0; j < n; j += 3) x[j] *= 1000.0f;
    on_every_path([&] {
      std::vector<double> sums(5);
      sums[0] = host::sum_row(x.data(), n);
      host::deviation_sums_row(x.data(), n, mean, &sums[1]);
      host::gradient_sums_row(dy.data(), x.data(), n, mean, rstd, &sums[3]);
      CHECK(sums[0] == fixed_order(n, [&](std::size_t j) { return double(x[j]); }));
      CHECK(sums[1] == fixed_order(n, [&](std::size_t j) { return double(x[j]) - mean; }));
      CHECK(sums[2] == fixed_order(n, [&](std::size_t j) {
              const double d = double(x[j]) - mean;
              return d * d;
            }));
      CHECK(sums[3] == fixed_order(n, [&](std::size_t j) { return double(dy[j]); }));
      CHECK(sums[4] == fixed_order(n, [&](std::size_t j) {
              return double(dy[j]) * ((double(x[j]) - mean) * rstd);
            }));
      std::vector<float> y(n), dx = random_floats(n, 63 + n), dx_expected = dx;
      host::normalize_row(x.data(), y.data(), n, mean, rstd, scale, shift);
      std::vector<float> written(n, 7.0f);
      host::normalize_backward_row(dy.data(), x.data(), dx.data(), n, mean, rstd, c1, c2, c3,
                                   false);
      host::normalize_backward_row(dy.data(), x.data(), written.data(), n, mean, rstd, c1, c2, c3,
                                   true);
      std::vector<float> y_expected(n), written_expected(n);
      for (std::size_t j = 0; j < n; ++j) {
        y_expected[j] = static_cast<float>((double(x[j]) - mean) * rstd * scale + shift);
        const double xhat = (double(x[j]) - mean) * rstd;
        written_expected[j] = static_cast<float>(c1 * double(dy[j]) - c2 - c3 * xhat);
        dx_expected[j] += written_expected[j];
      }
      CHECK(same_bits(y, y_expected));
      CHECK(same_bits(dx, dx_expected));
      CHECK(same_bits(written, written_expected));
      y.insert(y.end(), dx.begin(), dx.end());
      for (double s : sums) y.push_back(static_cast<float>(s));
      return y;
    });
  }
}

TEST_CASE("a correlate tile equals the scalar sums in the same order, bit for bit") {
  // Planes of 3 x-taps, 2 channels of 9 x 40 cells (row stride 40); 3 x 3 (y, z) taps per
  // channel; output rows of 39 cells (a source stride of 40, an output stride of 50), so
  // vectors are whole, run on from one row into the next past a skipped lane, or are padding
  // (one or two of a band's last tile: it sums only the others).
  constexpr int x_taps = 3, channels = 2, plane_rows = 9, stride = 40, row = 39, out_row = 50;
  const std::ptrdiff_t channel_stride = plane_rows * stride;
  const std::vector<float> source = random_floats(x_taps * channels * channel_stride, 31);
  std::vector<std::ptrdiff_t> offsets;
  for (int j = 0; j < channels; ++j)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 3; ++c) offsets.push_back(j * channel_stride + b * stride + c);
  const int taps = static_cast<int>(offsets.size());
  for (bool accumulate : {false, true})
    for (int case_index = 0; case_index < 4; ++case_index) {
      INFO("accumulate " << accumulate << ", case " << case_index);
      on_every_path([&] {
        const host::ConvTileShape shape = host::conv_tile_shape();
        const int R = shape.tile_rows;
        const int rows = case_index == 2 ? R - 1 : R;  // a tile short of its rows
        const std::vector<float> weights = random_floats(x_taps * taps * R, 32);
        const std::vector<float> bias = random_floats(R, 33);
        const float* planes[x_taps] = {source.data(), nullptr, source.data() + 2 * channels *
                                                                                  channel_stride};
        if (case_index == 1) planes[1] = source.data() + channels * channel_stride;
        std::vector<host::OutputVector> vectors =
            tile_vectors(case_index != 0, row, stride, out_row);
        if (case_index == 3)  // one whole vector, then padding
          for (std::size_t v = 1; v < vectors.size(); ++v) vectors[v] = {0, 0, 0, 0, 0};
        const std::ptrdiff_t out_stride = 2 * out_row;
        std::vector<float> out = random_floats(R * out_stride, 34), expected = out;
        host::correlate_tile(planes, x_taps, offsets.data(), taps, weights.data(), vectors.data(),
                             out.data(), out_stride, rows, bias.data(), accumulate);
        expect_tile(vectors, rows, out_stride, bias, accumulate, expected,
                    [&](int r, std::ptrdiff_t source) {
                      float acc = 0;
                      for (int a = 0; a < x_taps; ++a) {
                        if (!planes[a]) continue;
                        for (int t = 0; t < taps; ++t)
                          acc = std::fma(weights[(a * taps + t) * R + r],
                                         planes[a][source + offsets[t]], acc);
                      }
                      return acc;
                    });
        CHECK(same_bits(out, expected));
        // The tile (its rows and vectors) is the path's own: each path equals the same-order
        // sums, so every path gives the same bits (test_conv compares whole layers).
        return std::vector<float>();
      });
    }
}

TEST_CASE("a bf16 dot-product tile equals the scalar sums in pair order, bit for bit") {
  // Pair planes of 2 x-taps (one outside the source), 3 pairs of 7 x 40 cells; 2 x 3 (y, z)
  // taps per pair; bf16 values of both signs. Each output adds channel 2p's and 2p + 1's
  // products per pair tap as the path's instruction does (dot_pair_step).
  select_vector_isa("best");
  if (!host::pair_tiles_use_dot()) {  // the CPU's, whether or not convolutions prefer them
    WARN("no bf16 dot products on this CPU and path: nothing to test");
    return;
  }
  constexpr int x_taps = 2, pairs = 3, plane_rows = 7, stride = 40, row = 39, out_row = 50;
  const std::ptrdiff_t pair_stride = plane_rows * stride;
  const auto bf16 = bf16_upper;
  const std::vector<float> upper = random_floats(x_taps * pairs * pair_stride, 51),
                           lower = random_floats(x_taps * pairs * pair_stride, 52);
  std::vector<std::uint32_t> source(upper.size());
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = bf16(upper[i]) | bf16(lower[i]) >> 16;
  std::vector<std::ptrdiff_t> offsets;
  for (int p = 0; p < pairs; ++p)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c) offsets.push_back(p * pair_stride + b * stride + c);
  const int taps = static_cast<int>(offsets.size());
  const host::ConvTileShape shape = host::conv_tile_shape();
  const int R = shape.tile_rows;
  for (bool accumulate : {false, true})
    for (int case_index = 0; case_index < 4; ++case_index) {
      INFO("accumulate " << accumulate << ", case " << case_index);
      const int rows = case_index == 2 ? R - 1 : R;
      // Channel 2p's and 2p + 1's weights per (a, t, r), packed in pairs.
      const std::vector<float> wu = random_floats(x_taps * taps * R, 53),
                               wl = random_floats(wu.size(), 54);
      std::vector<std::uint32_t> packed(wu.size());
      for (std::size_t i = 0; i < wu.size(); ++i) packed[i] = bf16(wu[i]) | bf16(wl[i]) >> 16;
      const std::vector<float> bias = random_floats(R, 55);
      const std::uint32_t* planes[x_taps] = {source.data(), nullptr};
      if (case_index == 1) planes[1] = source.data() + pairs * pair_stride;
      std::vector<host::OutputVector> vectors = tile_vectors(case_index != 0, row, stride, out_row);
      if (case_index == 3)  // one whole vector, then padding
        for (std::size_t v = 1; v < vectors.size(); ++v) vectors[v] = {0, 0, 0, 0, 0};
      const std::ptrdiff_t out_stride = 2 * out_row;
      std::vector<float> out = random_floats(R * out_stride, 56), expected = out;
      host::correlate_pairs_tile(planes, x_taps, offsets.data(), taps, packed.data(),
                                 vectors.data(), out.data(), out_stride, rows, bias.data(),
                                 accumulate);
      expect_tile(vectors, rows, out_stride, bias, accumulate, expected,
                  [&](int r, std::ptrdiff_t source) {
                    float acc = 0;
                    for (int a = 0; a < x_taps; ++a) {
                      if (!planes[a]) continue;
                      for (int t = 0; t < taps; ++t) {
                        const std::uint32_t x = planes[a][source + offsets[t]];
                        const std::uint32_t w = packed[(a * taps + t) * R + r];
                        acc =
                            dot_pair_step(acc, value_of(w & 0xFFFF0000u), value_of(x & 0xFFFF0000u),
                                          value_of(w << 16), value_of(x << 16));
                      }
                    }
                    return acc;
                  });
      CHECK(same_bits(out, expected));
    }
}

TEST_CASE("a bf16 dot-product weight-gradient tile equals the scalar sums in pair order") {
  // A source plane of 3 rows as pairs of its own cells (cell k: k's bf16 value upper, k + 1's
  // lower), the output gradient as pairs of a row's cells (2q, 2q + 1) per channel; each sum
  // adds cell 2q's and 2q + 1's products per pair as the path's instruction does.
  select_vector_isa("best");
  if (!host::pair_tiles_use_dot()) {  // the CPU's, whether or not convolutions prefer them
    WARN("no bf16 dot products on this CPU and path: nothing to test");
    return;
  }
  constexpr int rows = 3, pairs = 6, stride = 20;
  const std::vector<float> plane = random_floats((rows + 5) * stride + 1, 61);
  std::vector<std::uint32_t> source(plane.size() - 1);
  for (std::size_t k = 0; k < source.size(); ++k)
    source[k] = bf16_upper(plane[k]) | bf16_upper(plane[k + 1]) >> 16;
  for_each_gradient_tile(
      stride, [&](int channels, int T, const std::vector<std::ptrdiff_t>& offsets) {
        const int dy_channels = host::gradient_channels + 5;
        const std::vector<float> dy_upper = random_floats(rows * pairs * dy_channels, 62),
                                 dy_lower = random_floats(dy_upper.size(), 63);
        std::vector<std::uint32_t> dy_pairs(dy_upper.size());
        for (std::size_t i = 0; i < dy_pairs.size(); ++i)
          dy_pairs[i] = bf16_upper(dy_upper[i]) | bf16_upper(dy_lower[i]) >> 16;
        const std::ptrdiff_t gradient_stride = host::gradient_channels + 3;
        std::vector<float> gradient = random_floats(T * gradient_stride, 64), expected = gradient;
        host::weight_gradient_pairs_tile(source.data(), offsets.data(), stride, rows, pairs,
                                         dy_pairs.data(), dy_channels, channels, gradient.data(),
                                         gradient_stride);
        for (int t = 0; t < T; ++t)
          for (int o = 0; o < channels; ++o) {
            float acc = 0;
            for (int y = 0; y < rows; ++y)
              for (int q = 0; q < pairs; ++q) {
                const std::uint32_t x = source[y * stride + offsets[t] + 2 * q],
                                    g = dy_pairs[(y * pairs + q) * dy_channels + o];
                acc = dot_pair_step(acc, value_of(x & 0xFFFF0000u), value_of(g & 0xFFFF0000u),
                                    value_of(x << 16), value_of(g << 16));
              }
            expected[t * gradient_stride + o] += acc;
          }
        CHECK(same_bits(gradient, expected));  // the lanes past the tile's too (untouched)
      });
}

TEST_CASE("transposed rows: every channel's value at its cell, the rest untouched") {
  // Channels in fours; cells: fewer than a vector, whole vectors, and a tail on every path.
  for (const int channels : {4, 8, 24, 32})
    for (const int cells : {1, 3, 7, 16, 37}) {
      INFO(channels << " channels, " << cells << " cells");
      const int stride = channels + 3;  // a row per cell wider than its channels
      const std::vector<float> source = random_floats(std::size_t(channels) * cells, 41);
      std::vector<const float*> rows(channels);
      for (int c = 0; c < channels; ++c) rows[c] = source.data() + std::size_t(c) * cells;
      on_every_path([&] {
        std::vector<float> to(std::size_t(stride) * cells, -7.0f);
        host::transpose_rows(rows.data(), channels, cells, to.data(), stride);
        bool right = true;
        for (int p = 0; p < cells; ++p)
          for (int k = 0; k < stride; ++k)
            right = right && to[std::size_t(p) * stride + k] == (k < channels ? rows[k][p] : -7.0f);
        CHECK(right);
        return to;
      });
    }
}

TEST_CASE("Winograd's F(2x2, 3x3) transforms equal the scalar transforms, bit for bit") {
  // Input: 4 x 4 cells per tile from shift + 2t, zeros outside [0, row_cells) (or the cells
  // a row away) and for a null row; tiles fewer than a vector, whole vectors and tails; rows read
  // from their ends.
  for (const int tiles : {1, 5, 8, 17, 37})
    for (const std::ptrdiff_t shift : {-1, 0, 1})
      for (const int missing_row : {-1, 3})
        for (const bool wrap : {false, true}) {
          const std::ptrdiff_t row_cells = 2 * tiles + 1 + shift;  // the last cells read past it
          INFO(tiles << " tiles, shift " << shift << ", row " << missing_row << " null"
                     << (wrap ? ", wrapping around" : ""));
          const std::vector<float> cells = random_floats(4 * std::size_t(row_cells), 51);
          const float* rows[4];
          for (int i = 0; i < 4; ++i)
            rows[i] = i == missing_row ? nullptr : cells.data() + i * row_cells;
          const std::ptrdiff_t stride = tiles + 16;
          on_every_path([&] {
            std::vector<float> v(16 * std::size_t(stride), -7.0f);
            host::winograd_input_tiles(rows, shift, row_cells, wrap, tiles, v.data(), stride);
            bool right = true;
            for (int t = 0; t < tiles; ++t) {
              float d[4][4], b[4][4], e[4][4];
              for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) {
                  const std::ptrdiff_t z = shift + 2 * t + j,
                                       zw = wrap ? (z + 2 * row_cells) % row_cells : z;
                  d[i][j] = rows[i] && zw >= 0 && zw < row_cells ? rows[i][zw] : 0.0f;
                }
              for (int j = 0; j < 4; ++j) {  // B^T d
                b[0][j] = d[0][j] - d[2][j], b[1][j] = d[1][j] + d[2][j];
                b[2][j] = d[2][j] - d[1][j], b[3][j] = d[1][j] - d[3][j];
              }
              for (int i = 0; i < 4; ++i) {  // (B^T d) B
                e[i][0] = b[i][0] - b[i][2], e[i][1] = b[i][1] + b[i][2];
                e[i][2] = b[i][2] - b[i][1], e[i][3] = b[i][1] - b[i][3];
              }
              for (int xi = 0; xi < 16; ++xi)
                right = right && v[xi * stride + t] == e[xi / 4][xi % 4];
            }
            CHECK(right);
            v.resize(16 * std::size_t(stride));
            for (int xi = 0; xi < 16; ++xi)  // past the tiles: whatever the vectors wrote
              std::fill(v.begin() + xi * stride + tiles, v.begin() + (xi + 1) * stride, 0.0f);
            return v;
          });
        }
  // Output: A^T m A + bias into two rows (or one), only the cells below `columns`.
  for (const int tiles : {1, 5, 8, 17, 37})
    for (const int columns : {2 * tiles - 1, 2 * tiles})
      for (const bool second_row : {true, false}) {
        INFO(tiles << " tiles, " << columns << " columns" << (second_row ? "" : ", one row"));
        const std::ptrdiff_t stride = tiles + 16;
        const std::vector<float> m = random_floats(16 * std::size_t(stride), 52);
        const float bias = 0.375f;
        on_every_path([&] {
          std::vector<float> out(2 * std::size_t(columns + 5), -7.0f);
          float* const row0 = out.data();
          float* const row1 = second_row ? out.data() + columns + 5 : nullptr;
          host::winograd_output_tiles(m.data(), stride, tiles, bias, row0, row1, columns);
          std::vector<float> expected(out.size(), -7.0f);
          for (int t = 0; t < tiles; ++t) {
            float s[2][4];
            for (int j = 0; j < 4; ++j) {
              const float m0 = m[j * stride + t], m1 = m[(4 + j) * stride + t],
                          m2 = m[(8 + j) * stride + t], m3 = m[(12 + j) * stride + t];
              s[0][j] = (m0 + m1) + m2, s[1][j] = (m1 - m2) - m3;
            }
            for (int i = 0; i < (second_row ? 2 : 1); ++i) {
              float* const row = expected.data() + i * (columns + 5);
              if (2 * t < columns) row[2 * t] = ((s[i][0] + s[i][1]) + s[i][2]) + bias;
              if (2 * t + 1 < columns) row[2 * t + 1] = ((s[i][1] - s[i][2]) - s[i][3]) + bias;
            }
          }
          CHECK(same_bits(out, expected));
          return out;
        });
      }
}

TEST_CASE("Winograd's F(2x4, 3x3) transforms equal the scalar transforms, bit for bit") {
  // Input: 4 x 6 cells per tile from shift + 4t, read as F(2x2)'s are; tiles fewer than a
  // vector, whole vectors and tails; rows read from their ends.
  for (const int tiles : {1, 3, 4, 9, 21})
    for (const std::ptrdiff_t shift : {-1, 0, 1})
      for (const int missing_row : {-1, 3})
        for (const bool wrap : {false, true}) {
          const std::ptrdiff_t row_cells = 4 * tiles + 1 + shift;  // the last cells read past it
          INFO(tiles << " tiles, shift " << shift << ", row " << missing_row << " null"
                     << (wrap ? ", wrapping around" : ""));
          const std::vector<float> cells = random_floats(4 * std::size_t(row_cells), 54);
          const float* rows[4];
          for (int i = 0; i < 4; ++i)
            rows[i] = i == missing_row ? nullptr : cells.data() + i * row_cells;
          const std::ptrdiff_t stride = tiles + 16;
          on_every_path([&] {
            std::vector<float> v(24 * std::size_t(stride), -7.0f);
            host::winograd_wide_input_tiles(rows, shift, row_cells, wrap, tiles, v.data(), stride);
            bool right = true;
            for (int t = 0; t < tiles; ++t) {
              float d[4][6], b[4][6], e[4][6];
              for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 6; ++j) {
                  const std::ptrdiff_t z = shift + 4 * t + j,
                                       zw = wrap ? (z + 2 * row_cells) % row_cells : z;
                  d[i][j] = rows[i] && zw >= 0 && zw < row_cells ? rows[i][zw] : 0.0f;
                }
              for (int j = 0; j < 6; ++j) {  // B^T d, F(2, 3)
                b[0][j] = d[0][j] - d[2][j], b[1][j] = d[1][j] + d[2][j];
                b[2][j] = d[2][j] - d[1][j], b[3][j] = d[1][j] - d[3][j];
              }
              for (int i = 0; i < 4; ++i) {  // (B^T d) B, F(4, 3) on 0, 1, -1, 1/2, -2
                const float* c = b[i];
                const float f = c[3] - c[1], g = c[4] - c[2];
                e[i][0] = std::fma(1.5f, f, std::fma(-2.0f, c[2], c[0] + c[4]));
                e[i][1] = std::fma(2.5f, c[3], std::fma(0.5f, c[2], c[4] - c[1]));
                e[i][2] = std::fma(0.5f, c[3], std::fma(-2.5f, c[2], c[4] + c[1]));
                e[i][3] = std::fma(2.0f, f, g);
                e[i][4] = std::fma(-0.5f, f, g);
                e[i][5] = std::fma(1.5f, g, std::fma(-2.0f, c[3], c[1] + c[5]));
              }
              for (int xi = 0; xi < 24; ++xi)
                right = right && v[xi * stride + t] == e[xi / 6][xi % 6];
            }
            CHECK(right);
            for (int xi = 0; xi < 24; ++xi)  // past the tiles: whatever the vectors wrote
              std::fill(v.begin() + xi * stride + tiles, v.begin() + (xi + 1) * stride, 0.0f);
            return v;
          });
        }
  // Output: A^T m A + bias into two rows (or one), only the cells below `columns`.
  for (const int tiles : {1, 3, 4, 9, 21})
    for (const int columns : {4 * tiles - 3, 4 * tiles - 1, 4 * tiles})
      for (const bool second_row : {true, false}) {
        INFO(tiles << " tiles, " << columns << " columns" << (second_row ? "" : ", one row"));
        const std::ptrdiff_t stride = tiles + 16;
        const std::vector<float> m = random_floats(24 * std::size_t(stride), 52);
        const float bias = 0.375f;
        on_every_path([&] {
          std::vector<float> out(2 * std::size_t(columns + 5), -7.0f);
          float* const row0 = out.data();
          float* const row1 = second_row ? out.data() + columns + 5 : nullptr;
          host::winograd_wide_output_tiles(m.data(), stride, tiles, bias, row0, row1, columns);
          std::vector<float> expected(out.size(), -7.0f);
          for (int t = 0; t < tiles; ++t) {
            float s[2][6];
            for (int j = 0; j < 6; ++j) {  // A^T m, F(2, 3)
              const float m0 = m[j * stride + t], m1 = m[(6 + j) * stride + t],
                          m2 = m[(12 + j) * stride + t], m3 = m[(18 + j) * stride + t];
              s[0][j] = (m0 + m1) + m2, s[1][j] = (m1 - m2) - m3;
            }
            for (int i = 0; i < (second_row ? 2 : 1); ++i) {  // (A^T m) A, F(4, 3)
              const float* c = s[i];
              const float p = c[1] + c[2], q = c[1] - c[2];
              const float y[4] = {((c[0] + p) + (c[3] + c[4])) + bias,
                                  std::fma(-2.0f, c[4], std::fma(0.5f, c[3], q)) + bias,
                                  std::fma(4.0f, c[4], std::fma(0.25f, c[3], p)) + bias,
                                  (std::fma(-8.0f, c[4], std::fma(0.125f, c[3], q)) + c[5]) + bias};
              float* const row = expected.data() + i * (columns + 5);
              for (int k = 0; k < 4; ++k)
                if (4 * t + k < columns) row[4 * t + k] = y[k];
            }
          }
          CHECK(same_bits(out, expected));
          return out;
        });
      }
}

TEST_CASE("Winograd's output-gradient transform equals the scalar transform, bit for bit") {
  // A y A^T of 2 x 2 output-gradient cells per tile: zeros at and past `columns` and for a null
  // second row; tiles fewer than a vector, whole vectors and tails.
  for (const int tiles : {1, 5, 8, 17, 37})
    for (const int columns : {2 * tiles - 1, 2 * tiles})
      for (const bool second_row : {true, false}) {
        INFO(tiles << " tiles, " << columns << " columns" << (second_row ? "" : ", one row"));
        const std::ptrdiff_t stride = tiles + 16;
        const std::vector<float> cells = random_floats(2 * std::size_t(columns), 53);
        const float* const row0 = cells.data();
        const float* const row1 = second_row ? cells.data() + columns : nullptr;
        on_every_path([&] {
          std::vector<float> m(16 * std::size_t(stride), -7.0f);
          host::winograd_gradient_tiles(row0, row1, columns, tiles, m.data(), stride);
          std::vector<float> expected = m;
          for (int t = 0; t < tiles; ++t) {
            float y[2][2], s[4][2];
            for (int i = 0; i < 2; ++i)
              for (int c = 0; c < 2; ++c) {
                const float* row = i == 0 ? row0 : row1;
                y[i][c] = row && 2 * t + c < columns ? row[2 * t + c] : 0.0f;
              }
            for (int c = 0; c < 2; ++c)  // A y
              s[0][c] = y[0][c], s[1][c] = y[0][c] + y[1][c], s[2][c] = y[0][c] - y[1][c],
              s[3][c] = -y[1][c];
            for (int i = 0; i < 4; ++i) {  // (A y) A^T
              const float e[4] = {s[i][0], s[i][0] + s[i][1], s[i][0] - s[i][1], -s[i][1]};
              for (int j = 0; j < 4; ++j) expected[(4 * i + j) * stride + t] = e[j];
            }
          }
          CHECK(same_bits(m, expected));
          for (int xi = 0; xi < 16; ++xi)  // past the tiles: whatever the vectors wrote
            std::fill(m.begin() + xi * stride + tiles, m.begin() + (xi + 1) * stride, 0.0f);
          return m;
        });
      }
}

TEST_CASE("a weight-gradient tile equals the scalar sums in the same order, bit for bit") {
  constexpr int rows = 3, columns = 13, stride = 20;
  const std::vector<float> source = random_floats((rows + 5) * stride, 41);
  on_every_path([&] {
    std::vector<float> common;
    // The transposed gradient's cells a dy_channels stride apart, more than a tile reads.
    for_each_gradient_tile(stride, [&](int channels, int T,
                                       const std::vector<std::ptrdiff_t>& offsets) {
      const int dy_channels = host::gradient_channels + 5;
      const std::vector<float> dy_t = random_floats(rows * columns * dy_channels, 42);
      const std::ptrdiff_t gradient_stride = host::gradient_channels + 3;
      std::vector<float> gradient = random_floats(T * gradient_stride, 43), expected = gradient;
      host::weight_gradient_tile(source.data(), offsets.data(), stride, rows, columns, dy_t.data(),
                                 dy_channels, channels, gradient.data(), gradient_stride);
      for (int t = 0; t < T; ++t)
        for (int o = 0; o < channels; ++o) {
          float acc = 0;
          for (int y = 0; y < rows; ++y)
            for (int z = 0; z < columns; ++z)
              acc = std::fma(source[y * stride + offsets[t] + z],
                             dy_t[(y * columns + z) * dy_channels + o], acc);
          expected[t * gradient_stride + o] += acc;
        }
      CHECK(same_bits(gradient, expected));  // the lanes past the tile's too (untouched)
      // Every path's tile covers its own channel count: compare the first 4 channels of 6 taps
      // (what every path computes).
      for (int t = 0; t < 6; ++t)
        for (int o = 0; o < 4; ++o) common.push_back(gradient[t * gradient_stride + o]);
    });
    return common;
  });
}

TEST_CASE(
    "bf16 pairs, rounded and packed arrays round to nearest even on every path, NaN quiet, "
    "infinities kept") {
  // The reference rounds by cases, not by the kernels' carry trick.
  const auto bits = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint32_t((u | 0x00400000u) >> 16);
    std::uint32_t upper = u >> 16;
    const std::uint32_t lower = u & 0xffffu;
    if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++upper;
    return upper;
  };
  const auto from_bits = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  std::vector<float> values = random_floats(45, 51, -3, 3);
  // Ties both ways, just below and above a tie, the largest finite, the smallest subnormal,
  // infinities, NaNs quiet and signalling, zeros.
  for (const std::uint32_t u :
       {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu, 0x00000001u, 0x7f800000u,
        0xff800000u, 0x7fc00001u, 0x7f800001u, 0xff800001u, 0x00000000u, 0x80000000u, 0x807fffffu})
    values.push_back(from_bits(u));
  const std::vector<float> lower = random_floats(values.size(), 52, -1e-3f, 1e-3f);
  on_every_path([&] {
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), values.size()})
      for (const bool with_lower : {true, false}) {
        CAPTURE(n, with_lower);
        // Upper from values, lower from `lower`, and the other way round (specials in both).
        for (const bool swapped : {false, true}) {
          const float* up = swapped ? lower.data() : values.data();
          const float* low = with_lower ? (swapped ? values.data() : lower.data()) : nullptr;
          std::vector<std::uint32_t> pairs(n + 1, 0xdeadbeefu);
          host::bf16_pairs(up, low, pairs.data(), n);
          for (std::size_t i = 0; i < n; ++i)
            CHECK(pairs[i] == (bits(up[i]) << 16 | (low ? bits(low[i]) : 0u)));
          CHECK(pairs[n] == 0xdeadbeefu);  // nothing past the end
        }
        // The same rounding of whole arrays: as floats (in place too) and packed in 16 bits.
        std::vector<float> rounded(n + 1, 7.0f), in_place(values.begin(), values.begin() + n);
        std::vector<std::uint16_t> packed(n + 1, 0xbeefu);
        host::bf16_round(values.data(), rounded.data(), n);
        host::bf16_round(in_place.data(), in_place.data(), n);
        const std::size_t inexact = host::bf16_pack(values.data(), packed.data(), n);
        std::size_t expected_inexact = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float expected = from_bits(bits(values[i]) << 16);
          CHECK(std::memcmp(&rounded[i], &expected, sizeof expected) == 0);
          CHECK(std::memcmp(&in_place[i], &expected, sizeof expected) == 0);
          CHECK(packed[i] == bits(values[i]));
          expected_inexact += !(expected == values[i]);  // NaN counts
        }
        CHECK(inexact == expected_inexact);
        CHECK(rounded[n] == 7.0f);  // nothing past the end
        CHECK(packed[n] == 0xbeefu);
      }
    return std::vector<float>();
  });
}
