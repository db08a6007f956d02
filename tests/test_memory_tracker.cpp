// Memory tracker: allocations land in the category of the scope that made them and leave
// when freed, peaks, the report over ranks, nothing recorded (and no Kokkos hook) while off,
// activation peaks per rank falling as 1/P for a sharded U-Net, FNO and ViT, a forward under
// NoGradGuard that keeps no graph, a graph that keeps no value nobody reads, a budget that
// stops every rank together, from the API and from a training run's config.

#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "equivalence.hpp"
#include "shardtensor/comm/memory_budget.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/data/heat_equation.hpp"
#include "shardtensor/io.hpp"
#include "shardtensor/kernels/conv.hpp"
#include "shardtensor/kernels/conv_library.hpp"
#include "shardtensor/kernels/vector_isa.hpp"
#include "shardtensor/models.hpp"
#include "shardtensor/train/run_config.hpp"
#include "shardtensor/train/trainer.hpp"
#include "test_support.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

constexpr std::uint64_t mib = 1024 * 1024;

/// Tracking on from zero for one test case, off again afterwards.
struct Tracking {
  Tracking() {
    disable_memory_tracking();
    enable_memory_tracking();
  }
  ~Tracking() { disable_memory_tracking(); }
};

/// Bytes Kokkos reports for a View of `bytes` bytes: the size asked for (Kokkos 3.4 and 4.x
/// report the logical size; a little slack in case a version rounds it up).
bool reported_as(std::uint64_t reported, std::uint64_t bytes) {
  return reported >= bytes && reported <= bytes + 256;
}

/// A smooth input field of `extents` split over `comm`.
ShardTensor<float> smooth_field(const Communicator& comm, Index channels,
                                const std::vector<Index>& extents) {
  const Decomposition d = Decomposition::automatic(extents, comm.size());
  ShardTensor<float> x(d, comm.rank(), 1, channels);
  test::fill(x, [](Index, Index c, const SpatialIndex&, const SpatialIndex& g) {
    return std::sin(0.3 * double(g[0]) + 0.7 * double(g[1]) + double(c));
  });
  return x;
}

/// Peak activation bytes on this rank for one forward + backward of `model` on a global
/// field of `extents` split over `comm`.
std::uint64_t activation_peak(const Communicator& comm, Module<float>& model, Index channels,
                              const std::vector<Index>& extents) {
  const ShardTensor<float> x = smooth_field(comm, channels, extents);
  const std::uint64_t before = memory_snapshot()[MemoryCategory::activations].current;
  reset_memory_peak();
  {
    MemoryCategoryScope graph(MemoryCategory::activations);
    const auto input = Variable<float>::field(x, true, "x");
    const Variable<float> y = model.forward(input);
    backward(sum(comm, y));
  }
  const MemorySnapshot after = memory_snapshot();
  CHECK(after[MemoryCategory::activations].current == before);  // the graph is gone
  return after[MemoryCategory::activations].peak - before;
}

/// A 2-D U-Net of two levels, 2 -> 2 channels, 8 base channels, max pooling down.
models::UNetOptions two_level_unet() {
  models::UNetOptions o;
  o.dims = 2;
  o.in_channels = 2;
  o.out_channels = 2;
  o.depth = 2;
  o.base_channels = 8;
  o.norm_groups = 2;
  o.down = models::DownMode::maxpool;
  o.seed = 3;
  return o;
}

std::uint64_t max_over(const Communicator& comm, std::uint64_t value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_UINT64_T, MPI_MAX, comm.get());
  return value;
}

}  // namespace

TEST_CASE("allocations land in their scope's category and leave when freed", "[memory]") {
  const Tracking tracking;
  const MemorySnapshot start = memory_snapshot();
  REQUIRE(start.enabled);
  CHECK(current_memory_category() == MemoryCategory::other);
  for (int c = 0; c < memory_category_count; ++c) {
    const auto category = MemoryCategory(c);
    const std::uint64_t bytes = 8000 * std::uint64_t(c + 1);
    {
      MemoryCategoryScope scope(category);
      CHECK(current_memory_category() == category);
      Kokkos::View<double*> view("known_size", bytes / sizeof(double));
      const MemorySnapshot during = memory_snapshot();
      INFO("category " << to_string(category));
      CHECK(reported_as(during[category].current - start[category].current, bytes));
      CHECK(reported_as(during.total.current - start.total.current, bytes));
      for (int other = 0; other < memory_category_count; ++other)
        if (other != c) CHECK(during.categories[other].current == start.categories[other].current);
    }
    const MemorySnapshot after = memory_snapshot();
    CHECK(after[category].current == start[category].current);
    CHECK(after.total.current == start.total.current);
  }
  CHECK(current_memory_category() == MemoryCategory::other);

  {  // scopes nest; the category is fixed at allocation, whoever frees the View
    Kokkos::View<float*> kept;
    {
      MemoryCategoryScope outer(MemoryCategory::workspaces);
      {
        MemoryCategoryScope inner(MemoryCategory::comm_buffers);
        kept = Kokkos::View<float*>("inner", 1000);
      }
      CHECK(current_memory_category() == MemoryCategory::workspaces);
    }
    CHECK(reported_as(memory_snapshot()[MemoryCategory::comm_buffers].current, 4000));
    MemoryCategoryScope elsewhere(MemoryCategory::parameters);
    kept = Kokkos::View<float*>();
    CHECK(memory_snapshot()[MemoryCategory::comm_buffers].current == 0);
    CHECK(memory_snapshot()[MemoryCategory::parameters].current == 0);
  }

  {  // unmanaged Views allocate nothing; allocations from before tracking are not counted
    std::vector<float> storage(1000);
    Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> wrapped(storage.data(), 1000);
    CHECK(memory_snapshot().total.current == start.total.current);
  }
}

TEST_CASE("parameters, their gradients and optimizer state are counted as such", "[memory]") {
  const Tracking tracking;
  const Communicator self(MPI_COMM_SELF);
  ConvOptions o;
  o.in_channels = 3;
  o.out_channels = 5;
  o.kernel = {3, 3};
  Conv<float> conv(self, o, "conv");
  const std::uint64_t values = (5 * 3 * 9 + 5) * sizeof(float);  // weight and bias
  CHECK(reported_as(memory_snapshot()[MemoryCategory::parameters].current, values));
  auto optimizer = make_optimizer<float>(OptimizerOptions{}, conv.named_parameters());  // adam
  const MemorySnapshot s = memory_snapshot();
  CHECK(reported_as(s[MemoryCategory::parameters].current, 2 * values));       // + gradients
  CHECK(reported_as(s[MemoryCategory::optimizer_state].current, 2 * values));  // exp_avg, _sq
  CHECK(s[MemoryCategory::activations].current == 0);
}

TEST_CASE("peaks follow the highest total and restart at reset_memory_peak", "[memory]") {
  const Tracking tracking;
  const std::uint64_t base = memory_snapshot().total.current;
  reset_memory_peak();
  {
    MemoryCategoryScope scope(MemoryCategory::activations);
    Kokkos::View<char*> a("a", 3000);
    { Kokkos::View<char*> b("b", 5000); }
    Kokkos::View<char*> c("c", 1000);
    const MemorySnapshot s = memory_snapshot();
    CHECK(reported_as(s.total.current - base, 4000));
    CHECK(reported_as(s.total.peak - base, 8000));
    CHECK(reported_as(s[MemoryCategory::activations].peak, 8000));
    reset_memory_peak();
    CHECK(memory_snapshot().total.peak == s.total.current);
    CHECK(memory_snapshot()[MemoryCategory::activations].peak ==
          s[MemoryCategory::activations].current);
  }
  const MemorySnapshot end = memory_snapshot();
  CHECK(end.total.current == base);
  CHECK(reported_as(end[MemoryCategory::activations].peak, 4000));
  CHECK(end.allocations >= 3);
  CHECK_THAT(end.describe(), Contains("activations"));
  CHECK_THAT(end.describe(), Contains("optimizer_state"));
  CHECK_THAT(end.describe(), Contains("total"));
}

TEST_CASE("the disabled tracker records nothing and leaves Kokkos without hooks", "[memory]") {
  disable_memory_tracking();
  CHECK_FALSE(memory_tracking_enabled());
  CHECK_FALSE(Kokkos::Tools::profileLibraryLoaded());  // no tool: allocations take no detour
  {
    MemoryCategoryScope scope(MemoryCategory::activations);
    Kokkos::View<double*> view("unseen", 100000);
  }
  const MemorySnapshot s = memory_snapshot();
  CHECK_FALSE(s.enabled);
  CHECK(s.total.current == 0);
  CHECK(s.total.peak == 0);
  CHECK(s.allocations == 0);
  CHECK(memory_budget() == 0);
  check_memory_budget();  // no budget: nothing to check
  CHECK_THAT(s.describe(), Contains("tracking is off"));

  enable_memory_tracking();
  CHECK(Kokkos::Tools::profileLibraryLoaded());
  disable_memory_tracking();
  CHECK_FALSE(Kokkos::Tools::profileLibraryLoaded());
}

TEST_CASE("memory_report gives the maximum over the ranks", "[memory]") {
  const Tracking tracking;
  const Communicator world;
  {
    MemoryCategoryScope scope(MemoryCategory::comm_buffers);
    Kokkos::View<char*> mine("rank_sized", (world.rank() + 1) * mib);
    const MemorySnapshot report = memory_report(world);
    CHECK(report.enabled);
    CHECK(report.ranks == world.size());
    CHECK(reported_as(report[MemoryCategory::comm_buffers].current, world.size() * mib));
    CHECK(reported_as(report[MemoryCategory::comm_buffers].peak, world.size() * mib));
    if (world.size() > 1) CHECK_THAT(report.describe(), Contains("max over"));
  }
  CHECK(memory_report(world)[MemoryCategory::comm_buffers].current == 0);
}

/// The activation peak of the model `make(comm)` builds, on one rank and sharded over all.
template <class Make>
void check_activations_fall_as_one_over_p(const Make& make, Index channels) {
  const Communicator world, self(MPI_COMM_SELF);
  const std::vector<Index> extents{128, 128};
  const std::uint64_t one_rank = activation_peak(self, *make(self), channels, extents);
  const std::uint64_t sharded =
      max_over(world, activation_peak(world, *make(world), channels, extents));
  const int p = world.size();
  INFO("activation peak: 1 rank " << to_mib(one_rank) << " MiB, " << p << " ranks "
                                  << to_mib(sharded) << " MiB per rank");
  CHECK(one_rank > 4 * mib);  // the measurement means something
  // Halo-padded copies grow a shard by a few percent; small replicated tensors are constant.
  CHECK(double(sharded) <= double(one_rank) / p * 1.3 + 256.0 * 1024);
  if (p > 1) CHECK(double(sharded) >= double(one_rank) / p * 0.9);
}

TEST_CASE("a U-Net's activation peak per rank falls as 1/P", "[memory][unet]") {
  const Tracking tracking;
  const models::UNetOptions o = two_level_unet();
  check_activations_fall_as_one_over_p(
      [&](const Communicator& c) { return std::make_shared<models::UNet<float>>(c, o); }, 2);
}

TEST_CASE("a convolution split along x alone makes no padded copy of its input",
          "[memory][conv][slabs]") {
  // Where the vector kernels run, the convolution reads its input and the neighbours' x-planes
  // (SlabExchange, charged to comm buffers): its forward allocates only its output. Without
  // them (SHARDTENSOR_SIMD=off, double) it makes the halo-padded copy, at least the input.
  const Tracking tracking;
  const Communicator world;
  const std::vector<Index> extents{8 * world.size(), 12, 20};
  for (const PaddingMode mode : {PaddingMode::zeros, PaddingMode::periodic}) {
    const Decomposition split(extents, {world.size(), 1, 1},
                              std::vector<bool>(3, mode == PaddingMode::periodic));
    ConvOptions o;
    o.in_channels = o.out_channels = 8;
    o.kernel = {3, 3, 3};
    o.padding = {1, 1, 1};
    o.padding_mode = mode;
    Conv<float> conv(world, o, "conv");
    const ShardTensor<float> x = test::random_shard<float>(split, world.rank(), 1, 8, 3);
    const std::uint64_t field = x.view().span() * sizeof(float);
    const std::uint64_t before = memory_snapshot()[MemoryCategory::activations].current;
    reset_memory_peak();
    {
      const MemoryCategoryScope graph(MemoryCategory::activations);
      const NoGradGuard no_graph;
      const Variable<float> y = conv.forward(Variable<float>::field(x, false, "x"));
    }
    const std::uint64_t peak = memory_snapshot()[MemoryCategory::activations].peak - before;
    INFO(to_string(mode) << " padding, " << split.describe() << ": forward's peak " << peak
                         << " bytes, a field " << field);
    if (kernels::conv_vector_kernels_available<float>() && world.size() > 1)
      CHECK(peak <= field + 1024);  // the output only
    else if (world.size() > 1)
      CHECK(peak >= 2 * field);  // the output and the padded copy
  }
}

TEST_CASE("a convolution holding its input's only reference writes the input gradient over it",
          "[memory][conv]") {
  // conv(gelu(x)): GELU's backward reads x, not its output h, so in the conv's backward the
  // closure holds h's only reference and h is dead once the weight gradient has read it: the
  // input gradient takes its buffer. Where a caller still holds h, a new buffer: one field
  // more at the peak, and the same gradients bit for bit.
  const Tracking tracking;
  const Communicator world;
  const Decomposition d = Decomposition::automatic({24, 16, 12}, world.size());
  ConvOptions o;
  o.in_channels = o.out_channels = 4;
  o.kernel = {3, 3, 3};
  o.padding = {1, 1, 1};
  const ShardTensor<float> x = test::random_shard<float>(d, world.rank(), 1, 4, 7);
  const std::uint64_t field = x.view().span() * sizeof(float);
  const auto run = [&](bool hold) {
    Conv<float> conv(world, o, "conv");
    const auto input = Variable<float>::field(x, true, "x");
    const std::uint64_t before = memory_snapshot()[MemoryCategory::activations].current;
    reset_memory_peak();
    {
      const MemoryCategoryScope graph(MemoryCategory::activations);
      Variable<float> h = activate(input, Activation::gelu);
      const Variable<float> held = hold ? h : Variable<float>();
      const Variable<float> y = conv.forward(h);
      h = Variable<float>();
      backward(sum(world, y));
    }
    const std::uint64_t peak = memory_snapshot()[MemoryCategory::activations].peak - before;
    return std::make_pair(peak, test::host_values(input.grad().view()));
  };
  const auto [reused, reused_grad] = run(false);
  const auto [held, held_grad] = run(true);
  INFO("activation peak per rank " << reused << " bytes with h let go, " << held
                                   << " with h held; a field " << field);
  CHECK(reused_grad == held_grad);
  // Where the conv reads its input in place: the vector kernels, on one rank or split along x
  // (elsewhere it reads a halo-padded copy, whose buffer takes the gradient either way).
  const bool in_place = kernels::conv_vector_kernels_available<float>() &&
                        !kernels::conv_library_available() && d.process_grid(1) == 1 &&
                        d.process_grid(2) == 1;
  if (in_place) CHECK(reused + field <= held + 1024);
}

TEST_CASE("a redistribute handed its source lets it go once packed", "[memory][redistribute]") {
  // The source goes once packed and the send buffer once sent: at most one field-sized array
  // beside the caller's at a time, where a source the caller keeps costs two (the buffers,
  // then the receive buffer and the result). The same values either way.
  const Tracking tracking;
  const Communicator world;
  const Decomposition from = Decomposition::automatic({24, 16, 12}, world.size());
  const Decomposition to = test::x_splits_moved(from);
  const auto run = [&](bool hand_over) {
    ShardTensor<float> x = test::random_shard<float>(from, world.rank(), 2, 3, 5);
    const std::uint64_t source = x.view().span() * sizeof(float);
    const std::uint64_t before = memory_snapshot().total.current;
    reset_memory_peak();
    const ShardTensor<float> y =
        hand_over ? redistribute(world, std::exchange(x, {}), to) : redistribute(world, x, to);
    const std::uint64_t peak = memory_snapshot().total.peak - before;
    const std::uint64_t result = y.view().span() * sizeof(float);
    return std::make_tuple(peak, source, result, test::host_values(y.view()));
  };
  const auto [handed_peak, source, result, handed_values] = run(true);
  const auto [kept_peak, kept_source, kept_result, kept_values] = run(false);
  INFO("peak beyond the source " << handed_peak << " bytes handed over, " << kept_peak
                                 << " kept; source " << source << ", result " << result);
  CHECK(handed_values == kept_values);
  // Packed: the send buffer (the source's size); sent: the receive buffer, then the result
  // (the result's size each), the source gone.
  CHECK(handed_peak <= std::max(source, 2 * result - std::min(result, source)) + 1024);
  CHECK(kept_peak >= source + result);
}

TEST_CASE("recomputed U-Net blocks keep less: the activation peak of a step falls",
          "[memory][unet][recompute]") {
  // A 3-D U-Net of two levels on 32^3 cells, sharded over the ranks. With recomputation each
  // block keeps only its input, which goes once the block's first conv has rebuilt its padded
  // copy in backward. The normalizations carry their activation (fuse_activation), so even
  // without recomputation no normalized field is kept; a recomputed block's last normalization
  // does not make its output again (forward_graph_only), and a normalization's input gradient
  // takes its output gradient's buffer. Level 0's up block is two units
  // (UNet::up_in_two_units): the first, from the skip and the coarser level's output, makes the
  // upsampling and the concatenation again, so no unit keeps the concatenation (twice the
  // skip) and none holds it beside the skip and the upsampled field. A convolution that holds
  // its input's only reference writes the input gradient over it, with and without
  // recomputation (13.25 -> 12.25 MiB without on one rank). On one rank 5.86 MiB with
  // (0.48; 0.49 before, of 13.25); split along x only, the convolutions read their input and
  // their neighbours' planes without a padded copy (SlabExchange): 0.50 at 2 ranks. Where the
  // split points are not multiples of 2^depth (3 ranks: 0, 11, 22, 32) the first unit's
  // concatenation redistributes the upsampled field into its channels: 0.53 (at 64^3 0.50; at
  // 32^3 the transposed conv's taps-chunk floor is a tenth of the peak). Split along more
  // axes (4 and 8 ranks) a conv copies its input into a halo-padded buffer; the first unit's
  // concatenation carries its conv's ghost cells instead, which the conv fills in place
  // (Conv::padded_input_ghosts): 0.53 and 0.52 (0.63 with the copy beside it). So do the
  // normalizations' outputs that feed a conv (set_output_ghosts), the first unit's output
  // included: 0.56 and 0.55 here, where a shard's ghost cells are a third of its cells and
  // that output's ghosted gradient sits under the first unit's backward; at 64^3 the second
  // unit's padded copy they save weighs more (bench_scaling at four ranks: 16.5 -> 15.3 MiB).
  // The coarser levels' up blocks are one unit each with their upsampling and concatenation,
  // from the skip and the coarser output (UNet::up_as_one_unit): the concatenation (twice the
  // skip) no longer sits under level 0's backward. Then (2026-12-04): 0.43 on one and two
  // ranks, 0.51 on three, 0.49 on four and eight (before: 0.45, 0.45, 0.53, 0.51, 0.51). A
  // conv that pads its input in place with a graph keeps that buffer to its backward, no
  // shell beside it (its ghost cells are its alone): 0.47 and 0.46 on four and eight. A
  // recomputed unit keeps its output gradient without the ghost cells of the conv buffer it
  // was (recompute's backward, without_ghosts): 0.44 on four and eight (2026-12-05).
  // Where a library (cuDNN) runs the convolutions, every conv reads a halo-padded buffer:

  // 0.67 on one rank (an H200, before the two units and the ghost cells above).
  // bench_scaling's 64^3 U-Net: 102.2 -> 48.0 MiB on one rank (all categories), 53.8 -> 25.8 MiB
  // per rank on 2, 38.4 -> 18.9 on 3, 28.8 -> 15.3 on 4 (2x2), 16.1 -> 9.3 on 8.
  const Tracking tracking;
  const Communicator world;
  models::UNetOptions o = two_level_unet();
  o.dims = 3;
  const std::vector<Index> extents{32, 32, 32};
  models::UNet<float> plain(world, o);
  o.recompute = true;
  models::UNet<float> recomputed(world, o);
  const std::uint64_t without = max_over(world, activation_peak(world, plain, 2, extents));
  const std::uint64_t with = max_over(world, activation_peak(world, recomputed, 2, extents));
  INFO("activation peak per rank: " << to_mib(without) << " MiB without, " << to_mib(with)
                                    << " MiB with recomputation");
  const Decomposition split = Decomposition::automatic(extents, world.size());
  const bool slabs = split.process_grid(1) == 1 && split.process_grid(2) == 1;
  bool aligned = true;  // every split point a multiple of 2^depth: no redistribution
  for (const Index point : split.split_points(0)) aligned = aligned && point % 4 == 0;
  INFO("decomposition " << split.describe());
  // Since the transposed convolution's taps chunk lies in the shared conv scratch (a
  // workspace), three ranks give 0.44 too (2026-12-05).
  const bool padded_copies = kernels::conv_library_available();
  CHECK(double(with) <= (padded_copies ? 0.70 : slabs && aligned ? 0.44 : 0.45) * double(without));
  // In bf16 it keeps no more where the bf16 convolutions read their input in place (the vector
  // kernels, which round as they copy; one rank, x splits; the transposed convs' GEMMs round
  // as they read, since 2026-12-05: before, their rounded input copy sat at the three-rank
  // peak, 98 KiB above float's): a recomputed unit's run inside
  // backward packs none of its fields into 16 bits beside the float ones, since its backward
  // comes next (bench_scaling: 57.5 -> 54.5 MiB, stop 50). With the portable kernels every bf16
  // conv makes a float halo-padded copy (7.9 against 5.9 MiB on one rank; the vector paths
  // without bf16 dot products did until stop 64).
  models::UNet<float> recomputed_bf16(world, o);
  recomputed_bf16.compute_in_bf16(true);
  const std::uint64_t bf16 = max_over(world, activation_peak(world, recomputed_bf16, 2, extents));
  INFO(to_mib(bf16) << " MiB with recomputation in bf16");
  // (Beside a float peak whose fields are all the same in bf16, the layers' bf16 weight
  // copies: 1.5 KiB at one rank and 18 KiB at two since the upsampling writes into the
  // concatenation, stop 60.)
  if (slabs && kernels::vector_kernels_on()) CHECK(bf16 <= with + 64 * 1024);
}

TEST_CASE("a bf16 U-Net keeps its saved activations in 16 bits: the peak falls",
          "[memory][unet][bf16]") {
  // Convolutions keep their rounded input packed, normalizations their input (a bf16 conv's
  // output) packed; the activations' inputs stay float, as in PyTorch's autocast.
  // 13.2 -> 10.4 MiB per rank on one rank; at 8 ranks (16^3 cells each) the ghosts, shells
  // and padded copies, which stay float, weigh more: 1.84 -> 1.80 MiB. bench_scaling's 64^3
  // U-Net: 108.0 -> 85.4 MiB, and 69.0 MiB with recomputation (stop 47, bf16 dot products).
  // With the portable kernels (SHARDTENSOR_SIMD=off) every bf16 conv reads a float halo-padded
  // copy, while a float conv reads its input in place and writes the input gradient over it:
  // 12.25 -> 10.45 MiB on one rank (0.85), 6.13 -> 5.64 on two (0.92), 1.77 -> 1.81 at 8 ranks
  // (stop 55, on AVX2, whose float tiles read such copies until stop 64).
  const Tracking tracking;
  const Communicator world;
  models::UNetOptions o = two_level_unet();
  o.dims = 3;
  const std::vector<Index> extents{32, 32, 32};
  models::UNet<float> full(world, o);
  models::UNet<float> low(world, o);
  low.compute_in_bf16(true);
  const std::uint64_t float_peak = max_over(world, activation_peak(world, full, 2, extents));
  const std::uint64_t bf16_peak = max_over(world, activation_peak(world, low, 2, extents));
  INFO("activation peak per rank: " << to_mib(float_peak) << " MiB float, " << to_mib(bf16_peak)
                                    << " MiB bf16");
  const bool in_place = kernels::vector_kernels_on();  // bf16 convs read their input itself
  CHECK(double(bf16_peak) <=
        (in_place ? (world.size() <= 2 ? 0.85 : 0.99) : (world.size() <= 2 ? 0.94 : 1.04)) *
            double(float_peak));
}

TEST_CASE("a forward under NoGradGuard frees each activation once it is read",
          "[memory][unet][no_grad]") {
  const Tracking tracking;
  const Communicator world;
  models::UNet<float> model(world, two_level_unet());  // max pooling: argmax only for backward
  model.eval();
  const ShardTensor<float> x = smooth_field(world, 2, {128, 128});
  // The peak of one forward whose output is kept, with the graph recorded or not.
  const auto forward_peak = [&](bool record) {
    const std::uint64_t before = memory_snapshot()[MemoryCategory::activations].current;
    reset_memory_peak();
    {
      MemoryCategoryScope graph(MemoryCategory::activations);
      std::optional<NoGradGuard> no_grad;
      if (!record) no_grad.emplace();
      const Variable<float> y = model.forward(Variable<float>::field(x, true, "x"));
    }
    const MemorySnapshot after = memory_snapshot();
    CHECK(after[MemoryCategory::activations].current == before);
    return max_over(world, after[MemoryCategory::activations].peak - before);
  };
  const std::uint64_t recorded = forward_peak(true), inference = forward_peak(false);
  INFO("forward peak per rank: graph recorded " << to_mib(recorded) << " MiB, under NoGradGuard "
                                                << to_mib(inference) << " MiB");
  CHECK(recorded > 2 * mib / std::uint64_t(world.size()));  // the measurement means something
  // Without the graph only the skip connections and the layer at work are alive.
  CHECK(double(inference) < 0.5 * double(recorded));
}

TEST_CASE("the graph keeps a value only while a Variable or a backward closure needs it",
          "[memory][autograd]") {
  const Tracking tracking;
  const Communicator world;
  const ShardTensor<float> field = smooth_field(world, 4, {64, 48});
  const std::uint64_t bytes = field.view().span() * sizeof(float);
  const auto held = [] { return memory_snapshot()[MemoryCategory::activations].current; };
  MemoryCategoryScope graph(MemoryCategory::activations);
  // d(sum(gelu(x) + relu(x)))/dx, with the two activations' Variables dropped after the sum
  // or held to the end: the same gradient, bit for bit.
  const auto gradient = [&](bool hold) {
    const auto x = Variable<float>::field(field, true, "x");
    const std::uint64_t start = held();
    Variable<float> y, a, b;
    {
      const Variable<float> gelu = activate(x, Activation::gelu);  // backward reads x, not gelu
      const Variable<float> relu = activate(x, Activation::relu);
      y = add(gelu, relu);  // reads neither value in backward
      CHECK(held() - start == 3 * bytes);
      if (hold) a = gelu, b = relu;
    }
    // Dropped, their nodes stay in the graph for the gradient only, without their values.
    CHECK(held() - start == (hold ? 3 : 1) * bytes);
    backward(sum(world, y));
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.grad().view());
  };
  const auto dropped = gradient(false), kept = gradient(true);
  REQUIRE(dropped.span() == kept.span());
  Index differ = 0;
  for (std::size_t i = 0; i < kept.span(); ++i) differ += dropped.data()[i] != kept.data()[i];
  CHECK(differ == 0);
}

TEST_CASE("an FNO's activation peak per rank falls as 1/P", "[memory][fno]") {
  const Tracking tracking;
  models::FNOOptions o;
  o.in_channels = 2;
  o.width = 16;
  o.modes = {8};
  o.layers = 2;
  o.projection_channels = 32;
  check_activations_fall_as_one_over_p(
      [&](const Communicator& c) { return std::make_shared<models::FNO<float>>(c, o); }, 2);
}

TEST_CASE("a ViT's activation peak per rank falls as 1/P", "[memory][vit]") {
  const Tracking tracking;
  for (AttentionKind attention : {AttentionKind::global, AttentionKind::neighborhood}) {
    models::ViTOptions o;
    o.in_channels = 2;
    o.patch = {2};
    o.embed_dim = 16;
    o.depth = 2;
    o.heads = 2;
    o.attention = attention;
    o.window = {5};
    o.input_skip = true;
    INFO((attention == AttentionKind::global ? "global" : "neighborhood") << " attention");
    check_activations_fall_as_one_over_p(
        [&](const Communicator& c) { return std::make_shared<models::ViT<float>>(c, o); }, 2);
  }
}

TEST_CASE("a memory budget exceeded on one rank stops every rank together", "[memory][budget]") {
  const Tracking tracking;
  const Communicator world;
  const std::uint64_t budget = max_over(world, memory_snapshot().total.current) + 4 * mib;
  set_memory_budget(budget);
  CHECK(memory_budget() == budget);
  check_memory_budget(world);  // nothing over yet
  const int culprit = world.size() - 1;
  if (world.rank() == culprit) {
    MemoryCategoryScope scope(MemoryCategory::workspaces);
    Kokkos::View<char*> big("too_big", 8 * mib);  // freed again before the check
  }
  const std::string message = test::error_message_of([&] { check_memory_budget(world); });
  CHECK(test::ranks_with_error(message) == world.size());
  CHECK_THAT(message, Contains("check_memory_budget: memory budget of "));
  CHECK_THAT(message, Contains(" MiB per rank exceeded: "));
  CHECK_THAT(message, Contains("on rank " + std::to_string(culprit)));
  CHECK_THAT(message, Contains("category workspaces"));
  CHECK_THAT(message, Contains("allocation 'too_big'"));
  // Reported once: the next check passes.
  CHECK(test::ranks_with_error(test::error_message_of([&] { check_memory_budget(world); })) == 0);

  // The local check throws only where the budget was exceeded.
  if (world.rank() == culprit) {
    MemoryCategoryScope scope(MemoryCategory::optimizer_state);
    Kokkos::View<char*> big("local_too_big", 8 * mib);
  }
  const std::string local = test::error_message_of([] { check_memory_budget(); });
  CHECK(local.empty() == (world.rank() != culprit));
  if (world.rank() == culprit) CHECK_THAT(local, Contains("category optimizer_state"));

  // A budget below what is allocated already is exceeded at once.
  {
    MemoryCategoryScope scope(MemoryCategory::parameters);
    Kokkos::View<char*> held("held", 2 * mib);
    set_memory_budget(mib);
    CHECK_THAT(test::error_message_of([&] { check_memory_budget(world); }),
               Contains("memory budget of 1.0 MiB per rank exceeded"));
  }
  set_memory_budget(0);
  CHECK(memory_tracking_enabled());
}

TEST_CASE("memory.budget_mib: config errors, and a training run that exceeds it",
          "[memory][train]") {
  const std::string base = "data: {path: a.h5}\nmodel: {type: unet}\n";
  CHECK(RunConfig::parse(base).memory.budget_mib == 0);
  CHECK(RunConfig::parse(base + "memory: {budget_mib: 512.5}\n").memory.budget_mib == 512.5);
  CHECK_THAT(test::error_message_of(
                 [&] { RunConfig::parse(base + "memory:\n  budget_mib: -1\n", "run.yaml"); }),
             Contains("memory.budget_mib (line 4): must be a number of MiB >= 0"));
  CHECK_THAT(
      test::error_message_of([&] { RunConfig::parse(base + "memory: {budget_mib: lots}\n"); }),
      Contains("memory.budget_mib"));
  CHECK_THAT(test::error_message_of([&] { RunConfig::parse(base + "memory: {budget: 5}\n"); }),
             Contains("memory (line 3): unknown key 'budget'; accepted keys: budget_mib, "
                      "library_workspace_share"));
  CHECK(RunConfig::parse(base).memory.library_workspace_share == 0.25);
  CHECK(RunConfig::parse(base + "memory: {library_workspace_share: 0.5}\n")
            .memory.library_workspace_share == 0.5);
  CHECK_THAT(test::error_message_of(
                 [&] { RunConfig::parse(base + "memory: {library_workspace_share: 1.5}\n"); }),
             Contains("memory.library_workspace_share (line 3): must be a share of free memory "
                      "from 0 to 1, got 1.5"));

  disable_memory_tracking();
  const Communicator world;
  const test::TempDir temporary(world);
  const std::string data = temporary.path("heat.h5");
  HeatOptions heat;
  heat.dims = 2;
  heat.size = 16;
  heat.samples = 4;
  heat.steps = 5;
  generate_heat_dataset(world, heat, data);
  const auto config = [&](const std::string& name, const std::string& memory) {
    std::ostringstream c;
    c << "run_dir: " << temporary.path(name) << "\n"
      << "data: {path: " << data << ", validation_samples: 1, prefetch: false}\n"
      << "model: {type: unet, depth: 1, base_channels: 4, norm_groups: 2, seed: 7}\n"
      << "training: {epochs: 1}\n"
      << memory;
    return RunConfig::parse(c.str());
  };
  TrainOptions quiet;
  quiet.progress = false;

  // Tracking on (as the CLI does): the result reports categories, max over the ranks. The
  // process's convolution scratch is freed first, so that this run allocates it tracked.
  kernels::release_conv_scratch();
  enable_memory_tracking();
  const TrainResult tracked = train(world, config("tracked", ""), quiet);
  const MemorySnapshot& m = tracked.memory;
  CHECK(m.enabled);
  CHECK(m.ranks == world.size());
  CHECK(m[MemoryCategory::parameters].current > 0);
  CHECK(m[MemoryCategory::optimizer_state].current > 0);
  CHECK(m[MemoryCategory::activations].peak > 0);
  CHECK(m[MemoryCategory::activations].current == 0);  // the graph is freed after each step
  CHECK(m[MemoryCategory::workspaces].current > 0);
  CHECK(m.total.peak >= m[MemoryCategory::activations].peak);
  disable_memory_tracking();

  // A budget below the parameters with gradients and adam state (1112 x 4 bytes x 4): refused
  // while the model is built, before its parameters are allocated.
  const std::string refused = test::error_message_of(
      [&] { train(world, config("tiny", "memory: {budget_mib: 0.01}\n"), quiet); });
  CHECK(test::ranks_with_error(refused) == world.size());
  CHECK_THAT(refused, Contains("the parameters need at least 0.02 MiB per rank") &&
                          Contains("more than memory.budget_mib (0.01 MiB)"));
  CHECK(memory_budget() == 0);

  // Room for the model, not for a training step: every rank stops with the same message; the
  // budget ends with the run and tracking goes back off.
  const std::string message = test::error_message_of(
      [&] { train(world, config("tight", "memory: {budget_mib: 0.03}\n"), quiet); });
  CHECK(test::ranks_with_error(message) == world.size());
  CHECK_THAT(message, Contains("memory budget of 0.03 MiB per rank exceeded"));
  CHECK(memory_budget() == 0);
  CHECK_FALSE(memory_tracking_enabled());

  // A generous budget passes.
  const TrainResult fine = train(world, config("fine", "memory: {budget_mib: 4096}\n"), quiet);
  CHECK(fine.steps == 3);
  CHECK_FALSE(memory_tracking_enabled());

  // Inference holds to the budget too, and reports its memory when tracking is on.
  InferOptions infer_options;
  infer_options.checkpoint = fine.checkpoint;
  infer_options.input_path = data;
  infer_options.output_path = temporary.path("prediction.h5");
  infer_options.progress = false;
  const std::string infer_message = test::error_message_of(
      [&] { infer(world, config("fine", "memory: {budget_mib: 0.01}\n"), infer_options); });
  CHECK(test::ranks_with_error(infer_message) == world.size());
  CHECK_THAT(infer_message, Contains("memory budget of 0.01 MiB per rank exceeded"));
  CHECK(memory_budget() == 0);
  enable_memory_tracking();
  const InferResult inferred = infer(world, config("fine", ""), infer_options);
  CHECK(inferred.samples == 4);
  CHECK(inferred.memory.enabled);
  CHECK(inferred.memory[MemoryCategory::activations].peak > 0);
  CHECK(inferred.memory[MemoryCategory::parameters].current > 0);
  disable_memory_tracking();
}
