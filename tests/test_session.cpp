// The embedding API: a solver's patches become a process grid (in any rank order) or are
// rejected on every rank; a Session on the solver's own arrays (C or Fortran order, ghost
// cells, float or double) computes what one rank computes on the whole field, trains
// online like one rank does, and writes checkpoints that load on another rank count.

#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

#include "shardtensor/embed.hpp"
#include "test_support.hpp"

using namespace shardtensor;

namespace {

/// Whether the model's kernels read host memory (not on a GPU): only then can the Session
/// read the solver's arrays in place.
constexpr bool model_reads_host_memory = host_reads_default_memory;

const std::vector<Index> global_extent{10, 12, 6};

/// The patch of solver rank `rank` when the solver numbers its ranks backwards over a
/// balanced process grid (so the grid order is not the rank order).
SolverPatch reversed_patch(int rank, int nranks) {
  std::vector<int> dims(3, 0);
  MPI_Dims_create(nranks, 3, dims.data());
  const Decomposition d(global_extent, dims);
  const Box box = d.box(nranks - 1 - rank);
  SolverPatch p;
  p.global_extent = global_extent;
  for (int a = 0; a < 3; ++a) {
    p.offset.push_back(box.lower[a]);
    p.extent.push_back(box.extent[a]);
  }
  return p;
}

SolverPatch whole_field() {
  return SolverPatch{global_extent, {0, 0, 0}, global_extent, {}};
}

/// This rank's ghost widths for `layout`, worked out here on their own (not by the library):
/// explicit per-side widths as given, else ghost_width facing a patch (periodic axes always
/// do) and boundary_ghost_width at the field's edge.
void expected_widths(const SolverPatch& p, const SolverArrays& l, Index lower[3], Index upper[3]) {
  for (int a = 0; a < 3; ++a) {
    if (!l.ghost_lower.empty()) {
      lower[a] = l.ghost_lower[a], upper[a] = l.ghost_upper[a];
      continue;
    }
    const bool periodic = !p.periodic.empty() && p.periodic[a];
    const Index edge = std::max<Index>(l.boundary_ghost_width, 0);
    lower[a] = periodic || p.offset[a] > 0 ? l.ghost_width : edge;
    upper[a] = periodic || p.offset[a] + p.extent[a] < p.global_extent[a] ? l.ghost_width : edge;
  }
}

/// A solver's arrays: with one component per cell, one array per channel, one after another
/// in one allocation; with `components` > 1, one array whose cells hold that many values
/// (channel c is component c). Each array is the patch plus its ghost cells, C or Fortran
/// order. Owned cells hold a function of (seed, channel, global cell); everything else
/// holds `fill`.
template <class S>
struct SolverField {
  SolverPatch patch;
  SolverArrays layout;
  Index nchannels = 1, lower[3], upper[3], allocated[3];
  std::size_t size = 1;  // values per array
  std::vector<S> storage;

  SolverField(const SolverPatch& p, const SolverArrays& l, Index channels, double fill)
      : patch(p), layout(l), nchannels(channels) {
    expected_widths(p, l, lower, upper);
    for (int a = 0; a < 3; ++a) size *= (allocated[a] = p.extent[a] + lower[a] + upper[a]);
    size *= l.components;
    storage.assign((l.components > 1 ? 1 : nchannels) * size, S(fill));
  }
  /// Index of owned cell `local` (0-based, without ghosts) of channel c in `storage`.
  std::size_t index(Index i, Index j, Index k, Index c = 0) const {
    const Index x = i + lower[0], y = j + lower[1], z = k + lower[2];
    const Index cell = layout.order == ArrayOrder::c ? (x * allocated[1] + y) * allocated[2] + z
                                                     : (z * allocated[1] + y) * allocated[0] + x;
    return std::size_t(offset(c) + cell * layout.components);
  }
  Index offset(Index c) const { return layout.components > 1 ? c : c * Index(size); }
  template <class F>
  void for_owned(F f) {
    for (Index i = 0; i < patch.extent[0]; ++i)
      for (Index j = 0; j < patch.extent[1]; ++j)
        for (Index k = 0; k < patch.extent[2]; ++k)
          f(i, j, k, patch.offset[0] + i, patch.offset[1] + j, patch.offset[2] + k);
  }
  void randomize(std::uint64_t seed) {
    for (Index c = 0; c < nchannels; ++c)
      for_owned([&](Index i, Index j, Index k, Index x, Index y, Index z) {
        const auto linear = std::uint64_t(((x * global_extent[1] + y) * global_extent[2]) + z);
        storage[index(i, j, k, c)] = S(2.0 * hashed_uniform(seed + 17 * c, linear) + 0.5 * c);
      });
  }
  std::vector<const S*> in() const {
    std::vector<const S*> out;
    for (Index c = 0; c < nchannels; ++c) out.push_back(storage.data() + offset(c));
    return out;
  }
  std::vector<S*> out() {
    std::vector<S*> result;
    for (Index c = 0; c < nchannels; ++c) result.push_back(storage.data() + offset(c));
    return result;
  }
  /// Value at a global cell, read from a whole-field C-order array without ghosts.
  static double at(const std::vector<S>& whole, Index x, Index y, Index z) {
    return double(whole[std::size_t((x * global_extent[1] + y) * global_extent[2] + z)]);
  }
};

std::string model_config(const std::string& precision, bool normalize) {
  std::ostringstream c;
  c << "model: {type: unet, depth: 1, base_channels: 4, norm: group, norm_groups: 2,"
    << " activation: gelu, input_skip: true, seed: 11}\n"
    << "optimizer: {type: adam, lr: 0.01}\n"
    << "training: {precision: " << precision << ", loss: mse, clip_grad_norm: 2.0}\n"
    << "data: {normalize: " << (normalize ? "true" : "false") << "}\n";
  return c.str();
}

SessionOptions options_for(const std::string& precision, bool normalize, SolverArrays layout) {
  SessionOptions o;
  o.config_text = model_config(precision, normalize);
  o.input_channels = 2;
  o.output_channels = 1;
  o.arrays = layout;
  return o;
}

/// max |a - b| / max |b| over the owned cells of `sharded` against the whole-field `whole`.
template <class S>
double relative_difference(SolverField<S>& sharded, const std::vector<S>& whole, Index c = 0) {
  double diff = 0, scale = 0;
  sharded.for_owned([&](Index i, Index j, Index k, Index x, Index y, Index z) {
    const double reference = SolverField<S>::at(whole, x, y, z);
    diff = std::max(diff, std::abs(double(sharded.storage[sharded.index(i, j, k, c)]) - reference));
    scale = std::max(scale, std::abs(reference));
  });
  MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &scale, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return diff / scale;
}

}  // namespace

TEST_CASE("solver patches in any rank order form the process grid", "[session]") {
  const Communicator world;
  const SolverGrid grid = solver_grid(world, reversed_patch(world.rank(), world.size()));
  CHECK(grid.grid_rank == world.size() - 1 - world.rank());
  CHECK(grid.decomposition.global_extents() == SpatialIndex{10, 12, 6});
  const Box mine = grid.decomposition.box(grid.grid_rank);
  const SolverPatch p = reversed_patch(world.rank(), world.size());
  for (int a = 0; a < 3; ++a) {
    CHECK(mine.lower[a] == p.offset[a]);
    CHECK(mine.extent[a] == p.extent[a]);
  }
}

TEST_CASE("an MPI Cartesian communicator describes the solver's patches", "[session]") {
  const Communicator world;
  std::vector<int> dims(3, 0), periods{1, 0, 1};
  MPI_Dims_create(world.size(), 3, dims.data());
  MPI_Comm cart = MPI_COMM_NULL;
  MPI_Cart_create(MPI_COMM_WORLD, 3, dims.data(), periods.data(), /*reorder=*/0, &cart);
  const SolverPatch patch = SolverPatch::cartesian(cart, global_extent);
  const SolverGrid grid = solver_grid(Communicator(cart), patch);
  const Decomposition expected(global_extent, dims, {true, false, true});
  CHECK(grid.decomposition == expected);
  int coords[3];
  int cart_rank = 0;
  MPI_Comm_rank(cart, &cart_rank);
  MPI_Cart_coords(cart, cart_rank, 3, coords);
  CHECK(grid.grid_rank == expected.rank_of({coords[0], coords[1], coords[2]}));
  CHECK_THAT(test::error_message_of([&] { SolverPatch::cartesian(MPI_COMM_WORLD, global_extent); }),
             Catch::Contains("no Cartesian topology"));
  MPI_Comm_free(&cart);
}

TEST_CASE("solver patches that do not tile the field fail on every rank", "[session]") {
  const Communicator world;
  const int rank = world.rank(), size = world.size();
  const auto fails_everywhere = [&](const SolverPatch& p, const std::string& text) {
    const std::string message = test::error_message_of([&] { solver_grid(world, p); });
    INFO(message);
    CHECK(test::ranks_with_error(message) == size);
    CHECK_THAT(message, Catch::Contains(text));
  };
  SolverPatch p = reversed_patch(rank, size);
  SECTION("a cell missing") {
    if (rank == 0) p.extent[2] -= 1;
    fails_everywhere(p, "cells are missing");
  }
  SECTION("outside the field") {
    if (rank == size - 1) p.offset[1] = 11;
    fails_everywhere(p, "lies outside the field [0, 12)");
  }
  SECTION("an empty patch") {
    if (rank == 0) p.extent[0] = 0;
    fails_everywhere(p, "every rank must own cells");
  }
  if (size >= 2) {
    SECTION("different global extents") {
      if (rank == size - 1) p.global_extent[0] = 11;
      fails_everywhere(p, "the global extent and periodic flags differs between ranks");
    }
    SECTION("two ranks claim the same patch") {
      if (rank == 1) p = reversed_patch(0, size);
      fails_everywhere(p, "overlap");
    }
    SECTION("overlapping patches") {
      // Two ranks split axis 0 at different points: [0, 6) and [4, 10) overlap.
      p = SolverPatch{global_extent, {rank == 0 ? 0 : 4, 0, 0}, {rank == 0 ? 6 : 6, 12, 6}, {}};
      if (rank >= 2) p = SolverPatch{global_extent, {0, 0, 0}, {1, 1, 1}, {}};
      fails_everywhere(p, "overlap");
    }
  }
}

TEST_CASE("Session::infer on solver arrays equals one rank on the whole field", "[session]") {
  const Communicator world;
  // bf16: a float model whose convolutions take bf16 operands (within a few bf16 steps of one
  // rank, test_bfloat16).
  for (const std::string precision : {"double", "float", "bf16"})
    for (const ArrayOrder order : {ArrayOrder::c, ArrayOrder::fortran})
      for (const Index ghost : {0, 2}) {
        DYNAMIC_SECTION(precision << (order == ArrayOrder::c ? " C" : " Fortran") << " order, "
                                  << ghost << " ghost cells") {
          const SolverArrays layout{order, ghost, ghost};  // ghosts at the edge too
          const SolverPatch patch = reversed_patch(world.rank(), world.size());
          Session session(MPI_COMM_WORLD, patch, options_for(precision, false, layout));
          SolverField<double> input(patch, layout, 2, 7777.0), output(patch, layout, 1, 4242.0);
          input.randomize(3);
          const auto input_before = input.storage;
          session.infer(input.in(), output.out());
          // In place exactly when the arrays are the model's layout and type, in memory the
          // model's kernels read (never on a GPU).
          CHECK(session.last_call().input_copied ==
                (!model_reads_host_memory || precision != "double" || order != ArrayOrder::c));
          CHECK(session.precision() == precision);
          CHECK(input.storage == input_before);  // the solver's input is never written

          // Reference: the same model on one rank, whole field, plain C arrays.
          Session single(MPI_COMM_SELF, whole_field(), options_for(precision, false, {}));
          SolverField<double> whole_in(whole_field(), {}, 2, 0.0),
              whole_out(whole_field(), {}, 1, 0.0);
          whole_in.randomize(3);
          single.infer(whole_in.in(), whole_out.out());
          CHECK(relative_difference(output, whole_out.storage) <=
                (precision == "double" ? 1e-12 : precision == "float" ? 1e-5 : 4.0 / 128));
          // Ghost cells of the output keep the solver's values.
          std::size_t owned = 0, kept = 0;
          for (double v : output.storage) kept += v == 4242.0;
          output.for_owned([&](Index, Index, Index, Index, Index, Index) { ++owned; });
          CHECK(kept == output.size - owned);
        }
      }
}

/// The patch of `rank` on a field periodic along axis 2 only, split as `reversed_patch`.
SolverPatch open_patch(int rank, int nranks) {
  SolverPatch p = reversed_patch(rank, nranks);
  p.periodic = {false, false, true};
  return p;
}

/// This rank's exact widths for a DMDA-like layout (ghost cells only where a patch is faced),
/// asymmetric: 2 below, 1 above.
SolverArrays per_side_layout(const SolverPatch& p, ArrayOrder order, Index components) {
  SolverArrays layout;
  layout.order = order;
  layout.components = components;
  for (int a = 0; a < 3; ++a) {
    const bool periodic = !p.periodic.empty() && p.periodic[a];
    layout.ghost_lower.push_back(periodic || p.offset[a] > 0 ? 2 : 0);
    layout.ghost_upper.push_back(periodic || p.offset[a] + p.extent[a] < p.global_extent[a] ? 1 : 0);
  }
  return layout;
}

TEST_CASE("Session reads per-side ghost widths and interleaved components as one rank does",
          "[session]") {
  const Communicator world;
  const SolverPatch patch = open_patch(world.rank(), world.size());
  SolverPatch whole = whole_field();
  whole.periodic = patch.periodic;
  // Two input channels and one output, in the layouts PETSc's DMDA and arrays of structures
  // give: no ghost cells past a non-periodic edge, widths per side, several values per cell.
  struct Case {
    std::string name;
    SolverArrays layout;
  };
  SolverArrays dmda;  // ghost_width 1 where a patch is faced, none past the edge
  dmda.ghost_width = 1;
  dmda.boundary_ghost_width = 0;
  SolverArrays dof3 = per_side_layout(patch, ArrayOrder::c, 3);
  SolverArrays fortran2 = per_side_layout(patch, ArrayOrder::fortran, 2);
  for (const Case& test : {Case{"ghost_width 1, none at the edge", dmda},
                           Case{"per-side widths, C order, 3 components", dof3},
                           Case{"per-side widths, Fortran order, 2 components", fortran2}}) {
    DYNAMIC_SECTION(test.name) {
      SessionOptions sharded_options = options_for("double", false, test.layout);
      Session session(MPI_COMM_WORLD, patch, sharded_options);
      SolverField<double> input(patch, test.layout, 2, 7777.0),
          output(patch, test.layout, 1, 4242.0);
      input.randomize(3);
      const auto input_before = input.storage;
      session.infer(input.in(), output.out());
      CHECK(input.storage == input_before);
      const Index widths_differ = [&] {
        Index lower[3], upper[3], mine = 0;
        expected_widths(patch, test.layout, lower, upper);
        for (int a = 0; a < 3; ++a) mine = mine * 16 + lower[a] * 4 + upper[a];
        const auto all = world.allgather({mine});
        return Index(std::count(all.begin(), all.end(), all.front()) != Index(all.size()));
      }();
      INFO(session.last_call().copy_reason);
      if (test.layout.components > 1)
        CHECK_THAT(session.last_call().copy_reason,
                   Catch::Contains(test.layout.order == ArrayOrder::c ? "interleave" : "Fortran"));
      else if (widths_differ && model_reads_host_memory)
        CHECK_THAT(session.last_call().copy_reason,
                   Catch::Contains("ghost widths differ between ranks"));
      else
        CHECK(session.last_call().input_copied == !model_reads_host_memory);

      Session single(MPI_COMM_SELF, whole, options_for("double", false, {}));
      SolverField<double> whole_in(whole, {}, 2, 0.0), whole_out(whole, {}, 1, 0.0);
      whole_in.randomize(3);
      single.infer(whole_in.in(), whole_out.out());
      CHECK(relative_difference(output, whole_out.storage) <= 1e-12);
      // Only owned cells of the output are written: the ghost cells and the other
      // components keep the solver's values.
      std::size_t owned = 0, kept = 0;
      for (double v : output.storage) kept += v == 4242.0;
      output.for_owned([&](Index, Index, Index, Index, Index, Index) { ++owned; });
      CHECK(kept == output.storage.size() - owned);

      // Online training on the same layouts: the losses of one rank.
      SessionOptions train_options = options_for("double", true, test.layout);
      Session trained(MPI_COMM_WORLD, patch, train_options);
      Session trained_single(MPI_COMM_SELF, whole, options_for("double", true, {}));
      for (int step = 0; step < 2; ++step) {
        SolverField<double> x(patch, test.layout, 2, 9.0), y(patch, test.layout, 1, 9.0);
        x.randomize(100 + step);
        y.randomize(200 + step);
        SolverField<double> wx(whole, {}, 2, 0.0), wy(whole, {}, 1, 0.0);
        wx.randomize(100 + step);
        wy.randomize(200 + step);
        const double loss = trained.train_step(x.in(), y.in());
        const double reference = trained_single.train_step(wx.in(), wy.in());
        CHECK(std::abs(loss - reference) <= 1e-10 * std::abs(reference));
      }
    }
  }
}

TEST_CASE("Session refuses array descriptions that do not fit, on every rank", "[session]") {
  const Communicator world;
  const int size = world.size();
  const SolverPatch patch = open_patch(world.rank(), size);
  const auto fails_everywhere = [&](auto body, const std::string& text) {
    const std::string message = test::error_message_of(body);
    INFO(message);
    CHECK(test::ranks_with_error(message) == size);
    CHECK_THAT(message, Catch::Contains(text));
  };
  const auto create = [&](const SolverArrays& layout) {
    Session(MPI_COMM_WORLD, patch, options_for("double", false, layout));
  };
  SECTION("ghost_width on a non-periodic field without boundary_ghost_width") {
    SolverArrays layout;
    layout.ghost_width = 1;  // PETSc's DMDA has none past the edge: reading there would overrun
    fails_everywhere([&] { create(layout); }, "say how many ghost cells the arrays keep past");
  }
  SECTION("a ghost layer wider than the patch it faces") {
    // Axis 2 (6 cells, periodic) is split in 2 at 8 ranks, else whole: 3 or 6 cells.
    SolverArrays layout;
    layout.ghost_width = 7;
    layout.boundary_ghost_width = 0;
    fails_everywhere([&] { create(layout); }, "must lie within the neighbouring patch");
  }
  SECTION("per-side widths for the wrong number of axes") {
    SolverArrays layout = per_side_layout(patch, ArrayOrder::c, 1);
    layout.ghost_upper.pop_back();
    fails_everywhere([&] { create(layout); }, "ghost_lower has 3 and ghost_upper 2 entries");
  }
  SECTION("a negative per-side width on one rank") {
    SolverArrays layout = per_side_layout(patch, ArrayOrder::c, 1);
    if (world.rank() == size - 1) layout.ghost_lower[1] = -1;
    fails_everywhere([&] { create(layout); }, "ghost_lower[1] = -1 is negative");
  }
  SECTION("components that differ between ranks") {
    SolverArrays layout = per_side_layout(patch, ArrayOrder::c, world.rank() == 0 ? 2 : 1);
    if (size > 1) fails_everywhere([&] { create(layout); }, "differs between ranks");
  }
  SECTION("interleaved channels passed as separate arrays (u, u + 1), components 1") {
    SolverArrays interleaved = per_side_layout(patch, ArrayOrder::c, 2);
    SolverField<double> u(patch, interleaved, 2, 0.0), y(patch, interleaved, 1, 0.0);
    u.randomize(5);
    SolverArrays wrong = per_side_layout(patch, ArrayOrder::c, 1);
    Session session(MPI_COMM_WORLD, patch, options_for("double", false, wrong));
    fails_everywhere([&] { session.infer(u.in(), {y.out()[0]}); },
                     "inputs arrays 0 and 1 overlap");
    fails_everywhere([&] { session.infer(u.in(), {y.out()[0]}); }, "need components set");
  }
  SECTION("one output array for two output channels") {
    SessionOptions o = options_for("double", false, {});
    o.output_channels = 2;
    Session session(MPI_COMM_WORLD, patch, o);
    SolverField<double> x(patch, {}, 2, 0.0), y(patch, {}, 1, 0.0);
    x.randomize(5);
    fails_everywhere([&] { session.infer(x.in(), {y.out()[0], y.out()[0]}); },
                     "one array cannot receive two output channels");
  }
  SECTION("a NaN in an input on one rank") {
    const SolverArrays layout = per_side_layout(patch, ArrayOrder::c, 2);
    Session session(MPI_COMM_WORLD, patch, options_for("double", false, layout));
    SolverField<double> x(patch, layout, 2, 0.0), y(patch, layout, 1, 5.0);
    x.randomize(5);
    if (world.rank() == size - 1) x.storage[x.index(0, 1, 0, 1)] = std::nan("");
    const auto before = y.storage;
    std::ostringstream cell;  // the failing rank's cell, in its message on every rank
    cell << "at cell (" << patch.offset[0] << ", " << patch.offset[1] + 1 << ", "
         << patch.offset[2] << ")";
    const std::string message =
        test::error_message_of([&] { session.infer(x.in(), y.out()); });
    INFO(message);
    CHECK(test::ranks_with_error(message) == size);
    CHECK_THAT(message, Catch::Contains("inputs array 1 holds a non-finite value (nan)") &&
                            Catch::Contains("the prediction was not made"));
    if (world.rank() == size - 1) CHECK_THAT(message, Catch::Contains(cell.str()));
    CHECK(y.storage == before);
  }
}

TEST_CASE("Session::infer on float arrays reads them in place", "[session]") {
  const Communicator world;
  const SolverArrays layout{ArrayOrder::c, 1, 1};
  const SolverPatch patch = reversed_patch(world.rank(), world.size());
  Session session(MPI_COMM_WORLD, patch, options_for("float", false, layout));
  // One allocation holding both channels, one after the other: a single (C, x, y, z) array.
  SolverField<float> input(patch, layout, 2, -1.0f), output(patch, layout, 1, 0.0f);
  input.randomize(5);
  session.infer(input.in(), output.out());
  CHECK(session.last_call().input_copied == !model_reads_host_memory);
  // The same values in two separate allocations: copied.
  const std::vector<float> first(input.in()[0], input.in()[0] + input.size),
      second(input.in()[1], input.in()[1] + input.size);
  SolverField<float> copied_out(patch, layout, 1, 0.0f);
  session.infer({first.data(), second.data()}, copied_out.out());
  CHECK(session.last_call().input_copied);
  CHECK_THAT(session.last_call().copy_reason,
             Catch::Contains(model_reads_host_memory ? "not one after another" : "on a GPU"));
  CHECK(copied_out.storage == output.storage);
}

TEST_CASE("Session::train_step equals one-rank training; checkpoints move between rank counts",
          "[session]") {
  const Communicator world;
  test::TempDir dir(world);
  const SolverArrays layout{ArrayOrder::fortran, 1, 1};
  const SolverPatch patch = reversed_patch(world.rank(), world.size());
  Session session(MPI_COMM_WORLD, patch, options_for("double", true, layout));
  Session single(MPI_COMM_SELF, whole_field(), options_for("double", true, {}));
  for (int step = 0; step < 3; ++step) {
    SolverField<double> x(patch, layout, 2, 9.0), y(patch, layout, 1, 9.0);
    x.randomize(100 + step);
    y.randomize(200 + step);
    SolverField<double> wx(whole_field(), {}, 2, 0.0), wy(whole_field(), {}, 1, 0.0);
    wx.randomize(100 + step);
    wy.randomize(200 + step);
    const double loss = session.train_step(x.in(), y.in());
    const double reference = single.train_step(wx.in(), wy.in());
    INFO("step " << step << ": sharded loss " << loss << ", single rank " << reference);
    CHECK(std::abs(loss - reference) <= 1e-10 * std::abs(reference));
  }
  CHECK(session.steps() == 3);

  // The sharded session's checkpoint, loaded on one rank (config from the file), predicts
  // what the sharded session predicts.
  const std::string path = dir.path("online.h5");
  session.save_checkpoint(path);
  SessionOptions from_file;
  from_file.checkpoint = path;
  from_file.input_channels = 2;
  Session reloaded(MPI_COMM_SELF, whole_field(), from_file);
  CHECK(reloaded.steps() == 3);
  SolverField<double> x(patch, layout, 2, 0.0), y(patch, layout, 1, 0.0);
  x.randomize(300);
  session.infer(x.in(), y.out());
  CHECK(session.last_call().input_copied);  // normalized inputs are staged
  SolverField<double> wx(whole_field(), {}, 2, 0.0), wy(whole_field(), {}, 1, 0.0);
  wx.randomize(300);
  reloaded.infer(wx.in(), wy.out());
  CHECK(relative_difference(y, wy.storage) <= 1e-12);
}

TEST_CASE("Session holds to memory.budget_mib while it lives", "[session][memory]") {
  const Communicator world;
  const SolverPatch patch = reversed_patch(world.rank(), world.size());
  SolverField<double> x(patch, {}, 2, 0.0), y(patch, {}, 1, 0.0);
  x.randomize(1);
  const std::uint64_t budget_before = memory_budget();
  // 10 KiB: below the parameters with their gradients and adam state (4412 x 8 bytes x 4):
  // refused while the model is built, on every rank.
  SessionOptions tiny = options_for("double", false, {});
  tiny.config_text += "memory: {budget_mib: 0.01}\n";
  const std::string refused = test::error_message_of([&] { Session(MPI_COMM_WORLD, patch, tiny); });
  CHECK(test::ranks_with_error(refused) == world.size());
  CHECK_THAT(refused, Catch::Contains("the parameters need at least 0.02 MiB per rank") &&
                          Catch::Contains("more than memory.budget_mib (0.01 MiB)"));
  CHECK(memory_budget() == budget_before);

  // 0.18 MiB: room for the model (its 4412 parameters x 8 bytes x 4), not for a training step
  // at any rank count, nor for an inference of the whole field (which fit in 0.25 MiB once its
  // convolutions read their input without a padded copy), so it runs on each rank's own
  // whole-field session.
  SessionOptions tight = options_for("double", false, {});
  tight.config_text += "memory: {budget_mib: 0.18}\n";
  for (int call = 0; call < 2; ++call) {
    const bool infer = call == 0;
    Session session(infer ? MPI_COMM_SELF : MPI_COMM_WORLD, infer ? whole_field() : patch, tight);
    CHECK(memory_budget() == 188744);  // 0.18 MiB
    SolverField<double> whole_x(whole_field(), {}, 2, 0.0), whole_y(whole_field(), {}, 1, 0.0);
    whole_x.randomize(1);
    const std::string message = test::error_message_of([&] {
      if (infer)
        session.infer(whole_x.in(), whole_y.out());
      else
        session.train_step(x.in(), y.in());
    });
    INFO(message);
    CHECK(test::ranks_with_error(message) == world.size());
    CHECK_THAT(message, Catch::Contains("memory budget of 0.18 MiB per rank exceeded"));
  }
  CHECK(memory_budget() == budget_before);  // lifted with the session

  SessionOptions roomy = options_for("double", false, {});
  roomy.config_text += "memory: {budget_mib: 512}\n";
  Session session(MPI_COMM_WORLD, patch, roomy);
  session.infer(x.in(), y.out());
  CHECK(std::isfinite(session.train_step(x.in(), y.in())));
}

TEST_CASE("Session bad input fails on every rank", "[session]") {
  const Communicator world;
  const int size = world.size();
  const SolverPatch patch = reversed_patch(world.rank(), size);
  Session session(MPI_COMM_WORLD, patch, options_for("double", false, {}));
  SolverField<double> x(patch, {}, 2, 0.0), y(patch, {}, 1, 0.0);
  x.randomize(1);
  const auto fails_everywhere = [&](auto body, const std::string& text) {
    const std::string message = test::error_message_of(body);
    INFO(message);
    CHECK(test::ranks_with_error(message) == size);
    CHECK_THAT(message, Catch::Contains(text));
  };
  SECTION("a null pointer on one rank") {
    auto inputs = x.in();
    if (world.rank() == size - 1) inputs[1] = nullptr;
    fails_everywhere([&] { session.infer(inputs, y.out()); }, "inputs array 1 is a null pointer");
  }
  SECTION("too few arrays") {
    fails_everywhere([&] { session.infer({x.in()[0]}, y.out()); },
                     "inputs: 1 arrays given, the model has 2 channels");
  }
  SECTION("a target with the wrong channel count") {
    fails_everywhere(
        [&] {
          session.train_step(x.in(), {x.in()[0], x.in()[1]});
        },
        "targets: 2 arrays given, the model has 1 channels");
  }
  SECTION("no model") {
    fails_everywhere([&] { Session(MPI_COMM_WORLD, patch, SessionOptions{}); },
                     "no model: give a config");
  }
  SECTION("a config file missing on one rank: an error everywhere, no hang") {
    test::TempDir dir(world);
    const std::string path = dir.path("model.yaml");
    if (world.rank() == 0) std::ofstream(path) << model_config("double", false);
    world.barrier();
    SessionOptions o = options_for("double", false, {});
    o.config_text.clear();
    o.config = world.rank() == size - 1 && size > 1 ? dir.path("missing.yaml") : path;
    if (size > 1)
      fails_everywhere([&] { Session(MPI_COMM_WORLD, patch, o); }, "missing.yaml");
    else
      Session(MPI_COMM_WORLD, patch, o);
  }
  SECTION("a learning rate that differs between ranks") {
    SessionOptions o = options_for("double", false, {});
    if (world.rank() == size - 1 && size > 1) o.overrides.push_back("optimizer.lr=0.02");
    if (size > 1)
      fails_everywhere([&] { Session(MPI_COMM_WORLD, patch, o); },
                       "the resolved config differs between ranks");
  }
  SECTION("a checkpoint path that differs between ranks") {
    test::TempDir dir(world);
    const std::string path = dir.path("r" + std::to_string(size > 1 ? world.rank() : 0) + ".h5");
    if (size > 1)
      fails_everywhere([&] { session.save_checkpoint(path); },
                       "the checkpoint path differs between ranks");
  }
  SECTION("options that differ between ranks") {
    SessionOptions o = options_for("double", false, {});
    if (world.rank() == 0 && size > 1) o.arrays.ghost_width = o.arrays.boundary_ghost_width = 1;
    if (size > 1)
      fails_everywhere([&] { Session(MPI_COMM_WORLD, patch, o); }, "differs between ranks");
  }
  SECTION("a checkpoint of another model") {
    test::TempDir dir(world);
    session.save_checkpoint(dir.path("two_in.h5"));
    SessionOptions o = options_for("double", false, {});
    o.input_channels = 3;
    o.checkpoint = dir.path("two_in.h5");
    fails_everywhere([&] { Session(MPI_COMM_WORLD, patch, o); }, "input and 1 output channels");
  }
}
