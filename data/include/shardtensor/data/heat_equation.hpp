#pragma once
// The project's own training data: an explicit solver of the variable-coefficient heat
// equation  du/dt = div(kappa grad u)  on the periodic unit square or cube. A sample is an
// initial field u0 and a diffusivity kappa (both random and smooth, drawn per global cell so
// any decomposition gives the same numbers) and the field u(T) after a fixed time.

#include <cstdint>
#include <string>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/core/shard_tensor.hpp"

namespace shardtensor {

struct HeatOptions {
  int dims = 2;              ///< 2 or 3 spatial dimensions
  Index size = 32;           ///< cells per dimension
  Index samples = 16;        ///< samples in a dataset
  int steps = 40;            ///< explicit time steps from u0 to the target
  int modes = 6;             ///< Fourier modes in each random field
  int max_wavenumber = 3;    ///< largest integer wavenumber per dimension
  double diffusivity = 1.0;  ///< mean kappa
  double contrast = 0.6;     ///< kappa varies within diffusivity * (1 +- contrast)
  double courant = 0.8;      ///< dt as a fraction of the stability limit
  std::uint64_t seed = 1;

  /// Throws shardtensor::Error naming the first bad option and its value.
  void validate() const;
  /// The periodic decomposition of the dims-dimensional size^dims grid over `nranks`.
  Decomposition decomposition(int nranks) const;
  /// Time step: courant * h^2 / (2 dims kappa_max), h = 1 / size.
  double time_step() const;
};

/// One sample on this rank's patch: input (1, 2, ...) holds u0 and kappa, target (1, 1, ...)
/// holds u after `steps` steps. Collective over `comm` (halo exchanges each step).
struct HeatSample {
  ShardTensor<double> input, target;
};
HeatSample solve_heat_sample(const Communicator& comm, const Decomposition& decomposition,
                             const HeatOptions& options, Index sample);

/// Writes a dataset of options.samples samples to `path` (atomically, with an XDMF
/// sidecar): float32 datasets /input [samples, 2, size...] (u0, kappa) and /target
/// [samples, 1, size...] (u at the final time), the options as attributes. Every rank of
/// `comm` solves and writes its patch. Rank 0 prints progress and a summary if `verbose`.
/// Returns the mean over samples of |u(T) - u0| / |u(T)|: the error of predicting "no
/// change", the baseline a trained surrogate must beat.
double generate_heat_dataset(const Communicator& comm, const HeatOptions& options,
                             const std::string& path, bool verbose = false);

}  // namespace shardtensor
