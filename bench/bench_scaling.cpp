// bench_scaling: the training step and the inference step of a model from a run config, on one
// global field split over however many ranks it runs on. tools/scaling.py runs it at several
// rank counts (strong, weak and capacity studies) and tabulates the JSON lines.
//
//   mpirun -n 4 ./bench_scaling --config bench/scaling_unet3d.yaml --size 64
//   options: --config FILE   a run config: its `model:` section (as `shardtensor train` reads
//                            it; required), optimizer, schedule, training.loss,
//                            training.clip_grad_norm, training.precision, data.periodic and
//                            memory.budget_mib; data.path is not needed (data is random)
//            --size N|AxBxC  global field: a cube of edge N in --dims dims, or explicit extents
//            --dims D (3)  --channels-in C (2)  --channels-out C (1)  --batch B (1)
//            --warmup K (1)  --iters K (5 timed training steps)
//            --infer-iters K (= iters; timed inference steps, after one untimed)
//            --overlap on|off (on: Conv overlaps its halo exchange with interior compute)
//            --precision float|double|bf16 (default: the config's training.precision)
//            --tf32 on|off (default: the config's training.tf32; float convolutions through
//                           cuDNN may use TF32 tensor cores)
//            --budget-mib M (per-rank budget on tracked memory, overrides the config's;
//                            over it, the run reports "fits":false instead of failing)
//            --peak-report N (the N largest allocations live at the training steps' peak, on
//                            the rank with the highest peak: where the bytes sit; 0)
//
// Decomposition: Decomposition::automatic over all ranks (one data group). Input and target are
// random values drawn per global cell, so every rank count trains on the same field and reports
// the same loss (last training step; up to the order of float sums). Time: every step
// starts after a barrier; a step's time is the slowest rank's; reported: the median over the
// timed steps, wall and CPU (CPU time is less inflated when other jobs share the cores).
// Communication: comm_timers.hpp counts each rank's seconds inside halo exchanges and inside
// collectives; a fraction is that rank's communication time over its step time, summed over
// the timed steps; reported: the largest over ranks. Memory: the tracker's peak per category
// over the whole run (parameters, optimizer state, activations, workspaces, comm buffers, other:
// input and target fields), the maximum over ranks; the inference steps' own peak; and the peak
// resident set (getrusage) and the resident set before the model was built (the process base).
// Exit: 0 (also when the budget is exceeded: "fits":false), 2 on any other error. Last line:
// one JSON object.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/core/allocation_cache.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/host_blas.hpp"
#include "shardtensor/core/kernel_counter.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/core/random.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/models.hpp"
#include "shardtensor/train/run_config.hpp"
#include "shardtensor/train/training_step.hpp"

using namespace shardtensor;
using namespace shardtensor::bench;

namespace {

struct Settings {
  std::string config_path;
  std::vector<Index> extents;
  Index channels_in = 2, channels_out = 1, batch = 1;
  int warmup = 1, iters = 5, infer_iters = 5;
  bool overlap = true;
  double budget_mib = 0;
  int peak_report = 0;  // allocations to list at the training peak
};

/// The `count` largest allocations live at this rank's tracked peak, printed by the rank with
/// the highest peak (the lowest such rank).
void print_peak_allocations(const Communicator& world, int count) {
  struct {
    double peak;
    int rank;
  } mine{double(memory_snapshot().total.peak), world.rank()}, top = mine;
  MPI_Allreduce(&mine, &top, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  if (world.rank() != top.rank) return;
  const std::vector<LiveAllocation> live = memory_peak_allocations();
  std::printf("  at the training peak (%.2f MiB, rank %d), the %d largest of %zu allocations:\n",
              to_mib(std::uint64_t(top.peak)), top.rank, std::min<int>(count, int(live.size())),
              live.size());
  for (int i = 0; i < count && i < int(live.size()); ++i)
    std::printf("    %8.3f MiB  %-14s %s\n", to_mib(live[i].bytes), to_string(live[i].category),
                live[i].label.empty() ? "(unlabelled)" : live[i].label.c_str());
  std::fflush(stdout);
}

/// Per-step timings of one kind of step, on this rank.
struct StepTimes {
  std::vector<double> wall;                         // slowest rank's, per step
  std::vector<double> cpu;                          // largest over ranks, per step
  double local_wall = 0, halo = 0, collective = 0;  // this rank, summed over the steps

  void add(double wall_s, double cpu_s, double halo_s, double collective_s) {
    wall.push_back(max_over_ranks(wall_s));
    cpu.push_back(max_over_ranks(cpu_s));
    local_wall += wall_s;
    halo += halo_s;
    collective += collective_s;
  }
  /// Largest over ranks of (communication / step time) on each rank.
  double fraction(double seconds) const {
    return max_over_ranks(local_wall > 0 ? seconds / local_wall : 0);
  }
};

struct Result {
  Index parameters = 0;
  Index cells_per_rank = 0;  // the busiest rank's
  Index size_multiple = 1;   // field extents must be multiples of this (U-Net: 2^depth)
  bool fits = true;
  double loss = std::nan("");  // of the last training step: the same on any rank count
  std::string error;           // why it does not fit
  StepTimes train, infer;
  MemorySnapshot memory, infer_memory;
  KernelCounts train_counts, infer_counts;  // of the last timed step (core/kernel_counter.hpp)
  double train_halo_mib = 0, infer_halo_mib = 0;  // sent per step, the busiest rank's
};

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<Index> parse_size(const std::string& text, int dims) {
  std::vector<Index> extents;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, 'x')) extents.push_back(std::stol(part));
  if (extents.size() == 1) extents.assign(dims, extents[0]);
  return extents;
}

/// Random values drawn per global cell: the same field on any rank count, so the losses of
/// runs on different rank counts can be compared.
template <class T>
ShardTensor<T> random_field(const Decomposition& d, int rank, Index batch, Index channels,
                            std::uint64_t seed) {
  ShardTensor<T> field(d, rank, batch, channels);
  const auto v = field.interior();
  const Box box = field.global_box();
  const Index gx = d.global_extent(0), gy = d.global_extent(1), gz = d.global_extent(2);
  const Index x0 = box.lower[0], y0 = box.lower[1], z0 = box.lower[2];  // std::array: host only
  Kokkos::parallel_for(
      "random_field",
      Kokkos::MDRangePolicy<RightRank<5>>(
          {0, 0, 0, 0, 0}, {v.extent(0), v.extent(1), v.extent(2), v.extent(3), v.extent(4)}),
      KOKKOS_LAMBDA(const Index n, const Index c, const Index i, const Index j, const Index k) {
        const Index cell = ((x0 + i) * gy + y0 + j) * gz + z0 + k;
        v(n, c, i, j, k) =
            T(hashed_uniform(seed, std::uint64_t((n * channels + c) * gx * gy * gz + cell)));
      });
  return field;
}

template <class T>
void run(const Communicator& world, const RunConfig& config, const Settings& s,
         const Decomposition& d, Result& r) {
  // One data group (every rank shares the one sample), moving data as parallel.* says.
  const RankMesh mesh = world.with_options(config.parallel.comm).mesh(1);
  const int dims = int(s.extents.size());
  for (int rank = 0; rank < world.size(); ++rank) {
    Index cells = 1;
    for (int dim = 0; dim < dims; ++dim) cells *= d.extent(rank, dim);
    r.cells_per_rank = std::max(r.cells_per_rank, cells);
  }
  const models::ModelShape shape{dims, s.channels_in, s.channels_out, s.extents};
  if (config.model["type"] && config.model["type"].as<std::string>() == "unet")
    r.size_multiple = Index(1) << models::unet_options(config.model, shape).depth;

  auto model = models::build_model<T>(config.model, mesh.domain, shape);
  config.configure_layers(*model);
  model->overlap_halo(s.overlap);
  r.parameters = models::count_parameters(*model);
  auto optimizer = make_optimizer<T>(config.optimizer, model->named_parameters());
  ScheduleOptions schedule_options = config.schedule;
  if (schedule_options.total_steps == 0)
    schedule_options.total_steps = schedule_options.warmup_steps + s.warmup + s.iters + 1;
  const LearningRateSchedule schedule(schedule_options);
  const ShardTensor<T> input = random_field<T>(d, world.rank(), s.batch, s.channels_in, 1);
  const ShardTensor<T> target = random_field<T>(d, world.rank(), s.batch, s.channels_out, 2);
  check_memory_budget(world);

  model->train();
  for (int step = 0; step < s.warmup + s.iters; ++step) {
    MPI_Barrier(MPI_COMM_WORLD);
    reset_comm_timers();
    // The last step's kernel launches, fences and deep copies (the counter's callbacks cost
    // nanoseconds per launch); the bench's own fence below is not the step's.
    std::optional<KernelCounter> counter;
    if (step + 1 == s.warmup + s.iters) counter.emplace();
    const double t0 = MPI_Wtime(), c0 = cpu_seconds();
    r.loss = training_step(*model, *optimizer, schedule, mesh.domain, mesh.data,
                           config.training.loss, config.training.clip_grad_norm, input, target)
                 .loss;
    if (counter) r.train_counts = counter->counts();
    counter.reset();
    Kokkos::fence();
    const double t1 = MPI_Wtime(), c1 = cpu_seconds();
    const double halo = comm_seconds(CommKind::halo);
    const double collective = comm_seconds(CommKind::collective);
    r.train_halo_mib = to_mib(comm_bytes_sent(CommKind::halo));
    check_memory_budget(world);  // the optimizer's state is allocated in its first step
    if (step >= s.warmup) r.train.add(t1 - t0, c1 - c0, halo, collective);
  }
  r.memory = memory_report(world);
  if (s.peak_report > 0) print_peak_allocations(world, s.peak_report);

  model->eval();
  reset_memory_peak();
  for (int step = 0; step < (s.infer_iters > 0 ? 1 : 0) + s.infer_iters; ++step) {
    MPI_Barrier(MPI_COMM_WORLD);
    reset_comm_timers();
    std::optional<KernelCounter> counter;
    if (step == s.infer_iters) counter.emplace();  // the last step
    const double t0 = MPI_Wtime(), c0 = cpu_seconds();
    {
      const NoGradGuard no_grad;  // as validation and `shardtensor infer` run it
      const Variable<T> prediction = model->forward(Variable<T>::field(input));
    }
    if (counter) r.infer_counts = counter->counts();
    counter.reset();
    Kokkos::fence();
    const double t1 = MPI_Wtime(), c1 = cpu_seconds();
    const double halo = comm_seconds(CommKind::halo);
    const double collective = comm_seconds(CommKind::collective);
    r.infer_halo_mib = to_mib(comm_bytes_sent(CommKind::halo));
    check_memory_budget(world);
    if (step >= 1) r.infer.add(t1 - t0, c1 - c0, halo, collective);  // one warm-up step
  }
  r.train_halo_mib = max_over_ranks(r.train_halo_mib);
  r.infer_halo_mib = max_over_ranks(r.infer_halo_mib);
  r.infer_memory = memory_report(world);
}

std::string json_number(double v, int digits = 6) {
  if (!std::isfinite(v)) return "null";
  char text[64];
  std::snprintf(text, sizeof text, "%.*g", digits, v);
  return text;
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double one_minute = -1;
  in >> one_minute;
  return one_minute;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  keep_freed_memory();  // as the CLI does: freed activations stay in the heap
  one_blas_thread_per_rank();  // as the CLI does
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const Communicator world;
    try {
      Settings s;
      s.config_path = option(argc, argv, "--config", "");
      const int dims = std::stoi(option(argc, argv, "--dims", "3"));
      s.extents = parse_size(option(argc, argv, "--size", "32"), dims);
      s.channels_in = std::stol(option(argc, argv, "--channels-in", "2"));
      s.channels_out = std::stol(option(argc, argv, "--channels-out", "1"));
      s.batch = std::stol(option(argc, argv, "--batch", "1"));
      s.warmup = std::stoi(option(argc, argv, "--warmup", "1"));
      s.iters = std::stoi(option(argc, argv, "--iters", "5"));
      s.infer_iters =
          std::stoi(option(argc, argv, "--infer-iters", std::to_string(s.iters).c_str()));
      const std::string overlap = option(argc, argv, "--overlap", "on");
      const std::string budget = option(argc, argv, "--budget-mib", "");
      const std::string tf32 = option(argc, argv, "--tf32", "");
      const std::string precision = option(argc, argv, "--precision", "");
      s.peak_report = std::stoi(option(argc, argv, "--peak-report", "0"));
      SHARDTENSOR_REQUIRE(s.peak_report >= 0 && !s.config_path.empty() && s.extents.size() >= 1 &&
                              s.extents.size() <= 3 && s.channels_in >= 1 && s.channels_out >= 1 &&
                              s.batch >= 1 && s.warmup >= 0 && s.iters >= 1 && s.infer_iters >= 0 &&
                              (overlap == "on" || overlap == "off") &&
                              (tf32.empty() || tf32 == "on" || tf32 == "off"),
                          "bench_scaling",
                          "bad options (--config is required; --size N or AxBxC with 1-3 dims; "
                          "--iters >= 1; --overlap on|off; --tf32 on|off; --peak-report >= 0)");
      std::vector<std::string> overrides;  // checked as the config's own keys are
      if (!precision.empty()) overrides.push_back("training.precision=" + precision);
      RunConfig config = RunConfig::load(s.config_path, overrides, RunConfig::DataUse::arrays);
      if (!tf32.empty()) config.training.tf32 = tf32 == "on";
      s.budget_mib = budget.empty() ? config.memory.budget_mib : std::stod(budget);
      s.overlap = overlap == "on";

      enable_comm_timers();
      enable_memory_tracking();  // before anything is allocated: parameters count too
      if (s.peak_report > 0) record_memory_peak_allocations(true);
      if (s.budget_mib > 0) set_memory_budget(std::uint64_t(std::ceil(s.budget_mib * 1048576)));

      std::vector<bool> periodic = config.data.periodic;
      if (periodic.size() == 1) periodic.assign(s.extents.size(), periodic[0]);
      const Decomposition d = Decomposition::automatic(s.extents, world.size(), periodic);
      // The process base (MPI, Kokkos, libraries): peak RSS less this is the run's own memory.
      const double base_rss = max_over_ranks(peak_resident_mib());
      Result r;
      try {
        if (config.training.precision == "double")
          run<double>(world, config, s, d, r);
        else
          run<float>(world, config, s, d, r);
      } catch (const Error& e) {
        // The budget check throws on every rank together: then the run "does not fit".
        const bool over = s.budget_mib > 0 && memory_snapshot().total.peak > memory_budget();
        if (max_over_ranks(over ? 1.0 : 0.0) == 0) throw;
        r.fits = false;
        r.error = e.what();
        r.memory = memory_report(world);
      }
      const double peak_rss = max_over_ranks(peak_resident_mib());
      const double train_s = median(r.train.wall), infer_s = median(r.infer.wall);
      const double train_cpu_s = median(r.train.cpu), infer_cpu_s = median(r.infer.cpu);
      const double train_halo = r.train.fraction(r.train.halo);
      const double train_collective = r.train.fraction(r.train.collective);
      const double infer_halo = r.infer.fraction(r.infer.halo);
      const double infer_collective = r.infer.fraction(r.infer.collective);

      if (world.rank() == 0) {
        std::string global, global_json;
        Index cells = 1;
        for (std::size_t i = 0; i < s.extents.size(); ++i) {
          global += (i ? "x" : "") + std::to_string(s.extents[i]);
          global_json += (i ? "," : "") + std::to_string(s.extents[i]);
          cells *= s.extents[i];
        }
        std::string grid;
        for (std::size_t i = 0; i < d.process_grid().size(); ++i)
          grid += (i ? "x" : "") + std::to_string(d.process_grid()[i]);
        const std::string model_type =
            config.model["type"] ? config.model["type"].as<std::string>() : "sequential";

        std::printf(
            "bench_scaling: %s (%lld parameters, %s), field %s x %lld batch, %d rank(s)"
            ", grid %s, overlap %s, vector path %s\n",
            model_type.c_str(), (long long)r.parameters, config.training.precision.c_str(),
            global.c_str(), (long long)s.batch, world.size(), grid.c_str(), overlap.c_str(),
            vector_path().c_str());
        if (r.fits) {
          std::printf(
              "  training step   %10.2f ms (CPU %.2f ms), halo %.1f %% (%.2f MiB sent), "
              "collectives %.1f %%\n",
              train_s * 1e3, train_cpu_s * 1e3, 100 * train_halo, r.train_halo_mib,
              100 * train_collective);
          if (s.infer_iters > 0)
            std::printf(
                "  inference step  %10.2f ms (CPU %.2f ms), halo %.1f %% (%.2f MiB sent), "
                "collectives %.1f %%\n",
                infer_s * 1e3, infer_cpu_s * 1e3, 100 * infer_halo, r.infer_halo_mib,
                100 * infer_collective);
        } else {
          std::printf("  does not fit: %s\n", r.error.c_str());
        }
        if (r.fits)
          std::printf(
              "  Kokkos per step: training %lld launches, %lld fences, %lld deep copies, %lld "
              "allocations; inference %lld, %lld, %lld, %lld\n",
              (long long)r.train_counts.launches, (long long)r.train_counts.fences,
              (long long)r.train_counts.deep_copies, (long long)r.train_counts.allocations,
              (long long)r.infer_counts.launches, (long long)r.infer_counts.fences,
              (long long)r.infer_counts.deep_copies, (long long)r.infer_counts.allocations);
        std::printf(
            "  peak tracked memory per rank %.1f MiB, resident set %.1f MiB (%.1f MiB before "
            "the model)\n",
            to_mib(r.memory.total.peak), peak_rss, base_rss);

        std::string memory = "{\"total\":" + json_number(to_mib(r.memory.total.peak));
        for (int c = 0; c < memory_category_count; ++c)
          memory += std::string(",\"") + to_string(static_cast<MemoryCategory>(c)) +
                    "\":" + json_number(to_mib(r.memory.categories[c].peak));
        memory += "}";
        std::printf(
            "{\"bench\":\"scaling\",\"model\":\"%s\",\"config\":\"%s\",\"precision\":\"%s\","
            "\"ranks\":%d,\"grid\":\"%s\",\"global\":[%s],\"cells\":%lld,\"cells_per_rank\":%lld,"
            "\"batch\":%lld,\"channels_in\":%lld,\"channels_out\":%lld,\"parameters\":%lld,"
            "\"overlap\":\"%s\",\"tf32\":%s,\"warmup\":%d,\"iters\":%d,\"infer_iters\":%d,"
            "\"train_step_s\":%s,\"train_step_cpu_s\":%s,\"infer_step_s\":%s,"
            "\"infer_step_cpu_s\":%s,\"train_halo_fraction\":%s,"
            "\"train_collective_fraction\":%s,\"infer_halo_fraction\":%s,"
            "\"infer_collective_fraction\":%s,\"peak_mib\":%s,\"infer_peak_mib\":%s,"
            "\"peak_rss_mib\":%s,\"base_rss_mib\":%s,\"budget_mib\":%s,\"fits\":%s,"
            "\"size_multiple\":%lld,\"loss\":%s,\"load_average\":%s,\"vector_isa\":\"%s\","
            "\"vector_lanes\":%d,\"bf16_dot\":%s,\"amx_tiles\":%s,\"train_launches\":%lld,\"train_"
            "fences\":%lld,"
            "\"train_deep_copies\":%lld,\"train_allocations\":%lld,\"infer_launches\":%lld,"
            "\"infer_fences\":%lld,\"infer_deep_copies\":%lld,\"infer_allocations\":%lld,"
            "\"bf16_wire\":\"%s\",\"train_halo_mib\":%s,\"infer_halo_mib\":%s}\n",
            model_type.c_str(), s.config_path.c_str(), config.training.precision.c_str(),
            world.size(), grid.c_str(), global_json.c_str(), (long long)cells,
            (long long)r.cells_per_rank, (long long)s.batch, (long long)s.channels_in,
            (long long)s.channels_out, (long long)r.parameters, overlap.c_str(),
            config.training.tf32 ? "true" : "false", s.warmup, s.iters, s.infer_iters,
            json_number(r.fits ? train_s : NAN).c_str(),
            json_number(r.fits ? train_cpu_s : NAN).c_str(),
            json_number(r.fits ? infer_s : NAN).c_str(),
            json_number(r.fits ? infer_cpu_s : NAN).c_str(),
            json_number(r.fits ? train_halo : NAN).c_str(),
            json_number(r.fits ? train_collective : NAN).c_str(),
            json_number(r.fits && s.infer_iters > 0 ? infer_halo : NAN).c_str(),
            json_number(r.fits && s.infer_iters > 0 ? infer_collective : NAN).c_str(),
            memory.c_str(),
            json_number(r.fits && s.infer_iters > 0 ? to_mib(r.infer_memory.total.peak) : NAN)
                .c_str(),
            json_number(peak_rss).c_str(), json_number(base_rss).c_str(),
            json_number(s.budget_mib).c_str(), r.fits ? "true" : "false",
            (long long)r.size_multiple, json_number(r.fits ? r.loss : NAN, 9).c_str(),
            json_number(load_average()).c_str(), kernels::vector_isa().c_str(),
            kernels::vector_lanes(), kernels::bf16_dot_products() ? "true" : "false",
            kernels::bf16_matrix_tiles() ? "true" : "false", (long long)r.train_counts.launches,
            (long long)r.train_counts.fences, (long long)r.train_counts.deep_copies,
            (long long)r.train_counts.allocations, (long long)r.infer_counts.launches,
            (long long)r.infer_counts.fences, (long long)r.infer_counts.deep_copies,
            (long long)r.infer_counts.allocations, to_string(config.parallel.comm.bf16_wire),
            json_number(r.train_halo_mib).c_str(), json_number(r.infer_halo_mib).c_str());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", world.rank(), e.what());
      status = 2;
      // An error on some ranks only would leave the others waiting in a collective.
      if (world.size() > 1) MPI_Abort(MPI_COMM_WORLD, status);
    }
  }
  MPI_Finalize();
  return status;
}
