#pragma once
// Outputs never replace what a command reads: before anything is written, the paths a command
// will write (an output file, its XDMF sidecar) are compared with each other and with the
// paths it reads (its input, its checkpoint, its config), by inode where the files exist and
// by resolved path where they do not yet.

#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"

namespace shardtensor::io {

/// A path and what it is to the command ("--input", "the XDMF sidecar of --output").
struct RolePath {
  std::string role, path;
};

/// Whether a and b name one file: the same inode (hard links and symbolic links included)
/// when both exist, else the same absolute, normalised path.
bool same_file(const std::string& a, const std::string& b);

/// Throws shardtensor::Error on every rank (rank 0 decides, collective over `comm`) when an
/// output is one of the files read or another output, naming both roles and the path; an
/// empty path is skipped.
void require_outputs_apart(const Communicator& comm, const std::string& where,
                           const std::vector<RolePath>& outputs,
                           const std::vector<RolePath>& reads);

}  // namespace shardtensor::io
