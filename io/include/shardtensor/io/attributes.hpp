#pragma once
// Attributes on the file root or a named group/dataset: run metadata, RNG state.

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtensor/io/file.hpp"

namespace shardtensor {
namespace impl {
void write_string_attribute(io::File& file, const std::string& object, const std::string& name,
                            const std::string& value);
void write_int64_attribute(io::File& file, const std::string& object, const std::string& name,
                           std::int64_t value);
void write_double_attribute(io::File& file, const std::string& object, const std::string& name,
                            double value);
void write_uint64s_attribute(io::File& file, const std::string& object, const std::string& name,
                             const std::vector<std::uint64_t>& value);
std::string read_string_attribute(const io::File& file, const std::string& object,
                                  const std::string& name);
std::int64_t read_int64_attribute(const io::File& file, const std::string& object,
                                  const std::string& name);
double read_double_attribute(const io::File& file, const std::string& object,
                             const std::string& name);
std::vector<std::uint64_t> read_uint64s_attribute(const io::File& file, const std::string& object,
                                                  const std::string& name);
}  // namespace impl

namespace io {

/// Writes (or replaces) attribute `name` of `object` ("/" for the file root, or the path of a
/// group or dataset). Stored types: strings (std::string, const char*) as strings, integers
/// as int64, floating point as double, std::vector<std::uint64_t> as a uint64 array.
/// Collective; every rank must pass the same value.
template <class T>
void write_attribute(File& file, const std::string& object, const std::string& name,
                     const T& value) {
  if constexpr (std::is_same<T, std::vector<std::uint64_t>>::value) {
    impl::write_uint64s_attribute(file, object, name, value);
  } else if constexpr (std::is_convertible<const T&, std::string>::value) {
    impl::write_string_attribute(file, object, name, std::string(value));
  } else if constexpr (std::is_integral<T>::value) {
    impl::write_int64_attribute(file, object, name, static_cast<std::int64_t>(value));
  } else {
    static_assert(std::is_floating_point<T>::value,
                  "attributes are strings, integers, floating point or vector<uint64_t>");
    impl::write_double_attribute(file, object, name, static_cast<double>(value));
  }
}

/// Reads attribute `name` of `object` as T: std::string, std::int64_t, double or
/// std::vector<std::uint64_t> (HDF5 converts between numeric types). Collective.
template <class T>
T read_attribute(const File& file, const std::string& object, const std::string& name) {
  if constexpr (std::is_same<T, std::vector<std::uint64_t>>::value) {
    return impl::read_uint64s_attribute(file, object, name);
  } else if constexpr (std::is_same<T, std::string>::value) {
    return impl::read_string_attribute(file, object, name);
  } else if constexpr (std::is_same<T, std::int64_t>::value) {
    return impl::read_int64_attribute(file, object, name);
  } else {
    static_assert(std::is_same<T, double>::value,
                  "read_attribute<T>: T is std::string, std::int64_t, double or "
                  "std::vector<std::uint64_t>");
    return impl::read_double_attribute(file, object, name);
  }
}

/// True if `object` exists and has attribute `name`. Collective.
bool has_attribute(const File& file, const std::string& object, const std::string& name);

}  // namespace io
}  // namespace shardtensor
