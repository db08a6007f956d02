#pragma once
// closest_name: the accepted name a misspelled one was probably meant to be, for "did you
// mean" hints in configuration errors.

#include <algorithm>
#include <string>
#include <vector>

namespace shardtensor {

/// Levenshtein distance between two strings.
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// The candidate nearest to `name` if it is close enough to be a typo (at most 2 edits, or
/// a third of the name's length), else "".
inline std::string closest_name(const std::string& name,
                                const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(name, c);
    if (d < best_distance) best_distance = d, best = c;
  }
  return best_distance <= std::max<std::size_t>(2, name.size() / 3) ? best : "";
}

}  // namespace shardtensor
