#include "launch/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

namespace rl {

void InitLogging(int rank, const std::string& host, LogVerbosity verbosity) {
  auto logger = std::make_shared<spdlog::logger>(
      "rl", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [r{} {}] [%l] %v", rank, host));
  const spdlog::level::level_enum progress_level =
      verbosity == LogVerbosity::kDebug ? spdlog::level::debug : spdlog::level::info;
  logger->set_level(rank == 0 ? progress_level : spdlog::level::warn);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace rl
