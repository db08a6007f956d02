#include "shardtensor/embed/session.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <type_traits>

#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/models/builder.hpp"
#include "shardtensor/models/summary.hpp"
#include "shardtensor/optim/lr_schedule.hpp"
#include "shardtensor/optim/optimizer.hpp"
#include "shardtensor/train/channel_statistics.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/parameter_limit.hpp"
#include "shardtensor/train/run_config.hpp"
#include "shardtensor/train/training_step.hpp"

namespace shardtensor {

namespace {

constexpr const char* where = "Session";

/// Arrays per input or output a session accepts: far above any model's channels, far below
/// what would overflow the arrays' sizes.
constexpr long long max_channels = 1 << 20;

/// What is wrong with a list of `channels` solver arrays laid out as `layout` ("" if
/// nothing): their number, a null pointer, arrays overlapping in memory.
template <class P>
std::string array_problem(const std::vector<P>& arrays, Index channels, const char* what,
                          const ResolvedArrays& layout) {
  std::ostringstream problem;
  if (Index(arrays.size()) != channels) {
    problem << what << ": " << arrays.size() << " arrays given, the model has " << channels
            << " channels";
    return problem.str();
  }
  for (std::size_t c = 0; c < arrays.size(); ++c)
    if (arrays[c] == nullptr) {
      problem << what << " array " << c << " is a null pointer";
      return problem.str();
    }
  using Value = std::remove_const_t<std::remove_pointer_t<P>>;
  const std::vector<const void*> pointers(arrays.begin(), arrays.end());
  return overlapping_arrays(pointers, sizeof(Value), layout, what,
                            !std::is_const<std::remove_pointer_t<P>>::value);
}

/// Checks the two array lists of a call before any collective work, in one agreement over
/// `comm`: on a problem on any rank, every rank throws.
template <class P, class Q>
void check_arrays(const Communicator& comm, const char* call, const ResolvedArrays& layout,
                  const std::vector<P>& first, Index first_channels, const char* first_name,
                  const std::vector<Q>& second, Index second_channels, const char* second_name) {
  std::string problem = array_problem(first, first_channels, first_name, layout);
  if (problem.empty()) problem = array_problem(second, second_channels, second_name, layout);
  comm.agree(problem.empty() ? ""
                             : std::string(where) + "::" + call + ": rank " +
                                   std::to_string(comm.rank()) + ": " + problem);
}

/// Per channel scale and shift on the device, value * scale[c] + shift[c]: normalisation by
/// statistics (or its inverse). Rebuilt only when the statistics change, so steady-state
/// calls allocate nothing.
class ChannelAffine {
 public:
  const Kokkos::View<double**>& of(const ChannelStatistics& s, bool inverse) {
    if (view_.data() != nullptr && s.mean == mean_ && s.std == std_ && inverse == inverse_)
      return view_;
    mean_ = s.mean, std_ = s.std, inverse_ = inverse;
    view_ = Kokkos::View<double**>("affine", s.channels(), 2);
    auto host = Kokkos::create_mirror_view(view_);
    for (Index c = 0; c < s.channels(); ++c) {
      host(c, 0) = inverse ? s.std[c] : 1.0 / s.std[c];
      host(c, 1) = inverse ? s.mean[c] : -s.mean[c] / s.std[c];
    }
    Kokkos::deep_copy(view_, host);
    return view_;
  }

 private:
  std::vector<double> mean_, std_;
  bool inverse_ = false;
  Kokkos::View<double**> view_;
};

}  // namespace

/// The precision-independent state and the model in its precision T.
template <class T>
class Engine {
  /// A field staged from solver arrays, reused between calls.
  struct Staging {
    ShardTensor<T> buffer;
    ChannelAffine affine;
  };

 public:
  Engine(const Communicator& comm, const SolverGrid& grid, const ResolvedArrays& layout,
         const RunConfig& config, const SessionOptions& options)
      : comm_(comm.with_options(config.parallel.comm)),
        mesh_(comm_.mesh(1)),
        decomposition_(grid.decomposition),
        config_(config),
        options_(options),
        layout_(layout) {
    std::vector<Index> extents;
    for (int d = 0; d < decomposition_.ndims(); ++d)
      extents.push_back(decomposition_.global_extent(d));
    {
      const auto limit = parameter_limit(comm, config, true);  // a session may train
      model_ = models::build_model<T>(
          config.model, comm_,
          {decomposition_.ndims(), options.input_channels, options.output_channels, extents});
    }
    config.configure_layers(*model_);
    optimizer_ = make_optimizer<T>(config.optimizer, model_->named_parameters());
    ScheduleOptions schedule = config.schedule;
    if (schedule.total_steps == 0) {
      SHARDTENSOR_REQUIRE(schedule.type != "cosine", where,
                          "schedule.total_steps must be set for online training with a cosine "
                          "schedule: the session does not know how many steps the solver takes");
      schedule.total_steps = schedule.warmup_steps + 1;
    }
    schedule_ = std::make_unique<LearningRateSchedule>(schedule);
    state_.seed = config.training.seed;
    state_.config = config.text;
    state_.input_statistics = ChannelStatistics::identity(options.input_channels);
    state_.target_statistics = ChannelStatistics::identity(options.output_channels);
    statistics_fixed_ = !config.data.normalize;
  }

  template <class S>
  void infer(const std::vector<const S*>& inputs, const std::vector<S*>& outputs,
             CallReport& report) {
    // A NaN or Inf would spread through the prediction: refuse it, named, on every rank.
    const std::string problem = non_finite_value(inputs, "inputs");
    comm_.agree(problem.empty() ? ""
                                : std::string(where) + "::infer: " + problem +
                                      ": the prediction was not made (the outputs are unchanged)");
    model_->eval();
    const NoGradGuard no_grad;  // inference: keep no graph
    const ShardTensor<T> x =
        input_field(inputs, state_.input_statistics, true, staged_input_, report);
    const Variable<T> prediction = model_->forward(Variable<T>::field(x));
    check_memory_budget(comm_);  // memory.budget_mib; every rank throws together
    write_output(prediction.value(), outputs);
  }

  template <class S>
  double train_step(const std::vector<const S*>& inputs, const std::vector<const S*>& targets,
                    CallReport& report) {
    // A NaN or Inf in the solver's fields would reach every parameter in one step: refuse the
    // pair, on every rank, before the statistics or the parameters see it.
    std::string problem = non_finite_value(inputs, "inputs");
    if (problem.empty()) problem = non_finite_value(targets, "targets");
    comm_.agree(problem.empty() ? ""
                                : std::string(where) + "::train_step: " + problem +
                                      ": the step was not taken (the parameters are unchanged)");
    if (!statistics_fixed_) {
      // The first pair fixes the normalisation: statistics of the raw fields.
      CallReport ignored;
      state_.input_statistics = field_channel_statistics(
          comm_, input_field(inputs, ChannelStatistics::identity(options_.input_channels), false,
                             staged_input_, ignored));
      state_.target_statistics = field_channel_statistics(
          comm_, input_field(targets, ChannelStatistics::identity(options_.output_channels), false,
                             staged_target_, ignored));
      statistics_fixed_ = true;
    }
    model_->train();
    const ShardTensor<T> x =
        input_field(inputs, state_.input_statistics, true, staged_input_, report);
    CallReport target_report;
    const ShardTensor<T> y =
        input_field(targets, state_.target_statistics, false, staged_target_, target_report);
    const StepOutcome outcome =
        training_step(*model_, *optimizer_, *schedule_, mesh_.domain, mesh_.data,
                      config_.training.loss, config_.training.clip_grad_norm, x, y);
    ++state_.step;
    SHARDTENSOR_REQUIRE(std::isfinite(outcome.loss), std::string(where) + "::train_step",
                        "the loss is " << outcome.loss << " at step " << state_.step
                                       << ": training diverged (try a smaller optimizer.lr or "
                                          "training.clip_grad_norm)");
    return outcome.loss;
  }

  void save(const std::string& path) const {
    save_checkpoint(comm_, path, *model_, optimizer_.get(), state_);
  }

  void load(const std::string& path) {
    const TrainingState stored = read_checkpoint_state(comm_, path);
    SHARDTENSOR_REQUIRE(stored.input_statistics.channels() == options_.input_channels &&
                            stored.target_statistics.channels() == options_.output_channels,
                        where,
                        path << " holds a model of " << stored.input_statistics.channels()
                             << " input and " << stored.target_statistics.channels()
                             << " output channels; the session has " << options_.input_channels
                             << " and " << options_.output_channels);
    TrainingState loaded = load_checkpoint(comm_, path, *model_, optimizer_.get());
    loaded.config = config_.text;
    state_ = loaded;
    statistics_fixed_ = true;
  }

  std::int64_t steps() const { return state_.step; }
  const Module<T>& model() const { return *model_; }

 private:
  /// The first NaN or Inf in the owned cells of the solver's arrays, named by array, rank and
  /// global cell ("" if none). One pass over the owned cells on the host threads.
  template <class S>
  std::string non_finite_value(const std::vector<const S*>& arrays, const char* what) const {
    const ArrayIndexing a = layout_.indexing;
    const Box owned = decomposition_.box(comm_.rank());
    const Index n0 = owned.extent[0], n1 = owned.extent[1], n2 = owned.extent[2];
    for (std::size_t c = 0; c < arrays.size(); ++c) {
      const S* source = arrays[c];
      Index first = n0 * n1 * n2;
      Kokkos::parallel_reduce(
          "Session::non_finite",
          Kokkos::MDRangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Rank<3>>({0, 0, 0},
                                                                                    {n0, n1, n2}),
          [=](const Index i, const Index j, const Index k, Index& found) {
            const S value = source[a.at(i, j, k)];
            const Index cell = (i * n1 + j) * n2 + k;
            if (!(value - value == S(0)) && cell < found) found = cell;  // NaN or Inf
          },
          Kokkos::Min<Index>(first));
      if (first >= n0 * n1 * n2) continue;  // none (the Min reduction starts at the largest)
      const Index local[3] = {first / (n1 * n2), first / n2 % n1, first % n2};
      std::ostringstream m;
      m << what << " array " << c << " holds a non-finite value ("
        << source[a.at(local[0], local[1], local[2])] << ") at cell (";
      for (int d = 0; d < decomposition_.ndims(); ++d)
        m << (d ? ", " : "") << owned.lower[d] + local[d];
      m << ") of the field, on rank " << comm_.rank();
      return m.str();
    }
    return "";
  }

  /// The model's view of the solver arrays: the arrays themselves when their layout is the
  /// model's (C order, precision T, one component per cell, channels one after another, no
  /// normalisation, ghost cells only where the model ignores them and of the same widths on
  /// every rank), else `staging`'s buffer filled from them.
  template <class S>
  ShardTensor<T> input_field(const std::vector<const S*>& arrays,
                             const ChannelStatistics& statistics, bool ghosts_allowed,
                             Staging& staging, CallReport& report) {
    const Index channels = Index(arrays.size());
    const SolverArrays& description = layout_.description;
    std::string reason;
    if (!host_reads_default_memory)
      reason = "the model computes on a GPU: the solver's host arrays are copied to it";
    else if (!std::is_same<S, T>::value)
      reason = "the arrays hold " +
               std::string(std::is_same<S, float>::value ? "float" : "double") +
               ", the model computes in " + config_.training.precision;
    else if (description.order != ArrayOrder::c)
      reason = "Fortran-order arrays are transposed into the model's C order";
    else if (description.components > 1)
      reason = "the arrays interleave " + std::to_string(description.components) +
               " components per cell; the model's fields hold one channel after another";
    else if (!statistics.is_identity())
      reason = "the inputs are normalized (data.normalize)";
    else if (!layout_.ghosts.none() && !(ghosts_allowed && model_->reads_owned_cells_only()))
      reason = "the model's first layer needs a field without ghost cells";
    else if (!layout_.ghosts_same_everywhere)
      reason = "the arrays' ghost widths differ between ranks (" + layout_.describe() +
               "); the model's fields have the same widths on every rank";
    for (Index c = 1; c < channels && reason.empty(); ++c)
      if (static_cast<const void*>(arrays[c]) !=
          static_cast<const void*>(arrays[0] + c * layout_.indexing.span))
        reason = "the channel arrays are not one after another in memory";
    report.input_copied = !reason.empty();
    report.copy_reason = reason;
    if (reason.empty()) {
      // Same type and layout: read in place (the model never writes its input).
      T* data = const_cast<T*>(reinterpret_cast<const T*>(arrays[0]));
      return ShardTensor<T>::wrap(data, decomposition_, comm_.rank(), 1, channels,
                                  layout_.ghosts);
    }
    ShardTensor<T>& buffer = staging.buffer;
    if (buffer.channels() != channels || buffer.view().data() == nullptr)
      buffer = ShardTensor<T>::uninitialized(decomposition_, comm_.rank(), 1, channels, {},
                                             "Session staged field");
    // The solver's arrays are host memory: read them on the host into a host mirror of the
    // buffer (the buffer itself on a host backend), then copy it to the buffer's space.
    const auto affine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                            staging.affine.of(statistics, false));
    const ArrayIndexing a = layout_.indexing;
    const auto out = Kokkos::create_mirror_view(buffer.view());
    for (Index c = 0; c < channels; ++c) {
      const S* source = arrays[c];
      Kokkos::parallel_for(
          "Session::stage",
          Kokkos::MDRangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Rank<3>>(
              {0, 0, 0}, {Index(out.extent(2)), Index(out.extent(3)), Index(out.extent(4))}),
          [=](const Index i, const Index j, const Index k) {
            const double value = double(source[a.at(i, j, k)]);
            out(0, c, i, j, k) = static_cast<T>(value * affine(c, 0) + affine(c, 1));
          });
    }
    Kokkos::deep_copy(buffer.view(), out);  // nothing to copy where the mirror is the buffer
    return buffer;
  }

  /// Owned cells of the solver's output arrays = the prediction in physical units.
  template <class S>
  void write_output(const ShardTensor<T>& prediction, const std::vector<S*>& arrays) {
    // The solver's arrays are host memory: write them on the host from a host copy of the
    // prediction (the prediction itself on a host backend).
    const auto affine = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), output_affine_.of(state_.target_statistics, true));
    const ArrayIndexing a = layout_.indexing;
    const auto in = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), prediction.interior());
    for (Index c = 0; c < Index(arrays.size()); ++c) {
      S* target = arrays[c];
      Kokkos::parallel_for(
          "Session::write_output",
          Kokkos::MDRangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::Rank<3>>(
              {0, 0, 0}, {Index(in.extent(2)), Index(in.extent(3)), Index(in.extent(4))}),
          [=](const Index i, const Index j, const Index k) {
            target[a.at(i, j, k)] =
                static_cast<S>(double(in(0, c, i, j, k)) * affine(c, 0) + affine(c, 1));
          });
    }
    Kokkos::fence();
  }

  Communicator comm_;
  RankMesh mesh_;
  Decomposition decomposition_;
  RunConfig config_;
  SessionOptions options_;
  ResolvedArrays layout_;
  std::shared_ptr<Module<T>> model_;
  std::unique_ptr<Optimizer<T>> optimizer_;
  std::unique_ptr<LearningRateSchedule> schedule_;
  TrainingState state_;
  bool statistics_fixed_ = false;
  Staging staged_input_, staged_target_;
  ChannelAffine output_affine_;
};

/// The session's own communicator, with ranks numbered like the solver's process grid
/// (so the solver's rank order is free), and that grid.
struct Binding {
  Communicator comm;
  SolverGrid grid;
};

Binding bind(MPI_Comm solver_comm, const SolverPatch& patch) {
  SHARDTENSOR_REQUIRE(Kokkos::is_initialized(), where,
                      "Kokkos is not initialized: create a Kokkos::ScopeGuard (or call "
                      "shardtensor_initialize from C) after MPI_Init, before the session");
  SHARDTENSOR_REQUIRE(solver_comm != MPI_COMM_NULL, where, "the solver communicator is null");
  const Communicator solver(solver_comm);
  SolverGrid grid = solver_grid(solver, patch);
  Communicator ordered = solver.reordered(grid.grid_rank);
  return Binding{std::move(ordered), std::move(grid)};
}

class Session::Impl {
 public:
  Impl(MPI_Comm solver_comm, const SolverPatch& patch, const SessionOptions& options)
      : options_(options), binding_(bind(solver_comm, patch)), comm_(binding_.comm) {
    const SolverGrid& grid = binding_.grid;
    std::string local;
    if (options.input_channels < 1 || options.output_channels < 1)
      local = "input_channels " + std::to_string(options.input_channels) + " and output_channels " +
              std::to_string(options.output_channels) + " must be positive";
    else if (options.input_channels > max_channels || options.output_channels > max_channels)
      local = "input_channels " + std::to_string(options.input_channels) + " and output_channels " +
              std::to_string(options.output_channels) + ": at most " +
              std::to_string(max_channels) + " each";
    else if (options.config.empty() && options.config_text.empty() && options.checkpoint.empty())
      local = "no model: give a config (file or text) or a checkpoint";
    else if (!options.config.empty() && !options.config_text.empty())
      local = "a config file ('" + options.config +
              "') and config text: give one (the text would be ignored)";
    comm_.agree(local.empty() ? "" : std::string(where) + ": " + local);

    // What every rank must share, agreed before anything collective: options that differ, a
    // config that one rank cannot read, or one that differs (a per-rank seed or learning
    // rate) stop every rank with one message, never a hang or silently different weights.
    comm_.require_same({options.config.empty(), options.config_text.empty(),
                        options.checkpoint.empty(), options.input_channels, options.output_channels},
                       where,
                       "the options (config file / config text / checkpoint given, "
                       "input_channels, output_channels)");
    layout_ = resolve_solver_arrays(comm_, grid.decomposition, options.arrays);
    comm_.require_same_text(options.checkpoint, where, "the checkpoint path");
    const auto arrays = RunConfig::DataUse::arrays;
    std::optional<RunConfig> loaded;
    std::string unreadable;
    try {
      if (!options.config.empty())
        loaded = RunConfig::load(options.config, options.overrides, arrays);
      else if (!options.config_text.empty())
        loaded = RunConfig::parse(options.config_text, "config text", options.overrides, arrays);
    } catch (const std::exception& e) {
      unreadable = e.what();
    }
    comm_.agree(unreadable);
    if (!loaded)  // collective: every rank takes this branch or none (agreed above)
      loaded = RunConfig::parse(read_checkpoint_state(comm_, options.checkpoint).config,
                                options.checkpoint + " (stored config)", options.overrides, arrays);
    const RunConfig& config = *loaded;
    comm_.require_same_text(config.text, where, "the resolved config");
    precision_ = config.training.precision;
    budget_ = std::make_unique<ScopedMemoryBudget>(config.memory.budget_mib);
    if (precision_ == "double")
      double_ = std::make_unique<Engine<double>>(comm_, grid, layout_, config, options);
    else
      float_ = std::make_unique<Engine<float>>(comm_, grid, layout_, config, options);
    if (!options.checkpoint.empty()) load(options.checkpoint);
    std::ostringstream out;
    out << config.model["type"].as<std::string>("model") << ", "
        << (float_ ? models::count_parameters(float_->model())
                   : models::count_parameters(double_->model()))
        << " parameters, " << precision_ << ", " << grid.decomposition.describe() << ", "
        << layout_.describe();
    description_ = out.str();
  }

  template <class S>
  void infer(const std::vector<const S*>& inputs, const std::vector<S*>& outputs) {
    check_arrays(comm_, "infer", layout_, inputs, options_.input_channels, "inputs", outputs,
                 options_.output_channels, "outputs");
    float_ ? float_->infer(inputs, outputs, report_) : double_->infer(inputs, outputs, report_);
  }

  template <class S>
  double train_step(const std::vector<const S*>& inputs, const std::vector<const S*>& targets) {
    check_arrays(comm_, "train_step", layout_, inputs, options_.input_channels, "inputs", targets,
                 options_.output_channels, "targets");
    return float_ ? float_->train_step(inputs, targets, report_)
                  : double_->train_step(inputs, targets, report_);
  }

  // The path must be the same on every rank: the file is written and read collectively.
  void save(const std::string& path) const {
    comm_.require_same_text(path, where, "the checkpoint path");
    float_ ? float_->save(path) : double_->save(path);
  }
  void load(const std::string& path) {
    comm_.require_same_text(path, where, "the checkpoint path");
    float_ ? float_->load(path) : double_->load(path);
  }

  const Decomposition& decomposition() const { return binding_.grid.decomposition; }
  const std::string& precision() const { return precision_; }
  std::int64_t steps() const { return float_ ? float_->steps() : double_->steps(); }
  const CallReport& report() const { return report_; }
  const std::string& description() const { return description_; }

 private:
  SessionOptions options_;
  Binding binding_;
  Communicator comm_;  // = binding_.comm
  ResolvedArrays layout_;
  std::string precision_, description_;
  // memory.budget_mib while the session lives; declared before the engines, so that it is
  // lifted only after their memory is gone.
  std::unique_ptr<ScopedMemoryBudget> budget_;
  std::unique_ptr<Engine<float>> float_;
  std::unique_ptr<Engine<double>> double_;
  CallReport report_;
};

Session::Session(MPI_Comm solver_comm, const SolverPatch& patch, const SessionOptions& options)
    : impl_(std::make_unique<Impl>(solver_comm, patch, options)) {}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

void Session::infer(const std::vector<const double*>& inputs, const std::vector<double*>& outputs) {
  impl_->infer(inputs, outputs);
}
void Session::infer(const std::vector<const float*>& inputs, const std::vector<float*>& outputs) {
  impl_->infer(inputs, outputs);
}
double Session::train_step(const std::vector<const double*>& inputs,
                           const std::vector<const double*>& targets) {
  return impl_->train_step(inputs, targets);
}
double Session::train_step(const std::vector<const float*>& inputs,
                           const std::vector<const float*>& targets) {
  return impl_->train_step(inputs, targets);
}
void Session::save_checkpoint(const std::string& path) const {
  impl_->save(path);
}
void Session::load_checkpoint(const std::string& path) {
  impl_->load(path);
}
const Decomposition& Session::decomposition() const {
  return impl_->decomposition();
}
const std::string& Session::precision() const {
  return impl_->precision();
}
std::int64_t Session::steps() const {
  return impl_->steps();
}
const CallReport& Session::last_call() const {
  return impl_->report();
}
std::string Session::describe() const {
  return impl_->description();
}

}  // namespace shardtensor
