#include "shardtensor/train/checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "shardtensor/core/error.hpp"
#include "shardtensor/core/memory_limits.hpp"
#include "shardtensor/io/array_io.hpp"
#include "shardtensor/io/atomic_output.hpp"
#include "shardtensor/io/attributes.hpp"
#include "shardtensor/io/dataset.hpp"
#include "shardtensor/io/file.hpp"

namespace shardtensor {

namespace {

constexpr const char* format_name = "shardtensor-checkpoint-1";

// Every dataset a checkpoint holds carries a checksum of its values (attribute "checksum":
// FNV-1a 64 over the values as float64, so a float dataset read as double checks the same),
// and the root says so ("checksums"); a file without them (the PyTorch exporter's) loads
// unchecked. A flipped bit in a value is caught on load, on every rank, naming the dataset.
constexpr const char* checksum_attribute = "checksum";
constexpr const char* checksums_marker = "checksums";
constexpr const char* checksum_kind = "fnv1a64 of the values as float64";

/// FNV-1a 64 of `count` bytes, continuing from `hash`.
std::uint64_t fnv1a(const unsigned char* bytes, std::size_t count,
                    std::uint64_t hash = 1469598103934665603ull) {
  for (std::size_t i = 0; i < count; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

/// A dataset's checksum: FNV-1a 64 over its values as float64.
template <class T>
std::uint64_t checksum_of(const T* values, std::size_t count) {
  std::uint64_t hash = fnv1a(nullptr, 0);
  for (std::size_t i = 0; i < count; ++i) {
    const double v = static_cast<double>(values[i]);
    unsigned char bytes[sizeof(double)];
    std::memcpy(bytes, &v, sizeof v);
    hash = fnv1a(bytes, sizeof bytes, hash);
  }
  return hash;
}

/// The stored config's checksum (attribute "config_checksum"): FNV-1a 64 over its bytes, so
/// that a damaged config cannot rebuild another model unnoticed.
std::uint64_t text_checksum(const std::string& text) {
  return fnv1a(reinterpret_cast<const unsigned char*>(text.data()), text.size());
}

/// Writes dataset `name` of `shape` and its checksum.
template <class T>
void write_checked(io::File& file, const std::string& name, const std::vector<Index>& shape,
                   const std::vector<T>& values) {
  io::write_array(file, name, shape, values.data());
  io::write_attribute(file, name, checksum_attribute,
                      std::vector<std::uint64_t>{checksum_of(values.data(), values.size())});
}
template <class T>
void write_checked(io::File& file, const std::string& name, const std::vector<T>& values) {
  write_checked(file, name, {static_cast<Index>(values.size())}, values);
}

/// Throws (on every rank) if dataset `name` of a checksummed checkpoint lacks its checksum or
/// its values do not match it. Collective.
void verify_checksum(const io::File& file, const std::string& name) {
  if (!io::has_attribute(file, "/", checksums_marker)) return;  // an unchecked file
  SHARDTENSOR_REQUIRE(io::has_attribute(file, name, checksum_attribute), "load_checkpoint",
                      file.path() << ": dataset '" << name << "' has no checksum: the file is "
                                  << "damaged or was altered");
  const std::vector<double> values = io::read_array<double>(file, name);
  const std::uint64_t stored =
      io::read_attribute<std::vector<std::uint64_t>>(file, name, checksum_attribute).at(0);
  SHARDTENSOR_REQUIRE(checksum_of(values.data(), values.size()) == stored, "load_checkpoint",
                      file.path() << ": dataset '" << name << "' does not match its checksum: "
                                  << "the file is corrupt (damaged on disk or altered); use "
                                  << "another checkpoint");
}

template <class T>
std::vector<T> host_values(const ReplicatedView<T>& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<T>(host.data(), host.data() + host.extent(0));
}

template <class T>
void set_values(const ReplicatedView<T>& view, const std::vector<T>& values) {
  auto host = Kokkos::create_mirror_view(view);
  std::copy(values.begin(), values.end(), host.data());
  Kokkos::deep_copy(view, host);
}

/// Reads `name` into `view`; its size must match. Collective.
template <class T>
void load_view(const io::File& file, const std::string& name, const ReplicatedView<T>& view,
               const char* what) {
  SHARDTENSOR_REQUIRE(io::has_dataset(file, name), "load_checkpoint",
                      file.path() << " has no " << what << " '" << name
                                  << "' (the model or optimizer does not match the checkpoint)");
  // The declared size first: a damaged or foreign file may declare any size, and reading
  // (the checksum reads every value) would allocate it.
  const io::DatasetInfo info = io::dataset_info(file, name);
  std::uint64_t declared = 1;
  for (const Index e : info.dims) declared = saturating_product(declared, std::uint64_t(e));
  SHARDTENSOR_REQUIRE(declared == view.extent(0), "load_checkpoint",
                      file.path() << ": " << what << " '" << name << "' has " << declared
                                  << " values " << info.shape() << ", the model expects "
                                  << view.extent(0));
  verify_checksum(file, name);
  std::vector<Index> shape;
  const std::vector<T> values = io::read_array<T>(file, name, &shape);
  SHARDTENSOR_REQUIRE(values.size() == view.extent(0), "load_checkpoint",
                      file.path() << ": " << what << " '" << name << "' has " << values.size()
                                  << " values, the model expects " << view.extent(0));
  set_values(view, values);
}

void write_statistics(io::File& file, const std::string& prefix, const ChannelStatistics& s) {
  write_checked(file, "normalization/" + prefix + "_mean", s.mean);
  write_checked(file, "normalization/" + prefix + "_std", s.std);
}

ChannelStatistics read_statistics(const io::File& file, const std::string& prefix) {
  ChannelStatistics s;
  verify_checksum(file, "normalization/" + prefix + "_mean");
  verify_checksum(file, "normalization/" + prefix + "_std");
  s.mean = io::read_array<double>(file, "normalization/" + prefix + "_mean");
  s.std = io::read_array<double>(file, "normalization/" + prefix + "_std");
  return s;
}

TrainingState read_state(const io::File& file) {
  TrainingState state;
  state.epoch = io::read_attribute<std::int64_t>(file, "/", "epoch");
  state.step = io::read_attribute<std::int64_t>(file, "/", "step");
  state.seed = io::read_attribute<std::vector<std::uint64_t>>(file, "/", "rng").at(0);
  state.config = io::read_attribute<std::string>(file, "/", "config");
  if (io::has_attribute(file, "/", "config_checksum"))  // checkpoints of 2026-11-26 on
    SHARDTENSOR_REQUIRE(
        io::read_attribute<std::vector<std::uint64_t>>(file, "/", "config_checksum").at(0) ==
            text_checksum(state.config),
        "load_checkpoint",
        file.path() << ": the stored config does not match its checksum: the file is corrupt "
                    << "(damaged on disk or altered); use another checkpoint");
  state.input_statistics = read_statistics(file, "input");
  state.target_statistics = read_statistics(file, "target");
  if (io::has_attribute(file, "/", "dims"))
    state.dims = io::read_attribute<std::int64_t>(file, "/", "dims");
  return state;
}

void require_checkpoint(const io::File& file) {
  SHARDTENSOR_REQUIRE(io::has_attribute(file, "/", "format") &&
                          io::read_attribute<std::string>(file, "/", "format") == format_name,
                      "load_checkpoint",
                      file.path() << " is not a ShardTensor checkpoint (" << format_name << ")");
}

/// A save replaces a checkpoint, never another file: a path that names the config, a data
/// file or a solver's output by mistake stops the save with its contents intact. Collective.
void require_replaceable(const Communicator& comm, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string problem;
  if (fs::is_directory(path, ec))
    problem = "'" + path + "' is a directory";
  else if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    problem = "'" + path + "' exists and is not a regular file";
  comm.agree(problem);
  if (!fs::exists(path, ec)) return;
  bool checkpoint = false;
  try {
    const io::File file = io::File::open(comm, path);
    checkpoint = io::has_attribute(file, "/", "format") &&
                 io::read_attribute<std::string>(file, "/", "format") == format_name;
  } catch (const Error&) {  // not HDF5, or damaged: not a checkpoint (every rank alike)
  }
  SHARDTENSOR_REQUIRE(checkpoint, "save_checkpoint",
                      "'" << path << "' exists and is not a ShardTensor checkpoint: it is not "
                          << "replaced (choose another path, or remove the file first)");
}

}  // namespace

template <class T>
void save_checkpoint(const Communicator& comm, const std::string& path, const Module<T>& model,
                     const Optimizer<T>* optimizer, const TrainingState& state) {
  require_replaceable(comm, path);
  io::AtomicOutput output(comm, path);
  {
    io::File file = io::File::create(comm, output.temporary_path());
    for (const auto& [name, p] : model.named_parameters()) {
      const std::vector<T> values = host_values(p.data());
      write_checked(file, "parameters/" + name, p.shape(), values);
    }
    for (const auto& [name, b] : model.named_buffers())
      write_checked(file, "buffers/" + name, host_values(b));
    if (optimizer) {
      for (const auto& [name, s] : optimizer->named_state())
        write_checked(file, "optimizer/" + name, host_values(s));
      io::write_attribute(file, "/", "optimizer_type", optimizer->type());
      io::write_attribute(file, "/", "optimizer_step_count", optimizer->step_count());
    }
    write_statistics(file, "input", state.input_statistics);
    write_statistics(file, "target", state.target_statistics);
    io::write_attribute(file, "/", "format", std::string(format_name));
    io::write_attribute(file, "/", checksums_marker, std::string(checksum_kind));
    io::write_attribute(file, "/", "precision",
                        std::string(std::is_same<T, float>::value ? "float" : "double"));
    io::write_attribute(file, "/", "epoch", state.epoch);
    io::write_attribute(file, "/", "step", state.step);
    if (state.dims > 0) io::write_attribute(file, "/", "dims", state.dims);
    io::write_attribute(file, "/", "rng",
                        std::vector<std::uint64_t>{state.seed, std::uint64_t(state.epoch),
                                                   std::uint64_t(state.step)});
    io::write_attribute(file, "/", "config", state.config);
    io::write_attribute(file, "/", "config_checksum",
                        std::vector<std::uint64_t>{text_checksum(state.config)});
    file.close();
  }
  output.commit();
}

template <class T>
TrainingState load_checkpoint(const Communicator& comm, const std::string& path,
                              const Module<T>& model, Optimizer<T>* optimizer) {
  io::File file = io::File::open(comm, path);
  require_checkpoint(file);
  for (const auto& [name, p] : model.named_parameters())
    load_view(file, "parameters/" + name, p.data(), "parameter");
  for (const auto& [name, b] : model.named_buffers())
    load_view(file, "buffers/" + name, b, "buffer");
  if (optimizer) {
    SHARDTENSOR_REQUIRE(io::has_attribute(file, "/", "optimizer_type"), "load_checkpoint",
                        path << " holds no optimizer state");
    const std::string type = io::read_attribute<std::string>(file, "/", "optimizer_type");
    SHARDTENSOR_REQUIRE(
        type == optimizer->type(), "load_checkpoint",
        path << " holds " << type << " state, the config asks for " << optimizer->type());
    for (const auto& [name, s] : optimizer->named_state())
      load_view(file, "optimizer/" + name, s, "optimizer state");
    optimizer->set_step_count(io::read_attribute<std::int64_t>(file, "/", "optimizer_step_count"));
  }
  TrainingState state = read_state(file);
  file.close();
  return state;
}

TrainingState read_checkpoint_state(const Communicator& comm, const std::string& path) {
  io::File file = io::File::open(comm, path);
  require_checkpoint(file);
  return read_state(file);
}

std::string checkpoint_name(const std::string& directory, std::int64_t step) {
  std::ostringstream name;
  name << "checkpoint_step" << std::setw(8) << std::setfill('0') << step << ".h5";
  return (std::filesystem::path(directory) / name.str()).string();
}

std::vector<std::string> list_checkpoints(const std::string& directory) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("checkpoint_step", 0) == 0 && entry.path().extension() == ".h5")
      names.push_back(entry.path().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

template void save_checkpoint(const Communicator&, const std::string&, const Module<float>&,
                              const Optimizer<float>*, const TrainingState&);
template void save_checkpoint(const Communicator&, const std::string&, const Module<double>&,
                              const Optimizer<double>*, const TrainingState&);
template TrainingState load_checkpoint(const Communicator&, const std::string&,
                                       const Module<float>&, Optimizer<float>*);
template TrainingState load_checkpoint(const Communicator&, const std::string&,
                                       const Module<double>&, Optimizer<double>*);

}  // namespace shardtensor
