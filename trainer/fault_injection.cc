#include "trainer/fault_injection.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>

#include "launch/check.h"

namespace rl {
namespace {

struct Fault {
  std::string kind;
  int rank = -1;
  int64_t iteration = -1;
};

Fault ParseFault(const std::string& spec) {
  Fault fault;
  const size_t first = spec.find(':');
  const size_t second = first == std::string::npos ? first : spec.find(':', first + 1);
  bool ok = second != std::string::npos;
  if (ok) {
    fault.kind = spec.substr(0, first);
    char* end = nullptr;
    const std::string rank = spec.substr(first + 1, second - first - 1);
    const std::string iteration = spec.substr(second + 1);
    fault.rank = static_cast<int>(std::strtol(rank.c_str(), &end, 10));
    ok = !rank.empty() && *end == '\0';
    fault.iteration = std::strtoll(iteration.c_str(), &end, 10);
    ok = ok && !iteration.empty() && *end == '\0';
  }
  ok = ok && (fault.kind == "hang" || fault.kind == "kill" || fault.kind == "save_crash" ||
              fault.kind == "exchange_hang");
  RL_CHECK(ok, ConfigError,
           "RL_FAULT='{}': expected KIND:RANK:ITERATION with KIND hang, kill, save_crash or "
           "exchange_hang (e.g. kill:1:2)",
           spec);
  return fault;
}

FaultPoint PointOf(const std::string& kind) {
  if (kind == "save_crash") return FaultPoint::kCheckpointWrite;
  if (kind == "exchange_hang") return FaultPoint::kExpertExchange;
  return FaultPoint::kTrain;
}

// SetFaultContext's; one thread runs the model.
int context_rank = -1;
int64_t context_iteration = -1;

}  // namespace

void SetFaultContext(int rank, int64_t iteration) {
  context_rank = rank;
  context_iteration = iteration;
}

void MaybeInjectFault(FaultPoint point) {
  if (context_rank >= 0) MaybeInjectFault(point, context_rank, context_iteration);
}

void MaybeInjectFault(FaultPoint point, int rank, int64_t iteration) {
  const char* spec = std::getenv("RL_FAULT");
  if (spec == nullptr) return;
  const Fault fault = ParseFault(spec);
  if (PointOf(fault.kind) != point || fault.rank != rank || fault.iteration != iteration) return;
  spdlog::warn("RL_FAULT: rank {} injects '{}' in iteration {}", rank, fault.kind, iteration);
  spdlog::default_logger()->flush();
  if (fault.kind == "kill") {
    std::raise(SIGKILL);
  } else if (fault.kind == "save_crash") {
    _exit(3);
  }
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace rl
