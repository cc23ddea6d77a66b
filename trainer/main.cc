// The trainer binary: one process per rank, started by mpirun (launch/run.sh).
//
// Exit status: 0 on success, 2 on a bad config or flag (the message names the option), 1 on any
// other failure. A failure on one rank ends every rank of the job (MpiSession::AbortJob), so no
// rank is left waiting in a collective.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>

#include "launch/check.h"
#include "launch/communicator.h"
#include "launch/device.h"
#include "launch/logging.h"
#include "launch/mpi_session.h"
#include "trainer/rank_layout.h"

namespace rl {
namespace {

int Run(const MpiSession& session, int argc, char** argv) {
  CLI::App app{"Distributed RL trainer for LLMs: colocated actor and rollout engine per GPU."};
  bool cpu_only = false;
  app.add_flag("--cpu", cpu_only, "Run on the CPU even when GPUs are present.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (session.rank() == 0) app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }

  const c10::Device device = BindDevice(
      session.local_rank(), cpu_only ? DevicePreference::kCpu : DevicePreference::kCudaIfAvailable);
  std::unique_ptr<Communicator> comm = CreateCommunicator(session, device, CommOptions{});
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
  try {
    return rl::Run(session, argc, argv);
  } catch (const rl::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("fatal: {}; ending the job", e.what());
    session.AbortJob(1);
  }
}
