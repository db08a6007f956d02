#include "run_data.hpp"

#include <algorithm>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_limits.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/field_io.hpp"

namespace shardtensor::impl {

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
  SHARDTENSOR_REQUIRE(
      !targets || trained.target_statistics.channels() == data.target_channels, where,
      data_path << " has " << data.target_channels << " target channel(s), " << checkpoint
                << " was trained with " << trained.target_statistics.channels());
}

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

double sum_over(const Communicator& comm, double value) {
  Kokkos::View<double*, Kokkos::HostSpace> v("value", 1);
  v(0) = value;
  allreduce(comm, v);
  return v(0);
}

}  // namespace shardtensor::impl
