#pragma once
// ConfigNode: a YAML map or value that knows its key path ("training.epochs"), so every
// config error names the key, the offending value and the line it came from.

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace shardtensor {

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
  /// A string that must be one of `accepted`.
  std::string choice(const std::string& key, const std::string& fallback,
                     std::initializer_list<const char*> accepted) const;

  /// Keys of this map that are not in `known` are errors (a typo must not be ignored).
  void allow_only(std::initializer_list<const char*> known) const;

  /// The check of every config map's keys, run configs and model specs alike: raises Error
  /// "<source>: <path> (line L): unknown key 'k' (did you mean 'x'?); accepted keys: a, b"
  /// for the first key of `map` that is not in `accepted` (or is no scalar).
  static void check_keys(const YAML::Node& map, const std::string& path, const std::string& source,
                         const std::vector<std::string>& accepted);
  /// Raises Error "<source>: <path> (line L): <message>".
  [[noreturn]] void fail(const std::string& message) const;
  /// Checks `condition`, else fail(message).
  void check(bool condition, const std::string& message) const {
    if (!condition) fail(message);
  }

  /// The node's value as written (for messages).
  std::string text() const;
  int line() const { return node_.Mark().line + 1; }

 private:
  ConfigNode required(const std::string& key) const;
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
