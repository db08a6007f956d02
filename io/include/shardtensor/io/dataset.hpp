#pragma once
// Datasets: introspection, field-dataset creation and validation, listing.

#include <optional>
#include <string>
#include <vector>

#include "shardtensor/core/types.hpp"
#include "shardtensor/io/file.hpp"

namespace shardtensor::io {

/// Floating-point types of field datasets.
enum class DataType { float32, float64 };

/// "float32" / "float64".
const char* to_string(DataType type);

/// What a dataset holds.
struct DatasetInfo {
  std::vector<Index> dims;        ///< extents, slowest-varying first
  std::optional<DataType> dtype;  ///< empty if the element type is not a float type
  std::string type_description;   ///< e.g. "float32", "int64", "string", "compound"
  std::vector<Index> chunk_dims;  ///< empty if the dataset is contiguous (not chunked)

  /// "[8, 2, 32, 32]": the extents, for messages.
  std::string shape() const;
};

/// Shape, type and chunking of dataset `name` (a path such as "fields/u"). Collective.
/// A missing dataset's error lists the datasets that exist.
DatasetInfo dataset_info(const File& file, const std::string& name);

/// True if `name` exists and is a dataset. Collective.
bool has_dataset(const File& file, const std::string& name);

/// Paths of every dataset under `group` (recursively), relative to it, sorted. Collective.
std::vector<std::string> list_datasets(const File& file, const std::string& group = "/");

/// Checks that `name` is a field dataset [samples, channels, spatial...] with `channels`
/// channels, the given global spatial extents (1-3 of them) and a float type. Collective;
/// the error says what differs: number of dims, which dim with expected and found extents,
/// or the element type.
void validate_field_dataset(const File& file, const std::string& name, Index channels,
                            const std::vector<Index>& global_extents);

/// Creates a field dataset [samples, channels, global_extents...] of `type`, chunked by
/// `chunk_dims` (one per dataset dim) or contiguous if empty. Intermediate groups are
/// created. Collective; the file must be writable and `name` must not exist.
void create_field_dataset(File& file, const std::string& name, Index samples, Index channels,
                          const std::vector<Index>& global_extents, DataType type,
                          const std::vector<Index>& chunk_dims = {});

}  // namespace shardtensor::io
