// Lists of names (tensors, tags) in error messages, cut short so that a wholesale mismatch (every
// tensor of a model) still gives a readable message.
//
// Thread safety: stateless. Failures: none.
#ifndef RL_LAUNCH_NAMES_H_
#define RL_LAUNCH_NAMES_H_

#include <cstddef>
#include <string>
#include <vector>

namespace rl {

// The most names FirstNames shows by default before it summarises the rest.
inline constexpr size_t kMaxNamesInMessage = 10;

// "a, b, c", or "n0, ..., n9, ... (5 more)" past `limit` names.
std::string FirstNames(const std::vector<std::string>& names, size_t limit = kMaxNamesInMessage);

}  // namespace rl

#endif  // RL_LAUNCH_NAMES_H_
