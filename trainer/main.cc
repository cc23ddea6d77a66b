// The trainer binary: one process per rank, started by mpirun (launch/run.sh).
//
// Exit status: 0 on success, 2 on a bad config or flag (every message names the option), 1 on
// any other failure. A failure on one rank ends every rank of the job (MpiSession::AbortJob), so
// no rank is left waiting in a collective; a config error found once MPI is up ends it with
// status 2 (Note [Config errors after MPI]).
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launch/atomic_file.h"
#include "launch/check.h"
#include "launch/communicator.h"
#include "launch/device.h"
#include "launch/json.h"
#include "launch/logging.h"
#include "launch/mpi_session.h"
#include "trainer/colocated_loop.h"
#include "trainer/config/config.h"
#include "trainer/config/validate.h"
#include "trainer/engine_rollout.h"
#include "trainer/memory/region_manager.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/model_config.h"
#include "trainer/parallel_groups.h"
#include "trainer/plan.h"
#include "trainer/rank_layout.h"
#include "trainer/rollout.h"

namespace rl {
namespace {

constexpr int kExitConfigError = 2;

std::string DescribeDerived(const config::ResolvedConfig& r) {
  return fmt::format(
      "# derived: with_ref = {}, param_buffer_host_backup = {}, check_kl = {}, "
      "check_weight_version = {}, update_weight_buffer_bytes = {}, planned world {} (DP {}, "
      "expert DP {})",
      r.with_ref, r.param_buffer_host_backup, config::NameOf(r.check_kl), r.check_weight_version,
      r.update_weight_buffer_bytes, r.planned_world_size, r.planned_dp_size,
      r.planned_expert_dp_size);
}

// The architecture: --model-config FILE, else the config.json of --hf-checkpoint.
model::ModelConfig LoadArchitecture(const config::ModelOptions& options) {
  if (!options.model_config.empty()) {
    return model::ParseModelConfig(json::ParseFile(options.model_config), options.model_config);
  }
  return model::LoadModelConfig(options.hf_checkpoint);
}

// Throws ConfigError with `header` and one indented line per problem, when there is any.
void RefuseIfAny(const std::string& header, const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string message = header;
  for (const std::string& problem : problems) message += "\n  " + problem;
  throw ConfigError(message);
}

// What this binary can run today: only the one value it implements of the options that --plan
// knows about but the trainer does not implement otherwise yet (--help marks them). Full-scale
// recipes validate and plan; running them stops here, naming what to change. The rank grid's
// checks follow once the number of ranks is known (Note [Runnable today] in trainer/plan.h).
void CheckRunnable(const config::Config& c) {
  RefuseIfAny(
      "the recipe validates but this binary cannot run it: not implemented yet (override these "
      "options, or use a *_4layer_ci recipe):",
      config::NotRunnable(c));
}

// --metrics-out names a file in a writable directory. Only world rank 0 writes it (MetricsWriter,
// opened after the model is built), so only rank 0 checks, in the config stage: a missing
// directory stops the job at once rather than after start-up. What the directory cannot tell (the
// file itself cannot be opened) is found when it is opened (Note [Config errors after MPI]).
void CheckMetricsDirectory(const config::LoggingOptions& logging) {
  if (logging.metrics_out.empty()) return;
  const std::string dir = ParentDirectory(logging.metrics_out);
  struct stat status {};
  std::string problem;
  if (::stat(dir.c_str(), &status) != 0) {
    problem = ErrnoText();
  } else if (!S_ISDIR(status.st_mode)) {
    problem = "not a directory";
  } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    problem = ErrnoText();
  }
  RL_CHECK(problem.empty(), ConfigError,
           "--metrics-out {}: the directory {} cannot take the file ({}); create it or choose "
           "another path",
           logging.metrics_out, dir, problem);
}

// The rank before MPI is initialised, from the launcher's environment (0 when run directly), so
// that the config stage, which needs no MPI, prints once per job.
int LauncherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// What the config stage gives the run: the resolved config and the architecture.
struct StageResult {
  config::ResolvedConfig resolved;
  model::ModelConfig model;
};

// The config stage: flags, recipe and the model's config.json to a resolved config and an
// architecture, or an exception (exit 2). Returns nullopt when the run ends here (--help,
// --validate-only, --plan).
std::optional<StageResult> ConfigStage(const std::vector<std::string>& args, bool print) {
  std::ostringstream sink;
  std::ostream& out = print ? std::cout : sink;
  const std::optional<config::CommandLine> command_line = config::ParseCommandLine(args, out);
  if (!command_line) return std::nullopt;  // --help
  const config::ValidationResult validation = config::Validate(command_line->config);
  RefuseIfAny(
      fmt::format("{} config error(s){}:", validation.errors.size(),
                  command_line->config_file.empty() ? "" : " in " + command_line->config_file),
      validation.errors);
  const config::ResolvedConfig& resolved = validation.resolved;
  switch (command_line->mode) {
    case config::Mode::kValidateOnly:
      out << config::DumpToml(resolved.config) << DescribeDerived(resolved) << "\n";
      return std::nullopt;
    case config::Mode::kPlan: {
      const model::ModelConfig model = LoadArchitecture(resolved.config.model);
      out << FormatPlan(resolved, model, PlanMemory(resolved, model));
      return std::nullopt;
    }
    case config::Mode::kRun:
      break;
  }
  spdlog::info("resolved config{}:\n{}{}",
               command_line->config_file.empty() ? "" : " (from " + command_line->config_file + ")",
               config::DumpToml(resolved.config), DescribeDerived(resolved));
  CheckRunnable(resolved.config);
  if (print) CheckMetricsDirectory(resolved.config.logging);  // world rank 0
  // Read here, before MPI, so that a bad config.json stops every rank with status 2 as a bad
  // flag does, instead of ending the job from inside the run.
  return StageResult{resolved, LoadArchitecture(resolved.config.model)};
}

int Run(const MpiSession& session, const config::ResolvedConfig& resolved,
        model::ModelConfig model) {
  const config::Config& cfg = resolved.config;
  InitLogging(session.rank(), session.host(),
              cfg.logging.log_level == config::LogLevel::kDebug ? LogVerbosity::kDebug
                                                                 : LogVerbosity::kNormal);
  const DevicePreference preference =
      cfg.run.device == config::Device::kCpu ? DevicePreference::kCpu
                                             : DevicePreference::kCudaIfAvailable;
  const c10::Device device = BindDevice(session.local_rank(), preference);
  RL_CHECK(cfg.run.device != config::Device::kCuda || device.is_cuda(), ConfigError,
           "--device cuda but this host has no CUDA device; use --device auto or cpu");
  std::unique_ptr<Communicator> comm = CreateCommunicator(
      session, device, CommOptions{std::chrono::seconds(cfg.parallel.comm_timeout_s)});
  const std::vector<RankInfo> layout = GatherRankLayout(session, device);
  spdlog::info("rank layout ({} ranks, backend {}):\n{}", session.world_size(), comm->backend(),
               FormatRankLayout(layout));
  // Note [Runnable today]: the rank grid's checks, the same --plan makes for the planned world,
  // before any rank builds its model or generates (every DP rank trains on an equal share of
  // each step).
  RefuseIfAny("this binary cannot run the recipe on these ranks:",
              LayoutProblems(cfg, model, session.world_size(), "mpirun -np"));
  // Note [Rank grid]: the tensor- and expert-parallel groups, and this rank's slices and experts.
  const ParallelGroups groups(*comm, static_cast<int>(cfg.parallel.tensor_model_parallel_size),
                              static_cast<int>(cfg.parallel.expert_model_parallel_size));
  if (groups.tp_size() > 1) {
    // Note [Tensor shard]: ListParams checks that the heads and features divide.
    model.tensor_shard = groups.tensor_shard();
    spdlog::info("parallel layout: {}; this rank holds tensor-parallel slice {} of {}",
                 groups.Describe(), groups.tp_rank(), groups.tp_size());
  }
  if (groups.ep_size() > 1) {
    model.expert_shard = groups.expert_shard();
    spdlog::info("parallel layout: {}; this rank holds experts [{}, {}) of every MoE layer",
                 groups.Describe(), model.first_local_expert(),
                 model.first_local_expert() + model.local_experts());
  }
  // The process's regions, actor's and engine's; CI runs poison fresh pages.
  memory::RegionManager regions(
      device, cfg.checks.ci_test ? memory::FreshPages::kPoison : memory::FreshPages::kAsMapped);
  std::unique_ptr<Rollout> rollout;
  if (!cfg.colocate.debug_train_only) {
    rollout = cfg.data.load_debug_rollout_data.empty()
                  ? MakeEngineRollout(resolved, model, groups, device, regions)
                  : MakeReplayRollout(resolved);
  }
  try {
    RunColocated(resolved, model, groups, device, regions, std::move(rollout));
    comm->Barrier();
  } catch (const CommError& e) {
    // End the job now, while the communicator (and its pending collective) still exists: a peer
    // is dead or hung, so waiting for anything else would only delay the end.
    spdlog::error("fatal: {}; ending the job", e.what());
    session.AbortJob(1);
  }
  return 0;
}

}  // namespace
}  // namespace rl

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int launcher_rank = rl::LauncherRank();
  rl::InitLogging(launcher_rank, rl::HostName());
  std::optional<rl::StageResult> stage;
  try {
    stage = rl::ConfigStage(args, launcher_rank == 0);
  } catch (const rl::Error& e) {
    // A bad flag, key, value or model config. Every rank parses the same flags and files, so
    // every rank stops here, before MPI exists, and rank 0 says why; the one check of rank 0
    // alone (--metrics-out's directory) stops it here while the others go on into MPI_Init,
    // and mpirun ends the job when rank 0 exits with 2 (Note [Config errors after MPI]).
    if (launcher_rank == 0) spdlog::error("{}", e.what());
    return rl::kExitConfigError;
  } catch (const std::exception& e) {
    // Whatever else the config stage throws (std::bad_alloc, std::length_error from a value no
    // rule caught) comes from the flags or the files it read: the same status and the same
    // ending, with what failed, rather than an abort.
    if (launcher_rank == 0) {
      spdlog::error(
          "the config stage failed reading the flags, the recipe or the model's "
          "config.json: {}",
          e.what());
    }
    return rl::kExitConfigError;
  }
  if (!stage) return 0;

  rl::MpiSession session(&argc, &argv);
  try {
    return rl::Run(session, stage->resolved, std::move(stage->model));
  } catch (const rl::ConfigError& e) {
    // Note [Config errors after MPI]: once MPI is up a config error may be found by one rank
    // alone (rank 0 opening --metrics-out, a rank's share of the data), while the others go on
    // into a collective that would wait for it until --comm-timeout-s and end the job with status
    // 1 from the wrong rank. So the rank that found it says why and ends the whole job with
    // status 2; a rule every rank checks is printed by each of them. Alone, it just returns.
    spdlog::error("{}", e.what());
    if (session.world_size() == 1) return rl::kExitConfigError;
    session.AbortJob(rl::kExitConfigError);
  } catch (const std::exception& e) {
    spdlog::error("fatal: {}; ending the job", e.what());
    session.AbortJob(1);
  }
}
