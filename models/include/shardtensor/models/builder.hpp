#pragma once
// build_model: a U-Net, FNO, ViT or sequential network from a YAML config's `model:` section.

#include <yaml-cpp/yaml.h>

#include <memory>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"
#include "shardtensor/models/unet.hpp"
#include "shardtensor/layers/module.hpp"

namespace shardtensor::models {

/// What the data fixes about a model: spatial dims, input / output channels and, where
/// known, the global field extents (needed only by models with grid-sized parameters: a
/// ViT's learned positional embedding).
struct ModelShape {
  int dims = 2;
  Index in_channels = 1;
  Index out_channels = 1;
  std::vector<Index> extents = {};  ///< empty: not known
};

/// Builds the model described by `model` (the map under the config's `model:` key; see
/// docs/models.md for the schema). Every config error (unknown key, unknown value, wrong
/// type, missing key, bad layer option) throws Error naming the key path (`key` is the name
/// of `model` itself, e.g. "model.layers[2].kernel"), the YAML line and the accepted values.
/// Parameters depend only on the config (and its seeds), not on the rank count.
template <class T>
std::shared_ptr<Module<T>> build_model(const YAML::Node& model, const Communicator& comm,
                                       const ModelShape& shape, const std::string& key = "model");

/// The UNetOptions of a `type: unet` model map (the checks build_model makes).
UNetOptions unet_options(const YAML::Node& model, const ModelShape& shape,
                         const std::string& key = "model");

extern template std::shared_ptr<Module<float>> build_model<float>(const YAML::Node&,
                                                                  const Communicator&,
                                                                  const ModelShape&,
                                                                  const std::string&);
extern template std::shared_ptr<Module<double>> build_model<double>(const YAML::Node&,
                                                                    const Communicator&,
                                                                    const ModelShape&,
                                                                    const std::string&);

}  // namespace shardtensor::models
