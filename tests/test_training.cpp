// Training from configs: config errors, the sample schedule, and whole training runs —
// sharded == single rank, data groups == a larger batch, restart == uninterrupted run,
// checkpoints that load on another rank count, inference.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "shardtensor/comm.hpp"
#include "shardtensor/data/heat_equation.hpp"
#include "shardtensor/io.hpp"
#include "shardtensor/train/checkpoint.hpp"
#include "shardtensor/train/run_config.hpp"
#include "shardtensor/train/sample_schedule.hpp"
#include "shardtensor/train/trainer.hpp"
#include "test_support.hpp"

using namespace shardtensor;
namespace fs = std::filesystem;

namespace {

/// A small heat dataset, generated once per directory.
std::string heat_data(const Communicator& comm, const std::string& dir) {
  const std::string path = dir + "/heat.h5";
  HeatOptions options;
  options.dims = 2;
  options.size = 16;
  options.samples = 12;
  options.steps = 10;
  generate_heat_dataset(comm, options, path);
  return path;
}

std::string config_text(const std::string& data, const std::string& run_dir, int epochs, int batch,
                        int groups, const std::string& precision) {
  std::ostringstream c;
  c << "run_dir: " << run_dir << "\n"
    << "data: {path: " << data << ", validation_samples: 3, periodic: true}\n"
    << "parallel: {data_groups: " << groups << "}\n"
    << "model: {type: unet, depth: 1, base_channels: 4, norm: group, norm_groups: 2,"
    << " activation: gelu, padding: periodic, seed: 7}\n"
    << "optimizer: {type: adam, lr: 0.003}\n"
    << "schedule: {type: cosine, warmup_steps: 2, total_steps: 16}\n"
    << "training: {epochs: " << epochs << ", batch_size: " << batch
    << ", clip_grad_norm: 5.0, precision: " << precision << ", keep_checkpoints: 10}\n";
  return c.str();
}

/// Column `name` of metrics.csv as numbers (empty cells skipped).
std::vector<double> metric(const std::string& run_dir, const std::string& name) {
  std::ifstream in(run_dir + "/metrics.csv");
  std::string line, cell;
  std::getline(in, line);
  std::vector<std::string> header;
  for (std::stringstream s(line); std::getline(s, cell, ',');) header.push_back(cell);
  const auto column = std::find(header.begin(), header.end(), name) - header.begin();
  std::vector<double> values;
  while (std::getline(in, line)) {
    std::stringstream s(line);
    for (long i = 0; std::getline(s, cell, ','); ++i)
      if (i == column && !cell.empty()) values.push_back(std::stod(cell));
  }
  return values;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-30));
  return worst;
}

TrainOptions quiet(std::string resume = "") {
  TrainOptions o;
  o.progress = false;
  o.resume = std::move(resume);
  return o;
}

}  // namespace

TEST_CASE("config errors name the key, the value and the line", "[config]") {
  const std::string bad_key =
      "run_dir: x\ndata:\n  path: a.h5\n  shufle: true\nmodel: {type: unet}\n";
  const std::string m1 = test::error_message_of([&] { RunConfig::parse(bad_key, "run.yaml"); });
  CHECK_THAT(m1, Catch::Contains("run.yaml: data (line 4): unknown key 'shufle' (did you mean"));
  CHECK_THAT(m1, Catch::Contains("did you mean 'shuffle'?"));

  const std::string bad_type =
      "data: {path: a.h5}\nmodel: {type: unet}\ntraining:\n  epochs: many\n";
  const std::string m2 = test::error_message_of([&] { RunConfig::parse(bad_type, "run.yaml"); });
  CHECK_THAT(m2, Catch::Contains("training.epochs (line 4): expects an integer, got 'many'"));

  const std::string bad_choice =
      "data: {path: a.h5}\nmodel: {type: unet}\noptimizer: {type: lbfgs}\n";
  const std::string m3 = test::error_message_of([&] { RunConfig::parse(bad_choice); });
  CHECK_THAT(m3, Catch::Contains("optimizer.type"));
  CHECK_THAT(m3, Catch::Contains("'lbfgs'"));
  CHECK_THAT(m3, Catch::Contains("sgd, adam, adamw"));

  const std::string gloo = "data: {path: a.h5}\nmodel: {type: unet}\nparallel: {backend: gloo}\n";
  CHECK_THAT(test::error_message_of([&] { RunConfig::parse(gloo, "run.yaml"); }),
             Catch::Contains("run.yaml: parallel.backend (line 3): unknown value 'gloo'; "
                             "accepted: mpi, nccl"));
  const std::string nccl = "data: {path: a.h5}\nmodel: {type: unet}\nparallel: {backend: nccl}\n";
  if (nccl_available())
    CHECK(RunConfig::parse(nccl).parallel.comm.backend == CommBackend::nccl);
  else
    CHECK_THAT(test::error_message_of([&] { RunConfig::parse(nccl, "run.yaml"); }),
               Catch::Contains("run.yaml: parallel.backend (line 3): 'nccl' needs a CUDA build "
                               "with NCCL; this build has none (use mpi)"));
  const RunConfig aware = RunConfig::parse(
      "data: {path: a.h5}\nmodel: {type: unet}\nparallel: {backend: mpi, device_aware_mpi: "
      "true}\n");
  CHECK(aware.parallel.comm.backend == CommBackend::mpi);
  CHECK(aware.parallel.comm.device_aware_mpi);
  CHECK_FALSE(
      RunConfig::parse("data: {path: a.h5}\nmodel: {type: unet}\n").parallel.comm.device_aware_mpi);
  const auto bf16_wire = [](const std::string& value) {
    return RunConfig::parse(
               "data: {path: a.h5}\nmodel: {type: unet}\nparallel: {bf16_wire: " + value + "}\n",
               "run.yaml")
        .parallel.comm.bf16_wire;
  };
  CHECK(RunConfig::parse("data: {path: a.h5}\nmodel: {type: unet}\n").parallel.comm.bf16_wire ==
        Bf16Wire::automatic);
  CHECK(bf16_wire("on") == Bf16Wire::always);
  CHECK(bf16_wire("off") == Bf16Wire::never);
  CHECK(bf16_wire("auto") == Bf16Wire::automatic);
  CHECK_THAT(test::error_message_of([&] { bf16_wire("half"); }),
             Catch::Contains("run.yaml: parallel.bf16_wire (line 3)") &&
                 Catch::Contains("'half'") && Catch::Contains("auto, on, off"));

  CHECK(RunConfig::parse("data: {path: a.h5}\nmodel: {type: unet}\ntraining: {tf32: true}\n")
            .training.tf32);
  CHECK_FALSE(RunConfig::parse("data: {path: a.h5}\nmodel: {type: unet}\n").training.tf32);
  const std::string m4 = test::error_message_of([&] {
    RunConfig::parse("data: {path: a.h5}\nmodel: {type: unet}\ntraining: {tf32: sometimes}\n");
  });
  CHECK_THAT(m4, Catch::Contains("training.tf32"));
  CHECK_THAT(m4, Catch::Contains("sometimes"));

  const std::string missing = "model: {type: unet}\n";
  CHECK_THAT(test::error_message_of([&] { RunConfig::parse(missing); }),
             Catch::Contains("data.path (line 1): missing required key"));
  CHECK_THAT(test::error_message_of([&] { RunConfig::parse("data: [1, 2\n"); }),
             Catch::Contains("YAML syntax error"));
  CHECK_THAT(test::error_message_of([&] {
               RunConfig::parse("data: {path: a.h5}\nmodel: {type: unet}\noptimizer: {lr: -1}\n");
             }),
             Catch::Contains("lr"));
}

TEST_CASE("--set overrides keys, creating maps, and parses values as YAML", "[config]") {
  const std::string text = "data: {path: a.h5}\nmodel: {type: unet, depth: 3}\n";
  const RunConfig c = RunConfig::parse(
      text, "run.yaml", {"training.epochs=7", "model.depth=1", "data.periodic=[true, false]"});
  CHECK(c.training.epochs == 7);
  CHECK(c.model["depth"].as<int>() == 1);
  CHECK(c.data.periodic == std::vector<bool>{true, false});
  CHECK_THAT(c.text, Catch::Contains("epochs: 7"));
  CHECK_THAT(test::error_message_of([&] { RunConfig::parse(text, "x", {"novalue"}); }),
             Catch::Contains("expected key=value, got 'novalue'"));
  CHECK_THAT(test::error_message_of([&] { RunConfig::parse(text, "x", {"data.path.x=1"}); }),
             Catch::Contains("'path' in 'data.path.x' is not a map"));
}

TEST_CASE("the sample schedule shuffles per epoch and splits batches between groups",
          "[schedule]") {
  std::vector<Index> samples;
  for (Index i = 0; i < 23; ++i) samples.push_back(i * 2);
  const SampleSchedule schedule(samples, 3, 2, 99, true);
  CHECK(schedule.steps_per_epoch() == 3);
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<Index> seen;
    for (Index step = 0; step < 3; ++step)
      for (int group = 0; group < 2; ++group)
        for (Index s : schedule.batch(epoch, step, group)) {
          CHECK(s % 2 == 0);
          seen.insert(s);
        }
    CHECK(seen.size() == 18);  // disjoint batches
  }
  CHECK(schedule.order(0) != schedule.order(1));
  CHECK(schedule.order(4) == SampleSchedule(samples, 3, 2, 99, true).order(4));
  CHECK_THAT(test::error_message_of([&] { SampleSchedule(samples, 12, 2, 1, true); }),
             Catch::Contains("needs batch_size 12 x data_groups 2 = 24 training samples"));
}

TEST_CASE("training on P ranks gives the losses of one rank", "[train]") {
  const Communicator world;
  const test::TempDir temporary(world);
  const std::string& dir = temporary.dir();
  const std::string data = heat_data(world, dir);

  const RunConfig sharded =
      RunConfig::parse(config_text(data, dir + "/sharded", 2, 2, 1, "double"));
  const TrainResult r = train(world, sharded, quiet());
  CHECK(r.steps == 8);  // 9 training samples, batch 2: 4 steps per epoch
  CHECK(r.val_relative_l2 > 0);
  if (world.rank() == 0) {
    const Communicator self(MPI_COMM_SELF);
    const RunConfig single =
        RunConfig::parse(config_text(data, dir + "/single", 2, 2, 1, "double"));
    const TrainResult s = train(self, single, quiet());
    CHECK(max_relative_difference(metric(dir + "/sharded", "loss"),
                                  metric(dir + "/single", "loss")) < 1e-10);
    CHECK(std::abs(r.val_relative_l2 - s.val_relative_l2) < 1e-10 * s.val_relative_l2);
    const auto losses = metric(dir + "/single", "loss");
    CHECK(losses.size() == 8);
    CHECK(metric(dir + "/single", "val_loss").size() == 2);
    CHECK(fs::exists(dir + "/single/config.yaml"));
    CHECK(list_checkpoints(dir + "/single/checkpoints").size() == 2);
  }
  world.barrier();

  {  // data groups average gradients: 2 groups x batch 1 == 1 group x batch 2
    if (world.size() % 2 == 0) {
      const RunConfig groups =
          RunConfig::parse(config_text(data, dir + "/groups", 2, 1, 2, "double"));
      train(world, groups, quiet());
      if (world.rank() == 0)
        CHECK(max_relative_difference(metric(dir + "/groups", "loss"),
                                      metric(dir + "/sharded", "loss")) < 1e-10);
    }
  }

  {  // a restart continues with the same losses and parameters, bit for bit
    const RunConfig four = RunConfig::parse(config_text(data, dir + "/four", 4, 2, 1, "float"));
    const TrainResult straight = train(world, four, quiet());
    const RunConfig two = RunConfig::parse(config_text(data, dir + "/restart", 2, 2, 1, "float"));
    train(world, two, quiet());
    const RunConfig more = RunConfig::parse(config_text(data, dir + "/restart", 4, 2, 1, "float"));
    const TrainResult resumed = train(world, more, quiet("latest"));
    CHECK(resumed.steps == straight.steps);
    if (world.rank() == 0) {
      CHECK(metric(dir + "/four", "loss") == metric(dir + "/restart", "loss"));
      CHECK(metric(dir + "/four", "val_loss") == metric(dir + "/restart", "val_loss"));
    }
    const io::File a = io::File::open(world, straight.checkpoint);
    const io::File b = io::File::open(world, resumed.checkpoint);
    for (const std::string& name : io::list_datasets(a, "parameters"))
      CHECK(io::read_array<float>(a, "parameters/" + name) ==
            io::read_array<float>(b, "parameters/" + name));
  }

  {  // inference on any rank count, from a checkpoint written on another
    InferOptions o;
    o.checkpoint = r.checkpoint;
    o.input_path = data;
    o.output_path = dir + "/prediction.h5";
    o.progress = false;
    const InferResult mine = infer(world, sharded, o);
    CHECK(mine.samples == 12);
    CHECK(mine.relative_l2 > 0);
    CHECK(fs::exists(dir + "/prediction.xdmf"));
    if (world.rank() == 0) {
      const Communicator self(MPI_COMM_SELF);
      o.output_path = dir + "/prediction_single.h5";
      const InferResult single = infer(self, sharded, o);
      CHECK(std::abs(mine.relative_l2 - single.relative_l2) < 1e-10 * single.relative_l2);
      const io::File a = io::File::open(self, dir + "/prediction.h5");
      const io::File b = io::File::open(self, dir + "/prediction_single.h5");
      const auto pa = io::read_array<double>(a, "prediction");
      const auto pb = io::read_array<double>(b, "prediction");
      CHECK(max_relative_difference(pa, pb) < 1e-9);
    }
    world.barrier();
  }

  {  // bad input is reported on every rank
    RunConfig wrong = sharded;
    wrong.run_dir = dir + "/wrong";  // a run dir of its own: "sharded" holds a run
    wrong.data.target = "missing";
    const std::string m = test::error_message_of([&] { train(world, wrong, quiet()); });
    CHECK_THAT(m, Catch::Contains("missing"));
    CHECK(test::ranks_with_error(m) == world.size());
    RunConfig too_big = wrong;
    too_big.data.target = sharded.data.target;
    too_big.training.batch_size = 100;
    CHECK(test::ranks_with_error(test::error_message_of([&] { train(world, too_big, quiet()); })) ==
          world.size());

    // A process grid that does not fit the ranks.
    RunConfig bad_grid = too_big;
    bad_grid.training.batch_size = sharded.training.batch_size;
    bad_grid.parallel.grid = {world.size() + 1, 1};
    const std::string g = test::error_message_of([&] { train(world, bad_grid, quiet()); });
    CHECK_THAT(g, Catch::Contains("parallel.grid"));
    CHECK(test::ranks_with_error(g) == world.size());

    // A checkpoint from another model: the parameters it lacks are named.
    InferOptions o;
    o.checkpoint = r.checkpoint;
    o.input_path = data;
    o.output_path = dir + "/never.h5";
    const RunConfig deeper = RunConfig::parse(config_text(data, dir + "/deeper", 2, 2, 1, "double"),
                                              "deeper", {"model.depth=2"});
    const std::string d = test::error_message_of([&] { infer(world, deeper, o); });
    CHECK_THAT(d, Catch::Contains("has no parameter 'parameters/down1.conv0.weight'"));
    CHECK(test::ranks_with_error(d) == world.size());
    CHECK_FALSE(fs::exists(dir + "/never.h5"));

    // Data whose channels do not match the model.
    o.input_dataset = "target";  // 1 channel; the model reads 2
    const std::string c = test::error_message_of([&] { infer(world, sharded, o); });
    CHECK_THAT(c, Catch::Contains("dataset 'target' has 1 input channel(s)") &&
                      Catch::Contains("was trained with 2"));
    CHECK(test::ranks_with_error(c) == world.size());
  }

  {  // a diverging run stops with a message on every rank and keeps its last checkpoint
    const RunConfig good = RunConfig::parse(config_text(data, dir + "/diverge", 1, 2, 1, "float"));
    const TrainResult first = train(world, good, quiet());
    const RunConfig wild = RunConfig::parse(config_text(data, dir + "/diverge", 3, 2, 1, "float"),
                                            "wild", {"optimizer.lr=1.0e30"});
    const std::string m = test::error_message_of([&] { train(world, wild, quiet("latest")); });
    CHECK_THAT(m, Catch::Contains("training diverged and stops"));
    CHECK_THAT(m, Catch::Contains("the last good checkpoint is " + first.checkpoint));
    CHECK(test::ranks_with_error(m) == world.size());
    CHECK(list_checkpoints(dir + "/diverge/checkpoints") ==
          std::vector<std::string>{first.checkpoint});
  }
}

TEST_CASE("bf16 training: float master weights, P ranks near one rank, float's accuracy",
          "[train][bf16]") {
  const Communicator world;
  const test::TempDir temporary(world);
  const std::string& dir = temporary.dir();
  const std::string data = heat_data(world, dir);
  const RunConfig bf16 = RunConfig::parse(config_text(data, dir + "/bf16", 4, 2, 1, "bf16"));
  const TrainResult low = train(world, bf16, quiet());
  const RunConfig full = RunConfig::parse(config_text(data, dir + "/float", 4, 2, 1, "float"));
  const TrainResult reference = train(world, full, quiet());
  // The operands were rounded: the runs differ, and bf16 learns as well (the bound:
  // at most 1.2x float's validation error).
  CHECK(metric(dir + "/bf16", "loss") != metric(dir + "/float", "loss"));
  CHECK(low.val_relative_l2 <= 1.2 * reference.val_relative_l2);
  // Checkpoints hold the float master weights.
  const io::File checkpoint = io::File::open(world, low.checkpoint);
  CHECK(io::read_attribute<std::string>(checkpoint, "/", "precision") == "float");
  if (world.rank() == 0) {
    // One rank: the same losses within bf16 rounding (an output that rounds the other way on
    // a shard moves the step a little; 16 steps keep it small).
    const Communicator self(MPI_COMM_SELF);
    const RunConfig single =
        RunConfig::parse(config_text(data, dir + "/bf16_single", 4, 2, 1, "bf16"));
    train(self, single, quiet());
    CHECK(max_relative_difference(metric(dir + "/bf16", "loss"),
                                  metric(dir + "/bf16_single", "loss")) < 2e-2);
  }
  world.barrier();
}

/// The bytes of a file ("" if it does not exist).
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_CASE("train and infer never destroy a run, an input or a checkpoint", "[train][errors]") {
  const Communicator world;
  const test::TempDir temporary(world);
  const std::string& dir = temporary.dir();
  const std::string data = heat_data(world, dir);
  const std::string run = dir + "/run";
  const RunConfig config = RunConfig::parse(config_text(data, run, 2, 2, 1, "float"));
  const TrainResult first = train(world, config, quiet());
  const std::string metrics = file_bytes(run + "/metrics.csv");
  const std::string checkpoint = file_bytes(first.checkpoint);
  REQUIRE_FALSE(metrics.empty());
  const auto unchanged = [&] {
    CHECK(file_bytes(run + "/metrics.csv") == metrics);
    CHECK(file_bytes(first.checkpoint) == checkpoint);
  };

  {  // a second run into the same run dir, without --resume: refused, nothing touched
    const std::string m = test::error_message_of([&] { train(world, config, quiet()); });
    CHECK_THAT(m, Catch::Contains("already holds a run") && Catch::Contains("--overwrite"));
    CHECK(test::ranks_with_error(m) == world.size());
    unchanged();
  }
  {  // --resume and --overwrite together: refused
    TrainOptions both = quiet("latest");
    both.overwrite = true;
    const std::string m = test::error_message_of([&] { train(world, config, both); });
    CHECK_THAT(m, Catch::Contains("exclude each other"));
    CHECK(test::ranks_with_error(m) == world.size());
    unchanged();
  }
  {  // resuming an earlier checkpoint would overwrite the later ones: refused
    const RunConfig longer = RunConfig::parse(config_text(data, run, 4, 2, 1, "float"));
    const TrainResult second = train(world, longer, quiet("latest"));
    const std::string later = file_bytes(second.checkpoint);
    const std::string m =
        test::error_message_of([&] { train(world, longer, quiet(first.checkpoint)); });
    CHECK_THAT(m, Catch::Contains("holds later checkpoints"));
    CHECK(test::ranks_with_error(m) == world.size());
    CHECK(file_bytes(second.checkpoint) == later);
    CHECK(file_bytes(first.checkpoint) == checkpoint);
  }
  {  // --overwrite moves the old run aside, whole, and starts a new one
    const std::string before = file_bytes(run + "/metrics.csv");
    TrainOptions fresh = quiet();
    fresh.overwrite = true;
    train(world, config, fresh);
    CHECK(file_bytes(run + ".old/metrics.csv") == before);
    CHECK(list_checkpoints(run + ".old/checkpoints").size() == 4);  // 4 epochs, all kept
    CHECK(metric(run, "loss").size() == 8);                         // the new run's rows only
  }

  if (fs::exists("/dev/full")) {  // a full disk says so (metrics.csv on /dev/full: ENOSPC)
    const std::string full = dir + "/full_run";
    if (world.rank() == 0) {
      fs::create_directories(full + "/checkpoints");
      fs::copy_file(run + ".old/checkpoints/" + fs::path(first.checkpoint).filename().string(),
                    full + "/checkpoints/" + fs::path(first.checkpoint).filename().string());
      fs::create_symlink("/dev/full", full + "/metrics.csv");
    }
    world.barrier();
    RunConfig on_full = config;
    on_full.run_dir = full;
    const std::string m = test::error_message_of([&] { train(world, on_full, quiet("latest")); });
    CHECK_THAT(m, Catch::Contains("metrics.csv': No space left on device"));
    CHECK(test::ranks_with_error(m) == world.size());
  }

  InferOptions o;
  o.checkpoint = first.checkpoint.substr(0, run.size()) + ".old" +
                 first.checkpoint.substr(run.size());  // moved aside above
  o.progress = false;
  const std::string input = file_bytes(data);
  const std::string old_checkpoint = file_bytes(o.checkpoint);
  const auto refused = [&](const std::string& in, const std::string& out, const char* says) {
    o.input_path = in;
    o.output_path = out;
    const std::string m = test::error_message_of([&] { infer(world, config, o); });
    CHECK_THAT(m, Catch::Contains(says) && Catch::Contains("nothing was written"));
    CHECK(test::ranks_with_error(m) == world.size());
    CHECK(file_bytes(data) == input);
    CHECK(file_bytes(o.checkpoint) == old_checkpoint);
  };
  refused(data, data, "is the --input");  // output over the input
  // the same file under another name: a symbolic link
  if (world.rank() == 0) fs::create_symlink(data, dir + "/link.h5");
  world.barrier();
  refused(data, dir + "/link.h5", "is the --input");
  refused(data, o.checkpoint, "is the --checkpoint");               // output over the checkpoint
  refused(data, dir + "/prediction.xdmf", "is also the --output");  // the sidecar over itself
  // the output's sidecar over the input: input.xdmf read as --input, output input.h5
  if (world.rank() == 0) fs::copy_file(data, dir + "/heat_copy.xdmf");
  world.barrier();
  const std::string copy = file_bytes(dir + "/heat_copy.xdmf");
  o.input_path = dir + "/heat_copy.xdmf";
  o.output_path = dir + "/heat_copy.h5";
  const std::string m = test::error_message_of([&] { infer(world, config, o); });
  CHECK_THAT(m, Catch::Contains("XDMF sidecar of --output") && Catch::Contains("is the --input"));
  CHECK(file_bytes(dir + "/heat_copy.xdmf") == copy);
  CHECK_FALSE(fs::exists(dir + "/heat_copy.h5"));

  // Damaged checkpoints are named as such, on every rank.
  const auto damaged_copy = [&](const std::string& name, const auto& damage) {
    const std::string path = dir + "/" + name;
    if (world.rank() == 0) {
      std::string bytes = old_checkpoint;
      damage(bytes);
      std::ofstream(path, std::ios::binary) << bytes;
    }
    world.barrier();
    o.checkpoint = path;
    o.input_path = data;
    o.output_path = dir + "/from_" + name;
    return test::error_message_of([&] { infer(world, config, o); });
  };
  {  // one value of a parameter changed: its bytes found in the file and one bit flipped
    const io::File file = io::File::open(world, o.checkpoint);
    const auto weight = io::read_array<float>(file, "parameters/down0.conv0.weight");
    REQUIRE(weight.size() >= 4);
    const std::string pattern(reinterpret_cast<const char*>(weight.data()), 4 * sizeof(float));
    const std::string m = damaged_copy("flipped.h5", [&](std::string& bytes) {
      const std::size_t at = bytes.find(pattern);
      REQUIRE(at != std::string::npos);
      bytes[at + 5] ^= 0x10;
    });
    CHECK_THAT(m, Catch::Contains("flipped.h5: dataset 'parameters/down0.conv0.weight' does not "
                                  "match its checksum"));
    CHECK(test::ranks_with_error(m) == world.size());
  }
  {  // cut in half
    const std::string m =
        damaged_copy("truncated.h5", [](std::string& bytes) { bytes.resize(bytes.size() / 2); });
    CHECK_THAT(m,
               Catch::Contains("truncated.h5") && Catch::Contains("damaged (truncated or corrupt"));
    CHECK(test::ranks_with_error(m) == world.size());
  }
  {  // a NaN in the input data: named where it is read, by file, dataset and sample
    const std::string nan_data = dir + "/nan.h5";
    {
      const io::File in = io::File::open(world, data);
      std::vector<Index> input_shape, target_shape;
      std::vector<float> input = io::read_array<float>(in, "input", &input_shape);
      const std::vector<float> target = io::read_array<float>(in, "target", &target_shape);
      input[5 * (input.size() / input_shape[0]) + 7] = std::numeric_limits<float>::quiet_NaN();
      io::File out = io::File::create(world, nan_data);
      io::write_array(out, "input", input_shape, input.data());
      io::write_array(out, "target", target_shape, target.data());
    }
    RunConfig nan_config = config;
    nan_config.data.path = nan_data;
    nan_config.run_dir = dir + "/nan_run";
    const std::string t = test::error_message_of([&] { train(world, nan_config, quiet()); });
    CHECK_THAT(t, Catch::Contains("nan.h5: dataset 'input', sample 5 holds a non-finite value"));
    CHECK(test::ranks_with_error(t) == world.size());
    o.checkpoint = dir + "/run.old/checkpoints/" + fs::path(first.checkpoint).filename().string();
    o.input_path = nan_data;
    o.output_path = dir + "/nan_prediction.h5";
    const std::string i = test::error_message_of([&] { infer(world, config, o); });
    CHECK_THAT(i, Catch::Contains("dataset 'input', sample 5 holds a non-finite value"));
    CHECK(test::ranks_with_error(i) == world.size());
    CHECK_FALSE(fs::exists(dir + "/nan_prediction.h5"));
  }
  {  // a field too large for memory.budget_mib: refused before anything is allocated
    // (4096^2 x 3 channels of float: 24 MiB per rank on 8 ranks, 192 MiB on one)
    const std::string big = dir + "/big.h5";
    {
      io::File out = io::File::create(world, big);
      io::create_field_dataset(out, "input", 1, 2, {4096, 4096}, io::DataType::float32);
      io::create_field_dataset(out, "target", 1, 1, {4096, 4096}, io::DataType::float32);
    }
    RunConfig big_config = config;
    big_config.data.path = big;
    big_config.run_dir = dir + "/big_run";
    big_config.training.batch_size = 1;
    big_config.memory.budget_mib = 16;
    const std::string b = test::error_message_of([&] { train(world, big_config, quiet()); });
    CHECK_THAT(b, Catch::Contains("big.h5 needs at least") &&
                      Catch::Contains("more than memory.budget_mib (16 MiB)"));
    CHECK(test::ranks_with_error(b) == world.size());
  }
  {  // not HDF5 at all
    const std::string m =
        damaged_copy("text.h5", [](std::string& bytes) { bytes = "not a checkpoint\n"; });
    CHECK_THAT(m, Catch::Contains("'" + dir + "/text.h5' is not an HDF5 file"));
    CHECK(test::ranks_with_error(m) == world.size());
  }
}

TEST_CASE("sequential models that change resolution train and infer on uneven splits",
          "[train][sequential]") {
  // 22 cells per axis: every process grid of 2, 3, 4 or 8 ranks has odd split points
  // (0,11,22; 0,8,15,22; 0,6,12,17,22), which a factor-2 pool, stride or upsample moves.
  const Communicator world;
  const test::TempDir temporary(world);
  const std::string& dir = temporary.dir();
  HeatOptions heat;
  heat.dims = 2;
  heat.size = 22;
  heat.samples = 6;
  heat.steps = 4;
  const std::string data = dir + "/heat.h5";
  generate_heat_dataset(world, heat, data);

  const std::vector<std::pair<std::string, std::string>> models{
      {"max pool, nearest upsample",
       "[{type: pool, kind: max, kernel: 2}, {type: upsample, scale: 2, mode: nearest},"
       " {type: conv, kernel: 1}]"},
      {"average pool, linear upsample",
       "[{type: conv, out_channels: 3, kernel: 3, padding: same, padding_mode: periodic},"
       " {type: pool, kind: average, kernel: 2}, {type: upsample, scale: 2, mode: linear},"
       " {type: conv, kernel: 1}]"},
      {"strided conv, linear upsample",
       "[{type: conv, out_channels: 3, kernel: 3, stride: 2, padding: 1},"
       " {type: upsample, scale: 2, mode: linear}, {type: conv, kernel: 1}]"},
      {"strided conv, transposed conv",
       "[{type: conv, out_channels: 3, kernel: 2, stride: 2},"
       " {type: activation, function: gelu}, {type: conv_transpose, kernel: 2, stride: 2}]"},
  };
  for (std::size_t m = 0; m < models.size(); ++m) {
    SECTION(models[m].first) {
      const auto config_for = [&](const std::string& run_dir) {
        std::ostringstream c;
        c << "run_dir: " << run_dir << "\n"
          << "data: {path: " << data << ", validation_samples: 2, periodic: true}\n"
          << "model: {type: sequential, seed: 3, layers: " << models[m].second << "}\n"
          << "optimizer: {type: adam, lr: 0.003}\n"
          << "training: {epochs: 2, batch_size: 2, precision: double}\n";
        return RunConfig::parse(c.str());
      };
      // Training: the losses (so the gradients) of one rank, and the validation error.
      const RunConfig sharded = config_for(dir + "/sharded");
      const TrainResult r = train(world, sharded, quiet());
      CHECK(r.steps == 4);
      CHECK(std::isfinite(r.val_relative_l2));
      if (world.rank() == 0) {
        const Communicator self(MPI_COMM_SELF);
        const TrainResult s = train(self, config_for(dir + "/single"), quiet());
        CHECK(max_relative_difference(metric(dir + "/sharded", "loss"),
                                      metric(dir + "/single", "loss")) < 1e-10);
        CHECK(std::abs(r.val_relative_l2 - s.val_relative_l2) < 1e-10 * s.val_relative_l2);
      }
      world.barrier();

      // Inference: against a target that is the model's own output the error is exactly 0.
      InferOptions o;
      o.checkpoint = r.checkpoint;
      o.input_path = data;
      o.output_path = dir + "/prediction.h5";
      o.progress = false;
      const InferResult first = infer(world, sharded, o);
      CHECK(first.has_target);
      CHECK(first.relative_l2 > 0);
      const std::string exact = dir + "/exact.h5";
      if (world.rank() == 0) fs::copy_file(data, exact, fs::copy_options::overwrite_existing);
      world.barrier();
      {
        std::vector<Index> shape;
        const std::vector<double> prediction =
            io::read_array<double>(io::File::open(world, o.output_path), "prediction", &shape);
        io::File file = io::File::open(world, exact, io::Mode::read_write);
        io::write_array(file, "exact", shape, prediction.data());
        std::vector<double> broken = prediction;  // a NaN in the first sample's target
        broken[broken.size() / (2 * shape[0])] = std::numeric_limits<double>::quiet_NaN();
        io::write_array(file, "broken", shape, broken.data());
      }
      o.input_path = exact;
      o.target_dataset = "exact";
      o.output_path = dir + "/again.h5";
      const InferResult again = infer(world, sharded, o);
      CHECK(again.has_target);
      CHECK(again.relative_l2 == 0);
      CHECK(again.max_relative_l2 == 0);
      // A NaN in the target gives a NaN error (the CLI prints it, with a warning), never 0.
      o.target_dataset = "broken";
      o.output_path = dir + "/broken.h5";
      const InferResult broken = infer(world, sharded, o);
      CHECK(broken.has_target);
      CHECK(std::isnan(broken.relative_l2));
      CHECK(std::isnan(broken.max_relative_l2));
    }
  }
}
