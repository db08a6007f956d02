// Parallel HDF5 I/O: sharded fields round trip bit-exactly between decompositions, ghost
// reads, files written by plain HDF5, type conversion, per-rank samples, replicated arrays
// and attributes, atomic output, validation errors on every rank, and XDMF sidecars.

#include <hdf5.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardtensor/io.hpp"
#include "test_support.hpp"

using namespace shardtensor;
using Catch::Matchers::Contains;

namespace {

/// Random value of (global sample n, channel c, global cell g): the same whatever the
/// decomposition; never zero in practice.
double cell_value(std::uint64_t seed, const std::vector<Index>& extents, Index channels, Index n,
                  Index c, const SpatialIndex& g) {
  SpatialIndex e{1, 1, 1};
  for (std::size_t d = 0; d < extents.size(); ++d) e[d] = extents[d];
  const auto linear =
      static_cast<std::uint64_t>((((n * channels + c) * e[0] + g[0]) * e[1] + g[1]) * e[2] + g[2]);
  return hashed_uniform(seed, linear);
}

std::vector<Index> extents_of(const Decomposition& d) {
  std::vector<Index> e;
  for (int k = 0; k < d.ndims(); ++k) e.push_back(d.global_extent(k));
  return e;
}

/// A shard whose owned cells hold cell_value of samples first_sample + n, ghosts `sentinel`.
template <class T>
ShardTensor<T> random_shard(const Decomposition& d, int rank, Index batch, Index channels,
                            const GhostWidths& ghosts, std::uint64_t seed, Index first_sample,
                            T sentinel = T(-99)) {
  ShardTensor<T> t(d, rank, batch, channels, ghosts);
  const std::vector<Index> e = extents_of(d);
  test::fill(t, [&](Index n, Index c, const SpatialIndex& local, const SpatialIndex& g) {
    return test::is_ghost(t, local)
               ? sentinel
               : static_cast<T>(cell_value(seed, e, channels, first_sample + n, c, g));
  });
  return t;
}

/// A shard filled with `sentinel` everywhere, to read into.
template <class T>
ShardTensor<T> sentinel_shard(const Decomposition& d, int rank, Index batch, Index channels,
                              const GhostWidths& ghosts, T sentinel = T(-99)) {
  ShardTensor<T> t(d, rank, batch, channels, ghosts);
  test::fill(t, [&](Index, Index, const SpatialIndex&, const SpatialIndex&) { return sentinel; });
  return t;
}

/// Cells of `t` that differ (bitwise) from what a read of samples [first_sample, ...) should
/// give: expected(n, c, g) on owned cells, and on in-domain ghosts if `ghosts_read`;
/// `sentinel` on every other ghost (out-of-domain ones, periodic ones included).
template <class T, class Expected>
long long wrong_cells(const ShardTensor<T>& t, Index first_sample, bool ghosts_read,
                      Expected expected, T sentinel = T(-99)) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t.view());
  const SpatialIndex e = t.decomposition().global_extents();
  long long wrong = 0;
  for (Index n = 0; n < t.batch(); ++n)
    for (Index c = 0; c < t.channels(); ++c)
      for (Index x = 0; x < t.allocated_extent(0); ++x)
        for (Index y = 0; y < t.allocated_extent(1); ++y)
          for (Index z = 0; z < t.allocated_extent(2); ++z) {
            const SpatialIndex local{x, y, z};
            const SpatialIndex g = t.to_global(local);
            bool inside = true;
            for (int k = 0; k < max_spatial_dims; ++k) inside = inside && g[k] >= 0 && g[k] < e[k];
            const bool want_value = !test::is_ghost(t, local) || (ghosts_read && inside);
            const T want = want_value ? expected(first_sample + n, c, g) : sentinel;
            if (host(n, c, x, y, z) != want) ++wrong;
          }
  return wrong;
}

/// Every process grid of `nranks` over `extents` that fits, plus an uneven explicit split
/// along the first axis and a periodic balanced one.
std::vector<Decomposition> decompositions_for(int nranks, const std::vector<Index>& extents) {
  const int ndims = static_cast<int>(extents.size());
  std::vector<Decomposition> out;
  for (const std::vector<int>& grid : test::process_grids(nranks, ndims)) {
    bool fits = true;
    for (int k = 0; k < ndims; ++k) fits = fits && grid[k] <= extents[k];
    if (fits) out.emplace_back(extents, grid);
  }
  std::vector<std::vector<Index>> points;
  for (int k = 0; k < ndims; ++k) points.push_back({0, extents[k]});
  points[0] = {0};
  for (int r = 0; r < nranks; ++r)
    points[0].push_back(points[0].back() + (r == 0 ? extents[0] - (nranks - 1) : 1));
  out.push_back(Decomposition::from_split_points(points));
  out.emplace_back(extents, out.front().process_grid(), std::vector<bool>(ndims, true));
  return out;
}

/// Asymmetric ghost widths: 1 below and 2 above along every axis.
GhostWidths test_ghosts(int ndims) {
  GhostWidths g;
  for (int d = 0; d < ndims; ++d) {
    g.lower[d] = 1;
    g.upper[d] = 2;
  }
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("write_field and read_field round trip bit-exactly between decompositions",
                   "[io][field]", float, double) {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const Index samples = 3, channels = 2;
  for (const std::vector<Index>& extents :
       {std::vector<Index>{17}, std::vector<Index>{13, 10}, std::vector<Index>{9, 7, 6}}) {
    const std::vector<Decomposition> all = decompositions_for(comm.size(), extents);
    const std::string path = tmp.path("fields_" + std::to_string(extents.size()) + "d.h5");
    const io::DataType type =
        std::is_same<TestType, float>::value ? io::DataType::float32 : io::DataType::float64;
    {
      io::File file = io::File::create(comm, path);
      for (std::size_t i = 0; i < all.size(); ++i) {
        const std::string name = "group/field" + std::to_string(i);
        // Every other dataset chunked, with chunks that do not align with the shards.
        std::vector<Index> chunks;
        if (i % 2 == 1) {
          chunks = {1, 1};
          for (Index e : extents) chunks.push_back((e + 1) / 2);
        }
        io::create_field_dataset(file, name, samples, channels, extents, type, chunks);
        const Decomposition& d = all[i];
        // Two writes: sample 0 alone, then samples 1 and 2; ghosts (-99) must not be written.
        io::write_field(file, name, 0,
                        random_shard<TestType>(d, comm.rank(), 1, channels,
                                               GhostWidths::uniform(1, d.ndims()), i, 0));
        io::write_field(file, name, 1,
                        random_shard<TestType>(d, comm.rank(), 2, channels, {}, i, 1));
      }
      file.close();
    }
    const io::File file = io::File::open(comm, path);
    for (std::size_t i = 0; i < all.size(); ++i) {
      const std::string name = "group/field" + std::to_string(i);
      auto expected = [&](Index n, Index c, const SpatialIndex& g) {
        return static_cast<TestType>(cell_value(i, extents, channels, n, c, g));
      };
      for (const Decomposition& d : {all[i], all[(i + 1) % all.size()]}) {
        INFO(name << " read on " << d.describe());
        ShardTensor<TestType> plain =
            sentinel_shard<TestType>(d, comm.rank(), samples, channels, test_ghosts(d.ndims()));
        io::read_field(file, name, 0, plain);
        CHECK(wrong_cells(plain, 0, false, expected) == 0);
        ShardTensor<TestType> ghosted =
            sentinel_shard<TestType>(d, comm.rank(), 2, channels, test_ghosts(d.ndims()));
        io::read_field(file, name, 1, ghosted, /*fill_ghosts=*/true);
        CHECK(wrong_cells(ghosted, 1, true, expected) == 0);
      }
    }
  }
}

TEST_CASE("read_field reads chunked and contiguous datasets written by plain HDF5", "[io][field]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const std::string path = tmp.path("plain.h5");
  const std::vector<Index> extents2{12, 10}, extents3{8, 6, 5};
  const Index samples = 2, channels = 3;
  auto values = [&](std::uint64_t seed, const std::vector<Index>& extents) {
    std::vector<double> v;
    SpatialIndex e{1, 1, 1};
    for (std::size_t d = 0; d < extents.size(); ++d) e[d] = extents[d];
    for (Index n = 0; n < samples; ++n)
      for (Index c = 0; c < channels; ++c)
        for (Index x = 0; x < e[0]; ++x)
          for (Index y = 0; y < e[1]; ++y)
            for (Index z = 0; z < e[2]; ++z)
              v.push_back(cell_value(seed, extents, channels, n, c, {x, y, z}));
    return v;
  };
  // Rank 0 alone writes with the serial driver, independently of io's writer.
  if (comm.rank() == 0) {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    auto write = [&](const char* name, const std::vector<Index>& extents, hid_t file_type,
                     const std::vector<hsize_t>& chunks, std::uint64_t seed) {
      std::vector<hsize_t> dims{hsize_t(samples), hsize_t(channels)};
      for (Index e : extents) dims.push_back(hsize_t(e));
      const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
      const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      if (!chunks.empty()) H5Pset_chunk(dcpl, int(chunks.size()), chunks.data());
      const hid_t dataset =
          H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      const std::vector<double> v = values(seed, extents);
      H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
      H5Dclose(dataset);
      H5Pclose(dcpl);
      H5Sclose(space);
    };
    write("chunked2", extents2, H5T_IEEE_F64LE, {1, 2, 5, 3}, 11);
    write("contiguous2", extents2, H5T_IEEE_F32LE, {}, 12);
    write("chunked3", extents3, H5T_IEEE_F32LE, {2, 1, 3, 4, 2}, 13);
    write("contiguous3", extents3, H5T_IEEE_F64LE, {}, 14);
    H5Fclose(file);
  }
  comm.barrier();

  const io::File file = io::File::open(comm, path);
  const io::DatasetInfo chunked = io::dataset_info(file, "chunked2");
  CHECK(chunked.dims == std::vector<Index>{2, 3, 12, 10});
  CHECK(chunked.dtype == io::DataType::float64);
  CHECK(chunked.chunk_dims == std::vector<Index>{1, 2, 5, 3});
  const io::DatasetInfo contiguous = io::dataset_info(file, "contiguous3");
  CHECK(contiguous.dims == std::vector<Index>{2, 3, 8, 6, 5});
  CHECK(contiguous.chunk_dims.empty());
  CHECK(io::dataset_info(file, "chunked3").dtype == io::DataType::float32);

  struct Case {
    const char* name;
    std::vector<Index> extents;
    bool stored_as_float;
    std::uint64_t seed;
  };
  for (const Case& k :
       {Case{"chunked2", extents2, false, 11}, Case{"contiguous2", extents2, true, 12},
        Case{"chunked3", extents3, true, 13}, Case{"contiguous3", extents3, false, 14}}) {
    for (const Decomposition& d : decompositions_for(comm.size(), k.extents)) {
      INFO(k.name << " on " << d.describe());
      // The file's values after its own rounding, then converted to the tensor's type.
      auto as_float = [&](Index n, Index c, const SpatialIndex& g) {
        const double v = cell_value(k.seed, k.extents, channels, n, c, g);
        return static_cast<float>(k.stored_as_float ? static_cast<float>(v) : v);
      };
      auto as_double = [&](Index n, Index c, const SpatialIndex& g) {
        const double v = cell_value(k.seed, k.extents, channels, n, c, g);
        return k.stored_as_float ? static_cast<double>(static_cast<float>(v)) : v;
      };
      ShardTensor<float> f =
          sentinel_shard<float>(d, comm.rank(), samples, channels, test_ghosts(d.ndims()));
      io::read_field(file, k.name, 0, f, true);
      CHECK(wrong_cells(f, 0, true, as_float) == 0);
      ShardTensor<double> g = sentinel_shard<double>(d, comm.rank(), 1, channels, {});
      io::read_field(file, k.name, 1, g);
      CHECK(wrong_cells(g, 1, false, as_double) == 0);
    }
  }
}

TEST_CASE("a float64 dataset written by write_field reads into a float ShardTensor",
          "[io][field]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const std::string path = tmp.path("convert.h5");
  const std::vector<Index> extents{10, 9, 4};
  const Decomposition d = Decomposition::automatic(extents, comm.size());
  {
    io::File file = io::File::create(comm, path);
    io::create_field_dataset(file, "u", 2, 3, extents, io::DataType::float64);
    io::write_field(file, "u", 0, random_shard<double>(d, comm.rank(), 2, 3, {}, 5, 0));
    io::create_field_dataset(file, "v", 2, 3, extents, io::DataType::float32, {1, 3, 5, 5, 4});
    io::write_field(file, "v", 0, random_shard<double>(d, comm.rank(), 2, 3, {}, 6, 0));
  }
  const io::File file = io::File::open(comm, path);
  CHECK(io::dataset_info(file, "u").dtype == io::DataType::float64);
  ShardTensor<float> u = sentinel_shard<float>(d, comm.rank(), 2, 3, {});
  io::read_field(file, "u", 0, u);
  CHECK(wrong_cells(u, 0, false, [&](Index n, Index c, const SpatialIndex& g) {
          return static_cast<float>(cell_value(5, extents, 3, n, c, g));
        }) == 0);
  ShardTensor<double> v = sentinel_shard<double>(d, comm.rank(), 2, 3, {});
  io::read_field(file, "v", 0, v);
  CHECK(wrong_cells(v, 0, false, [&](Index n, Index c, const SpatialIndex& g) {
          return static_cast<double>(static_cast<float>(cell_value(6, extents, 3, n, c, g)));
        }) == 0);
}

TEST_CASE("data-parallel groups write and read different samples in one collective call",
          "[io][field]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const int groups = comm.size() % 2 == 0 ? 2 : comm.size();
  const RankMesh mesh = comm.mesh(groups);
  const std::vector<Index> extents{12, 9};
  const Decomposition d = Decomposition::automatic(extents, mesh.domain.size());
  const Index channels = 2;
  const std::string path = tmp.path("samples.h5");
  {
    io::File file = io::File::create(comm, path);
    io::create_field_dataset(file, "u", groups + 1, channels, extents, io::DataType::float32);
    // Group g writes sample g; the last group also writes the extra last sample.
    const Index first = mesh.data_group;
    const Index batch = mesh.data_group == groups - 1 ? 2 : 1;
    io::write_field(file, "u", first,
                    random_shard<float>(d, mesh.domain.rank(), batch, channels,
                                        GhostWidths::uniform(1, 2), 21, first));
  }
  const io::File file = io::File::open(comm, path);
  // Group g reads sample (g + 1) mod (groups + 1), with ghosts; every rank of a group alike.
  const Index first = (mesh.data_group + 1) % (groups + 1);
  ShardTensor<float> t =
      sentinel_shard<float>(d, mesh.domain.rank(), 1, channels, GhostWidths::uniform(2, 2));
  io::read_field(file, "u", first, t, true);
  CHECK(wrong_cells(t, first, true, [&](Index n, Index c, const SpatialIndex& g) {
          return static_cast<float>(cell_value(21, extents, channels, n, c, g));
        }) == 0);
  // Each rank on its own sample (ranks of one group differ too).
  const Index own = comm.rank() % (groups + 1);
  ShardTensor<float> s = sentinel_shard<float>(d, mesh.domain.rank(), 1, channels, {});
  io::read_field(file, "u", own, s);
  CHECK(wrong_cells(s, own, false, [&](Index n, Index c, const SpatialIndex& g) {
          return static_cast<float>(cell_value(21, extents, channels, n, c, g));
        }) == 0);
}

TEST_CASE("replicated arrays and attributes round trip", "[io][array]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const std::string path = tmp.path("checkpoint.h5");
  std::vector<float> weight(4 * 3 * 3 * 3);
  std::vector<double> bias(4);
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = float(hashed_uniform(31, i));
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = hashed_uniform(32, i);
  const std::vector<std::uint64_t> rng{0x9E3779B97F4A7C15ull, 42, ~0ull};
  const std::int64_t step = 123456789012345ll;
  {
    io::File file = io::File::create(comm, path);
    io::write_array(file, "parameters/enc.0.conv.weight", {4, 3, 3, 3}, weight.data());
    io::write_array(file, "parameters/enc.0.conv.bias", bias);
    io::write_array(file, "optimizer/step", {}, &step);
    io::write_array(file, "rng", rng);
    io::write_attribute(file, "/", "model", "unet");
    io::write_attribute(file, "/", "model", std::string("unet-2d"));  // replaces
    io::write_attribute(file, "/", "epoch", 7);
    io::write_attribute(file, "/", "learning_rate", 1.25e-3);
    io::write_attribute(file, "/", "rng_state", rng);
    io::write_attribute(file, "/", "empty", std::vector<std::uint64_t>{});
    io::write_attribute(file, "parameters/enc.0.conv.weight", "layout", "OIDHW");
    io::write_attribute(file, "parameters", "count", std::int64_t(2));
    file.close();
  }
  const io::File file = io::File::open(comm, path);
  std::vector<Index> shape;
  CHECK(io::read_array<float>(file, "parameters/enc.0.conv.weight", &shape) == weight);
  CHECK(shape == std::vector<Index>{4, 3, 3, 3});
  CHECK(io::read_array<double>(file, "parameters/enc.0.conv.bias") == bias);
  // Converted on read: float file values into double.
  const std::vector<double> widened = io::read_array<double>(file, "parameters/enc.0.conv.weight");
  CHECK(widened == std::vector<double>(weight.begin(), weight.end()));
  CHECK(io::read_array<std::int64_t>(file, "optimizer/step", &shape) ==
        std::vector<std::int64_t>{step});
  CHECK(shape.empty());
  CHECK(io::read_array<std::uint64_t>(file, "rng") == rng);

  CHECK(io::list_datasets(file) == std::vector<std::string>{"optimizer/step",
                                                            "parameters/enc.0.conv.bias",
                                                            "parameters/enc.0.conv.weight", "rng"});
  CHECK(io::list_datasets(file, "parameters") ==
        std::vector<std::string>{"enc.0.conv.bias", "enc.0.conv.weight"});
  CHECK(io::has_dataset(file, "parameters/enc.0.conv.weight"));
  CHECK_FALSE(io::has_dataset(file, "parameters"));
  CHECK_FALSE(io::has_dataset(file, "missing/deeper/name"));

  CHECK(io::read_attribute<std::string>(file, "/", "model") == "unet-2d");
  CHECK(io::read_attribute<std::int64_t>(file, "/", "epoch") == 7);
  CHECK(io::read_attribute<double>(file, "/", "learning_rate") == 1.25e-3);
  CHECK(io::read_attribute<double>(file, "/", "epoch") == 7.0);
  CHECK(io::read_attribute<std::vector<std::uint64_t>>(file, "/", "rng_state") == rng);
  CHECK(io::read_attribute<std::vector<std::uint64_t>>(file, "", "empty").empty());
  CHECK(io::read_attribute<std::string>(file, "parameters/enc.0.conv.weight", "layout") == "OIDHW");
  CHECK(io::read_attribute<std::int64_t>(file, "parameters", "count") == 2);
  CHECK(io::has_attribute(file, "/", "epoch"));
  CHECK_FALSE(io::has_attribute(file, "/", "nope"));
  CHECK_FALSE(io::has_attribute(file, "no/such/object", "epoch"));

  const std::string missing_array =
      test::error_message_of([&] { io::read_array<float>(file, "parameters/enc.1.conv.weight"); });
  CHECK(test::ranks_with_error(missing_array) == comm.size());
  CHECK_THAT(missing_array,
             Contains("no dataset 'parameters/enc.1.conv.weight'") &&
                 Contains("parameters/enc.0.conv.bias, parameters/enc.0.conv.weight"));
  const std::string missing_attribute =
      test::error_message_of([&] { io::read_attribute<double>(file, "/", "lr"); });
  CHECK(test::ranks_with_error(missing_attribute) == comm.size());
  CHECK_THAT(missing_attribute, Contains("no attribute 'lr'") && Contains("learning_rate"));
  const std::string wrong_kind =
      test::error_message_of([&] { io::read_attribute<std::string>(file, "/", "epoch"); });
  CHECK(test::ranks_with_error(wrong_kind) == comm.size());
  CHECK_THAT(wrong_kind, Contains("'epoch'") && Contains("not a string"));
}

TEST_CASE("AtomicOutput replaces on commit and leaves the old file on failure", "[io][atomic]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const std::string final_path = tmp.path("state.h5");
  auto write_version = [&](std::int64_t version, bool fail) {
    io::AtomicOutput out(comm, final_path);
    CHECK(out.temporary_path().rfind(tmp.dir() + "/", 0) == 0);
    io::File file = io::File::create(comm, out.temporary_path());
    io::write_attribute(file, "/", "version", version);
    io::create_field_dataset(file, "u", 1, 1, {8, 8}, io::DataType::float32);
    if (fail) {
      // Bad data: a field of the wrong size. Every rank throws; the temporary goes away.
      const Decomposition wrong = Decomposition::automatic({8, 9}, comm.size());
      io::write_field(file, "u", 0, random_shard<float>(wrong, comm.rank(), 1, 1, {}, 1, 0));
    }
    file.close();
    out.commit();
    CHECK(out.committed());
  };
  auto version_on_disk = [&] {
    const io::File file = io::File::open(comm, final_path);
    return io::read_attribute<std::int64_t>(file, "/", "version");
  };
  auto leftovers = [&] {
    int count = 0;
    if (comm.rank() == 0)
      for (const auto& entry : std::filesystem::directory_iterator(tmp.dir()))
        if (entry.path().string() != final_path) ++count;
    MPI_Bcast(&count, 1, MPI_INT, 0, comm.get());
    return count;
  };
  write_version(1, false);
  CHECK(version_on_disk() == 1);
  CHECK(leftovers() == 0);
  const std::string message = test::error_message_of([&] { write_version(2, true); });
  CHECK(test::ranks_with_error(message) == comm.size());
  CHECK_THAT(message, Contains("dim 3 (spatial y) is 8, expected 9"));
  CHECK(version_on_disk() == 1);
  CHECK(leftovers() == 0);
  write_version(3, false);
  CHECK(version_on_disk() == 3);
  CHECK(leftovers() == 0);
}

TEST_CASE("bad files and datasets raise errors naming what differs, on every rank",
          "[io][errors]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const std::string path = tmp.path("fields.h5");
  const std::vector<Index> extents{12, 10};
  const Decomposition d = Decomposition::automatic(extents, comm.size());
  {
    io::File file = io::File::create(comm, path);
    io::create_field_dataset(file, "fields/u", 2, 3, extents, io::DataType::float32);
    io::write_array(file, "labels", std::vector<std::int64_t>{1, 2, 3});
    io::write_array(file, "ints", {2, 3, 12, 10}, std::vector<std::int32_t>(720, 1).data());
  }
  auto all_ranks_with = [&](const std::string& message, const std::string& part) {
    INFO(message);
    CHECK(test::ranks_with_error(message) == comm.size());
    CHECK_THAT(message, Contains(part));
  };
  const io::File file = io::File::open(comm, path);
  auto validate = [&](Index channels, std::vector<Index> global) {
    return test::error_message_of(
        [&] { io::validate_field_dataset(file, "fields/u", channels, global); });
  };
  CHECK(validate(3, extents).empty());
  all_ranks_with(validate(4, extents), "dim 1 (channels) is 3, expected 4");
  all_ranks_with(validate(3, {12, 11}), "dim 3 (spatial y) is 10, expected 11");
  all_ranks_with(validate(3, {13, 10}), "dim 2 (spatial x) is 12, expected 13");
  all_ranks_with(validate(3, {12, 10, 5}), "has 4 dims [2, 3, 12, 10], expected 5");
  all_ranks_with(test::error_message_of([&] {
                   io::validate_field_dataset(file, "labels", 3, {12, 10});
                 }),
                 "has 1 dims [3], expected 4");
  all_ranks_with(test::error_message_of([&] {
                   io::validate_field_dataset(file, "ints", 3, {12, 10});
                 }),
                 "holds int32, expected float32 or float64");
  all_ranks_with(test::error_message_of([&] { io::dataset_info(file, "fields/v"); }),
                 "no dataset 'fields/v' in '" + path + "'; it has fields/u, ints, labels");

  // A shard whose shape differs from the dataset's.
  ShardTensor<float> two_channels(d, comm.rank(), 1, 2);
  all_ranks_with(test::error_message_of([&] { io::read_field(file, "fields/u", 0, two_channels); }),
                 "io::read_field: dataset 'fields/u'");
  // Samples past the end on the last rank only: still raised everywhere, none hangs.
  ShardTensor<float> one(d, comm.rank(), 1, 3);
  const Index first = comm.rank() == comm.size() - 1 ? 2 : 0;
  all_ranks_with(test::error_message_of([&] { io::read_field(file, "fields/u", first, one); }),
                 "samples [2, 3) lie outside the 2 samples");
  // Writing through a read-only file.
  all_ranks_with(test::error_message_of([&] {
                   io::File& writable_alias = const_cast<io::File&>(file);
                   io::write_field(writable_alias, "fields/u", 0, one);
                 }),
                 "is open read-only");

  // Missing files and files that are not HDF5.
  const std::string missing = tmp.path("missing.h5");
  all_ranks_with(test::error_message_of([&] { io::File::open(comm, missing); }),
                 "io::File::open: no file '" + missing + "'");
  const std::string text = tmp.path("notes.txt");
  if (comm.rank() == 0) std::ofstream(text) << "not hdf5\n";
  comm.barrier();
  all_ranks_with(test::error_message_of([&] { io::File::open(comm, text); }),
                 "'" + text + "' is not an HDF5 file");
  all_ranks_with(test::error_message_of([&] { io::File::create(comm, tmp.path("no/dir/x.h5")); }),
                 "cannot create '" + tmp.path("no/dir/x.h5") + "'");
}

TEST_CASE("write_xdmf describes field datasets for ParaView", "[io][xdmf]") {
  const Communicator comm;
  const test::TempDir tmp(comm);
  const std::string h5 = tmp.path("run.h5"), xdmf = tmp.path("run.xdmf");
  {
    io::File file = io::File::create(comm, h5);
    io::create_field_dataset(file, "fields/pressure", 2, 1, {6, 5, 4}, io::DataType::float32);
    io::create_field_dataset(file, "velocity2d", 3, 2, {7, 5}, io::DataType::float64);
    io::create_field_dataset(file, "line", 1, 1, {7}, io::DataType::float64);
    const Decomposition d3 = Decomposition::automatic({6, 5, 4}, comm.size());
    io::write_field(file, "fields/pressure", 0,
                    random_shard<float>(d3, comm.rank(), 2, 1, {}, 3, 0));
  }
  io::write_xdmf(comm, h5, xdmf, {"fields/pressure", "velocity2d"},
                 io::XdmfGeometry{{0.5, 0.0, -1.0}, {0.1, 0.2, 0.3}});
  std::string text;
  if (comm.rank() == 0) {
    std::ifstream in(xdmf);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, comm.get());
  text.resize(length);
  MPI_Bcast(&text[0], length, MPI_CHAR, 0, comm.get());
  CHECK_THAT(text, Contains("<Xdmf Version=\"3.0\">") && Contains("CollectionType=\"Temporal\""));
  CHECK_THAT(text, Contains("run.h5:/fields/pressure") && Contains("run.h5:/velocity2d"));
  CHECK_THAT(text, Contains("TopologyType=\"3DCoRectMesh\" Dimensions=\"7 6 5\""));
  CHECK_THAT(text, Contains("TopologyType=\"2DCoRectMesh\" Dimensions=\"8 6\""));
  CHECK_THAT(text, Contains("ORIGIN_DXDYDZ") && Contains("ORIGIN_DXDY\""));
  CHECK_THAT(text, Contains("Name=\"velocity2d_1\"") && Contains("Name=\"velocity2d_sample2\""));
  CHECK_THAT(text, Contains("Name=\"fields_pressure_0\""));
  // Sample 1, channel 1 of velocity2d: start, stride, count.
  CHECK_THAT(text, Contains(">1 1 0 0 1 1 1 1 1 1 7 5</DataItem>"));
  CHECK_FALSE(std::filesystem::exists(xdmf + ".tmp"));
  const std::string one_d =
      test::error_message_of([&] { io::write_xdmf(comm, h5, tmp.path("line.xdmf"), {"line"}); });
  CHECK(test::ranks_with_error(one_d) == comm.size());
  CHECK_THAT(one_d, Contains("'line' has dims [1, 1, 7]"));
}
