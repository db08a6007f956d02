#include "shardtensor/train/channel_statistics.hpp"

#include <Kokkos_Core.hpp>
#include <cmath>

#include "shardtensor/comm/collectives.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/execution.hpp"
#include "shardtensor/io/field_io.hpp"

namespace shardtensor {

namespace {

/// x = x * scale[c] + shift[c] for every channel c.
template <class T>
void affine_per_channel(const ShardTensor<T>& x, const std::vector<double>& scale,
                        const std::vector<double>& shift, const char* where) {
  SHARDTENSOR_REQUIRE(
      Index(scale.size()) == x.channels(), where,
      "statistics for " << scale.size() << " channels, the field has " << x.channels());
  Kokkos::View<double*> s("scale", scale.size()), b("shift", shift.size());
  auto hs = Kokkos::create_mirror_view(s);
  auto hb = Kokkos::create_mirror_view(b);
  for (std::size_t c = 0; c < scale.size(); ++c) hs(c) = scale[c], hb(c) = shift[c];
  Kokkos::deep_copy(s, hs);
  Kokkos::deep_copy(b, hb);
  const auto v = x.view();
  Kokkos::parallel_for(
      where,
      Kokkos::MDRangePolicy<RightRank<5>>(
          {0, 0, 0, 0, 0}, {v.extent(0), v.extent(1), v.extent(2), v.extent(3), v.extent(4)}),
      KOKKOS_LAMBDA(const Index n, const Index c, const Index i, const Index j, const Index k) {
        v(n, c, i, j, k) = static_cast<T>(v(n, c, i, j, k) * s(c) + b(c));
      });
}

/// sums(c) += sum of channel c, sums(channels + c) += sum of its squares, over the owned
/// cells of every sample of `field`. False if a sum is not finite: a NaN or Inf among the values.
template <class T>
bool add_channel_sums(const ShardTensor<T>& field,
                      const Kokkos::View<double*, Kokkos::HostSpace>& sums) {
  bool finite = true;
  const Index channels = field.channels();
  const auto v = field.interior();
  for (Index n = 0; n < field.batch(); ++n)
    for (Index c = 0; c < channels; ++c) {
      double sum = 0, squares = 0;
      Kokkos::parallel_reduce(
          "channel_sums",
          Kokkos::MDRangePolicy<RightRank<3>>({0, 0, 0}, {v.extent(2), v.extent(3), v.extent(4)}),
          KOKKOS_LAMBDA(const Index i, const Index j, const Index k, double& s, double& q) {
            const double value = v(n, c, i, j, k);
            s += value;
            q += value * value;
          },
          sum, squares);
      sums(c) += sum;
      sums(channels + c) += squares;
      finite = finite && std::isfinite(sum) && std::isfinite(squares);
    }
  return finite;
}

/// Mean and population std per channel from global sums over `cells` values each.
ChannelStatistics statistics_from_sums(const Kokkos::View<double*, Kokkos::HostSpace>& sums,
                                       Index channels, double cells) {
  ChannelStatistics out;
  for (Index c = 0; c < channels; ++c) {
    const double mean = sums(c) / cells;
    const double variance = std::max(0.0, sums(channels + c) / cells - mean * mean);
    out.mean.push_back(mean);
    out.std.push_back(variance > 1e-24 ? std::sqrt(variance) : 1.0);
  }
  return out;
}

}  // namespace

ChannelStatistics compute_channel_statistics(const io::File& file, const std::string& name,
                                             Index channels, const Decomposition& domain,
                                             const RankMesh& mesh,
                                             const std::vector<Index>& samples) {
  const char* where = "compute_channel_statistics";
  SHARDTENSOR_REQUIRE(!samples.empty(), where, "no samples for '" << name << "'");
  const int groups = mesh.data.size();
  ShardTensor<double> field(domain, mesh.domain.rank(), 1, channels, {}, "statistics");
  // Rounds of one sample per data group; groups past the end re-read a sample they do not
  // count, so that every rank joins every collective read.
  Kokkos::View<double*, Kokkos::HostSpace> sums("sums", 2 * channels);
  const Index rounds = (Index(samples.size()) + groups - 1) / groups;
  std::string non_finite;  // the first sample with a NaN or Inf in this rank's patch
  for (Index r = 0; r < rounds; ++r) {
    const Index index = r * groups + mesh.data_group;
    const bool counted = index < Index(samples.size());
    io::read_field(file, name, samples[counted ? index : 0], field);
    if (counted && !add_channel_sums(field, sums) && non_finite.empty())
      non_finite = file.path() + ": dataset '" + name + "', sample " +
                   std::to_string(samples[index]) +
                   " holds a non-finite value (NaN or Inf, or values whose squares overflow; "
                   "found computing the normalisation statistics): fix or drop the sample";
  }
  mesh.world.agree(non_finite);  // every rank stops, with the message of the first that saw one
  allreduce(mesh.world, sums);
  return statistics_from_sums(sums, channels,
                              double(samples.size()) * double(domain.global_cells()));
}

template <class T>
ChannelStatistics field_channel_statistics(const Communicator& comm, const ShardTensor<T>& field) {
  Kokkos::View<double*, Kokkos::HostSpace> sums("sums", 2 * field.channels());
  add_channel_sums(field, sums);
  allreduce(comm, sums);
  return statistics_from_sums(sums, field.channels(),
                              double(field.batch()) * double(field.decomposition().global_cells()));
}

template <class T>
void normalize(const ShardTensor<T>& x, const ChannelStatistics& statistics) {
  std::vector<double> scale, shift;
  for (Index c = 0; c < statistics.channels(); ++c) {
    scale.push_back(1.0 / statistics.std[c]);
    shift.push_back(-statistics.mean[c] / statistics.std[c]);
  }
  affine_per_channel(x, scale, shift, "normalize");
}

template <class T>
void denormalize(const ShardTensor<T>& x, const ChannelStatistics& statistics) {
  affine_per_channel(x, statistics.std, statistics.mean, "denormalize");
}

template void normalize(const ShardTensor<float>&, const ChannelStatistics&);
template void normalize(const ShardTensor<double>&, const ChannelStatistics&);
template void denormalize(const ShardTensor<float>&, const ChannelStatistics&);
template void denormalize(const ShardTensor<double>&, const ChannelStatistics&);
template ChannelStatistics field_channel_statistics(const Communicator&, const ShardTensor<float>&);
template ChannelStatistics field_channel_statistics(const Communicator&,
                                                    const ShardTensor<double>&);

}  // namespace shardtensor
