// What multi-rank tests get from tests/mpi_catch_main.cc.
#ifndef RL_TESTS_MPI_TEST_ENV_H_
#define RL_TESTS_MPI_TEST_ENV_H_

#include <chrono>

#include "launch/mpi_session.h"

namespace rl::testing {
const MpiSession& Session();

// The timeout tests' communicator timeout, and how late after it the error may come (polling
// granularity and a loaded 2-core machine).
inline constexpr std::chrono::milliseconds kCommTimeout(1000);
inline constexpr std::chrono::milliseconds kCommSlack(1500);
}  // namespace rl::testing

#endif  // RL_TESTS_MPI_TEST_ENV_H_
