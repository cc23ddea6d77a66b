// main() for multi-rank Catch2 tests, started by tests/mpi_run.sh under mpirun.
//
// Every rank runs every test case (collectives need all ranks). Each rank reports its own
// failures; the process exit status is non-zero on every rank if any rank failed, so mpirun's
// status reflects the whole job. Tests reach the session through rl::testing::Session().
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include "launch/logging.h"
#include "launch/mpi_session.h"
#include "tests/mpi_test_env.h"

namespace rl::testing {
namespace {
MpiSession* g_session = nullptr;
}
const MpiSession& Session() { return *g_session; }
}  // namespace rl::testing

int main(int argc, char** argv) {
  rl::MpiSession session(&argc, &argv);
  rl::testing::g_session = &session;
  rl::InitLogging(session.rank(), session.host());
  const int local_failures = Catch::Session().run(argc, argv);
  int any_failures = 0;
  MPI_Allreduce(&local_failures, &any_failures, 1, MPI_INT, MPI_MAX, session.world());
  return any_failures != 0 ? 1 : 0;
}
