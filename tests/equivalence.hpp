#pragma once
// The equivalence harness every layer test uses: the same module (same parameters) on the
// whole field on one rank vs sharded over all ranks; outputs, input gradients and parameter
// gradients must agree. Plus finite-difference gradient checks in double.

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

#include "shardtensor/layers.hpp"
#include "test_support.hpp"

namespace shardtensor::test {

template <class T>
using ModuleFactory = std::function<std::shared_ptr<Module<T>>(const Communicator&)>;

/// Turns the module's output into the scalar that backward starts from.
template <class T>
using LossFunction = std::function<Variable<T>(const Communicator&, const Variable<T>& output)>;

/// A field of the decomposition with reproducible random values per global cell.
template <class T>
ShardTensor<T> random_shard(const Decomposition& d, int rank, Index batch, Index channels,
                            std::uint64_t seed) {
  ShardTensor<T> t(d, rank, batch, channels);
  fill(t, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
    return hashed_uniform(seed, global_linear_index(d, channels, n, c, g));
  });
  return t;
}

/// The whole field of a decomposition on one rank (same periodic flags).
inline Decomposition unsharded(const Decomposition& d) {
  std::vector<std::vector<Index>> points;
  std::vector<bool> periodic;
  for (int k = 0; k < d.ndims(); ++k) {
    points.push_back({0, d.global_extent(k)});
    periodic.push_back(d.periodic(k));
  }
  return Decomposition::from_split_points(points, periodic);
}

/// Every value of a view's span on the host (floats widen exactly): for bit-for-bit comparisons.
template <class A>
std::vector<double> host_values(const A& a) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  return std::vector<double>(h.data(), h.data() + h.span());
}

/// max |a - b| / max |b| over the whole arrays (b the reference); infinite where either holds
/// a NaN or an infinity (which std::max would pass over).
template <class A, class B>
double relative_error(const A& a, const B& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  REQUIRE(ha.span() == hb.span());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < ha.span(); ++i) {
    if (!std::isfinite(double(ha.data()[i])) || !std::isfinite(double(hb.data()[i])))
      return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(double(ha.data()[i]) - double(hb.data()[i])));
    scale = std::max(scale, std::abs(double(hb.data()[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

/// The default loss: sum(output * weights), weights random per global output cell, so every
/// output cell gets a different gradient.
template <class T>
Variable<T> weighted_sum(const Communicator& comm, const Variable<T>& output) {
  const ShardTensor<T>& y = output.value();
  const auto weights = Variable<T>::field(
      random_shard<T>(y.decomposition(), comm.rank(), y.batch(), y.channels(), 23), false,
      "weights");
  return sum(comm, multiply(output, weights));
}

/// Result of one forward + backward.
template <class T>
struct Run {
  std::shared_ptr<Module<T>> module;
  Variable<T> input, output;
  double loss = 0;
};

/// One forward + backward of `module` (its parameters' gradients zeroed first).
template <class T>
Run<T> run_module(const std::shared_ptr<Module<T>>& module, const Communicator& comm,
                  const Decomposition& d, Index batch, Index channels,
                  const LossFunction<T>& loss_function) {
  Run<T> run;
  run.module = module;
  for (const auto& parameter : module->named_parameters()) parameter.second.zero_grad();
  run.input =
      Variable<T>::field(random_shard<T>(d, comm.rank(), batch, channels, 11), true, "input");
  run.output = run.module->forward(run.input);
  const Variable<T> loss = loss_function(comm, run.output);
  backward(loss);
  run.loss = loss.item();
  return run;
}

template <class T>
Run<T> run_module(const ModuleFactory<T>& make, const Communicator& comm, const Decomposition& d,
                  Index batch, Index channels, const LossFunction<T>& loss_function) {
  return run_module(make(comm), comm, d, batch, channels, loss_function);
}

/// Two runs of one model on the same ranks (recomputed or not, run alone or interleaved,
/// repeated): the same loss, output, input gradient and parameter gradients, bit for bit.
template <class T>
void check_bit_identical(const Run<T>& a, const Run<T>& b) {
  CHECK(a.loss == b.loss);
  CHECK(host_values(a.output.value().view()) == host_values(b.output.value().view()));
  CHECK(host_values(a.input.grad().view()) == host_values(b.input.grad().view()));
  const auto p = a.module->named_parameters(), q = b.module->named_parameters();
  REQUIRE(p.size() == q.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    INFO("parameter " << p[i].first);
    CHECK(p[i].first == q[i].first);
    CHECK(host_values(p[i].second.data_grad()) == host_values(q[i].second.data_grad()));
  }
}

/// One module object run on each (decomposition, batch) of `shapes` in turn, twice over, so
/// that what it keeps from call to call (plans, tables, scratch) is remade for a new shape and
/// reused for a known one, against a fresh module per run: the same bits.
template <class T>
void check_module_reused_across_shapes(const ModuleFactory<T>& make,
                                       const std::vector<std::pair<Decomposition, Index>>& shapes,
                                       Index channels) {
  const Communicator comm;
  const std::shared_ptr<Module<T>> kept = make(comm);
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& [d, batch] : shapes) {
      INFO("pass " << pass << ", batch " << batch << ", " << d.global_cells() << " cells");
      const Run<T> reused =
          run_module(kept, comm, d, batch, channels, LossFunction<T>(weighted_sum<T>));
      check_bit_identical(
          reused, run_module(make, comm, d, batch, channels, LossFunction<T>(weighted_sum<T>)));
    }
}

/// The relative errors check_equivalence allows: the type's, or a test's own (bf16 layers).
struct Tolerances {
  double output = 0, gradients = 0;  ///< 0: float 1e-5, double 1e-12
};

/// Sharded over `d` on all ranks vs the whole field on each rank alone.
template <class T>
void check_equivalence(const ModuleFactory<T>& make, const Decomposition& d, Index batch,
                       Index channels, const LossFunction<T>& loss_function = weighted_sum<T>,
                       Tolerances allowed = {}) {
  const double tolerance = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  const double output_tolerance = allowed.output > 0 ? allowed.output : tolerance;
  const double gradient_tolerance = allowed.gradients > 0 ? allowed.gradients : tolerance;
  const Communicator world;
  const Communicator self(MPI_COMM_SELF);
  const Run<T> reference = run_module(make, self, unsharded(d), batch, channels, loss_function);
  const Run<T> sharded = run_module(make, world, d, batch, channels, loss_function);
  INFO("decomposition " << d.describe());
  CHECK(std::abs(sharded.loss - reference.loss) <=
        output_tolerance * std::max(1.0, std::abs(reference.loss)));
  CHECK(relative_error(all_gather(world, sharded.output.value()),
                       reference.output.value().view()) <= output_tolerance);
  CHECK(relative_error(all_gather(world, sharded.input.grad()), reference.input.grad().view()) <=
        gradient_tolerance);
  const auto ref_params = reference.module->named_parameters();
  const auto sh_params = sharded.module->named_parameters();
  REQUIRE(ref_params.size() == sh_params.size());
  for (std::size_t i = 0; i < ref_params.size(); ++i) {
    INFO("parameter " << ref_params[i].first);
    CHECK(relative_error(sh_params[i].second.data_grad(), ref_params[i].second.data_grad()) <=
          gradient_tolerance);
  }
}

/// Central finite differences in double of loss = sum(output * weights) against the
/// gradients from backward, at a few input cells and parameter entries.
inline void check_gradients_by_finite_differences(
    const ModuleFactory<double>& make, const Decomposition& d, Index batch, Index channels,
    const LossFunction<double>& loss_function = weighted_sum<double>) {
  const Communicator comm;
  const Run<double> run = run_module(make, comm, d, batch, channels, loss_function);
  auto loss_with = [&](const std::function<void(const Run<double>&)>& perturb) {
    Run<double> probe;
    probe.module = make(comm);  // same seeds: the same parameters as `run`
    probe.input =
        Variable<double>::field(random_shard<double>(d, comm.rank(), batch, channels, 11), false);
    perturb(probe);
    return loss_function(comm, probe.module->forward(probe.input)).item();
  };
  const double eps = 1e-6;
  // Input cells: a few global cells, perturbed on their owner.
  const SpatialIndex extents = d.global_extents();
  for (int probe = 0; probe < 4; ++probe) {
    SpatialIndex g;
    for (int k = 0; k < 3; ++k)
      g[k] = static_cast<Index>(hash_bits(probe, k) % std::uint64_t(extents[k]));
    const Index c = probe % channels, n = probe % batch;
    const int owner = d.owner(g);
    auto perturb_by = [&](double delta) {
      return [&, delta](const Run<double>& p) {
        if (comm.rank() != owner) return;
        const SpatialIndex l = p.input.value().to_local(g);
        auto host =
            Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.input.value().view());
        host(n, c, l[0], l[1], l[2]) += delta;
        Kokkos::deep_copy(p.input.value().view(), host);
      };
    };
    const double numeric = (loss_with(perturb_by(eps)) - loss_with(perturb_by(-eps))) / (2 * eps);
    double analytic = 0;
    if (comm.rank() == owner) {
      const SpatialIndex l = run.input.grad().to_local(g);
      auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), run.input.grad().view());
      analytic = host(n, c, l[0], l[1], l[2]);
    }
    MPI_Bcast(&analytic, 1, MPI_DOUBLE, owner, MPI_COMM_WORLD);
    INFO("input cell (" << n << ", " << c << ", " << g[0] << ", " << g[1] << ", " << g[2] << ")");
    CHECK(numeric == Approx(analytic).epsilon(1e-6).margin(1e-8));
  }
  // Parameters: a few entries of each.
  const auto params = run.module->named_parameters();
  for (std::size_t p = 0; p < params.size(); ++p) {
    auto grad =
        Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), params[p].second.data_grad());
    for (int probe = 0; probe < 3; ++probe) {
      const std::size_t entry = hash_bits(100 + p, probe) % grad.extent(0);
      auto perturb_by = [&](double delta) {
        return [&, delta](const Run<double>& r) {
          auto values = r.module->named_parameters()[p].second.data();
          auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
          host(entry) += delta;
          Kokkos::deep_copy(values, host);
        };
      };
      const double numeric = (loss_with(perturb_by(eps)) - loss_with(perturb_by(-eps))) / (2 * eps);
      INFO("parameter " << params[p].first << "[" << entry << "]");
      CHECK(numeric == Approx(grad(entry)).epsilon(1e-6).margin(1e-8));
    }
  }
}

/// Decompositions of a field of `extents` over `nranks` ranks to test: a split of the first
/// axis only, the automatic grid, and uneven explicit splits; those that leave a rank fewer
/// than `min_cells` cells along an axis are skipped.
inline std::vector<Decomposition> test_decompositions(const std::vector<Index>& extents, int nranks,
                                                      const std::vector<bool>& periodic,
                                                      Index min_cells) {
  std::vector<Decomposition> out;
  auto fits = [&](const Decomposition& d) {
    for (int r = 0; r < d.nranks(); ++r)
      for (int k = 0; k < d.ndims(); ++k)
        if (d.extent(r, k) < min_cells) return false;
    return true;
  };
  std::vector<std::vector<int>> grids{std::vector<int>(extents.size(), 1)};
  grids[0][0] = nranks;
  for (const auto& g : process_grids(nranks, static_cast<int>(extents.size())))
    if (g != grids[0] && grids.size() < 3) grids.push_back(g);
  for (const auto& grid : grids) {
    bool possible = true;
    for (std::size_t k = 0; k < extents.size(); ++k) possible = possible && grid[k] <= extents[k];
    if (!possible) continue;
    Decomposition balanced(extents, grid, periodic);
    if (fits(balanced)) out.push_back(balanced);
    // Uneven: the first part along each split axis is min_cells long.
    std::vector<std::vector<Index>> points;
    bool uneven_possible = true;
    for (std::size_t k = 0; k < extents.size(); ++k) {
      std::vector<Index> p = balanced.split_points(int(k));
      if (grid[k] > 1 && extents[k] - min_cells < grid[k] - 1) uneven_possible = false;
      if (grid[k] > 1 && uneven_possible) {
        const std::vector<Index> rest = balanced_split_points(extents[k] - min_cells, grid[k] - 1);
        p = {0};
        for (Index r : rest) p.push_back(min_cells + r);
      }
      points.push_back(p);
    }
    if (!uneven_possible) continue;
    Decomposition uneven = Decomposition::from_split_points(points, periodic);
    if (uneven != balanced && fits(uneven)) out.push_back(uneven);
  }
  return out;
}

/// Shapes for check_module_reused_across_shapes: the first test decomposition of open field
/// `a` with batch `batch`, the last of `b` with batch 1, the last of `a` with `batch` again.
inline std::vector<std::pair<Decomposition, Index>> reuse_shapes(const std::vector<Index>& a,
                                                                 const std::vector<Index>& b,
                                                                 Index min_cells, Index batch) {
  const auto in_a =
      test_decompositions(a, world_size(), std::vector<bool>(a.size(), false), min_cells);
  const auto in_b =
      test_decompositions(b, world_size(), std::vector<bool>(b.size(), false), min_cells);
  REQUIRE((!in_a.empty() && !in_b.empty()));
  return {{in_a.front(), batch}, {in_b.back(), 1}, {in_a.back(), batch}};
}

}  // namespace shardtensor::test
