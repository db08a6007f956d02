// The launch budget of a step: Kokkos kernel launches, fences and deep copies of the main
// job's U-Net (examples/02_train_config/heat2d.yaml: 32^2, batch 4) per training step and
// inference, counted by KernelCounter (core/kernel_counter.hpp). On a GPU every launch costs
// microseconds and every fence or device-host copy stalls the stream, so these counts bound a
// small field's step time there; they are the same on every backend of one Kokkos version,
// and a change that adds launches or host syncs to the step fails here, on a CPU.

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

// The budget, per rank, 10 % over the largest count measured (2026-11-27, 1 and 2 ranks):
// training 677-803 launches, 58 deep copies; inference 153-203 launches, no deep copies.
// Fences: Kokkos 3.4 reports none on Serial; Kokkos 4.6 reports its fences around View
// initializations and reductions into host values: 511-661 per training step, 93-167 per
// inference (OpenMP, 2 threads). Those are the stream syncs to remove for a GPU.
constexpr std::int64_t training_launches = 885, training_deep_copies = 64;
constexpr std::int64_t inference_launches = 225, inference_deep_copies = 4;
#if KOKKOS_VERSION >= 40000
constexpr std::int64_t training_fences = 730, inference_fences = 185;
#else
constexpr std::int64_t training_fences = 4, inference_fences = 4;
#endif

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

}  // namespace

TEST_CASE("the main job's step stays within its launch, fence and deep-copy budget",
          "[launches]") {
  const Communicator world;
  const Communicator self(MPI_COMM_SELF);  // one data group
  const Decomposition d = Decomposition::automatic({32, 32}, world.size(), {true, true});
  auto model = models::build_model<float>(YAML::Load(heat2d_model), world, {2, 2, 1, {32, 32}});
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
  step();  // the first step makes the optimizer's state and the plans
  KernelCounts training;
  {
    KernelCounter counter;
    step();
    training = counter.counts();
  }
  model->eval();
  const auto infer = [&] {
    const NoGradGuard no_graph;
    model->forward(Variable<float>::field(input));
  };
  infer();
  KernelCounts inference;
  {
    KernelCounter counter;
    infer();
    inference = counter.counts();
  }
  if (world.rank() == 0)
    std::printf("test_kernel_counts: %d rank(s): training %lld launches, %lld fences, %lld deep "
                "copies; inference %lld, %lld, %lld\n",
                world.size(), (long long)training.launches, (long long)training.fences,
                (long long)training.deep_copies, (long long)inference.launches,
                (long long)inference.fences, (long long)inference.deep_copies);
  CHECK(training.launches > 100);  // the counter sees the step
  CHECK(training.launches <= training_launches);
  CHECK(training.fences <= training_fences);
  CHECK(training.deep_copies <= training_deep_copies);
  CHECK(inference.launches <= inference_launches);
  CHECK(inference.fences <= inference_fences);
  CHECK(inference.deep_copies <= inference_deep_copies);
}

TEST_CASE("one KernelCounter at a time, and it counts what it sees", "[launches]") {
  KernelCounter counter;
  CHECK_THROWS_WITH(KernelCounter(), Catch::Contains("another KernelCounter is alive"));
  Kokkos::View<double*> v("v", 10);
  Kokkos::parallel_for("count_me", 10, KOKKOS_LAMBDA(const int i) { v(i) = i; });
  auto host = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(host, v);
  const KernelCounts c = counter.counts();
  CHECK(c.launches >= 1);
  CHECK(c.deep_copies >= 1);
  counter.reset();
  CHECK(counter.counts().launches == 0);
}
