#include "shardtensor/config/config_node.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "shardtensor/core/closest_name.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/input_file.hpp"

namespace shardtensor {

ConfigNode::ConfigNode(YAML::Node node, std::string path, std::string source)
    : node_(std::move(node)), path_(std::move(path)), source_(std::move(source)) {}

std::string read_config_file(const std::string& path) {
  // A directory opens as an empty stream on Linux, a named pipe waits for a writer forever:
  // name them rather than report missing keys or hang.
  require_input_file(path, "config file", "config");
  errno = 0;
  std::ifstream in(path);
  SHARDTENSOR_REQUIRE(in.good(), "config",
                      "cannot open config file '"
                          << path << "'"
                          << (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  std::stringstream text;
  text << in.rdbuf();
  // An empty file (or one of comments only) is a mistake, not a config of defaults.
  bool content = false;
  for (std::string line; std::getline(text, line) && !content;) {
    const auto first = line.find_first_not_of(" \t\r");
    content = first != std::string::npos && line[first] != '#';
  }
  SHARDTENSOR_REQUIRE(content, "config", "config file '" << path << "' is empty");
  return text.str();
}

ConfigNode ConfigNode::load_file(const std::string& path) {
  return parse(read_config_file(path), path);
}

namespace {

/// Nodes a config may hold once its aliases are expanded: far above any real config, far
/// below what nested aliases (a "billion laughs") expand to.
constexpr long max_config_nodes = 100000;

/// Cuts a value that would flood a message (a whole file given as a config) to its start.
std::string shorten(const std::string& text) {
  constexpr std::size_t keep = 100;
  if (text.size() <= keep + 20) return text;
  return text.substr(0, keep) + "... (" + std::to_string(text.size()) + " characters)";
}

/// Counts the nodes of `node` with its aliases expanded, stopping past `budget`.
long count_nodes(const YAML::Node& node, long budget) {
  long count = 1;
  if (node.IsMap() || node.IsSequence())
    for (auto it = node.begin(); it != node.end() && count <= budget; ++it)
      count += node.IsMap() ? count_nodes(it->first, budget - count) +
                                  count_nodes(it->second, budget - count)
                            : count_nodes(*it, budget - count);
  return count;
}

/// YAML allows no key twice in a map, but yaml-cpp keeps both and answers with the first:
/// a second `lr:` further down would be silently ignored.
void require_unique_keys(const YAML::Node& node, const std::string& source) {
  if (node.IsSequence())
    for (const YAML::Node& item : node) require_unique_keys(item, source);
  if (!node.IsMap()) return;
  std::map<std::string, int> lines;
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (it->first.IsScalar()) {
      const std::string key = it->first.Scalar();
      const int line = it->first.Mark().line + 1;
      const auto [seen, inserted] = lines.emplace(key, line);
      SHARDTENSOR_REQUIRE(inserted, "config",
                          source << " (line " << line << "): duplicate key '" << key
                                 << "' (first on line " << seen->second
                                 << "): a key may appear once per map");
    }
    require_unique_keys(it->second, source);
  }
}

}  // namespace

ConfigNode ConfigNode::parse(const std::string& text, const std::string& source) {
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    SHARDTENSOR_REQUIRE(documents.size() <= 1, "config",
                        source << ": " << documents.size()
                               << " YAML documents (separated by '---'); a config is one");
    YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
    if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    SHARDTENSOR_REQUIRE(count_nodes(root, max_config_nodes) <= max_config_nodes, "config",
                        source << ": more than " << max_config_nodes
                               << " YAML nodes once its aliases are expanded (nested aliases?)");
    require_unique_keys(root, source);
    SHARDTENSOR_REQUIRE(
        root.IsMap(), "config",
        source << ": the top level must be a map of keys, got '" << shorten(text) << "'");
    return ConfigNode(root, "", source);
  } catch (const YAML::ParserException& e) {
    SHARDTENSOR_FAIL("config",
                     source << " (line " << e.mark.line + 1 << "): YAML syntax error: " << e.msg);
  }
}

bool ConfigNode::has(const std::string& key) const {
  return node_.IsMap() && node_[key].IsDefined() && !node_[key].IsNull();
}

ConfigNode ConfigNode::operator[](const std::string& key) const {
  if (!node_.IsDefined() || node_.IsNull()) {
    ConfigNode child(YAML::Node(), path_.empty() ? key : path_ + "." + key, source_);
    child.parent_line_ = parent_line_;
    return child;
  }
  check(node_.IsMap(), "expects a map of keys, got '" + text() + "'");
  // A missing key of a const map is an invalid node that throws on most queries; stand in
  // a null node for it.
  const YAML::Node found = node_[key];
  ConfigNode child(found.IsDefined() ? found : YAML::Node(),
                   path_.empty() ? key : path_ + "." + key, source_);
  child.parent_line_ = line();
  return child;
}

std::vector<ConfigNode> ConfigNode::sequence(const std::string& key) const {
  std::vector<ConfigNode> out;
  if (!has(key)) return out;
  const ConfigNode list = (*this)[key];
  list.check(list.node_.IsSequence(), "expects a list, got '" + list.text() + "'");
  for (std::size_t i = 0; i < list.node_.size(); ++i) {
    ConfigNode element(list.node_[i], list.path_ + "[" + std::to_string(i) + "]", source_);
    element.parent_line_ = list.line();
    out.push_back(element);
  }
  return out;
}

std::string ConfigNode::choice(const std::string& key, const std::string& fallback,
                               std::initializer_list<const char*> accepted) const {
  const std::string value = get<std::string>(key, fallback);
  std::string list;
  for (const char* a : accepted) {
    if (value == a) return value;
    list += std::string(list.empty() ? "" : ", ") + a;
  }
  (*this)[key].fail("unknown value '" + value + "'; accepted: " + list);
}

void ConfigNode::allow_only(std::initializer_list<const char*> known) const {
  check_keys(node_, path_.empty() ? "<top level>" : path_, source_,
             std::vector<std::string>(known.begin(), known.end()));
}

void ConfigNode::require_map(const std::vector<std::string>& known) const {
  check(node_.IsMap(), "expects a map of keys, got '" + text() + "'");
  check_keys(node_, path_.empty() ? "<top level>" : path_, source_, known);
}

long long ConfigNode::integer(const std::string& key, long long fallback, long long min) const {
  return has(key) ? (*this)[key].as_integer(min) : fallback;
}

long long ConfigNode::required_integer(const std::string& key, long long min) const {
  return required(key).as_integer(min);
}

long long ConfigNode::as_integer(long long min) const {
  long long x = 0;
  check(node_.IsScalar() && YAML::convert<long long>::decode(node_, x),
        "expects an integer, got '" + text() + "'");
  check(x >= min, "must be at least " + std::to_string(min) + ", got " + std::to_string(x));
  constexpr long long most = std::numeric_limits<int>::max();
  check(x <= most, "must be at most " + std::to_string(most) + ", got " + std::to_string(x));
  return x;
}

double ConfigNode::number(const std::string& key, double fallback, double min, double max) const {
  if (!has(key)) return fallback;
  const ConfigNode value = (*this)[key];
  double x = 0;
  value.check(value.node_.IsScalar() && YAML::convert<double>::decode(value.node_, x),
              "expects a number, got '" + value.text() + "'");
  std::ostringstream range;
  range << "must lie in [" << min << ", " << max << "], got " << x;
  value.check(x >= min && x <= max, range.str());
  return x;
}

std::uint64_t ConfigNode::seed(const std::string& key, std::uint64_t fallback) const {
  if (!has(key)) return fallback;
  const ConfigNode value = (*this)[key];
  unsigned long long s = 0;
  value.check(value.node_.IsScalar() && value.node_.Scalar().find('-') == std::string::npos &&
                  YAML::convert<unsigned long long>::decode(value.node_, s),
              "expects a non-negative integer, got '" + value.text() + "'");
  return s;
}

std::vector<int> ConfigNode::sizes(const std::string& key, int dims, int fallback, int min) const {
  return has(key) ? (*this)[key].as_sizes(dims, min) : std::vector<int>(dims, fallback);
}

std::vector<int> ConfigNode::required_sizes(const std::string& key, int dims, int min) const {
  return required(key).as_sizes(dims, min);
}

std::vector<int> ConfigNode::as_sizes(int dims, int min) const {
  if (!node_.IsSequence()) return std::vector<int>(dims, int(as_integer(min)));
  check(int(node_.size()) == dims, "expects " + std::to_string(dims) +
                                       " sizes (one per spatial dim), got " +
                                       std::to_string(node_.size()));
  std::vector<int> out;
  for (std::size_t i = 0; i < node_.size(); ++i) {
    ConfigNode element(node_[i], path_ + "[" + std::to_string(i) + "]", source_);
    element.parent_line_ = line();
    out.push_back(int(element.as_integer(min)));
  }
  return out;
}

void ConfigNode::check_keys(const YAML::Node& map, const std::string& path,
                            const std::string& source, const std::vector<std::string>& accepted) {
  if (!map.IsMap()) return;
  std::string list;
  for (const std::string& k : accepted) list += (list.empty() ? "" : ", ") + k;
  for (const auto& entry : map) {
    const ConfigNode at(entry.first, path, source);
    if (!entry.first.IsScalar()) at.fail("expected a key name, got '" + at.text() + "'");
    const std::string key = entry.first.Scalar();
    if (std::find(accepted.begin(), accepted.end(), key) != accepted.end()) continue;
    const std::string closest = closest_name(key, accepted);
    at.fail("unknown key '" + key + "'" +
            (closest.empty() ? "" : " (did you mean '" + closest + "'?)") +
            "; accepted keys: " + list);
  }
}

void ConfigNode::fail(const std::string& message) const {
  const int at = node_.IsDefined() && node_.Mark().line >= 0 ? line() : parent_line_;
  std::ostringstream where;
  where << (path_.empty() ? "<top level>" : path_);
  if (at > 0) where << " (line " << at << ")";
  throw ConfigError(source_ + ": " + where.str() + ": " + message);
}

std::string ConfigNode::text() const {
  if (!node_.IsDefined() || node_.IsNull()) return "";
  if (node_.IsScalar()) return shorten(node_.Scalar());
  YAML::Emitter out;
  out << YAML::Flow << node_;
  return shorten(out.c_str());
}

ConfigNode ConfigNode::required(const std::string& key) const {
  const ConfigNode child = (*this)[key];
  if (!child.defined()) child.fail("missing required key");
  return child;
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto equals = assignment.find('=');
  SHARDTENSOR_REQUIRE(equals != std::string::npos && equals > 0, "--set",
                      "expected key=value, got '" << assignment << "'");
  const std::string key = assignment.substr(0, equals);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    SHARDTENSOR_FAIL("--set", "cannot parse the value of '" << assignment << "': " << e.msg);
  }
  // Walk the dotted path with fresh node handles: YAML::Node assignment would rebind.
  std::vector<std::string> parts;
  std::stringstream split(key);
  for (std::string part; std::getline(split, part, '.');) {
    SHARDTENSOR_REQUIRE(!part.empty(), "--set", "empty key component in '" << key << "'");
    parts.push_back(part);
  }
  std::vector<YAML::Node> chain{root};
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    SHARDTENSOR_REQUIRE(!next.IsDefined() || next.IsNull() || next.IsMap(), "--set",
                        "'" << parts[i] << "' in '" << key << "' is not a map of keys");
    if (!next.IsDefined() || next.IsNull())
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
    chain.push_back(chain.back()[parts[i]]);
  }
  chain.back()[parts.back()] = value;
}

}  // namespace shardtensor
