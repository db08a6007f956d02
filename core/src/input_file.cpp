#include "shardtensor/core/input_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

const char* kind_of(std::filesystem::file_type type) {
  using std::filesystem::file_type;
  switch (type) {
    case file_type::directory: return "a directory";
    case file_type::fifo: return "a named pipe (FIFO)";
    case file_type::socket: return "a socket";
    case file_type::block: return "a block device";
    case file_type::character: return "a character device";
    default: return "not a regular file";
  }
}

}  // namespace

void require_input_file(const std::string& path, const std::string& what, const char* where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);  // follows links: loops are errors
  SHARDTENSOR_REQUIRE(!ec && fs::exists(status), where,
                      "cannot open " << what << " '" << path << "': "
                                     << (ec ? ec.message() : "no such file"));
  SHARDTENSOR_REQUIRE(fs::is_regular_file(status), where,
                      what << " '" << path << "' is " << kind_of(status.type())
                           << ", not a regular file");
  SHARDTENSOR_REQUIRE(::access(path.c_str(), R_OK) == 0, where,
                      "cannot read " << what << " '" << path << "': " << std::strerror(errno));
}

}  // namespace shardtensor
