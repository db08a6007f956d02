#pragma once
// FNO<T>: the Fourier neural operator (Li et al. 2021) on sharded 2-D and 3-D fields.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtensor/layers.hpp"
#include "shardtensor/spectral/spectral_conv.hpp"

namespace shardtensor::models {

struct FNOOptions {
  int dims = 2;                ///< spatial dims: 2 or 3
  Index in_channels = 1;       ///< channels of the input field
  Index out_channels = 1;      ///< channels of the output field
  Index width = 32;            ///< channels of the spectral blocks
  std::vector<int> modes{12};  ///< Fourier modes kept per axis (one value: every axis)
  int layers = 4;              ///< spectral blocks
  Activation activation = Activation::gelu;
  Index projection_channels = 128;  ///< hidden channels of the projection
  std::uint64_t seed = 1;           ///< initialisation: same seed, same parameters
};

/// lifting (1x1 conv: in -> width), then `layers` blocks
///   x = activation(spectral{l}(x) + bypass{l}(x))      (SpectralConv, 1x1 conv with bias)
/// then projection_hidden (1x1 conv: width -> projection_channels), the activation, and
/// projection_out (1x1 conv -> out_channels). Parameter names: "lifting.weight",
/// "spectral0.weight_real", "spectral0.weight_imag", "bypass0.weight", "bypass0.bias", ...,
/// "projection_out.bias".
///
/// Sharding: the 1x1 convolutions and activations need no communication; each SpectralConv
/// costs two all-to-alls forward and two backward (see docs/fno.md). The field must be large
/// enough for the modes: modes <= extent / 2 along every axis but the last, <= extent / 2 + 1
/// along the last, or forward throws on every rank.
template <class T>
class FNO : public Module<T> {
 public:
  FNO(const Communicator& comm, FNOOptions options, const std::string& name = "fno");

  Variable<T> forward(const Variable<T>& input) override;
  /// The input feeds only the lifting convolution.
  bool reads_owned_cells_only() const override { return true; }

  const FNOOptions& options() const { return options_; }

 private:
  std::shared_ptr<Conv<T>> make_pointwise(const std::string& name, Index in, Index out);

  Communicator comm_;
  FNOOptions options_;
  std::string name_;
  std::shared_ptr<Conv<T>> lifting_, projection_hidden_, projection_out_;
  std::vector<std::shared_ptr<SpectralConv<T>>> spectral_;
  std::vector<std::shared_ptr<Conv<T>>> bypass_;
};

extern template class FNO<float>;
extern template class FNO<double>;

}  // namespace shardtensor::models
