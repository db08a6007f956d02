#pragma once
// Session: a trained (or training) model inside an MPI simulation. The solver keeps its own
// decomposition, arrays and ghost layout; the session runs the model on them in place.
//
//   shardtensor::SolverPatch patch{{nx, ny, nz}, {x0, y0, z0}, {lx, ly, lz}};
//   shardtensor::SessionOptions options;
//   options.config = "model.yaml";  options.checkpoint = "trained.h5";
//   options.arrays.ghost_width = 1;           // one ghost cell on every side facing a patch,
//   options.arrays.boundary_ghost_width = 0;  // none past the field's edge (SolverArrays)
//   shardtensor::Session session(solver_comm, patch, options);
//   session.infer({temperature}, {prediction});   // pointers to the solver's arrays

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/core/decomposition.hpp"
#include "shardtensor/embed/solver_arrays.hpp"
#include "shardtensor/embed/solver_patch.hpp"

namespace shardtensor {

struct SessionOptions {
  std::string config;       ///< run config file (model, optimizer, schedule, training sections)
  std::string config_text;  ///< or the config itself (used when `config` is empty)
  std::vector<std::string> overrides;  ///< "key=value", like `shardtensor train --set`
  std::string checkpoint;   ///< parameters to start from (and, when given, the config); optional
  Index input_channels = 1;
  Index output_channels = 1;
  SolverArrays arrays;
};

/// What the last infer or train_step did with the solver's input arrays.
struct CallReport {
  bool input_copied = false;  ///< false: the model read the solver's arrays in place
  /// Why a copy was needed (empty when none was): the model on a GPU, the arrays'
  /// precision, Fortran order, normalisation, ghost cells (the model's first layer, or
  /// widths that differ between ranks), interleaved components, channels apart in memory.
  std::string copy_reason;
};

/// A model bound to a solver's communicator and decomposition. Every call is collective
/// over the solver's communicator (ranks call in the same order); an error on any rank
/// (null pointer, wrong channel count, overlapping arrays, a NaN in an input, a diverging
/// loss) throws Error on every rank, so no rank is left waiting. The solver's input arrays
/// are never written; in output arrays only the owned cells are (ghost cells keep the
/// solver's values).
class Session {
 public:
  /// Collective over `solver_comm`, which is duplicated: the session's messages never
  /// meet the solver's. Builds the model from the config, loads the checkpoint if given.
  Session(MPI_Comm solver_comm, const SolverPatch& patch, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  /// Runs the model (eval mode) on `inputs` (input_channels arrays) and writes the
  /// prediction into `outputs` (output_channels arrays). Arrays may be float or double
  /// whatever the model's precision; matching precision, C order, one component per cell,
  /// ghost widths the same on every rank and no normalisation let the model read the
  /// inputs in place (see last_call()). A NaN or Inf in an input's owned cells is refused
  /// (named by array, cell and rank) before the model runs.
  void infer(const std::vector<const double*>& inputs, const std::vector<double*>& outputs);
  void infer(const std::vector<const float*>& inputs, const std::vector<float*>& outputs);

  /// One optimizer step (train mode) on an input/target pair of the solver's fields.
  /// Returns the loss (normalized units, the same on every rank). The first step fixes the
  /// normalisation statistics when the config asks for them (data.normalize, default
  /// true) and the session did not load them from a checkpoint.
  double train_step(const std::vector<const double*>& inputs,
                    const std::vector<const double*>& targets);
  double train_step(const std::vector<const float*>& inputs,
                    const std::vector<const float*>& targets);

  /// Writes a checkpoint (parameters, optimizer state, statistics, config) that
  /// `shardtensor infer` and other sessions load on any rank count. Atomic. Collective.
  void save_checkpoint(const std::string& path) const;
  /// Loads parameters, optimizer state and statistics. Collective.
  void load_checkpoint(const std::string& path);

  /// The solver's patches as a Decomposition (its rank numbering is the grid's).
  const Decomposition& decomposition() const;
  /// "float" or "double".
  const std::string& precision() const;
  std::int64_t steps() const;  ///< optimizer steps taken (including a loaded checkpoint's)
  const CallReport& last_call() const;
  /// A one-line summary: model, parameters, decomposition, precision, array layout.
  std::string describe() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtensor
