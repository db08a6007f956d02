#include "shardtensor/train/trainer.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "metrics_file.hpp"
#include "run_dir.hpp"
#include "stop_on_signal.hpp"
#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/comm/redistribute.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_limits.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/field_io.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/io/output_paths.hpp"
#include "shardtensor/io/xdmf.hpp"
#include "shardtensor/models/builder.hpp"
#include "shardtensor/nn/redistribute_field.hpp"  // same_global_field
#include "shardtensor/train/batch_reader.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/parameter_limit.hpp"
#include "shardtensor/train/progress.hpp"
#include "shardtensor/train/sample_schedule.hpp"
#include "shardtensor/train/training_step.hpp"

namespace shardtensor {

namespace {

namespace fs = std::filesystem;
using impl::make_directories;
using impl::MetricsFile;
using impl::prepare_run_dir;
using impl::StopOnSignal;
using impl::write_text_file;

/// Shapes of a file's input and target datasets, checked against each other.
struct FieldData {
  int dims = 0;
  std::vector<Index> extents;
  Index samples = 0, input_channels = 0, target_channels = 0;
  bool has_target = false;
};

FieldData inspect(const io::File& file, const std::string& input, const std::string& target,
                  bool target_required) {
  const char* where = "data";
  const io::DatasetInfo in = io::dataset_info(file, input);
  SHARDTENSOR_REQUIRE(in.dims.size() >= 3 && in.dims.size() <= 5, where,
                      file.path() << ": dataset '" << input << "' has " << in.dims.size()
                                  << " dims; expected [samples, channels, 1-3 spatial dims]");
  FieldData f;
  f.dims = int(in.dims.size()) - 2;
  f.samples = in.dims[0];
  f.input_channels = in.dims[1];
  f.extents.assign(in.dims.begin() + 2, in.dims.end());
  io::validate_field_dataset(file, input, f.input_channels, f.extents);
  f.has_target = !target.empty() && io::has_dataset(file, target);
  SHARDTENSOR_REQUIRE(f.has_target || !target_required, where,
                      file.path() << " has no target dataset '" << target << "'");
  if (f.has_target) {
    const io::DatasetInfo out = io::dataset_info(file, target);
    SHARDTENSOR_REQUIRE(out.dims.size() == in.dims.size() && out.dims[0] == f.samples, where,
                        file.path() << ": target '" << target << "' " << out.shape()
                                    << " must have the samples and spatial dims of input '" << input
                                    << "' " << in.shape());
    f.target_channels = out.dims[1];
    io::validate_field_dataset(file, target, f.target_channels, f.extents);
  }
  return f;
}

/// Stops where the data's field is not the kind the checkpoint was trained on (its spatial dims,
/// its input channels and, with `targets`, its target channels): the cause, before any
/// parameter sizes are compared. Every rank reads the same values: every rank stops.
void require_trained_on(const TrainingState& trained, const std::string& checkpoint,
                        const FieldData& data, const std::string& data_path, bool targets,
                        const char* where) {
  SHARDTENSOR_REQUIRE(trained.dims == 0 || trained.dims == data.dims, where,
                      data_path << " holds " << data.dims << "-D fields, " << checkpoint
                                << " was trained on " << trained.dims << "-D fields (its model is "
                                << trained.dims << "-D)");
  SHARDTENSOR_REQUIRE(trained.input_statistics.channels() == data.input_channels, where,
                      data_path << " has " << data.input_channels << " input channel(s), "
                                << checkpoint << " was trained with "
                                << trained.input_statistics.channels());
  SHARDTENSOR_REQUIRE(!targets || trained.target_statistics.channels() == data.target_channels,
                      where,
                      data_path << " has " << data.target_channels << " target channel(s), "
                                << checkpoint << " was trained with "
                                << trained.target_statistics.channels());
}

/// Refuses, on every rank and before anything is allocated, data whose one batch alone (the
/// input and target values of the largest shard: a lower bound of a step's memory) exceeds
/// memory.budget_mib or the memory the node has free: a small file that declares a huge
/// dataset, or too few ranks for the field.
void require_batch_fits(const Communicator& world, const io::File& file, const FieldData& data,
                        const Decomposition& domain, Index batch, std::size_t value_bytes,
                        double budget_mib) {
  std::uint64_t cells = 0;
  for (int r = 0; r < domain.nranks(); ++r) {
    const Box b = domain.box(r);
    cells = std::max(cells,
                     saturating_product(saturating_product(b.extent[0], b.extent[1]), b.extent[2]));
  }
  const std::uint64_t channels = std::uint64_t(data.input_channels + data.target_channels);
  const std::uint64_t bytes = saturating_product(
      saturating_product(saturating_product(std::uint64_t(batch), channels), cells), value_bytes);
  const std::uint64_t budget = budget_mib > 0 ? std::uint64_t(budget_mib * 1048576.0) : 0;
  const std::uint64_t available = node_available_bytes();
  std::string problem;
  const std::string need = describe_bytes(bytes);
  if ((budget > 0 && bytes > budget) || (available > 0 && bytes > available))
    problem =
        "data: one batch of " + file.path() + " needs at least " + need + " per rank (batch " +
        std::to_string(batch) + " x " + std::to_string(channels) + " channels x " +
        std::to_string(cells) + " cells on the largest shard x " + std::to_string(value_bytes) +
        " bytes), more than " +
        (budget > 0 && bytes > budget ? "memory.budget_mib (" + describe_bytes(budget) + ")"
                                      : "this node has free (" + describe_bytes(available) + ")") +
        ": use more ranks (smaller shards), a smaller batch, or check the file's "
        "dataset shapes";
  world.agree(problem);
}

Decomposition domain_decomposition(const FieldData& data, const RunConfig& config,
                                   int domain_ranks) {
  std::vector<bool> periodic = config.data.periodic;
  if (periodic.size() == 1) periodic.assign(data.dims, periodic[0]);
  if (periodic.empty()) periodic.assign(data.dims, false);
  SHARDTENSOR_REQUIRE(
      int(periodic.size()) == data.dims, "data.periodic",
      "has " << periodic.size() << " entries, the data has " << data.dims << " spatial dims");
  std::vector<int> grid = config.parallel.grid;
  if (!grid.empty()) {
    SHARDTENSOR_REQUIRE(
        int(grid.size()) == data.dims, "parallel.grid",
        "has " << grid.size() << " entries, the data has " << data.dims << " spatial dims");
    int product = 1;
    for (int g : grid) product *= g;
    SHARDTENSOR_REQUIRE(product == domain_ranks, "parallel.grid",
                        "covers " << product << " ranks, each data group has " << domain_ranks);
  }
  return Decomposition::automatic(data.extents, domain_ranks, periodic, grid);
}

RankMesh make_mesh(const Communicator& world, int data_groups) {
  SHARDTENSOR_REQUIRE(world.size() % data_groups == 0, "parallel.data_groups",
                      data_groups << " data groups do not divide " << world.size() << " ranks");
  return world.mesh(data_groups);
}

/// Sum over `comm` of a double on every rank.
double sum_over(const Communicator& comm, double value) {
  Kokkos::View<double*, Kokkos::HostSpace> v("value", 1);
  v(0) = value;
  allreduce(comm, v);
  return v(0);
}

/// Per sample: sum (p - y)^2 and sum y^2 over this rank's cells of the target. A prediction
/// split elsewhere than the target (same global field) is redistributed onto the target's
/// split first; any other difference is an error naming both layouts: shards of different
/// layouts are never compared cell by cell.
template <class T>
std::vector<std::pair<double, double>> squared_errors(const Communicator& comm,
                                                      const ShardTensor<T>& prediction,
                                                      const ShardTensor<T>& target) {
  const bool resplit = !prediction.same_layout(target) && prediction.batch() == target.batch() &&
                       prediction.channels() == target.channels() &&
                       same_global_field(prediction.decomposition(), target.decomposition());
  const ShardTensor<T> on_target =
      resplit ? redistribute(comm, prediction, target.decomposition(), target.ghosts())
              : prediction;
  SHARDTENSOR_REQUIRE(on_target.same_layout(target), "relative L2 error",
                      "prediction (batch "
                          << prediction.batch() << ", channels " << prediction.channels() << ", "
                          << prediction.decomposition().describe() << ") and target (batch "
                          << target.batch() << ", channels " << target.channels() << ", "
                          << target.decomposition().describe() << ") differ");
  const auto p = on_target.interior(), y = target.interior();
  std::vector<std::pair<double, double>> out;
  for (std::size_t n = 0; n < p.extent(0); ++n) {
    double error = 0, norm = 0;
    Kokkos::parallel_reduce(
        "relative_l2_sums",
        Kokkos::MDRangePolicy<Kokkos::Rank<4>>(
            {0, 0, 0, 0}, {p.extent(1), p.extent(2), p.extent(3), p.extent(4)}),
        KOKKOS_LAMBDA(const Index c, const Index i, const Index j, const Index k, double& e,
                      double& s) {
          const double d = double(p(n, c, i, j, k)) - double(y(n, c, i, j, k));
          e += d * d;
          s += double(y(n, c, i, j, k)) * double(y(n, c, i, j, k));
        },
        error, norm);
    out.emplace_back(error, norm);
  }
  return out;
}

/// Everything a training or inference run sets up from the config and the data file.
template <class T>
struct Setup {
  RankMesh mesh;
  FieldData data;
  Decomposition domain;
  std::shared_ptr<Module<T>> model;
};

template <class T>
Setup<T> set_up(const Communicator& world, const RunConfig& config, const io::File& file,
                const std::string& input, const std::string& target, bool target_required,
                Index out_channels = 0) {
  // The domain and data-parallel communicators move device memory as parallel.backend says.
  RankMesh mesh = make_mesh(world.with_options(config.parallel.comm), config.parallel.data_groups);
  FieldData data = inspect(file, input, target, target_required);
  if (out_channels > 0) {
    SHARDTENSOR_REQUIRE(!data.has_target || data.target_channels == out_channels, "infer",
                        file.path() << ": target '" << target << "' has " << data.target_channels
                                    << " channels, the model predicts " << out_channels);
    data.target_channels = out_channels;
  }
  Decomposition domain = domain_decomposition(data, config, mesh.domain.size());
  // Before the model, the statistics or any batch is allocated.
  require_batch_fits(world, file, data, domain, target_required ? config.training.batch_size : 1,
                     sizeof(T), config.memory.budget_mib);
  std::shared_ptr<Module<T>> model;
  {
    const auto limit = parameter_limit(world, config, target_required);
    model = models::build_model<T>(
        config.model, mesh.domain,
        {data.dims, data.input_channels, data.target_channels, data.extents});
  }
  model->allow_tf32(config.training.tf32);
  return Setup<T>{std::move(mesh), std::move(data), std::move(domain), std::move(model)};
}

/// Validation: mean loss (normalized space) and mean relative L2 error (physical units)
/// over `samples`, shared round-robin between the data groups.
template <class T>
std::pair<double, double> validate(Setup<T>& s, const RunConfig& config, const io::File& file,
                                   const std::vector<Index>& samples,
                                   const ChannelStatistics& input_statistics,
                                   const ChannelStatistics& target_statistics) {
  s.model->eval();
  const NoGradGuard no_grad;  // nothing here runs backward: keep no graph
  const int groups = s.mesh.data.size();
  BatchReader<T> reader(file, {config.data.input, config.data.target},
                        {s.data.input_channels, s.data.target_channels}, s.domain,
                        s.mesh.domain.rank(), false);
  double loss_sum = 0, relative_sum = 0;
  const Index rounds = (Index(samples.size()) + groups - 1) / groups;
  for (Index r = 0; r < rounds; ++r) {
    const Index index = r * groups + s.mesh.data_group;
    const bool counted = index < Index(samples.size());
    reader.start({samples[counted ? index : 0]});
    std::vector<ShardTensor<T>> batch = reader.finish();
    normalize(batch[0], input_statistics);
    ShardTensor<T> target = batch[1];
    ShardTensor<T> normalized_target =
        ShardTensor<T>::uninitialized(s.domain, s.mesh.domain.rank(), 1, target.channels());
    Kokkos::deep_copy(normalized_target.view(), target.view());
    normalize(normalized_target, target_statistics);
    MemoryCategoryScope graph_memory(MemoryCategory::activations);
    const Variable<T> prediction = s.model->forward(Variable<T>::field(batch[0]));
    const double loss = scalar_value(loss_by_name(config.training.loss, s.mesh.domain, prediction,
                                                  Variable<T>::field(normalized_target)));
    denormalize(prediction.value(), target_statistics);
    const auto sums = squared_errors(s.mesh.domain, prediction.value(), target)[0];
    const double error = sum_over(s.mesh.domain, sums.first);
    const double norm = sum_over(s.mesh.domain, sums.second);
    if (counted) {
      loss_sum += loss;
      relative_sum += std::sqrt(error / std::max(norm, 1e-300));
    }
  }
  s.model->train();
  // Every domain rank of a group holds the same sums: combine over the data groups only.
  const double n = double(samples.size());
  return {sum_over(s.mesh.data, loss_sum) / n, sum_over(s.mesh.data, relative_sum) / n};
}

template <class T>
TrainResult train_as(const Communicator& world, const RunConfig& config,
                     const TrainOptions& options) {
  const auto start_time = std::chrono::steady_clock::now();
  // Checked after every forward pass and backward (training_step), on every rank together.
  const ScopedMemoryBudget budget(config.memory.budget_mib);
  SHARDTENSOR_REQUIRE(!config.data.path.empty(), "train",
                      "data.path is empty: training reads its samples from an HDF5 file");
  io::File file = io::File::open(world, config.data.path);
  const impl::RunDirLock lock(world, config.run_dir);  // one train per run dir at a time
  prepare_run_dir(world, config.run_dir, options);  // before the model or anything is written
  Setup<T> s = set_up<T>(world, config, file, config.data.input, config.data.target, true);
  const int groups = s.mesh.data.size();
  const int rank0 = world.rank() == 0;

  // Training and validation samples.
  std::vector<Index> train_samples, val_samples;
  std::unique_ptr<io::File> val_file_storage;
  const io::File* val_file = &file;
  if (!config.data.validation_path.empty()) {
    for (Index i = 0; i < s.data.samples; ++i) train_samples.push_back(i);
    val_file_storage =
        std::make_unique<io::File>(io::File::open(world, config.data.validation_path));
    const FieldData v = inspect(*val_file_storage, config.data.input, config.data.target, true);
    SHARDTENSOR_REQUIRE(
        v.extents == s.data.extents && v.input_channels == s.data.input_channels &&
            v.target_channels == s.data.target_channels,
        "data.validation_path",
        config.data.validation_path << " holds fields of another shape than " << config.data.path);
    for (Index i = 0; i < v.samples; ++i) val_samples.push_back(i);
    val_file = val_file_storage.get();
  } else {
    Index validation = config.data.validation_samples >= 0
                           ? config.data.validation_samples
                           : Index(std::floor(config.data.validation_fraction * s.data.samples));
    SHARDTENSOR_REQUIRE(validation < s.data.samples, "data.validation_samples",
                        validation << " validation samples leave none of the " << s.data.samples
                                   << " samples in " << config.data.path << " for training");
    for (Index i = 0; i < s.data.samples - validation; ++i) train_samples.push_back(i);
    for (Index i = s.data.samples - validation; i < s.data.samples; ++i) val_samples.push_back(i);
  }
  const SampleSchedule schedule(train_samples, config.training.batch_size, groups,
                                config.training.seed, config.data.shuffle);
  const Index steps_per_epoch = schedule.steps_per_epoch();

  auto optimizer = make_optimizer<T>(config.optimizer, s.model->named_parameters());
  ScheduleOptions schedule_options = config.schedule;
  if (schedule_options.total_steps == 0)
    schedule_options.total_steps = std::max<std::int64_t>(config.training.epochs * steps_per_epoch,
                                                          schedule_options.warmup_steps + 1);
  const LearningRateSchedule lr_schedule(schedule_options);

  // Resume, or start: normalisation statistics are computed once and kept in checkpoints.
  const std::string checkpoint_dir = (fs::path(config.run_dir) / "checkpoints").string();
  make_directories(world, checkpoint_dir);
  TrainingState state;
  std::string resume = options.resume;
  if (resume == "latest") {
    const auto found = list_checkpoints(checkpoint_dir);
    SHARDTENSOR_REQUIRE(!found.empty(), "train --resume latest",
                        "no checkpoint in " << checkpoint_dir);
    resume = found.back();
  }
  if (!resume.empty()) {
    // The data's shape against what the checkpoint was trained on, before its parameters
    // are compared with the model's (whose sizes would only say that something differs).
    require_trained_on(read_checkpoint_state(world, resume), resume, s.data, config.data.path,
                       true, "train --resume");
    state = load_checkpoint(world, resume, *s.model, optimizer.get());
  } else {
    state.seed = config.training.seed;
    state.input_statistics =
        config.data.normalize
            ? compute_channel_statistics(file, config.data.input, s.data.input_channels, s.domain,
                                         s.mesh, train_samples)
            : ChannelStatistics::identity(s.data.input_channels);
    state.target_statistics =
        config.data.normalize
            ? compute_channel_statistics(file, config.data.target, s.data.target_channels, s.domain,
                                         s.mesh, train_samples)
            : ChannelStatistics::identity(s.data.target_channels);
  }
  {  // Resumed from an earlier step: the later checkpoints of that run would be overwritten.
    std::string later;
    if (rank0)
      for (const std::string& c : list_checkpoints(checkpoint_dir))
        if (c > checkpoint_name(checkpoint_dir, state.step))
          later += (later.empty() ? "" : ", ") + fs::path(c).filename().string();
    world.agree(later.empty()
                    ? ""
                    : "train --resume: " + resume + " is at step " + std::to_string(state.step) +
                          ", but " + checkpoint_dir + " holds later checkpoints (" + later +
                          ") that this run would " +
                          "overwrite: resume the newest (--resume latest), or copy the checkpoint "
                          "into another "
                          "run_dir and resume there");
  }
  state.config = config.text;
  state.dims = s.data.dims;
  write_text_file(world, (fs::path(config.run_dir) / "config.yaml").string(), config.text);
  MetricsFile metrics(world, (fs::path(config.run_dir) / "metrics.csv").string(), state.step);
  world.agree(metrics.error());

  Progress progress(rank0 && options.progress, config.training.epochs, steps_per_epoch);
  if (rank0 && options.progress) {
    std::printf("train: %s, %d rank(s) = %d data group(s) x %d domain rank(s), %s\n",
                config.run_dir.c_str(), world.size(), groups, s.mesh.domain.size(),
                s.domain.describe().c_str());
    std::printf("train: %lld training and %lld validation samples, %lld steps per epoch, %s\n",
                (long long)train_samples.size(), (long long)val_samples.size(),
                (long long)steps_per_epoch, config.training.precision.c_str());
    std::fflush(stdout);
  }

  BatchReader<T> reader(file, {config.data.input, config.data.target},
                        {s.data.input_channels, s.data.target_channels}, s.domain,
                        s.mesh.domain.rank(), config.data.prefetch);
  TrainResult result;
  s.model->train();
  s.model->zero_grad();
  const StopOnSignal stop;
  for (std::int64_t epoch = state.epoch; epoch < config.training.epochs; ++epoch) {
    double loss_sum = 0;
    // A run stopped by a signal mid-epoch continues at the step it stopped after.
    const Index resumed = state.step - epoch * steps_per_epoch;
    const Index first_step = resumed > 0 && resumed < steps_per_epoch ? resumed : 0;
    reader.start(schedule.batch(epoch, first_step, s.mesh.data_group));
    progress.start_epoch(epoch);
    for (Index step = first_step; step < steps_per_epoch; ++step) {
      const auto step_start = std::chrono::steady_clock::now();
      std::vector<ShardTensor<T>> batch = reader.finish();
      if (step + 1 < steps_per_epoch)
        reader.start(schedule.batch(epoch, step + 1, s.mesh.data_group));
      normalize(batch[0], state.input_statistics);
      normalize(batch[1], state.target_statistics);

      const StepOutcome outcome =
          training_step(*s.model, *optimizer, lr_schedule, s.mesh.domain, s.mesh.data,
                        config.training.loss, config.training.clip_grad_norm, batch[0], batch[1]);
      const double grad_norm = outcome.grad_norm, lr = outcome.learning_rate;
      ++state.step;

      // The same on every rank (summed over the groups, equal within a group): all ranks
      // stop together. Checkpoints written so far are left as they are.
      const double step_loss = sum_over(s.mesh.data, outcome.loss) / groups;
      if (!std::isfinite(step_loss)) {
        const auto kept = list_checkpoints(checkpoint_dir);
        SHARDTENSOR_FAIL(
            "train", "the loss is " << step_loss << " at step " << state.step << " (epoch "
                                    << epoch + 1
                                    << ") with finite data (every batch is checked when read): "
                                    << "training diverged and stops; "
                                    << (kept.empty() ? "no checkpoint was written"
                                                     : "the last good checkpoint is " + kept.back())
                                    << " (try a smaller optimizer.lr or "
                                       "training.clip_grad_norm)");
      }
      loss_sum += step_loss;
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      const double samples_per_s = double(groups * config.training.batch_size) / seconds;
      progress.step(step, step_loss, samples_per_s);

      const bool last_step = step + 1 == steps_per_epoch;
      const bool validating = last_step && !val_samples.empty() &&
                              ((epoch + 1) % config.training.validate_every == 0 ||
                               epoch + 1 == config.training.epochs);
      if (validating) {
        std::tie(result.val_loss, result.val_relative_l2) = validate(
            s, config, *val_file, val_samples, state.input_statistics, state.target_statistics);
        check_memory_budget(s.mesh.domain, s.mesh.data);
      }
      metrics.row(state.step, epoch, step_loss, validating ? result.val_loss : -1,
                  result.val_relative_l2, lr, grad_norm, samples_per_s);
      if (last_step)
        progress.end_epoch(loss_sum / double(steps_per_epoch - first_step),
                           validating ? result.val_loss : -1,
                           validating ? result.val_relative_l2 : -1, lr);
      if (const int signal = stop.received(s.mesh); signal != 0 && !last_step) {
        // At this step boundary: a checkpoint to resume from, then every rank stops.
        reader.finish();      // the next batch's read: done before the checkpoint's collectives
        state.epoch = epoch;  // epochs completed; the step says how far into this one
        result.checkpoint = checkpoint_name(checkpoint_dir, state.step);
        save_checkpoint(world, result.checkpoint, *s.model, optimizer.get(), state);
        std::ostringstream message;
        message << "train: stopped by " << (signal == SIGINT ? "SIGINT" : "SIGTERM")
                << " after step " << state.step << " (epoch " << epoch + 1 << ", step " << step + 1
                << " of " << steps_per_epoch << "); checkpoint " << result.checkpoint
                << "; continue with --resume latest";
        throw TrainingStopped(message.str(), signal);
      }
    }
    world.agree(metrics.error());  // no read in flight after an epoch's last step
    state.epoch = epoch + 1;
    result.loss = loss_sum / double(steps_per_epoch - first_step);
    if (state.epoch % config.training.checkpoint_every == 0 ||
        state.epoch == config.training.epochs) {
      result.checkpoint = checkpoint_name(checkpoint_dir, state.step);
      save_checkpoint(world, result.checkpoint, *s.model, optimizer.get(), state);
      if (rank0) {
        // Only this run's checkpoints rotate: none lies past the one just written.
        std::vector<std::string> all;
        for (const std::string& c : list_checkpoints(checkpoint_dir))
          if (c <= result.checkpoint) all.push_back(c);
        for (std::size_t i = 0; i + config.training.keep_checkpoints < all.size(); ++i) {
          std::error_code ignored;
          fs::remove(all[i], ignored);
        }
      }
    }
  }
  result.steps = state.step;
  result.epochs = state.epoch;
  result.memory = memory_report(world);  // before the model and optimizer go
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return result;
}

template <class T>
InferResult infer_as(const Communicator& world, const RunConfig& config,
                     const InferOptions& options) {
  const auto start_time = std::chrono::steady_clock::now();
  // Checked after every forward pass, on every rank together.
  const ScopedMemoryBudget budget(config.memory.budget_mib);
  const std::string input =
      options.input_dataset.empty() ? config.data.input : options.input_dataset;
  const std::string target =
      options.target_dataset.empty() ? config.data.target : options.target_dataset;
  io::File file = io::File::open(world, options.input_path);
  // A target asked for by name must be there: without it no error would be reported, and a
  // typo would pass for a file without targets.
  if (!options.target_dataset.empty())
    io::dataset_info(file, target);  // throws, naming those there
  const TrainingState stored = read_checkpoint_state(world, options.checkpoint);
  require_trained_on(stored, options.checkpoint, inspect(file, input, "", false),
                     options.input_path + " dataset '" + input + "'", false, "infer");
  Setup<T> s =
      set_up<T>(world, config, file, input, target, false, stored.target_statistics.channels());
  const TrainingState state = load_checkpoint<T>(world, options.checkpoint, *s.model, nullptr);
  const Index out_channels = state.target_statistics.channels();
  s.model->eval();
  const NoGradGuard no_grad;  // inference: keep no graph

  io::AtomicOutput output(world, options.output_path);
  io::File out = io::File::create(world, output.temporary_path());
  io::create_field_dataset(
      out, options.output_dataset, s.data.samples, out_channels, s.data.extents,
      std::is_same<T, float>::value ? io::DataType::float32 : io::DataType::float64);
  std::vector<std::string> names{input};
  std::vector<Index> channels{s.data.input_channels};
  if (s.data.has_target) names.push_back(target), channels.push_back(s.data.target_channels);
  BatchReader<T> reader(file, names, channels, s.domain, s.mesh.domain.rank(), false);
  reader.allow_non_finite(target);  // a non-finite target gives a NaN error, printed as such

  const int groups = s.mesh.data.size();
  const Index rounds = (s.data.samples + groups - 1) / groups;
  double relative_sum = 0, relative_max = 0;
  Index nan_samples = 0;
  for (Index r = 0; r < rounds; ++r) {
    const Index index = r * groups + s.mesh.data_group;
    const bool counted = index < s.data.samples;
    const Index sample = counted ? index : 0;
    reader.start({sample});
    std::vector<ShardTensor<T>> batch = reader.finish();
    normalize(batch[0], state.input_statistics);
    MemoryCategoryScope graph_memory(MemoryCategory::activations);
    const Variable<T> prediction = s.model->forward(Variable<T>::field(batch[0]));
    check_memory_budget(s.mesh.domain, s.mesh.data);
    denormalize(prediction.value(), state.target_statistics);
    // Groups past the end rewrite sample 0 with the same values: every rank joins the write.
    io::write_field(out, options.output_dataset, sample, prediction.value());
    if (s.data.has_target) {
      const auto sums = squared_errors(s.mesh.domain, prediction.value(), batch[1])[0];
      const double relative = std::sqrt(sum_over(s.mesh.domain, sums.first) /
                                        std::max(sum_over(s.mesh.domain, sums.second), 1e-300));
      if (counted) {
        relative_sum += relative;
        if (std::isnan(relative)) ++nan_samples;
        relative_max = std::max(relative_max, relative);  // NaN counted above
      }
    }
  }
  out.close();
  output.commit();
  if (s.data.dims >= 2) {  // XDMF describes 2-D and 3-D grids; 1-D fields get no sidecar
    const std::string xdmf = fs::path(options.output_path).replace_extension(".xdmf").string();
    io::write_xdmf(world, options.output_path, xdmf, {options.output_dataset});
  }

  InferResult result;
  result.samples = s.data.samples;
  if (s.data.has_target) {
    Kokkos::View<double*, Kokkos::HostSpace> v("max", 1);
    v(0) = relative_max;
    allreduce(s.mesh.data, v, ReduceOp::max);
    result.has_target = true;
    result.relative_l2 = sum_over(s.mesh.data, relative_sum) / double(s.data.samples);
    // MPI's max of a NaN is undefined: the NaN samples are counted instead.
    const bool any_nan = sum_over(s.mesh.data, double(nan_samples)) > 0;
    result.max_relative_l2 = any_nan ? std::numeric_limits<double>::quiet_NaN() : v(0);
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  result.memory = memory_report(world);  // before the model goes
  return result;
}

}  // namespace

TrainResult train(const Communicator& world, const RunConfig& config, const TrainOptions& options) {
  return config.training.precision == "double" ? train_as<double>(world, config, options)
                                               : train_as<float>(world, config, options);
}

InferResult infer(const Communicator& world, const RunConfig& config, const InferOptions& options) {
  SHARDTENSOR_REQUIRE(!options.checkpoint.empty(), "infer", "no checkpoint given");
  // Before anything is opened for writing: the outputs replace none of the files read.
  const std::string sidecar = fs::path(options.output_path).replace_extension(".xdmf").string();
  io::require_outputs_apart(
      world, "infer", {{"--output", options.output_path}, {"XDMF sidecar of --output", sidecar}},
      {{"--input", options.input_path},
       {"--checkpoint", options.checkpoint},
       {"--config", options.config_path}});
  return config.training.precision == "double" ? infer_as<double>(world, config, options)
                                               : infer_as<float>(world, config, options);
}

}  // namespace shardtensor
