#pragma once
// Upsample<T>: nearest or (bi/tri)linear upsampling of a sharded field by integer factors.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtensor/kernels/upsample.hpp"  // UpsampleMode
#include "shardtensor/layers/halo_padding.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor {

/// Output cell o along an axis scaled by s is owned by the rank owning input cell o / s, so
/// the output split is the input split times s. Nearest needs no communication; linear
/// (edges clamped; `coordinates` as in kernels/upsample.hpp: PyTorch's align_corners=False,
/// align_corners=True, or ONNX's asymmetric) reads at most one ghost cell per side (each
/// output's sources lie within a cell of o / s), filled by the halo exchange inside the field
/// and by replicate padding at its edges; where one shard holds the whole field, the kernels
/// read the input itself, clamped to its ends.
template <class T>
class Upsample : public Module<T> {
 public:
  Upsample(const Communicator& comm, std::vector<int> scale, UpsampleMode mode,
           const std::string& name = "upsample",
           LinearCoordinates coordinates = LinearCoordinates::half_pixel);
  Variable<T> forward(const Variable<T>& input) override;

 private:
  Communicator comm_;
  std::array<int, max_spatial_dims> scale_{1, 1, 1};
  int ndims_;
  UpsampleMode mode_;
  LinearCoordinates coordinates_;
  std::string name_, where_;
  std::shared_ptr<HaloPadding<T>> halo_;  // shared with backward closures  // linear mode
  std::optional<kernels::UpsamplePlan<T>> plan_;  // the last input's shape's tables
};

extern template class Upsample<float>;
extern template class Upsample<double>;

}  // namespace shardtensor
