#pragma once
// The one check every input path passes before it is opened: a regular file (not a named pipe,
// socket or device, whose open would wait for a writer forever; not a directory), readable,
// with the operating system's reason where it is not (a symlink loop, a missing directory,
// no permission).

#include <string>

namespace shardtensor {

/// Throws shardtensor::Error "<where>: ..." unless `path` names a regular file this process
/// may read. `what` names the file in the message ("config file", "data file").
void require_input_file(const std::string& path, const std::string& what, const char* where);

}  // namespace shardtensor
