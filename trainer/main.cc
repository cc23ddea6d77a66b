// The trainer binary: one process per rank, started by mpirun (launch/run.sh).
//
// Exit status: 0 on success, 2 on a bad config or flag (every message names the option), 1 on
// any other failure. A failure on one rank ends every rank of the job (MpiSession::AbortJob), so
// no rank is left waiting in a collective.
#include <spdlog/spdlog.h>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "launch/check.h"
#include "launch/communicator.h"
#include "launch/device.h"
#include "launch/logging.h"
#include "launch/mpi_session.h"
#include "trainer/config/config.h"
#include "trainer/config/validate.h"
#include "trainer/rank_layout.h"

namespace rl {
namespace {

constexpr int kExitConfigError = 2;

std::string DescribeDerived(const config::ResolvedConfig& r) {
  return fmt::format(
      "# derived: with_ref = {}, param_buffer_host_backup = {}, check_kl = {}, "
      "check_weight_version = {}, update_weight_buffer_bytes = {}, planned world {} (DP {}, "
      "expert DP {})",
      r.with_ref, r.param_buffer_host_backup, r.check_kl, r.check_weight_version,
      r.update_weight_buffer_bytes, r.planned_world_size, r.planned_dp_size,
      r.planned_expert_dp_size);
}

// Layouts this binary can run today: data parallel only.
void CheckRunnableLayout(const config::Config& c) {
  const auto& p = c.parallel;
  RL_CHECK(p.tensor_model_parallel_size == 1 && p.pipeline_model_parallel_size == 1 &&
               p.context_parallel_size == 1 && p.expert_model_parallel_size == 1 &&
               p.expert_tensor_parallel_size == 1,
           ConfigError,
           "this binary runs data-parallel layouts only (TP = PP = CP = EP = ETP = 1); the recipe "
           "asks for TP {} PP {} CP {} EP {} ETP {}, which --plan can plan but not run. Override "
           "with --tensor-model-parallel-size 1 ... or use a *_4layer_ci recipe",
           p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
           p.expert_model_parallel_size, p.expert_tensor_parallel_size);
}

int Run(const MpiSession& session, const std::vector<std::string>& args) {
  const std::optional<config::CommandLine> command_line =
      config::ParseCommandLine(args, session.rank() == 0 ? std::cout : std::cerr);
  if (!command_line) return 0;  // --help
  const config::ValidationResult validation = config::Validate(command_line->config);
  if (!validation.ok()) {
    std::string message = fmt::format("{} config error(s){}:", validation.errors.size(),
                                      command_line->config_file.empty()
                                          ? ""
                                          : " in " + command_line->config_file);
    for (const std::string& e : validation.errors) message += "\n  " + e;
    throw ConfigError(message);
  }
  const config::ResolvedConfig& resolved = validation.resolved;
  const config::Config& cfg = resolved.config;
  if (command_line->mode == config::Mode::kValidateOnly) {
    if (session.rank() == 0) {
      std::cout << config::DumpToml(cfg) << DescribeDerived(resolved) << "\n";
    }
    return 0;
  }
  if (command_line->mode == config::Mode::kPlan) {
    throw ConfigError("--plan is not available in this build yet");
  }

  InitLogging(session.rank(), session.host(),
              cfg.logging.log_level == "debug" ? LogVerbosity::kDebug : LogVerbosity::kNormal);
  spdlog::info("resolved config{}:\n{}{}",
               command_line->config_file.empty() ? "" : " (from " + command_line->config_file + ")",
               config::DumpToml(cfg), DescribeDerived(resolved));
  CheckRunnableLayout(cfg);

  const DevicePreference preference =
      cfg.run.device == "cpu" ? DevicePreference::kCpu : DevicePreference::kCudaIfAvailable;
  const c10::Device device = BindDevice(session.local_rank(), preference);
  RL_CHECK(cfg.run.device != "cuda" || device.is_cuda(), ConfigError,
           "--device cuda but this host has no CUDA device; use --device auto or cpu");
  std::unique_ptr<Communicator> comm = CreateCommunicator(
      session, device, CommOptions{std::chrono::seconds(cfg.parallel.comm_timeout_s)});
  const std::vector<RankInfo> layout = GatherRankLayout(session, device);
  spdlog::info("rank layout ({} ranks, backend {}):\n{}", session.world_size(), comm->backend(),
               FormatRankLayout(layout));
  comm->Barrier();
  return 0;
}

}  // namespace
}  // namespace rl

int main(int argc, char** argv) {
  rl::MpiSession session(&argc, &argv);
  rl::InitLogging(session.rank(), session.host());
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return rl::Run(session, args);
  } catch (const rl::ConfigError& e) {
    // Every rank parses the same flags and file, so every rank stops here: no rank waits.
    if (session.rank() == 0) spdlog::error("{}", e.what());
    return rl::kExitConfigError;
  } catch (const std::exception& e) {
    spdlog::error("fatal: {}; ending the job", e.what());
    session.AbortJob(1);
  }
}
