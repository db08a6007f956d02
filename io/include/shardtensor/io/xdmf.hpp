#pragma once
// XDMF 3 sidecar files, so ParaView and VisIt open field datasets of an HDF5 file.

#include <array>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::io {

/// Position of the grid in space: coordinates of the first cell's lower corner and the cell
/// size, per spatial dim of the datasets (dim 0 slowest-varying, as in the arrays).
struct XdmfGeometry {
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  std::array<double, 3> spacing{1.0, 1.0, 1.0};
};

/// Writes `xdmf_path` describing each field dataset [samples, channels, x, y(, z)] of the
/// closed HDF5 file `h5_path` as a uniform 2-D or 3-D grid (CoRectMesh, cell-centred
/// values): one temporal collection per dataset, one time step per sample, one scalar
/// attribute "<dataset>_<channel>" per channel, each a HyperSlab into the HDF5 dataset (no
/// data is copied). The XDMF names the HDF5 file relative to its own directory when both
/// lie in the same one. Collective: rank 0 reads the shapes and writes the file (through a
/// temporary name); errors are raised on every rank.
void write_xdmf(const Communicator& comm, const std::string& h5_path, const std::string& xdmf_path,
                const std::vector<std::string>& datasets, const XdmfGeometry& geometry = {});

}  // namespace shardtensor::io
