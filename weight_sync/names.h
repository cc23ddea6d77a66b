// Lists of tensor names in error messages, cut short so that a wholesale mismatch (every tensor
// of a model) still gives a readable message. Internal to weight_sync/.
//
// Thread safety: stateless. Failures: none.
#ifndef RL_WEIGHT_SYNC_NAMES_H_
#define RL_WEIGHT_SYNC_NAMES_H_

#include <cstddef>
#include <string>
#include <vector>

namespace rl::weight_sync {

// The most names FirstNames shows before it summarises the rest.
inline constexpr size_t kMaxNamesInMessage = 10;

// "a, b, c", or "n0, ..., n9, ... (5 more)" past kMaxNamesInMessage names.
std::string FirstNames(const std::vector<std::string>& names);

}  // namespace rl::weight_sync

#endif  // RL_WEIGHT_SYNC_NAMES_H_
