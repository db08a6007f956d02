// The launch budget of a step: Kokkos kernel launches, fences, deep copies and allocations per
// training step and inference of the main job's U-Net (examples/02_train_config/heat2d.yaml:
// 32^2, batch 4) and of the same U-Net with group normalization, counted by KernelCounter
// (core/kernel_counter.hpp). On a GPU every launch costs microseconds, every fence or
// device-host copy stalls the stream and every allocation is a cudaMalloc, a fence and a
// cudaFree, so these counts bound a small field's step time there; launches, copies and
// allocations are the same on every backend of one Kokkos version, and a change that adds
// launches, host reads or allocations to the step fails here, on a CPU.

#include <catch2/catch.hpp>
#include <cstdio>

#include <Kokkos_Core.hpp>

#include "equivalence.hpp"
#include "shardtensor/core/kernel_counter.hpp"
#include "shardtensor/models.hpp"
#include "shardtensor/optim.hpp"
#include "shardtensor/train/training_step.hpp"

using namespace shardtensor;

namespace {

// The main job's U-Net (examples/02_train_config/heat2d.yaml) and the same U-Net with group
// normalization (as the 3-D bench U-Net, bench/scaling_unet3d.yaml, has).
const char* heat2d_model = R"(
type: unet
depth: 2
base_channels: 16
norm: none
activation: gelu
down: avgpool
up: linear
padding: periodic
input_skip: true
)";

const char* group_norm_model = R"(
type: unet
depth: 2
base_channels: 16
norm: group
activation: gelu
down: maxpool
up: linear
padding: periodic
input_skip: true
)";

struct StepCounts {
  KernelCounts training, inference;
};

/// The counts of one training step (AdamW, gradients clipped) and one inference of `model_yaml`
/// on a 32^2 field, batch 4, after a first step of each (the optimizer's state, the plans).
StepCounts count_step(const char* model_yaml) {
  const Communicator world;
  const Communicator self(MPI_COMM_SELF);  // one data group
  const Decomposition d = Decomposition::automatic({32, 32}, world.size(), {true, true});
  auto model = models::build_model<float>(YAML::Load(model_yaml), world, {2, 2, 1, {32, 32}});
  OptimizerOptions adamw;
  adamw.type = "adamw";
  adamw.lr = 3e-3;
  auto optimizer = make_optimizer<float>(adamw, model->named_parameters());
  ScheduleOptions schedule_options;
  schedule_options.base_lr = adamw.lr;
  const LearningRateSchedule schedule(schedule_options);
  const ShardTensor<float> input = test::random_shard<float>(d, world.rank(), 4, 2, 1);
  const ShardTensor<float> target = test::random_shard<float>(d, world.rank(), 4, 1, 2);
  const auto step = [&] {
    training_step(*model, *optimizer, schedule, world, self, "mse", 1.0, input, target);
  };
  StepCounts c;
  step();
  {
    KernelCounter counter;
    step();
    c.training = counter.counts();
  }
  model->eval();
  const auto infer = [&] {
    const NoGradGuard no_graph;
    model->forward(Variable<float>::field(input));
  };
  infer();
  {
    KernelCounter counter;
    infer();
    c.inference = counter.counts();
  }
  if (world.rank() == 0)
    std::printf(
        "test_kernel_counts: %d rank(s), norm %s: training %lld launches, %lld fences, "
        "%lld deep copies, %lld allocations; inference %lld, %lld, %lld, %lld\n",
        world.size(), model_yaml == heat2d_model ? "none" : "group", (long long)c.training.launches,
        (long long)c.training.fences, (long long)c.training.deep_copies,
        (long long)c.training.allocations, (long long)c.inference.launches,
        (long long)c.inference.fences, (long long)c.inference.deep_copies,
        (long long)c.inference.allocations);
  return c;
}

/// A step's budget, per rank.
struct Budget {
  std::int64_t launches, fences, deep_copies, allocations;
};

void check_within(const KernelCounts& c, const Budget& budget) {
  CHECK(c.launches <= budget.launches);
  CHECK(c.fences <= budget.fences);
  CHECK(c.deep_copies <= budget.deep_copies);
  CHECK(c.allocations <= budget.allocations);
}

// Deep copies are host reads: on a host backend a training step makes none (the loss and the
// gradient norm are read in place), on a GPU it reads the gradient norm, the loss and the
// loss's gradient; inference reads nothing. A layer that reads a value on the host inside the
// step fails here whatever its launches.
constexpr std::int64_t training_host_reads = kernels_run_on_host ? 0 : 3;
// The budgets: 10 % over the largest count measured (2026-11-30, 1 and 2 ranks, Serial and
// OpenMP with 1 and 2 threads: the host backends' thread splits are launches too). Fences:
// Kokkos 3.4 reports none on Serial; Kokkos 4.6's OpenMP fences before each deallocation and
// around zero-filled allocations (on a GPU a cudaFree waits for the device likewise).
#if KOKKOS_VERSION >= 40000
constexpr std::int64_t fences(std::int64_t measured) {
  return measured + measured / 10;
}
#else
constexpr std::int64_t fences(std::int64_t) {
  return 4;
}
#endif
// Main job: training 207-439 launches, 146-323 fences, no deep copies, 89-157 allocations;
// inference 23-99 launches, 39-109 fences, 39-71 allocations. The optimizer's update and
// zero_grad in one kernel each, not one per parameter (2026-12-02): training 152 launches
// on one rank and 320 on two on Serial, 54 fewer (two per parameter) than before. The
// gradient norm in one kernel, not one per parameter (2026-12-02): 125-357 launches, 27 fewer.
// Partial gradient sums in the zeroed gradients (2026-12-04): no add kernel per parameter,
// 97 launches on one rank (Serial), 28 fewer. Upsampling and pooling keep their tables per
// shape (2026-12-05): 89 launches and 61 allocations on one rank (Serial), 8 and 16 fewer;
// all: training 89-321 launches, 112-291 fences, 61-131 allocations; inference 21-97, 35-105,
// 35-67. Slab exchanges lease their send buffers (2026-12-05): training 112-271 fences, 61-111
// allocations; inference 35-95 fences, 35-57 allocations (the launches the same). Activations
// in place in inference (the same day): inference 25-85 fences, 25-47 allocations.
constexpr Budget main_job_training{353, fences(271), training_host_reads, 122};
constexpr Budget main_job_inference{107, fences(85), 0, 52};
// With group norm: training 289-571 launches, 192-409 fences, no deep copies, 91-159
// allocations; inference 53-159, 79-169, 0, 49-81. Before the statistics stayed on the device
// (b19ef63, OpenMP, one rank): 174 deep copies and 1015 fences per training step of the 3-D
// bench U-Net, now none and 168.
// Fused optimizer: 214 and 382 launches on Serial, one and two ranks. Fused gradient norm:
// 177-459 launches (Serial and OpenMP, one and two ranks and threads). Tables kept per shape
// and the normalizations' scratch reused (2026-12-05): training 131-413 launches, 148-367
// fences, 53-123 allocations; inference 51-157, 65-155, 35-67. Slab exchanges' leases (the
// same day): training 148-347 fences, 53-103 allocations; inference 65-145, 35-57.
constexpr Budget group_norm_training{454, fences(347), training_host_reads, 113};
constexpr Budget group_norm_inference{173, fences(145), 0, 62};

}  // namespace

TEST_CASE("the main job's step stays within its launch, fence, copy and allocation budget",
          "[launches]") {
  const StepCounts c = count_step(heat2d_model);
  CHECK(c.training.launches > 50);  // the counter sees the step
  CHECK(c.training.allocations > 10);
  check_within(c.training, main_job_training);
  check_within(c.inference, main_job_inference);
}

TEST_CASE("group normalization reads nothing on the host and allocates once per pass",
          "[launches]") {
  const StepCounts c = count_step(group_norm_model);
  check_within(c.training, group_norm_training);
  check_within(c.inference, group_norm_inference);
}

TEST_CASE("one KernelCounter at a time, and it counts what it sees", "[launches]") {
  KernelCounter counter;
  CHECK_THROWS_WITH(KernelCounter(), Catch::Contains("another KernelCounter is alive"));
  Kokkos::View<double*> v("v", 10);
  Kokkos::parallel_for(
      "count_me", 10, KOKKOS_LAMBDA(const int i) { v(i) = i; });
  auto host = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(host, v);
  const KernelCounts c = counter.counts();
  CHECK(c.launches >= 1);
  CHECK(c.deep_copies >= 1);
  CHECK(c.allocations >= 1);  // v (and its host mirror where the View is on a device)
  counter.reset();
  CHECK(counter.counts().launches == 0);
  CHECK(counter.counts().allocations == 0);
}
