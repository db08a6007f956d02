#pragma once
// Replicated arrays (every rank holds the same values): checkpoints, parameters, metadata.

#include <cstring>
#include <string>
#include <vector>

#include "shardtensor/core/types.hpp"
#include "shardtensor/io/file.hpp"
#include "shardtensor/io/impl/element_type.hpp"

namespace shardtensor {
namespace impl {
void write_array(io::File& file, const std::string& name, const std::vector<Index>& shape,
                 ElementType type, const void* data);
/// Resizes `bytes` and fills it with the dataset converted to `type`; sets `shape`.
void read_array(const io::File& file, const std::string& name, ElementType type,
                std::vector<unsigned char>& bytes, std::vector<Index>& shape);
}  // namespace impl

namespace io {

/// Creates dataset `name` of `shape` (empty: a scalar) and element type T, and writes
/// `data` (C order, product of shape values). Every rank holds the same data; creation is
/// collective, rank 0 writes the values. Intermediate groups are created: names such as
/// "parameters/enc.0.conv.weight" work. `name` must not exist yet.
/// T: float, double, std::int32_t, std::int64_t or std::uint64_t.
template <class T>
void write_array(File& file, const std::string& name, const std::vector<Index>& shape,
                 const T* data) {
  impl::write_array(file, name, shape, impl::element_type_of<T>(), data);
}

template <class T>
void write_array(File& file, const std::string& name, const std::vector<T>& values) {
  impl::write_array(file, name, {static_cast<Index>(values.size())}, impl::element_type_of<T>(),
                    values.data());
}

/// Reads the whole dataset `name` on every rank, converted to T (rank 0 reads, then
/// broadcasts). Collective. Its shape goes to `*shape` if given.
template <class T>
std::vector<T> read_array(const File& file, const std::string& name,
                          std::vector<Index>* shape = nullptr) {
  std::vector<unsigned char> bytes;
  std::vector<Index> found_shape;
  impl::read_array(file, name, impl::element_type_of<T>(), bytes, found_shape);
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  if (shape) *shape = found_shape;
  return values;
}

}  // namespace io
}  // namespace shardtensor
