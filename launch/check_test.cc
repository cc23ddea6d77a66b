// The check macros throw the right error type with the call site, the process identity and the
// library's own message.
#include "launch/check.h"

#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <string>

namespace rl {
namespace {

bool Contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

TEST_CASE("RL_CHECK_CUDA throws CudaError with the CUDA message, call site and identity") {
  SetProcessIdentity({3, "host-a"});
  try {
    RL_CHECK_CUDA(cudaErrorInvalidValue);
    FAIL("no throw");
  } catch (const CudaError& e) {
    const std::string message = e.what();
    CHECK(Contains(message, "cudaErrorInvalidValue"));
    CHECK(Contains(message, "check_test.cc:"));
    CHECK(Contains(message, "rank 3 on host-a"));
  }
}

TEST_CASE("RL_CHECK_MPI throws CommError naming the failed call") {
  // MPI is not initialised in this process; the message must still be built without MPI.
  try {
    RL_CHECK_MPI(MPI_ERR_COUNT);
    FAIL("no throw");
  } catch (const CommError& e) {
    CHECK(Contains(e.what(), "MPI_ERR_COUNT"));
    CHECK(Contains(e.what(), "MPI error"));
  }
}

TEST_CASE("RL_CHECK_NCCL treats ncclInProgress as success and throws on errors") {
  CHECK_NOTHROW([] { RL_CHECK_NCCL(0); }());
  CHECK_NOTHROW([] { RL_CHECK_NCCL(7); }());
  CHECK_THROWS_AS([] { RL_CHECK_NCCL(4); }(), CommError);
}

TEST_CASE("RL_CHECK throws the given type with the formatted message") {
  try {
    RL_CHECK(1 + 1 == 3, ConfigError, "--lr must be positive, got {}", -1.5);
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) == "--lr must be positive, got -1.5");
  }
  CHECK_NOTHROW([] { RL_CHECK(true, ConfigError, "unused"); }());
}

}  // namespace
}  // namespace rl
