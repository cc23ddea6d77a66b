#include "launch/names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace rl {

std::string FirstNames(const std::vector<std::string>& names, size_t limit) {
  const std::vector<std::string> shown(names.begin(),
                                       names.begin() + std::min(names.size(), limit));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > shown.size()) {
    text += fmt::format(", ... ({} more)", names.size() - shown.size());
  }
  return text;
}

}  // namespace rl
