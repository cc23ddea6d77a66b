// Timeouts around Split on 4 ranks (Note [Sub-groups]): a sub-group collective that a member
// never joins, and a Split that a parent rank never calls, end with CommError within the timeout
// on the ranks that waited, naming the operation, the group and the missing rank by world rank.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <regex>
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

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("a sub-group collective a member never joins throws CommError naming the group") {
  const MpiSession& session = testing::Session();
  REQUIRE(session.world_size() == 4);
  const int rank = session.rank();
  MpiCommunicator world(session, CommOptions{kTimeout});
  // Pairs {0, 1} and {2, 3}; in each, group rank 1 (world 1, 3) waits for group rank 0 (world 0,
  // 2), which is late. World rank 3 is group rank 1: only world ranks say which process hangs.
  const std::unique_ptr<Communicator> ep = world.Split(rank / 2, rank, "ep");
  REQUIRE(ep->size() == 2);
  if (ep->rank() == 1) {
    at::Tensor t = at::ones({16});
    const auto start = Clock::now();
    std::string message;
    try {
      ep->AllReduce(t, ReduceOp::kSum);
    } catch (const CommError& e) {
      message = e.what();
    }
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    INFO(message);
    CHECK(elapsed >= kTimeout);
    CHECK(elapsed <= kTimeout + kSlack);
    CHECK(Contains(message, "mpi all_reduce(sum) over 'ep' (rank 1 of 2, world rank " +
                                std::to_string(rank) + ", 64 bytes in"));
    CHECK(Contains(message, "timeout of 1000 ms"));
    // Note [Peer probe]: only the group's other member is asked, and it is named by world rank.
    CHECK(Contains(message, fmt::format("waiting for world rank {} (no answer", rank - 1)));
    // The sub-group is aborted: the next call fails at once and still names the group.
    const auto again = Clock::now();
    std::string again_message;
    try {
      ep->Barrier();
    } catch (const CommError& e) {
      again_message = e.what();
    }
    CHECK(Clock::now() - again < milliseconds(100));
    CHECK(Contains(again_message, "mpi barrier over 'ep'"));
  } else {
    // Late beyond the timeout, then complete the orphaned collective so that the waiter's
    // sub-communicator can be freed cleanly. Non-blocking, like the waiter's call.
    std::this_thread::sleep_for(kTimeout + kSlack);
    at::Tensor late = at::ones({16});
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallreduce(MPI_IN_PLACE, late.data_ptr(), 16, MPI_FLOAT, MPI_SUM,
                   dynamic_cast<MpiCommunicator&>(*ep).mpi_comm(), &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  // Aborting the sub-group left the parent usable. The late ranks get here kSlack after the
  // waiters, beyond the timeout: meet untimed first.
  MPI_Barrier(session.world());
  world.Barrier();
}

TEST_CASE("a split a parent rank never calls throws CommError naming the split") {
  const MpiSession& session = testing::Session();
  REQUIRE(session.world_size() == 4);
  const int rank = session.rank();
  constexpr int kLate = 3;
  MpiCommunicator world(session, CommOptions{kTimeout});
  if (rank != kLate) {
    const auto start = Clock::now();
    std::string message;
    try {
      world.Split(rank / 2, rank, "ep");
    } catch (const CommError& e) {
      message = e.what();
    }
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    INFO(message);
    CHECK(elapsed >= kTimeout);
    CHECK(elapsed <= kTimeout + kSlack);
    CHECK(Contains(message, fmt::format("mpi split(color {}, key {}) into 'ep' over 'world'",
                                        rank / 2, rank)));
    CHECK(Contains(message, "timeout of 1000 ms"));
    // The late rank is among the silent ones. Another waiter may be too, when it timed out
    // first and finished its own diagnosis before this rank asked (loaded 2-core machine).
    CHECK(std::regex_search(
        message,
        std::regex(fmt::format(R"(waiting for ranks? ([0-9]+, )*{} \(no answer)", kLate))));
    CHECK_THROWS_AS(world.Barrier(), CommError);  // the parent is aborted
  } else {
    // Join the (color, key) exchange late, as Split's own non-blocking all-gather.
    std::this_thread::sleep_for(kTimeout + kSlack);
    const int64_t mine[2] = {rank / 2, rank};
    int64_t all[8];
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, world.mpi_comm(), &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
}

}  // namespace
}  // namespace rl
