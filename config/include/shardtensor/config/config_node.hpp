#pragma once
// ConfigNode: a YAML map or value that knows its key path ("training.epochs"), so every
// config error names the key, the offending value and the line it came from.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

/// An error in a config: its message names the source, the key path, the line and the value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

class ConfigNode {
 public:
  ConfigNode(YAML::Node node, std::string path, std::string source = "config");

  /// Parses a YAML file or text; syntax errors name the source and line.
  static ConfigNode load_file(const std::string& path);
  static ConfigNode parse(const std::string& text, const std::string& source = "config");

  const YAML::Node& yaml() const { return node_; }
  const std::string& path() const { return path_; }
  bool defined() const { return node_.IsDefined() && !node_.IsNull(); }
  bool has(const std::string& key) const;

  /// The child `key` (maybe undefined); its path is "<path>.<key>".
  ConfigNode operator[](const std::string& key) const;
  /// The elements of the sequence `key` (empty when absent), paths "<path>.<key>[i]".
  std::vector<ConfigNode> sequence(const std::string& key) const;

  /// The value at `key` converted to T, or `fallback` when absent; a value of the wrong type
  /// raises an Error naming key, value and line.
  template <class T>
  T get(const std::string& key, const T& fallback) const {
    return has(key) ? (*this)[key].as<T>() : fallback;
  }
  /// The value at `key`; absent raises "missing key".
  template <class T>
  T require(const std::string& key) const {
    return required(key).as<T>();
  }
  /// This node's own value converted to T.
  template <class T>
  T as() const {
    try {
      return node_.as<T>();
    } catch (const YAML::Exception&) {
      fail("expects " + type_name<T>() + ", got '" + text() + "'");
    }
  }
  /// The value at `key`; absent raises "missing required key".
  ConfigNode required(const std::string& key) const;

  /// A string that must be one of `accepted`.
  std::string choice(const std::string& key, const std::string& fallback,
                     std::initializer_list<const char*> accepted) const;

  // Typed values with their ranges, read the same way for run configs and model specs: an
  // absent key gives `fallback`; a value of the wrong type or outside the range raises a
  // ConfigError naming the key, the value and the line.

  /// An integer in [min, INT_MAX].
  long long integer(const std::string& key, long long fallback, long long min) const;
  long long required_integer(const std::string& key, long long min) const;
  long long as_integer(long long min) const;
  /// A number in [min, max].
  double number(const std::string& key, double fallback, double min, double max) const;
  /// A non-negative 64-bit integer (a random seed).
  std::uint64_t seed(const std::string& key, std::uint64_t fallback) const;
  /// One size per spatial dim: a single integer (the same along every dim) or a list of
  /// `dims`, each at least `min`.
  std::vector<int> sizes(const std::string& key, int dims, int fallback, int min) const;
  std::vector<int> required_sizes(const std::string& key, int dims, int min) const;
  std::vector<int> as_sizes(int dims, int min) const;
  /// One of the named values of `choices`.
  template <class E>
  E named(const std::string& key, E fallback,
          const std::vector<std::pair<std::string, E>>& choices) const {
    return has(key) ? (*this)[key].as_named(choices) : fallback;
  }
  template <class E>
  E required_named(const std::string& key,
                   const std::vector<std::pair<std::string, E>>& choices) const {
    const ConfigNode value = (*this)[key];
    if (!value.defined()) value.fail("missing required key; accepted: " + names_of(choices));
    return value.as_named(choices);
  }
  template <class E>
  E as_named(const std::vector<std::pair<std::string, E>>& choices) const {
    check(node_.IsScalar(), "expects one of " + names_of(choices) + ", got '" + text() + "'");
    for (const auto& c : choices)
      if (c.first == node_.Scalar()) return c.second;
    fail("unknown value '" + text() + "'; accepted: " + names_of(choices));
  }

  /// Keys of this map that are not in `known` are errors (a typo must not be ignored).
  void allow_only(std::initializer_list<const char*> known) const;
  /// This node must be a map whose keys are all in `known`.
  void require_map(const std::vector<std::string>& known) const;

  /// The check of every config map's keys, run configs and model specs alike: raises Error
  /// "<source>: <path> (line L): unknown key 'k' (did you mean 'x'?); accepted keys: a, b"
  /// for the first key of `map` that is not in `accepted` (or is no scalar).
  static void check_keys(const YAML::Node& map, const std::string& path, const std::string& source,
                         const std::vector<std::string>& accepted);
  /// Raises ConfigError "<source>: <path> (line L): <message>".
  [[noreturn]] void fail(const std::string& message) const;
  /// Checks `condition`, else fail(message).
  void check(bool condition, const std::string& message) const {
    if (!condition) fail(message);
  }

  /// The node's value as written (for messages).
  std::string text() const;
  int line() const { return node_.Mark().line + 1; }

 private:
  template <class E>
  static std::string names_of(const std::vector<std::pair<std::string, E>>& choices) {
    std::string out;
    for (const auto& c : choices) out += (out.empty() ? "" : ", ") + c.first;
    return out;
  }
  template <class T>
  static std::string type_name() {
    return "a value of another type";
  }

  YAML::Node node_;
  std::string path_, source_;
  int parent_line_ = 0;  // for absent children: the line of the map they are missing from
};

// Names of the types config values convert to, for messages.
template <>
inline std::string ConfigNode::type_name<std::string>() {
  return "a string";
}
template <>
inline std::string ConfigNode::type_name<bool>() {
  return "true or false";
}
template <>
inline std::string ConfigNode::type_name<int>() {
  return "an integer";
}
template <>
inline std::string ConfigNode::type_name<long>() {
  return "an integer";
}
template <>
inline std::string ConfigNode::type_name<long long>() {
  return "an integer";
}
template <>
inline std::string ConfigNode::type_name<unsigned long>() {
  return "a non-negative integer";
}
template <>
inline std::string ConfigNode::type_name<double>() {
  return "a number";
}
template <>
inline std::string ConfigNode::type_name<std::vector<long>>() {
  return "a list of integers";
}
template <>
inline std::string ConfigNode::type_name<std::vector<int>>() {
  return "a list of integers";
}

/// The text of a config file; a clear error (with the OS's reason) when it cannot be read
/// or is a directory.
std::string read_config_file(const std::string& path);

/// Applies a command-line override "a.b.c=value" to `root` (value parsed as YAML, so
/// numbers, booleans and lists work). Creates missing maps. Raises Error on a malformed
/// assignment or when a key on the path is not a map.
void apply_override(YAML::Node& root, const std::string& assignment);

}  // namespace shardtensor
