// Distributed FFT, SpectralConv and the FNO: round trips, agreement with FFTW on the gathered
// field, adjoint dot-product tests, sharded == single rank (outputs, input and parameter
// gradients) on several process grids and uneven splits, finite differences, bad input.

#include <fftw3.h>
#include <complex>

#include <yaml-cpp/yaml.h>
#include <catch2/catch.hpp>

#include "equivalence.hpp"
#include "model_options.hpp"
#include "shardtensor/models.hpp"
#include "shardtensor/spectral.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

template <class T>
double tolerance() {
  return std::is_same<T, float>::value ? 1e-5 : 1e-12;
}

/// The fields the tests transform: small, uneven extents in 2-D and 3-D.
const std::vector<std::vector<Index>> field_extents{{12, 10}, {8, 6, 10}, {9, 7}, {5, 6, 7}};

std::vector<Decomposition> decompositions_of(const std::vector<Index>& extents) {
  return test::test_decompositions(extents, test::world_size(), {}, 1);
}

/// A spectrum block with reproducible values per global mode (imaginary parts of the real
/// modes included: the adjoints must handle them).
template <class T>
SpectralView<T> random_spectrum(const DistributedFFT<T>& fft, std::uint64_t seed) {
  SpectralView<T> s = fft.allocate_spectrum("random_spectrum");
  auto host = Kokkos::create_mirror_view(s);
  const Box b = fft.local_spectral_box();
  const SpatialIndex e = fft.spectral_extents();
  for (Index n = 0; n < Index(s.extent(0)); ++n)
    for (Index c = 0; c < Index(s.extent(1)); ++c)
      for (Index i = 0; i < b.extent[0]; ++i)
        for (Index j = 0; j < b.extent[1]; ++j)
          for (Index k = 0; k < b.extent[2]; ++k) {
            const std::uint64_t g =
                (((n * s.extent(1) + c) * e[0] + b.lower[0] + i) * e[1] + b.lower[1] + j) * e[2] +
                b.lower[2] + k;
            host(n, c, i, j, k) = Kokkos::complex<T>(T(hashed_uniform(seed, 2 * g)),
                                                     T(hashed_uniform(seed, 2 * g + 1)));
          }
  Kokkos::deep_copy(s, host);
  return s;
}

/// Sum over all ranks of sum Re(conj(a) b) over the local blocks.
template <class T>
double inner(const SpectralView<T>& a, const SpectralView<T>& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  double s = 0;
  for (std::size_t i = 0; i < ha.span(); ++i)
    s += double(ha.data()[i].real()) * double(hb.data()[i].real()) +
         double(ha.data()[i].imag()) * double(hb.data()[i].imag());
  return test::sum_over_ranks(s);
}

/// Sum over all ranks of the products of the owned cells.
template <class T>
double inner(const ShardTensor<T>& a, const ShardTensor<T>& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.view());
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.view());
  const Box ia = a.interior_box(), ib = b.interior_box();
  double s = 0;
  for (Index n = 0; n < a.batch(); ++n)
    for (Index c = 0; c < a.channels(); ++c)
      for (Index x = 0; x < ia.extent[0]; ++x)
        for (Index y = 0; y < ia.extent[1]; ++y)
          for (Index z = 0; z < ia.extent[2]; ++z)
            s += double(ha(n, c, ia.lower[0] + x, ia.lower[1] + y, ia.lower[2] + z)) *
                 double(hb(n, c, ib.lower[0] + x, ib.lower[1] + y, ib.lower[2] + z));
  return test::sum_over_ranks(s);
}

double max_over_ranks(double local) {
  MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return local;
}

}  // namespace

TEMPLATE_TEST_CASE("inverse FFT of the forward FFT gives the field back", "[fft]", float, double) {
  const Communicator comm;
  for (const auto& extents : field_extents)
    for (const Decomposition& d : decompositions_of(extents)) {
      INFO("decomposition " << d.describe());
      // Ghost cells on the input: the transform reads owned cells only.
      ShardTensor<TestType> x(d, comm.rank(), 2, 3, GhostWidths::uniform(1, d.ndims()));
      test::fill(x, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
        return hashed_uniform(5, test::global_linear_index(d, 3, n, c, g));
      });
      DistributedFFT<TestType> fft(comm, d, 2, 3);
      const ShardTensor<TestType> back = fft.inverse(fft.forward(x));
      const ShardTensor<TestType> owned = test::random_shard<TestType>(d, comm.rank(), 2, 3, 5);
      CHECK(test::relative_error(all_gather(comm, back), all_gather(comm, owned)) <=
            tolerance<TestType>());
    }
}

TEMPLATE_TEST_CASE("the distributed FFT equals FFTW on the gathered field", "[fft]", float,
                   double) {
  const Communicator comm;
  for (const auto& extents : field_extents)
    for (const Decomposition& d : decompositions_of(extents)) {
      INFO("decomposition " << d.describe());
      const Index batch = 2, channels = 2;
      const auto x = test::random_shard<TestType>(d, comm.rank(), batch, channels, 7);
      DistributedFFT<TestType> fft(comm, d, batch, channels);
      const auto spectrum =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), fft.forward(x));
      const auto whole =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all_gather(comm, x));
      // Reference: FFTW's multi-dimensional r2c in double, of each (sample, channel) plane.
      const SpatialIndex n = d.global_extents(), k = fft.spectral_extents();
      std::vector<int> dims;
      for (int a = 0; a < d.ndims(); ++a) dims.push_back(int(n[a]));
      std::vector<double> in(n[0] * n[1] * n[2]);
      // std::complex<double> has fftw_complex's layout (FFTW's manual, "Complex numbers").
      std::vector<std::complex<double>> out(k[0] * k[1] * k[2]);
      fftw_plan plan =
          fftw_plan_dft_r2c(d.ndims(), dims.data(), in.data(),
                            reinterpret_cast<fftw_complex*>(out.data()), FFTW_ESTIMATE);
      const Box b = fft.local_spectral_box();
      double diff = 0, scale = 0;
      for (Index s = 0; s < batch; ++s)
        for (Index c = 0; c < channels; ++c) {
          for (Index i = 0; i < Index(in.size()); ++i)
            in[i] = whole.data()[(s * channels + c) * Index(in.size()) + i];
          fftw_execute(plan);
          for (Index i = 0; i < Index(out.size()); ++i) scale = std::max(scale, std::abs(out[i]));
          for (Index i = 0; i < b.extent[0]; ++i)
            for (Index j = 0; j < b.extent[1]; ++j)
              for (Index l = 0; l < b.extent[2]; ++l) {
                const auto& ref =
                    out[((b.lower[0] + i) * k[1] + b.lower[1] + j) * k[2] + b.lower[2] + l];
                const auto got = spectrum(s, c, i, j, l);
                diff = std::max(diff, std::hypot(double(got.real()) - ref.real(),
                                                 double(got.imag()) - ref.imag()));
              }
        }
      fftw_destroy_plan(plan);
      CHECK(max_over_ranks(diff) / scale <= tolerance<TestType>());
    }
}

TEMPLATE_TEST_CASE("FFT adjoints pass the dot-product test", "[fft][adjoint]", float, double) {
  const Communicator comm;
  const double tol = std::is_same<TestType, float>::value ? 1e-5 : 1e-12;
  for (const auto& extents : field_extents)
    for (const Decomposition& d : decompositions_of(extents)) {
      INFO("decomposition " << d.describe());
      DistributedFFT<TestType> fft(comm, d, 1, 2);
      const auto x = test::random_shard<TestType>(d, comm.rank(), 1, 2, 3);
      const auto g = random_spectrum(fft, 4);
      // <F x, g> = <x, F^T g>
      const double forward = inner<TestType>(fft.forward(x), g);
      const double forward_t = inner<TestType>(x, fft.forward_adjoint(g));
      CHECK(std::abs(forward - forward_t) <= tol * std::max(std::abs(forward), 1.0));
      // <F^-1 s, y> = <s, F^-T y>
      const auto s = random_spectrum(fft, 6);
      const auto y = test::random_shard<TestType>(d, comm.rank(), 1, 2, 8);
      const double inverse = inner<TestType>(fft.inverse(s), y);
      const double inverse_t = inner<TestType>(s, fft.inverse_adjoint(y));
      CHECK(std::abs(inverse - inverse_t) <= tol * std::max(std::abs(inverse), 1.0));
    }
}

namespace {

struct SpectralCase {
  const char* name;
  std::vector<Index> extents;
  SpectralConvOptions options;
};

std::vector<SpectralCase> spectral_cases() {
  auto opts = [](int in, int out, std::vector<int> modes) {
    SpectralConvOptions o;
    o.in_channels = in;
    o.out_channels = out;
    o.modes = modes;
    o.seed = 9;
    return o;
  };
  return {{"2-D 12x10, modes 3x4", {12, 10}, opts(2, 3, {3, 4})},
          {"2-D 9x7, modes at the Nyquist limit 4x4", {9, 7}, opts(3, 2, {4, 4})},
          {"3-D 8x6x10, modes 2x3x3", {8, 6, 10}, opts(2, 2, {2, 3, 3})}};
}

template <class T>
test::ModuleFactory<T> spectral_factory(const SpectralConvOptions& o) {
  return [o](const Communicator& comm) { return std::make_shared<SpectralConv<T>>(comm, o, "sc"); };
}

template <class T>
test::ModuleFactory<T> fno_factory(int dims) {
  return [dims](const Communicator& comm) {
    const models::FNOOptions o = test::small_fno(dims);
    return std::make_shared<models::FNO<T>>(comm, o, "fno");
  };
}

}  // namespace

TEMPLATE_TEST_CASE("SpectralConv sharded equals SpectralConv on one rank",
                   "[spectral_conv][equivalence]", float, double) {
  for (const SpectralCase& c : spectral_cases()) {
    INFO(c.name);
    for (const Decomposition& d : decompositions_of(c.extents))
      test::check_equivalence<TestType>(spectral_factory<TestType>(c.options), d, 2,
                                        c.options.in_channels);
  }
}

TEST_CASE("SpectralConv gradients match finite differences", "[spectral_conv][gradient]") {
  for (const SpectralCase& c : spectral_cases()) {
    INFO(c.name);
    const auto decompositions = decompositions_of(c.extents);
    test::check_gradients_by_finite_differences(spectral_factory<double>(c.options),
                                                decompositions.back(), 2, c.options.in_channels);
  }
}

TEMPLATE_TEST_CASE("FNO sharded equals FNO on one rank", "[fno][equivalence]", float, double) {
  for (const auto& extents : {std::vector<Index>{12, 10}, std::vector<Index>{8, 6, 10}}) {
    const auto decompositions = decompositions_of(extents);
    for (std::size_t i = 0; i < decompositions.size(); i += 2)  // balanced splits of each grid
      test::check_equivalence<TestType>(fno_factory<TestType>(int(extents.size())),
                                        decompositions[i], 1, 2);
  }
}

TEST_CASE("FNO gradients match finite differences", "[fno][gradient]") {
  const auto decompositions = decompositions_of({12, 10});
  test::check_gradients_by_finite_differences(fno_factory<double>(2), decompositions.back(), 1, 2);
}

TEST_CASE("the FNO builds from a config and rejects bad keys", "[fno][config]") {
  const Communicator comm;
  const models::ModelShape shape{2, 2, 1};
  const auto model = models::build_model<float>(
      YAML::Load("type: fno\nwidth: 6\nmodes: [3, 2]\nlayers: 2\nactivation: silu\n"
                 "projection_channels: 8\nseed: 4\n"),
      comm, shape);
  // lifting (6x2 + 6), 2 x (spectral 2 x 6x6x6x2, bypass 6x6 + 6), hidden 8x6 + 8, out 8 + 1
  CHECK(models::count_parameters(*model) ==
        (12 + 6) + 2 * (2 * 6 * 6 * 6 * 2 + 36 + 6) + (48 + 8) + 9);
  CHECK(model->named_parameters()[2].first == "spectral0.weight_real");
  CHECK_THROWS_WITH(models::build_model<float>(YAML::Load("type: fno\nwidht: 6\n"), comm, shape),
                    Contains("build_model: model (line 2): unknown key 'widht' (did you mean "
                             "'width'?)"));
  CHECK_THROWS_WITH(
      models::build_model<float>(YAML::Load("type: fno\nmodes: [3, 2, 1]\n"), comm, shape),
      Contains("model.modes (line 2): expects 2 sizes (one per spatial dim), got 3"));
  CHECK_THROWS_WITH(models::build_model<float>(YAML::Load("type: fno\n"), comm, {1, 1, 1}),
                    Contains("the fno model runs on 2-D and 3-D fields"));
}

TEST_CASE("SpectralConv and the FFT reject bad input naming layer, axis and values",
          "[spectral_conv][errors]") {
  const Communicator comm;
  const int p = comm.size();
  SpectralConvOptions o;
  o.in_channels = 2;
  o.out_channels = 2;
  o.modes = {7, 3};
  SpectralConv<float> too_many(comm, o, "sc1");
  const Decomposition d = Decomposition::automatic({12, 10}, p);
  {  // modes above the Nyquist limit: found on every rank
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    const std::string message = test::error_message_of([&] { too_many.forward(x); });
    CHECK(test::ranks_with_error(message) == p);
    CHECK_THAT(message, Contains("SpectralConv2d 'sc1': modes 7 along axis 0 exceed the Nyquist "
                                 "limit 6 of a field extent 12"));
  }
  o.modes = {3, 7};
  SpectralConv<float> last_axis(comm, o, "sc2");
  {
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 2));
    CHECK_THROWS_WITH(last_axis.forward(x),
                      Contains("modes 7 along axis 1 exceed the Nyquist limit 6 of a field extent "
                               "10"));
  }
  o.modes = {3, 3};
  SpectralConv<float> layer(comm, o, "sc3");
  {  // channel mismatch
    auto x = Variable<float>::field(ShardTensor<float>(d, comm.rank(), 1, 3));
    CHECK_THROWS_WITH(layer.forward(x),
                      Contains("SpectralConv2d 'sc3': input has 3 channels, the layer expects 2"));
  }
  {  // a 3-D field into a 2-D layer
    const Decomposition d3 = Decomposition::automatic({8, 8, 8}, p);
    auto x = Variable<float>::field(ShardTensor<float>(d3, comm.rank(), 1, 2));
    CHECK_THROWS_WITH(layer.forward(x), Contains("input is a 3-D field"));
  }
  o.modes = {0, 3};
  CHECK_THROWS_WITH(SpectralConv<float>(comm, o, "sc4"),
                    Contains("SpectralConv2d 'sc4': modes 0 along axis 0 must be at least 1"));
  o.modes = {3};
  CHECK_THROWS_WITH(SpectralConv<float>(comm, o, "sc5"),
                    Contains("modes needs 2 or 3 sizes (one per spatial dim), got 1"));
  // Fields too small or of the wrong dimension for the FFT.
  const Decomposition thin = Decomposition::automatic({Index(2 * p), 1}, p, {}, {p, 1});
  CHECK_THROWS_WITH(DistributedFFT<float>(comm, thin, 1, 1),
                    Contains("DistributedFFT: field extent 1 along axis 1 is too small"));
  const Decomposition line = Decomposition::automatic({Index(4 * p)}, p);
  CHECK_THROWS_WITH(DistributedFFT<double>(comm, line, 1, 1),
                    Contains("the distributed FFT transforms 2-D and 3-D fields"));
  {  // a field of another layout than the plan's
    DistributedFFT<float> fft(comm, d, 1, 2);
    CHECK_THROWS_WITH(fft.forward(ShardTensor<float>(d, comm.rank(), 1, 3)),
                      Contains("DistributedFFT::forward: field"));
  }
}
