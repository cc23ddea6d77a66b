// The process's resident memory, for the per-phase memory logs (host side of "what did this
// phase cost"): read from /proc/self/statm, Linux only.
//
// Thread safety: stateless; safe from any thread.
// Failures: throws rl::Error naming /proc/self/statm when it cannot be read or parsed.
#ifndef RL_TRAINER_MEMORY_PROCESS_MEMORY_H_
#define RL_TRAINER_MEMORY_PROCESS_MEMORY_H_

#include <cstdint>

namespace rl::memory {

// Resident set size in bytes (statm's second field times the page size). Pinned host buffers
// count once touched; a paused CPU region does not count.
int64_t ProcessRssBytes();

}  // namespace rl::memory

#endif  // RL_TRAINER_MEMORY_PROCESS_MEMORY_H_
