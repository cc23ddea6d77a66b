// A collective that one rank never joins ends with CommError within its timeout on the rank
// that waited, and leaves that communicator aborted; nothing hangs. A timeout too long for
// nanoseconds does not expire at once.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "launch/check.h"
#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"

namespace rl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout = testing::kCommTimeout;
constexpr milliseconds kSlack = testing::kCommSlack;

TEST_CASE("a collective a peer never joins throws CommError within the timeout") {
  const MpiSession& session = testing::Session();
  REQUIRE(session.world_size() >= 2);
  for (int waiter = 0; waiter < 2; ++waiter) {
    CAPTURE(waiter);
    MpiCommunicator comm(session, CommOptions{kTimeout});
    at::Tensor t = at::ones({16});
    if (session.rank() == waiter) {
      const auto start = Clock::now();
      std::string message;
      try {
        comm.AllReduce(t, ReduceOp::kSum);
      } catch (const CommError& e) {
        message = e.what();
      }
      const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
      INFO(message);
      CHECK(elapsed >= kTimeout);
      CHECK(elapsed <= kTimeout + kSlack);
      CHECK(message.find("all_reduce(sum)") != std::string::npos);
      CHECK(message.find("timeout of 1000 ms") != std::string::npos);
      CHECK(message.find("64 bytes") != std::string::npos);
      // Note [Peer probe]: the late peer is asleep, outside any collective, and is named.
      CHECK(message.find(fmt::format("waiting for rank {} (no answer", 1 - waiter)) !=
            std::string::npos);
      // Aborted: the next call fails at once instead of waiting again.
      const auto again = Clock::now();
      CHECK_THROWS_AS(comm.Barrier(), CommError);
      CHECK(Clock::now() - again < milliseconds(100));
    } else if (session.rank() == 1 - waiter) {
      // Play a peer that is late beyond the timeout, then complete the orphaned collective so the
      // waiter's communicator can be freed cleanly at the end of this scope.
      std::this_thread::sleep_for(kTimeout + kSlack);
      at::Tensor late = at::ones({16});
      // Non-blocking, like the waiter's: MPI never matches a blocking with a non-blocking call.
      MPI_Request request = MPI_REQUEST_NULL;
      MPI_Iallreduce(MPI_IN_PLACE, late.data_ptr(), 16, MPI_FLOAT, MPI_SUM, comm.mpi_comm(),
                     &request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
  }
}

// Note [Timeout comparison] (launch/communicator.h): a timeout of 10^10 s is 10^19 ns, beyond
// int64; compared in nanoseconds it wrapped negative and every collective timed out at once.
TEST_CASE("a timeout too long for nanoseconds does not expire at once") {
  const CommOptions huge{milliseconds(int64_t{10'000'000'000'000})};
  CHECK_FALSE(huge.Expired(std::chrono::seconds(1)));
  CHECK_FALSE(huge.Expired(std::chrono::hours(24 * 365)));
  CHECK(CommOptions{milliseconds(1000)}.Expired(milliseconds(1001)));
  CHECK_FALSE(CommOptions{milliseconds(1000)}.Expired(milliseconds(1000)));
  // A collective that rank 1 joins late completes on rank 0, which polled in the meantime.
  const MpiSession& session = testing::Session();
  MpiCommunicator comm(session, huge);
  if (session.rank() == 1) std::this_thread::sleep_for(milliseconds(200));
  at::Tensor t = at::ones({16});
  CHECK_NOTHROW(comm.AllReduce(t, ReduceOp::kSum));
  CHECK(t.sum().item<float>() == 16.0f * session.world_size());
}

}  // namespace
}  // namespace rl
