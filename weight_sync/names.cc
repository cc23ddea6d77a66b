#include "weight_sync/names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace rl::weight_sync {

std::string FirstNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kMaxNamesInMessage));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > shown.size()) {
    text += fmt::format(", ... ({} more)", names.size() - shown.size());
  }
  return text;
}

}  // namespace rl::weight_sync
