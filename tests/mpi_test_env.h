// What multi-rank tests get from tests/mpi_catch_main.cc.
#ifndef RL_TESTS_MPI_TEST_ENV_H_
#define RL_TESTS_MPI_TEST_ENV_H_

#include "launch/mpi_session.h"

namespace rl::testing {
const MpiSession& Session();
}  // namespace rl::testing

#endif  // RL_TESTS_MPI_TEST_ENV_H_
