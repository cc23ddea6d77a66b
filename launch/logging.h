// One logger per process (spdlog's default logger), tagged with rank and host.
//
// Progress (info) is printed by rank 0 only; warnings and errors by every rank. Library code logs
// with spdlog::info / spdlog::warn / spdlog::error and never writes to stdout directly. Metrics
// go to their own JSON-lines file, not through here.
#ifndef RL_LAUNCH_LOGGING_H_
#define RL_LAUNCH_LOGGING_H_

#include <string>

namespace rl {

enum class LogVerbosity { kNormal, kDebug };

// Installs the default logger: "[14:55:01.123] [r0 host-a] [info] message" on stderr.
// Idempotent; the last call wins.
void InitLogging(int rank, const std::string& host, LogVerbosity verbosity = LogVerbosity::kNormal);

}  // namespace rl

#endif  // RL_LAUNCH_LOGGING_H_
