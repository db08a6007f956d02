#include "shardtensor/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "metrics_file.hpp"
#include "run_data.hpp"
#include "run_dir.hpp"
#include "run_setup.hpp"
#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/train/batch_reader.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/progress.hpp"
#include "shardtensor/train/sample_schedule.hpp"
#include "shardtensor/train/training_step.hpp"
#include "stop_on_signal.hpp"

namespace shardtensor {

namespace {

namespace fs = std::filesystem;
using impl::FieldData;
using impl::inspect;
using impl::make_directories;
using impl::MetricsFile;
using impl::prepare_run_dir;
using impl::require_trained_on;
using impl::set_up;
using impl::Setup;
using impl::squared_errors;
using impl::StopOnSignal;
using impl::sum_over;
using impl::validate;
using impl::write_text_file;

/// The samples a run trains on and validates with: the validation file's (data.validation_path)
/// or the last ones of the training file (data.validation_samples or validation_fraction).
struct SampleSplit {
  std::vector<Index> train, validation;
  std::unique_ptr<io::File> validation_file;  // null: validation samples are in the data file
};

SampleSplit split_samples(const Communicator& world, const RunConfig& config,
                          const FieldData& data) {
  SampleSplit split;
  if (!config.data.validation_path.empty()) {
    for (Index i = 0; i < data.samples; ++i) split.train.push_back(i);
    split.validation_file =
        std::make_unique<io::File>(io::File::open(world, config.data.validation_path));
    const FieldData v =
        inspect(*split.validation_file, config.data.input, config.data.target, true);
    SHARDTENSOR_REQUIRE(
        v.extents == data.extents && v.input_channels == data.input_channels &&
            v.target_channels == data.target_channels,
        "data.validation_path",
        config.data.validation_path << " holds fields of another shape than " << config.data.path);
    for (Index i = 0; i < v.samples; ++i) split.validation.push_back(i);
    return split;
  }
  const Index validation = config.data.validation_samples >= 0
                               ? config.data.validation_samples
                               : Index(std::floor(config.data.validation_fraction * data.samples));
  SHARDTENSOR_REQUIRE(validation < data.samples, "data.validation_samples",
                      validation << " validation samples leave none of the " << data.samples
                                 << " samples in " << config.data.path << " for training");
  for (Index i = 0; i < data.samples - validation; ++i) split.train.push_back(i);
  for (Index i = data.samples - validation; i < data.samples; ++i) split.validation.push_back(i);
  return split;
}

/// Resumed from an earlier step: the later checkpoints of that run would be overwritten.
void refuse_overwriting_later(const Communicator& world, const std::string& checkpoint_dir,
                              const std::string& resume, std::int64_t step) {
  std::string later;
  if (world.rank() == 0)
    for (const std::string& c : list_checkpoints(checkpoint_dir))
      if (c > checkpoint_name(checkpoint_dir, step))
        later += (later.empty() ? "" : ", ") + fs::path(c).filename().string();
  world.agree(later.empty()
                  ? ""
                  : "train --resume: " + resume + " is at step " + std::to_string(step) + ", but " +
                        checkpoint_dir + " holds later checkpoints (" + later +
                        ") that this run would overwrite: resume the newest (--resume latest), "
                        "or copy the checkpoint into another run_dir and resume there");
}

/// The state a run starts from: the checkpoint's (--resume, its parameters and optimizer
/// state loaded), or step 0 with the normalisation statistics of the training samples.
template <class T>
TrainingState start_or_resume(const Communicator& world, const RunConfig& config,
                              const TrainOptions& options, const io::File& file, Setup<T>& s,
                              const std::vector<Index>& train_samples,
                              const std::string& checkpoint_dir, Optimizer<T>& optimizer) {
  std::string resume = options.resume;
  if (resume == "latest") {
    const auto found = list_checkpoints(checkpoint_dir);
    SHARDTENSOR_REQUIRE(!found.empty(), "train --resume latest",
                        "no checkpoint in " << checkpoint_dir);
    resume = found.back();
  }
  TrainingState state;
  if (!resume.empty()) {
    // The data's shape against what the checkpoint was trained on, before its parameters
    // are compared with the model's (whose sizes would only say that something differs).
    require_trained_on(read_checkpoint_state(world, resume), resume, s.data, config.data.path, true,
                       "train --resume");
    state = load_checkpoint(world, resume, *s.model, &optimizer);
    refuse_overwriting_later(world, checkpoint_dir, resume, state.step);
    return state;
  }
  state.seed = config.training.seed;
  const auto statistics = [&](const std::string& dataset, Index channels) {
    return config.data.normalize ? compute_channel_statistics(file, dataset, channels, s.domain,
                                                              s.mesh, train_samples)
                                 : ChannelStatistics::identity(channels);
  };
  state.input_statistics = statistics(config.data.input, s.data.input_channels);
  state.target_statistics = statistics(config.data.target, s.data.target_channels);
  return state;
}

/// Rank 0 removes all but the newest `keep` checkpoints up to `newest` (only this run's
/// checkpoints rotate: none lies past the one just written).
void rotate_checkpoints(const Communicator& world, const std::string& checkpoint_dir,
                        const std::string& newest, std::size_t keep) {
  if (world.rank() != 0) return;
  std::vector<std::string> all;
  for (const std::string& c : list_checkpoints(checkpoint_dir))
    if (c <= newest) all.push_back(c);
  for (std::size_t i = 0; i + keep < all.size(); ++i) {
    std::error_code ignored;
    fs::remove(all[i], ignored);
  }
}

/// Stops every rank (the loss is the same on all): training diverged. Checkpoints written so
/// far are left as they are.
[[noreturn]] void stop_diverged(double loss, std::int64_t step, std::int64_t epoch,
                                const std::string& checkpoint_dir) {
  const auto kept = list_checkpoints(checkpoint_dir);
  SHARDTENSOR_FAIL("train", "the loss is "
                                << loss << " at step " << step << " (epoch " << epoch + 1
                                << ") with finite data (every batch is checked when read): "
                                << "training diverged and stops; "
                                << (kept.empty() ? "no checkpoint was written"
                                                 : "the last good checkpoint is " + kept.back())
                                << " (try a smaller optimizer.lr or training.clip_grad_norm)");
}

/// One training run after its setup: epochs of steps, with validation, metrics, progress,
/// checkpoints and the stop at a signal.
template <class T>
class TrainingLoop {
 public:
  TrainingLoop(const Communicator& world, const RunConfig& config, const TrainOptions& options,
               const io::File& file, Setup<T>& s, SampleSplit& samples)
      : world_(world),
        config_(config),
        file_(file),
        s_(s),
        samples_(samples),
        groups_(s.mesh.data.size()),
        schedule_(samples.train, config.training.batch_size, groups_, config.training.seed,
                  config.data.shuffle),
        steps_per_epoch_(schedule_.steps_per_epoch()),
        optimizer_(make_optimizer<T>(config.optimizer, s.model->named_parameters())),
        lr_schedule_(schedule_options(config, steps_per_epoch_)),
        checkpoint_dir_((fs::path(config.run_dir) / "checkpoints").string()),
        progress_(world.rank() == 0 && options.progress, config.training.epochs, steps_per_epoch_) {
    make_directories(world, checkpoint_dir_);
    state_ = start_or_resume(world, config, options, file, s, samples.train, checkpoint_dir_,
                             *optimizer_);
    state_.config = config.text;
    state_.dims = s.data.dims;
    write_text_file(world, (fs::path(config.run_dir) / "config.yaml").string(), config.text);
    metrics_ = std::make_unique<MetricsFile>(
        world, (fs::path(config.run_dir) / "metrics.csv").string(), state_.step);
    world.agree(metrics_->error());
    if (world.rank() == 0 && options.progress) print_header();
  }

  TrainResult run() {
    BatchReader<T> reader(file_, {config_.data.input, config_.data.target},
                          {s_.data.input_channels, s_.data.target_channels}, s_.domain,
                          s_.mesh.domain.rank(), config_.data.prefetch);
    s_.model->train();
    s_.model->zero_grad();
    stop_ = std::make_unique<StopOnSignal>();  // from the first step on
    for (std::int64_t epoch = state_.epoch; epoch < config_.training.epochs; ++epoch)
      run_epoch(reader, epoch);
    result_.steps = state_.step;
    result_.epochs = state_.epoch;
    result_.memory = memory_report(world_);  // before the model and optimizer go
    return result_;
  }

 private:
  static ScheduleOptions schedule_options(const RunConfig& config, Index steps_per_epoch) {
    ScheduleOptions o = config.schedule;
    if (o.total_steps == 0)
      o.total_steps =
          std::max<std::int64_t>(config.training.epochs * steps_per_epoch, o.warmup_steps + 1);
    return o;
  }

  void print_header() const {
    std::printf("train: %s, %d rank(s) = %d data group(s) x %d domain rank(s), %s\n",
                config_.run_dir.c_str(), world_.size(), groups_, s_.mesh.domain.size(),
                s_.domain.describe().c_str());
    std::printf("train: %lld training and %lld validation samples, %lld steps per epoch, %s\n",
                (long long)samples_.train.size(), (long long)samples_.validation.size(),
                (long long)steps_per_epoch_, config_.training.precision.c_str());
    std::fflush(stdout);
  }

  void run_epoch(BatchReader<T>& reader, std::int64_t epoch) {
    double loss_sum = 0;
    // A run stopped by a signal mid-epoch continues at the step it stopped after.
    const Index resumed = state_.step - epoch * steps_per_epoch_;
    const Index first_step = resumed > 0 && resumed < steps_per_epoch_ ? resumed : 0;
    reader.start(schedule_.batch(epoch, first_step, s_.mesh.data_group));
    progress_.start_epoch(epoch);
    for (Index step = first_step; step < steps_per_epoch_; ++step) {
      const bool last_step = step + 1 == steps_per_epoch_;
      loss_sum += run_step(reader, epoch, step);
      if (last_step)
        progress_.end_epoch(loss_sum / double(steps_per_epoch_ - first_step),
                            validated_ ? result_.val_loss : -1,
                            validated_ ? result_.val_relative_l2 : -1, last_lr_);
      if (const int signal = stop_->received(s_.mesh); signal != 0 && !last_step)
        stop_at_signal(reader, epoch, step, signal);
    }
    world_.agree(metrics_->error());  // no read in flight after an epoch's last step
    state_.epoch = epoch + 1;
    result_.loss = loss_sum / double(steps_per_epoch_ - first_step);
    if (state_.epoch % config_.training.checkpoint_every == 0 ||
        state_.epoch == config_.training.epochs) {
      result_.checkpoint = checkpoint_name(checkpoint_dir_, state_.step);
      save_checkpoint(world_, result_.checkpoint, *s_.model, optimizer_.get(), state_);
      rotate_checkpoints(world_, checkpoint_dir_, result_.checkpoint,
                         config_.training.keep_checkpoints);
    }
  }

  /// One optimizer step on the next batch (the one after it starts reading); its loss, the
  /// same on every rank (summed over the groups, equal within a group).
  double run_step(BatchReader<T>& reader, std::int64_t epoch, Index step) {
    const auto step_start = std::chrono::steady_clock::now();
    std::vector<ShardTensor<T>> batch = reader.finish();
    if (step + 1 < steps_per_epoch_)
      reader.start(schedule_.batch(epoch, step + 1, s_.mesh.data_group));
    normalize(batch[0], state_.input_statistics);
    normalize(batch[1], state_.target_statistics);
    const StepOutcome outcome =
        training_step(*s_.model, *optimizer_, lr_schedule_, s_.mesh.domain, s_.mesh.data,
                      config_.training.loss, config_.training.clip_grad_norm, batch[0], batch[1]);
    ++state_.step;
    const double loss = sum_over(s_.mesh.data, outcome.loss) / groups_;
    if (!std::isfinite(loss)) stop_diverged(loss, state_.step, epoch, checkpoint_dir_);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    const double samples_per_s = double(groups_ * config_.training.batch_size) / seconds;
    progress_.step(step, loss, samples_per_s);

    const bool epoch_done =
        epoch + 1 == config_.training.epochs || (epoch + 1) % config_.training.validate_every == 0;
    validated_ = step + 1 == steps_per_epoch_ && !samples_.validation.empty() && epoch_done;
    if (validated_) {
      const io::File& file = samples_.validation_file ? *samples_.validation_file : file_;
      std::tie(result_.val_loss, result_.val_relative_l2) =
          validate(s_, config_, file, samples_.validation, state_.input_statistics,
                   state_.target_statistics);
      check_memory_budget(s_.mesh.domain, s_.mesh.data);
    }
    last_lr_ = outcome.learning_rate;
    metrics_->row(state_.step, epoch, loss, validated_ ? result_.val_loss : -1,
                  result_.val_relative_l2, outcome.learning_rate, outcome.grad_norm, samples_per_s);
    return loss;
  }

  /// At this step boundary: a checkpoint to resume from, then every rank stops.
  [[noreturn]] void stop_at_signal(BatchReader<T>& reader, std::int64_t epoch, Index step,
                                   int signal) {
    reader.finish();       // the next batch's read: done before the checkpoint's collectives
    state_.epoch = epoch;  // epochs completed; the step says how far into this one
    result_.checkpoint = checkpoint_name(checkpoint_dir_, state_.step);
    save_checkpoint(world_, result_.checkpoint, *s_.model, optimizer_.get(), state_);
    std::ostringstream message;
    message << "train: stopped by " << (signal == SIGINT ? "SIGINT" : "SIGTERM") << " after step "
            << state_.step << " (epoch " << epoch + 1 << ", step " << step + 1 << " of "
            << steps_per_epoch_ << "); checkpoint " << result_.checkpoint
            << "; continue with --resume latest";
    throw TrainingStopped(message.str(), signal);
  }

  const Communicator& world_;
  const RunConfig& config_;
  const io::File& file_;
  Setup<T>& s_;
  SampleSplit& samples_;
  const int groups_;
  const SampleSchedule schedule_;
  const Index steps_per_epoch_;
  std::unique_ptr<Optimizer<T>> optimizer_;
  const LearningRateSchedule lr_schedule_;
  const std::string checkpoint_dir_;
  Progress progress_;
  TrainingState state_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<StopOnSignal> stop_;
  TrainResult result_;
  bool validated_ = false;  // at the step just run
  double last_lr_ = 0;
};

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
  prepare_run_dir(world, config.run_dir, options);     // before the model or anything is written
  Setup<T> s = set_up<T>(world, config, file, config.data.input, config.data.target, true);
  SampleSplit samples = split_samples(world, config, s.data);
  TrainResult result = TrainingLoop<T>(world, config, options, file, s, samples).run();
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return result;
}

}  // namespace

TrainResult train(const Communicator& world, const RunConfig& config, const TrainOptions& options) {
  return config.training.precision == "double" ? train_as<double>(world, config, options)
                                               : train_as<float>(world, config, options);
}

}  // namespace shardtensor
