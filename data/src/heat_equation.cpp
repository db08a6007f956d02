#include "shardtensor/data/heat_equation.hpp"

#include <unistd.h>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/halo_exchange.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/kokkos_math.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/attributes.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/field_io.hpp"
#include "shardtensor/io/xdmf.hpp"

namespace shardtensor {

namespace {

constexpr double two_pi = 6.283185307179586476925;

/// Random Fourier modes sum_m a_m sin(2 pi k_m . x + phi_m), amplitudes falling as 1/|k|, so
/// the field is smooth and periodic on the unit domain. A function of (seed, mode) only.
struct SmoothField {
  static constexpr int max_modes = 16;
  int modes = 0;
  double wave[max_modes][3] = {};
  double amplitude[max_modes] = {};
  double phase[max_modes] = {};

  SmoothField(std::uint64_t seed, int mode_count, int max_wavenumber, int dims)
      : modes(mode_count) {
    for (int m = 0; m < modes; ++m) {
      double norm2 = 0;
      for (int d = 0; d < 3; ++d) {
        const double r = hashed_uniform(seed, 8 * m + d);
        // integer wavenumber in [-max, max], period 1 in every dim
        wave[m][d] = d < dims
                         ? std::floor((r + 1.0) * 0.5 * (2 * max_wavenumber + 1)) - max_wavenumber
                         : 0.0;
        norm2 += wave[m][d] * wave[m][d];
      }
      if (norm2 == 0) wave[m][0] = 1, norm2 = 1;  // no constant mode
      amplitude[m] = hashed_uniform(seed, 8 * m + 3) / std::sqrt(norm2);
      phase[m] = two_pi * hashed_uniform(seed, 8 * m + 4);
    }
  }

  KOKKOS_INLINE_FUNCTION double operator()(double x, double y, double z) const {
    double value = 0;
    for (int m = 0; m < modes; ++m)
      value += amplitude[m] *
               math::sin(two_pi * (wave[m][0] * x + wave[m][1] * y + wave[m][2] * z) + phase[m]);
    return value;
  }
};

/// Seeds of a sample's two random fields, distinct for every (dataset seed, sample).
std::uint64_t field_seed(std::uint64_t seed, Index sample, int which) {
  return hash_bits(hash_bits(seed, static_cast<std::uint64_t>(sample)), which);
}

/// Writes f(global cell centre) into channel `channel` of the owned cells of `t`.
template <class F>
void fill_owned(const ShardTensor<double>& t, int channel, Index size, const F& f) {
  const Box owned = t.interior_box();
  const Box global = t.global_box();
  const auto v = t.view();
  const double h = 1.0 / double(size);
  Index origin[3];
  for (int d = 0; d < 3; ++d) origin[d] = global.lower[d] - owned.lower[d];
  const int ndims = t.ndims();
  Kokkos::parallel_for(
      "heat_fill",
      Kokkos::MDRangePolicy<RightRank<3>>({owned.lower[0], owned.lower[1], owned.lower[2]},
                                          {owned.upper(0), owned.upper(1), owned.upper(2)}),
      KOKKOS_LAMBDA(const Index i, const Index j, const Index k) {
        const double x = (double(i + origin[0]) + 0.5) * h;
        const double y = ndims > 1 ? (double(j + origin[1]) + 0.5) * h : 0.0;
        const double z = ndims > 2 ? (double(k + origin[2]) + 0.5) * h : 0.0;
        v(0, channel, i, j, k) = f(x, y, z);
      });
}

}  // namespace

void HeatOptions::validate() const {
  const char* where = "HeatOptions";
  SHARDTENSOR_REQUIRE(dims == 2 || dims == 3, where, "dims " << dims << " must be 2 or 3");
  SHARDTENSOR_REQUIRE(size >= 4, where, "size " << size << " must be at least 4");
  SHARDTENSOR_REQUIRE(samples >= 1, where, "samples " << samples << " must be positive");
  SHARDTENSOR_REQUIRE(steps >= 0, where, "steps " << steps << " must not be negative");
  SHARDTENSOR_REQUIRE(modes >= 1 && modes <= SmoothField::max_modes, where,
                      "modes " << modes << " must lie in [1, " << SmoothField::max_modes << "]");
  SHARDTENSOR_REQUIRE(max_wavenumber >= 1, where,
                      "max_wavenumber " << max_wavenumber << " must be at least 1");
  SHARDTENSOR_REQUIRE(diffusivity > 0 && std::isfinite(diffusivity), where,
                      "diffusivity " << diffusivity << " must be positive");
  SHARDTENSOR_REQUIRE(contrast >= 0 && contrast < 1, where,
                      "contrast " << contrast << " must lie in [0, 1)");
  SHARDTENSOR_REQUIRE(courant > 0 && courant <= 1, where,
                      "courant " << courant << " must lie in (0, 1]");
}

Decomposition HeatOptions::decomposition(int nranks) const {
  validate();
  return Decomposition::automatic(std::vector<Index>(dims, size), nranks,
                                  std::vector<bool>(dims, true));
}

double HeatOptions::time_step() const {
  const double h = 1.0 / double(size);
  return courant * h * h / (2.0 * dims * diffusivity * (1.0 + contrast));
}

HeatSample solve_heat_sample(const Communicator& comm, const Decomposition& decomposition,
                             const HeatOptions& options, Index sample) {
  options.validate();
  const char* where = "solve_heat_sample";
  SHARDTENSOR_REQUIRE(
      decomposition.ndims() == options.dims, where,
      "decomposition has " << decomposition.ndims() << " dims, options.dims is " << options.dims);
  for (int d = 0; d < options.dims; ++d)
    SHARDTENSOR_REQUIRE(decomposition.global_extent(d) == options.size && decomposition.periodic(d),
                        where, "dim " << d << " must be periodic with extent " << options.size);

  const int rank = comm.rank();
  const GhostWidths ghosts = GhostWidths::uniform(1, options.dims);
  HeatSample out{ShardTensor<double>(decomposition, rank, 1, 2, {}, "heat_input"),
                 ShardTensor<double>(decomposition, rank, 1, 1, {}, "heat_target")};
  ShardTensor<double> u(decomposition, rank, 1, 1, ghosts, "heat_u");
  ShardTensor<double> next(decomposition, rank, 1, 1, ghosts, "heat_next");
  ShardTensor<double> kappa(decomposition, rank, 1, 1, ghosts, "heat_kappa");

  const SmoothField initial(field_seed(options.seed, sample, 0), options.modes,
                            options.max_wavenumber, options.dims);
  const SmoothField log_kappa(field_seed(options.seed, sample, 1), options.modes,
                              options.max_wavenumber, options.dims);
  const double mean = options.diffusivity, contrast = options.contrast;
  fill_owned(u, 0, options.size, initial);
  fill_owned(
      kappa, 0, options.size, KOKKOS_LAMBDA(double x, double y, double z) {
        return mean * (1.0 + contrast * math::tanh(2.0 * log_kappa(x, y, z)));
      });

  HaloExchange<double> halo(comm, u);
  halo.exchange(kappa);

  // Conservative flux form with face diffusivities (kappa_i + kappa_j) / 2.
  const double h = 1.0 / double(options.size);
  const double r = options.time_step() / (h * h);
  const Box owned = u.interior_box();
  const int ndims = options.dims;
  const auto k = kappa.view();
  for (int step = 0; step < options.steps; ++step) {
    halo.exchange(u);
    const auto a = u.view();
    const auto b = next.view();
    Kokkos::parallel_for(
        "heat_step",
        Kokkos::MDRangePolicy<RightRank<3>>({owned.lower[0], owned.lower[1], owned.lower[2]},
                                            {owned.upper(0), owned.upper(1), owned.upper(2)}),
        KOKKOS_LAMBDA(const Index i, const Index j, const Index l) {
          const double centre = a(0, 0, i, j, l), kc = k(0, 0, i, j, l);
          double flux = 0;
          for (int d = 0; d < ndims; ++d) {
            const Index di = d == 0, dj = d == 1, dl = d == 2;
            flux += 0.5 * (kc + k(0, 0, i + di, j + dj, l + dl)) *
                        (a(0, 0, i + di, j + dj, l + dl) - centre) -
                    0.5 * (kc + k(0, 0, i - di, j - dj, l - dl)) *
                        (centre - a(0, 0, i - di, j - dj, l - dl));
          }
          b(0, 0, i, j, l) = centre + r * flux;
        });
    std::swap(u, next);
  }

  // Copy owned cells into the ghost-free outputs: input = (u0, kappa), target = u(T).
  fill_owned(out.input, 0, options.size, initial);
  const auto in = out.input.view(), target = out.target.view(), uv = u.view();
  const Box out_box = out.input.interior_box();
  Index shift[3];
  for (int d = 0; d < 3; ++d) shift[d] = owned.lower[d] - out_box.lower[d];
  Kokkos::parallel_for(
      "heat_copy",
      Kokkos::MDRangePolicy<RightRank<3>>({out_box.lower[0], out_box.lower[1], out_box.lower[2]},
                                          {out_box.upper(0), out_box.upper(1), out_box.upper(2)}),
      KOKKOS_LAMBDA(const Index i, const Index j, const Index l) {
        in(0, 1, i, j, l) = k(0, 0, i + shift[0], j + shift[1], l + shift[2]);
        target(0, 0, i, j, l) = uv(0, 0, i + shift[0], j + shift[1], l + shift[2]);
      });
  Kokkos::fence();
  return out;
}

double generate_heat_dataset(const Communicator& comm, const HeatOptions& options,
                             const std::string& path, bool verbose) {
  const Decomposition decomposition = options.decomposition(comm.size());
  const std::vector<Index> extents(options.dims, options.size);
  // One chunk per sample and channel: a rank's patch is a hyperslab of few chunks.
  std::vector<Index> chunk{1, 1};
  chunk.insert(chunk.end(), extents.begin(), extents.end());
  io::AtomicOutput output(comm, path);
  double mean_change = 0;
  {
    io::File file = io::File::create(comm, output.temporary_path());
    io::create_field_dataset(file, "input", options.samples, 2, extents, io::DataType::float32,
                             chunk);
    io::create_field_dataset(file, "target", options.samples, 1, extents, io::DataType::float32,
                             chunk);
    io::write_attribute(file, "/", "generator", std::string("shardtensor generate heat"));
    io::write_attribute(file, "/", "equation", std::string("du/dt = div(kappa grad u), periodic"));
    io::write_attribute(file, "/", "input_channels", std::string("u0,kappa"));
    io::write_attribute(file, "/", "target_channels", std::string("u(T)"));
    io::write_attribute(file, "/", "dims", std::int64_t(options.dims));
    io::write_attribute(file, "/", "size", options.size);
    io::write_attribute(file, "/", "steps", std::int64_t(options.steps));
    io::write_attribute(file, "/", "time_step", options.time_step());
    io::write_attribute(file, "/", "final_time", options.time_step() * options.steps);
    io::write_attribute(file, "/", "modes", std::int64_t(options.modes));
    io::write_attribute(file, "/", "max_wavenumber", std::int64_t(options.max_wavenumber));
    io::write_attribute(file, "/", "diffusivity", options.diffusivity);
    io::write_attribute(file, "/", "contrast", options.contrast);
    io::write_attribute(file, "/", "seed", std::int64_t(options.seed));
    for (Index sample = 0; sample < options.samples; ++sample) {
      const HeatSample s = solve_heat_sample(comm, decomposition, options, sample);
      io::write_field(file, "input", sample, s.input);
      io::write_field(file, "target", sample, s.target);
      const auto u0 = s.input.view(), u = s.target.view();
      Kokkos::View<double*, Kokkos::HostSpace> sums("change_sums", 2);
      Kokkos::parallel_reduce(
          "heat_change",
          Kokkos::MDRangePolicy<RightRank<3>>({0, 0, 0}, {u.extent(2), u.extent(3), u.extent(4)}),
          KOKKOS_LAMBDA(const Index i, const Index j, const Index k, double& change, double& norm) {
            const double d = u(0, 0, i, j, k) - u0(0, 0, i, j, k);
            change += d * d;
            norm += u(0, 0, i, j, k) * u(0, 0, i, j, k);
          },
          sums(0), sums(1));
      allreduce(comm, sums);
      mean_change += std::sqrt(sums(0) / sums(1)) / double(options.samples);
      if (verbose && comm.rank() == 0 && isatty(fileno(stdout))) {
        std::printf("\rgenerate heat: sample %lld/%lld", (long long)sample + 1,
                    (long long)options.samples);
        std::fflush(stdout);
      }
    }
    file.close();
  }
  output.commit();
  const std::string xdmf = std::filesystem::path(path).replace_extension(".xdmf").string();
  if (options.dims >= 2) {  // XDMF describes 2-D and 3-D grids; 1-D fields get no sidecar
    io::XdmfGeometry geometry;
    geometry.spacing = {1.0 / options.size, 1.0 / options.size, 1.0 / options.size};
    io::write_xdmf(comm, path, xdmf, {"input", "target"}, geometry);
  }
  if (verbose && comm.rank() == 0) {
    const std::string sidecar = options.dims >= 2 ? " (+ " + xdmf + ")" : "";
    std::printf("\rgenerate heat: %lld samples of %s on %d rank(s) -> %s%s\n",
                (long long)options.samples, decomposition.describe().c_str(), comm.size(),
                path.c_str(), sidecar.c_str());
    std::printf(
        "generate heat: |u(T) - u0| / |u(T)| = %.4f (mean over samples): the error of "
        "predicting no change\n",
        mean_change);
  }
  return mean_change;
}

}  // namespace shardtensor
