#include "run_setup.hpp"

#include <algorithm>
#include <cmath>

#include "shardtensor/comm/redistribute.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/core/memory_tracker.hpp"
#include "shardtensor/models/builder.hpp"
#include "shardtensor/layers/redistribute_field.hpp"  // same_global_field
#include "shardtensor/train/batch_reader.hpp"
#include "shardtensor/train/parameter_limit.hpp"
#include "shardtensor/train/training_step.hpp"

namespace shardtensor::impl {

template <class T>
std::vector<std::pair<double, double>> squared_errors(const Communicator& comm,
                                                      const ShardTensor<T>& prediction,
                                                      const ShardTensor<T>& target) {
  const bool resplit = !prediction.same_layout(target) && prediction.batch() == target.batch() &&
                       prediction.channels() == target.channels() &&
                       same_global_field(prediction.decomposition(), target.decomposition());
  const ShardTensor<T> on_target =
      resplit ? redistribute(comm, prediction, target.decomposition(), target.ghosts())
              : prediction;
  SHARDTENSOR_REQUIRE(on_target.same_layout(target), "relative L2 error",
                      "prediction (batch "
                          << prediction.batch() << ", channels " << prediction.channels() << ", "
                          << prediction.decomposition().describe() << ") and target (batch "
                          << target.batch() << ", channels " << target.channels() << ", "
                          << target.decomposition().describe() << ") differ");
  const auto p = on_target.interior(), y = target.interior();
  std::vector<std::pair<double, double>> out;
  for (std::size_t n = 0; n < p.extent(0); ++n) {
    double error = 0, norm = 0;
    Kokkos::parallel_reduce(
        "relative_l2_sums",
        Kokkos::MDRangePolicy<RightRank<4>>({0, 0, 0, 0},
                                            {p.extent(1), p.extent(2), p.extent(3), p.extent(4)}),
        KOKKOS_LAMBDA(const Index c, const Index i, const Index j, const Index k, double& e,
                      double& s) {
          const double d = double(p(n, c, i, j, k)) - double(y(n, c, i, j, k));
          e += d * d;
          s += double(y(n, c, i, j, k)) * double(y(n, c, i, j, k));
        },
        error, norm);
    out.emplace_back(error, norm);
  }
  return out;
}

template <class T>
Setup<T> set_up(const Communicator& world, const RunConfig& config, const io::File& file,
                const std::string& input, const std::string& target, bool target_required,
                Index out_channels) {
  // The domain and data-parallel communicators move device memory as parallel.backend says.
  RankMesh mesh = make_mesh(world.with_options(config.parallel.comm), config.parallel.data_groups);
  FieldData data = inspect(file, input, target, target_required);
  if (out_channels > 0) {
    SHARDTENSOR_REQUIRE(!data.has_target || data.target_channels == out_channels, "infer",
                        file.path() << ": target '" << target << "' has " << data.target_channels
                                    << " channels, the model predicts " << out_channels);
    data.target_channels = out_channels;
  }
  Decomposition domain = domain_decomposition(data, config, mesh.domain.size());
  // Before the model, the statistics or any batch is allocated.
  require_batch_fits(world, file, data, domain, target_required ? config.training.batch_size : 1,
                     sizeof(T), config.memory.budget_mib);
  std::shared_ptr<Module<T>> model;
  {
    const auto limit = parameter_limit(world, config, target_required);
    model = models::build_model<T>(
        config.model, mesh.domain,
        {data.dims, data.input_channels, data.target_channels, data.extents});
  }
  config.configure_layers(*model);
  return Setup<T>{std::move(mesh), std::move(data), std::move(domain), std::move(model)};
}

template <class T>
std::pair<double, double> validate(Setup<T>& s, const RunConfig& config, const io::File& file,
                                   const std::vector<Index>& samples,
                                   const ChannelStatistics& input_statistics,
                                   const ChannelStatistics& target_statistics) {
  s.model->eval();
  const NoGradGuard no_grad;  // nothing here runs backward: keep no graph
  const int groups = s.mesh.data.size();
  BatchReader<T> reader(file, {config.data.input, config.data.target},
                        {s.data.input_channels, s.data.target_channels}, s.domain,
                        s.mesh.domain.rank(), false);
  double loss_sum = 0, relative_sum = 0;
  const Index rounds = (Index(samples.size()) + groups - 1) / groups;
  for (Index r = 0; r < rounds; ++r) {
    const Index index = r * groups + s.mesh.data_group;
    const bool counted = index < Index(samples.size());
    reader.start({samples[counted ? index : 0]});
    std::vector<ShardTensor<T>> batch = reader.finish();
    normalize(batch[0], input_statistics);
    ShardTensor<T> target = batch[1];
    ShardTensor<T> normalized_target =
        ShardTensor<T>::uninitialized(s.domain, s.mesh.domain.rank(), 1, target.channels());
    Kokkos::deep_copy(normalized_target.view(), target.view());
    normalize(normalized_target, target_statistics);
    MemoryCategoryScope graph_memory(MemoryCategory::activations);
    const Variable<T> prediction = s.model->forward(Variable<T>::field(batch[0]));
    const double loss = scalar_value(loss_by_name(config.training.loss, s.mesh.domain, prediction,
                                                  Variable<T>::field(normalized_target)));
    denormalize(prediction.value(), target_statistics);
    const auto sums = squared_errors(s.mesh.domain, prediction.value(), target)[0];
    const double error = sum_over(s.mesh.domain, sums.first);
    const double norm = sum_over(s.mesh.domain, sums.second);
    if (counted) {
      loss_sum += loss;
      relative_sum += std::sqrt(error / std::max(norm, 1e-300));
    }
  }
  s.model->train();
  // Every domain rank of a group holds the same sums: combine over the data groups only.
  const double n = double(samples.size());
  return {sum_over(s.mesh.data, loss_sum) / n, sum_over(s.mesh.data, relative_sum) / n};
}

#define SHARDTENSOR_RUN_SETUP(T)                                                      \
  template Setup<T> set_up<T>(const Communicator&, const RunConfig&, const io::File&, \
                              const std::string&, const std::string&, bool, Index);   \
  template std::vector<std::pair<double, double>> squared_errors<T>(                  \
      const Communicator&, const ShardTensor<T>&, const ShardTensor<T>&);             \
  template std::pair<double, double> validate<T>(                                     \
      Setup<T>&, const RunConfig&, const io::File&, const std::vector<Index>&,        \
      const ChannelStatistics&, const ChannelStatistics&);
SHARDTENSOR_RUN_SETUP(float)
SHARDTENSOR_RUN_SETUP(double)
#undef SHARDTENSOR_RUN_SETUP

}  // namespace shardtensor::impl
