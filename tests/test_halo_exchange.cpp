// HaloExchange: every ghost cell (faces, edges, corners) holds the owner's value after an
// exchange, for 1-D/2-D/3-D process grids, uneven splits, periodic and open boundaries,
// widths 1-3 (also asymmetric), float and double; and the reverse is the exact adjoint. A slab
// exchange brings the neighbours' x-planes, open and periodic. The bfloat16 wire moves the
// owners' values rounded, in half the bytes.

#include <array>
#include <catch2/catch.hpp>
#include <sstream>

#include "shardtensor/comm/comm_timers.hpp"
#include "shardtensor/core/bfloat16.hpp"
#include "shardtensor/core/kernel_counter.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "test_support.hpp"

using namespace shardtensor;

namespace {

constexpr double sentinel = -7.0;

/// Global extents giving every rank of `grid` at least `min_cells` cells, uneven where the
/// grid allows it.
std::vector<Index> extents_for(const std::vector<int>& grid, int min_cells) {
  std::vector<Index> e;
  for (std::size_t k = 0; k < grid.size(); ++k) e.push_back(grid[k] * min_cells + 1 + Index(k));
  return e;
}

/// What a ghost cell of `d` at global cell g holds after an exchange: its owner's value
/// (global linear index + 1), or the sentinel past an open boundary.
inline double exchanged_value(const Decomposition& d, Index channels, Index n, Index c,
                              SpatialIndex g) {
  if (!test::wrap_global(d, g)) return sentinel;
  return double(test::global_linear_index(d, channels, n, c, g) + 1);
}

/// A field of `d` with its owned cells at their exchanged_value and its ghosts the sentinel.
template <class T>
ShardTensor<T> field_to_exchange(const Communicator& comm, const Decomposition& d,
                                 const GhostWidths& ghosts, Index channels) {
  ShardTensor<T> field(d, comm.rank(), 2, channels, ghosts);
  test::fill(field, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex& g) {
    return test::is_ghost(field, local) ? sentinel : exchanged_value(d, channels, n, c, g);
  });
  return field;
}

/// The cells of `field` whose value is not their exchanged_value.
template <class T>
long long wrong_cells(const ShardTensor<T>& field) {
  return test::count_cells(
      field, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g, double value) {
        return value != exchanged_value(field.decomposition(), field.channels(), n, c, g);
      });
}

/// Fills a field (field_to_exchange), exchanges, and returns its wrong cells.
template <class T>
long long wrong_cells_after_exchange(const Decomposition& d, const GhostWidths& ghosts,
                                     bool split_phase, const CommOptions& options = {}) {
  const Communicator comm = Communicator().with_options(options);
  const ShardTensor<T> field = field_to_exchange<T>(comm, d, ghosts, 3);
  HaloExchange<T> halo(comm, field);
  if (split_phase) {
    halo.start(field);
    // Interior work would go here; the owned cells may be read meanwhile.
    halo.finish(field);
  } else {
    halo.exchange(field);
  }
  return wrong_cells(field);
}

std::vector<std::vector<bool>> periodic_variants(int ndims) {
  std::vector<std::vector<bool>> out{std::vector<bool>(ndims, false),
                                     std::vector<bool>(ndims, true)};
  if (ndims > 1) {
    std::vector<bool> mixed(ndims, false);
    mixed[0] = true;
    out.push_back(mixed);
  }
  return out;
}

std::string describe(const Decomposition& d, const GhostWidths& g) {
  std::ostringstream os;
  os << d.describe() << ", ghosts " << g;
  return os.str();
}

}  // namespace

TEMPLATE_TEST_CASE("halo exchange fills every ghost cell from its owner", "[halo]", float, double) {
  const int nranks = test::world_size();
  for (int ndims = 1; ndims <= 3; ++ndims) {
    for (const std::vector<int>& grid : test::process_grids(nranks, ndims)) {
      for (const std::vector<bool>& periodic : periodic_variants(ndims)) {
        for (int width = 1; width <= 3; ++width) {
          const Decomposition d(extents_for(grid, 3), grid, periodic);
          const GhostWidths ghosts = GhostWidths::uniform(width, ndims);
          INFO(describe(d, ghosts));
          CHECK(wrong_cells_after_exchange<TestType>(d, ghosts, width == 2) == 0);
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("halo exchange with asymmetric widths and explicit uneven splits", "[halo]",
                   float, double) {
  const int nranks = test::world_size();
  for (const std::vector<int>& grid : test::process_grids(nranks, 3)) {
    // Uneven explicit split points: part i along dim k has 3 + (i + k) % 3 cells.
    std::vector<std::vector<Index>> points(3);
    for (int k = 0; k < 3; ++k) {
      points[k].push_back(0);
      for (int i = 0; i < grid[k]; ++i) points[k].push_back(points[k].back() + 3 + (i + k) % 3);
    }
    for (const std::vector<bool>& periodic : periodic_variants(3)) {
      const Decomposition d = Decomposition::from_split_points(points, periodic);
      GhostWidths ghosts;
      ghosts.lower = {1, 3, 0};
      ghosts.upper = {2, 0, 3};
      INFO(describe(d, ghosts));
      CHECK(wrong_cells_after_exchange<TestType>(d, ghosts, true) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("every communication backend fills the ghosts", "[halo]", float, double) {
  // On a GPU: staged through host buffers, device pointers to MPI, NCCL (one group on the
  // plan's stream); on the CPU the first two are the same path.
  for (const CommOptions& options : test::comm_backends()) {
    for (const std::vector<int>& grid : test::process_grids(test::world_size(), 3)) {
      for (const std::vector<bool>& periodic : periodic_variants(3)) {
        const Decomposition d(extents_for(grid, 3), grid, periodic);
        GhostWidths ghosts = GhostWidths::uniform(2, 3);
        ghosts.upper[1] = 1;
        INFO(test::describe(options) << ", " << describe(d, ghosts));
        CHECK(wrong_cells_after_exchange<TestType>(d, ghosts, true, options) == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("halo plans lease their buffers from one pool, each exchange in flight its own",
                   "[halo][pool]", float, double) {
  // Two plans exchange at once (both started, then finished in the other order): each needs
  // its own buffers, and both fill their ghosts. Idle, the plans hold none: their buffers are
  // back in the pool, where the next exchanges take them without allocating. Periodic, so
  // that every rank exchanges, itself included on one rank.
  const Communicator comm;
  const std::vector<int> grid = test::process_grids(comm.size(), 3).back();
  const Decomposition d(extents_for(grid, 3), grid, {true, true, true});
  const GhostWidths ghosts = GhostWidths::uniform(1, 3);
  const ShardTensor<TestType> a = field_to_exchange<TestType>(comm, d, ghosts, 3);
  const ShardTensor<TestType> b = field_to_exchange<TestType>(comm, d, ghosts, 5);
  HaloExchange<TestType> plan_a(comm, a), plan_b(comm, b);
  using Lease = impl::BufferLease<TestType>;
  const auto round = [&](OwnedCells owned) {
    plan_a.start(a, HaloWire::native, owned);
    plan_b.start(b, HaloWire::native, owned);
    plan_b.finish(b);
    plan_a.finish(a);
  };
  const auto reverse_round = [&] {
    plan_a.reverse_start(a);
    plan_b.reverse_start(b);
    plan_b.reverse_finish(b);
    plan_a.reverse_finish(a);
  };
  // MPI in host memory receives forward messages into the ghost cells and, where the caller
  // leaves the owned cells unchanged, sends them out of the owned cells: then a forward
  // exchange leases no buffer. Else (or elsewhere) both plans' send buffers at least.
  const bool boxes = impl::transport_for<DefaultMemorySpace>(comm).moves_boxes();
  const std::size_t before = Lease::free_values();
  round(OwnedCells::unchanged);
  CHECK(wrong_cells(a) == 0);
  CHECK(wrong_cells(b) == 0);
  if (boxes) CHECK(Lease::free_values() == before);
  round(OwnedCells::may_change);
  CHECK(wrong_cells(a) == 0);
  CHECK(wrong_cells(b) == 0);
  CHECK(Lease::free_values() * sizeof(TestType) >= plan_a.bytes_sent() + plan_b.bytes_sent());
  // The adjoint adds what comes back: each plan in flight holds a buffer of its send boxes'
  // size for it (and, where the transport packs, one for its ghost values).
  reverse_round();
  const std::size_t pooled = Lease::free_values();
  CHECK(pooled * sizeof(TestType) >= plan_a.bytes_sent() + plan_b.bytes_sent());
  if (boxes && comm.size() > 1)
    CHECK(pooled * sizeof(TestType) < 2 * (plan_a.bytes_sent() + plan_b.bytes_sent()));
  const auto refill = [&] {  // the adjoint added into the owned cells and zeroed the ghosts
    Kokkos::deep_copy(a.view(), field_to_exchange<TestType>(comm, d, ghosts, 3).view());
    Kokkos::deep_copy(b.view(), field_to_exchange<TestType>(comm, d, ghosts, 5).view());
  };
  refill();
  disable_memory_tracking();
  enable_memory_tracking();  // from zero
  round(OwnedCells::may_change);
  round(OwnedCells::unchanged);
  reverse_round();
  refill();
  round(OwnedCells::may_change);
  const std::uint64_t allocated = memory_snapshot()[MemoryCategory::comm_buffers].peak;
  disable_memory_tracking();
  CHECK(wrong_cells(a) == 0);
  CHECK(wrong_cells(b) == 0);
  CHECK(Lease::free_values() == pooled);
  CHECK(allocated == 0);
  // A larger exchange takes the memory of a smaller free buffer rather than adding to it.
  {
    const Lease small(1), large(pooled + 1);
    CHECK(large.view().extent(0) == pooled + 1);
  }
  CHECK(Lease::free_values() >= pooled + 1);
}

TEST_CASE("the bfloat16 wire moves half the bytes: the owners' values rounded to bfloat16",
          "[halo][bf16]") {
  // The owned cells count up to thousands, most with more significant bits than bfloat16's 8:
  // each ghost must hold its owner's value rounded to nearest even, the owned cells unchanged,
  // the open boundaries' ghosts untouched. A bf16 layer's operand is rounded already, so there
  // the wire changes nothing (the bf16 layer tests compare sharded with one rank).
  const Communicator comm;
  for (int ndims = 1; ndims <= 3; ++ndims)
    for (const std::vector<int>& grid : test::process_grids(comm.size(), ndims))
      for (const std::vector<bool>& periodic : periodic_variants(ndims))
        for (int width = 1; width <= 2; ++width) {
          const Decomposition d(extents_for(grid, 3), grid, periodic);
          const GhostWidths ghosts = GhostWidths::uniform(width, ndims);
          INFO(describe(d, ghosts));
          const ShardTensor<float> field = field_to_exchange<float>(comm, d, ghosts, 3);
          HaloExchange<float> plan(comm, field);
          CHECK(2 * plan.bytes_sent(HaloWire::bfloat16) == plan.bytes_sent());
          CHECK(2 * plan.bytes_received(HaloWire::bfloat16) == plan.bytes_received());
          plan.start(field, HaloWire::bfloat16);
          plan.finish(field);
          const auto wrong = [&] {
            return test::count_cells(field, [&](Index n, Index c, const SpatialIndex& local,
                                                const SpatialIndex& g, double value) {
              const double owner = exchanged_value(d, field.channels(), n, c, g);
              const bool ghost = test::is_ghost(field, local);
              return value != (ghost ? double(round_to_bfloat16(float(owner))) : owner);
            });
          };
          CHECK(wrong() == 0);
          // The plan goes on to an adjoint (floats) and to bfloat16 exchanges again: the ghosts
          // hold bfloat16 values of the owners' sums.
          plan.reverse_accumulate(field);
          plan.exchange(field, HaloWire::bfloat16);
          CHECK(test::count_cells(field, [&](Index, Index, const SpatialIndex& local,
                                             const SpatialIndex&, double value) {
                  return test::is_ghost(field, local) &&
                         value != double(round_to_bfloat16(float(value)));
                }) == 0);
        }
  // Doubles are never sent as bfloat16.
  const Decomposition d(extents_for({comm.size()}, 3), {comm.size()}, {true});
  const ShardTensor<double> wide =
      field_to_exchange<double>(comm, d, GhostWidths::uniform(1, 1), 1);
  HaloExchange<double> plan(comm, wide);
  CHECK_THROWS_WITH(plan.start(wide, HaloWire::bfloat16),
                    Catch::Contains("the bfloat16 wire moves float fields, this one has 8-byte"));
  plan.exchange(wide);  // the refused start left the plan idle
  CHECK(wrong_cells(wide) == 0);
}

TEST_CASE("reverse_accumulate is the adjoint of the exchange", "[halo][adjoint]") {
  const int nranks = test::world_size();
  for (const CommOptions& options : test::comm_backends()) {
    const Communicator comm = Communicator().with_options(options);
    INFO(test::describe(options));
    int case_index = 0;
    for (int ndims = 1; ndims <= 3; ++ndims) {
      for (const std::vector<int>& grid : test::process_grids(nranks, ndims)) {
        for (const std::vector<bool>& periodic : periodic_variants(ndims)) {
          ++case_index;
          const Decomposition d(extents_for(grid, 3), grid, periodic);
          GhostWidths ghosts = GhostWidths::uniform(2, ndims);
          ghosts.lower[0] = 1;  // asymmetric on the first axis
          ghosts.upper[0] = 3;
          INFO(describe(d, ghosts));
          const Index channels = 2;
          ShardTensor<double> x(d, comm.rank(), 1, channels, ghosts);
          ShardTensor<double> y(d, comm.rank(), 1, channels, ghosts);
          // x: random owned values, zero ghosts (H acts on owned cells); y: random everywhere.
          test::fill(x, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex& g) {
            return test::is_ghost(x, local) ? 0.0
                                            : hashed_uniform(case_index, test::global_linear_index(
                                                                             d, channels, n, c, g));
          });
          test::fill(y, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex&) {
            const std::uint64_t id = ((comm.rank() * 8 + n) * channels + c) * 1000003ull +
                                     (local[0] * 1009 + local[1]) * 1013 + local[2];
            return hashed_uniform(1000 + case_index, id);
          });
          HaloExchange<double> halo(comm, x);
          auto local_dot = [](const ShardTensor<double>& a, const ShardTensor<double>& b) {
            double s = 0;
            const auto av = a.view(), bv = b.view();
            Kokkos::parallel_reduce(
                "dot", av.span(),
                KOKKOS_LAMBDA(const std::size_t i, double& acc) {
                  acc += av.data()[i] * bv.data()[i];
                },
                s);
            return s;
          };
          ShardTensor<double> hx(d, comm.rank(), 1, channels, ghosts);
          Kokkos::deep_copy(hx.view(), x.view());
          halo.exchange(hx);
          const double lhs = test::sum_over_ranks(local_dot(hx, y));
          ShardTensor<double> hty(d, comm.rank(), 1, channels, ghosts);
          Kokkos::deep_copy(hty.view(), y.view());
          halo.reverse_accumulate(hty);
          const double rhs = test::sum_over_ranks(local_dot(x, hty));
          INFO("<Hx, y> = " << lhs << ", <x, H^T y> = " << rhs);
          CHECK(std::abs(lhs - rhs) <= 1e-12 * std::max(1.0, std::abs(lhs)));
        }
      }
    }
  }
}

TEST_CASE("reverse_accumulate adds ghost values into their owners and clears them", "[halo]") {
  // Ones in every ghost cell that has an owner: afterwards each owned cell holds the number
  // of ghost copies of it on all ranks (counted by brute force here), every ghost holds 0.
  const Communicator comm;
  for (const std::vector<bool>& periodic : periodic_variants(2)) {
    const Decomposition d = Decomposition::automatic({7, 6}, comm.size(), periodic);
    const GhostWidths ghosts = GhostWidths::uniform(1, 2);
    INFO(describe(d, ghosts));
    const SpatialIndex e = d.global_extents();
    std::vector<double> copies_of(static_cast<std::size_t>(e[0] * e[1]), 0.0);
    for (int r = 0; r < d.nranks(); ++r) {
      const Box b = d.box(r);
      for (Index x = b.lower[0] - 1; x < b.upper(0) + 1; ++x)
        for (Index y = b.lower[1] - 1; y < b.upper(1) + 1; ++y) {
          SpatialIndex g{x, y, 0};
          if (b.contains(g) || !test::wrap_global(d, g)) continue;
          copies_of[static_cast<std::size_t>(g[0] * e[1] + g[1])] += 1.0;
        }
    }
    ShardTensor<double> field(d, comm.rank(), 1, 1, ghosts);
    test::fill(field, [&](Index, Index, const SpatialIndex& local, const SpatialIndex& g) {
      SpatialIndex w = g;
      return test::is_ghost(field, local) && test::wrap_global(d, w) ? 1.0 : 0.0;
    });
    HaloExchange<double> halo(comm, field);
    halo.reverse_accumulate(field);
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), field.view());
    long long wrong = 0;
    for (Index x = 0; x < field.allocated_extent(0); ++x)
      for (Index y = 0; y < field.allocated_extent(1); ++y) {
        const SpatialIndex local{x, y, 0};
        const SpatialIndex g = field.to_global(local);
        const double want = test::is_ghost(field, local)
                                ? 0.0
                                : copies_of[static_cast<std::size_t>(g[0] * e[1] + g[1])];
        if (host(0, 0, x, y, 0) != want) ++wrong;
      }
    CHECK(wrong == 0);
  }
}

TEMPLATE_TEST_CASE("a slab exchange brings the neighbours' x-planes", "[halo][slabs]", float,
                   double) {
  const Communicator comm;
  const int p = comm.size();
  const Index batch = 2, channels = 3;
  for (const bool periodic : {false, true})
    for (const auto& widths : std::vector<std::array<Index, 2>>{{1, 1}, {2, 1}, {0, 2}}) {
      const Decomposition d(extents_for({p, 1, 1}, 2), {p, 1, 1}, {periodic, false, false});
      INFO(describe(d, {}) << ", planes " << widths[0] << " below, " << widths[1] << " above");
      if (p == 1) {
        CHECK_FALSE(SlabExchange<TestType>::covers(d, widths[0], widths[1]));
        continue;
      }
      REQUIRE(SlabExchange<TestType>::covers(d, widths[0], widths[1]));
      ShardTensor<TestType> field(d, comm.rank(), batch, channels);
      const auto value = [&](Index n, Index c, SpatialIndex g) {
        return double(test::global_linear_index(d, channels, n, c, g) + 1);
      };
      test::fill(field, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
        return value(n, c, g);
      });
      SlabExchange<TestType> slabs(comm, field, widths[0], widths[1], periodic);
      slabs.wait();
      // Plane i of a slab is global plane `first + i`, wrapped; none past an open end.
      const Index nx = d.global_extent(0), offset = field.global_box().lower[0];
      long long wrong = 0;
      const auto check = [&](const FieldView<TestType>& slab, Index planes, Index first) {
        const bool outside = !periodic && (first < 0 || first + planes > nx);
        if (Index(slab.extent(2)) != (outside ? 0 : planes)) ++wrong;
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), slab);
        for (Index n = 0; n < batch; ++n)
          for (Index c = 0; c < channels; ++c)
            for (Index i = 0; i < Index(host.extent(2)); ++i)
              for (Index y = 0; y < Index(host.extent(3)); ++y)
                for (Index z = 0; z < Index(host.extent(4)); ++z)
                  if (double(host(n, c, i, y, z)) != value(n, c, {(first + i + nx) % nx, y, z}))
                    ++wrong;
      };
      check(slabs.lower(), widths[0], offset - widths[0]);
      check(slabs.upper(), widths[1], offset + field.local_extent(0));
      CHECK(wrong == 0);
    }
}

TEST_CASE("a slab exchange on the bfloat16 wire brings the planes rounded, in half the bytes",
          "[halo][slabs][bf16]") {
  const Communicator comm;
  const int p = comm.size();
  if (p == 1) return;  // no slabs on one rank (covers() is false)
  for (const bool periodic : {false, true}) {
    const Decomposition d(extents_for({p, 1, 1}, 2), {p, 1, 1}, {periodic, false, false});
    INFO(describe(d, {}));
    ShardTensor<float> field(d, comm.rank(), 2, 3);
    // Owned values past bfloat16's 8 significant bits, so that rounding shows.
    const auto value = [&](Index n, Index c, SpatialIndex g) {
      return double(float(1.001 * double(test::global_linear_index(d, 3, n, c, g) + 1)));
    };
    test::fill(field, [&](Index n, Index c, const SpatialIndex&, const SpatialIndex& g) {
      return value(n, c, g);
    });
    std::uint64_t bytes[2] = {0, 0};
    for (const HaloWire wire : {HaloWire::native, HaloWire::bfloat16}) {
      const bool bf16 = wire == HaloWire::bfloat16;
      enable_comm_timers();
      reset_comm_timers();
      SlabExchange<float> slabs(comm, field, 2, 1, periodic, wire);
      slabs.wait();
      bytes[bf16] = comm_bytes_sent(CommKind::halo);
      enable_comm_timers(false);
      const Index nx = d.global_extent(0), offset = field.global_box().lower[0];
      long long wrong = 0;
      const auto check = [&](const FieldView<float>& slab, Index first) {
        auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), slab);
        for (Index n = 0; n < 2; ++n)
          for (Index c = 0; c < 3; ++c)
            for (Index i = 0; i < Index(host.extent(2)); ++i)
              for (Index y = 0; y < Index(host.extent(3)); ++y)
                for (Index z = 0; z < Index(host.extent(4)); ++z) {
                  const double owner = value(n, c, {(first + i + nx) % nx, y, z});
                  const double want = bf16 ? double(round_to_bfloat16(float(owner))) : owner;
                  if (double(host(n, c, i, y, z)) != want) ++wrong;
                }
      };
      check(slabs.lower(), offset - 2);
      check(slabs.upper(), offset + field.local_extent(0));
      CHECK(wrong == 0);
    }
    CHECK(2 * bytes[1] == bytes[0]);
    CHECK(bytes[0] > 0);  // every shard has a neighbour along x
  }
  // Doubles are never sent as bfloat16.
  const Decomposition d(extents_for({p, 1, 1}, 2), {p, 1, 1});
  const ShardTensor<double> wide(d, comm.rank(), 1, 1);
  CHECK_THROWS_WITH(SlabExchange<double>(comm, wide, 1, 1, false, HaloWire::bfloat16),
                    Catch::Contains("the bfloat16 wire moves float fields, this one has 8-byte"));
}

TEST_CASE("a slab exchange allocates only the slabs it brings", "[halo][slabs][launches]") {
  // Its send buffer and the bfloat16 wire's bits are leased from the communication buffers'
  // pool until wait(), and the slab past an open end is no View: once the pool holds buffers
  // of these sizes, an exchange allocates one View per neighbour's slab, on either wire. (On
  // a GPU each allocation is a cudaMalloc, and its cudaFree waits for the device.)
  const Communicator comm;
  const int p = comm.size();
  if (p == 1) return;  // no slabs on one rank (covers() is false)
  for (const bool periodic : {false, true})
    for (const HaloWire wire : {HaloWire::native, HaloWire::bfloat16}) {
      const Decomposition d(extents_for({p, 1, 1}, 2), {p, 1, 1}, {periodic, false, false});
      INFO(describe(d, {}) << (wire == HaloWire::bfloat16 ? ", bfloat16 wire" : ""));
      ShardTensor<float> field(d, comm.rank(), 2, 3);
      const auto exchange = [&] {
        SlabExchange<float> slabs(comm, field, 2, 1, periodic, wire);
        slabs.wait();
        return Index(slabs.lower().extent(2) > 0) + Index(slabs.upper().extent(2) > 0);
      };
      exchange();  // the pool's buffers
      KernelCounter counter;
      const Index slabs = exchange();
      CHECK(counter.counts().allocations == slabs);
      CHECK(slabs == (periodic || (comm.rank() > 0 && comm.rank() + 1 < p) ? 2 : 1));
    }
}
