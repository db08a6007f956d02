#include "shardtensor/io/output_paths.hpp"

#include <filesystem>

namespace shardtensor::io {

namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) {
    const bool same = fs::equivalent(a, b, error);
    if (!error) return same;
  }
  const fs::path pa = fs::weakly_canonical(fs::absolute(a, error), error);
  const fs::path pb = fs::weakly_canonical(fs::absolute(b, error), error);
  return pa.lexically_normal() == pb.lexically_normal();
}

void require_outputs_apart(const Communicator& comm, const std::string& where,
                           const std::vector<RolePath>& outputs,
                           const std::vector<RolePath>& reads) {
  std::string error;
  if (comm.rank() == 0) {
    for (std::size_t i = 0; i < outputs.size() && error.empty(); ++i) {
      const RolePath& out = outputs[i];
      if (out.path.empty()) continue;
      for (const RolePath& in : reads)
        if (!in.path.empty() && same_file(out.path, in.path)) {
          error = where + ": " + out.role + " '" + out.path + "' is the " + in.role + " ('" +
                  in.path + "'), which this command reads: writing it would destroy it; " +
                  "choose another path (nothing was written)";
          break;
        }
      for (std::size_t j = 0; j < i && error.empty(); ++j)
        if (!outputs[j].path.empty() && same_file(out.path, outputs[j].path))
          error = where + ": " + out.role + " '" + out.path + "' is also the " + outputs[j].role +
                  ": one would replace the other; choose another path (nothing was written)";
    }
  }
  comm.agree(error);
}

}  // namespace shardtensor::io
