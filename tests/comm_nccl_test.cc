// The NCCL backend's AllToAll and Split on GPU ranks, one GPU per rank, with the exact data of
// tests/all_to_all_rows.h. Skips loudly when this host has fewer CUDA devices than ranks (NCCL
// refuses two ranks on one device). On one GPU (mpirun -np 1) it still runs the split and
// all-to-all paths: non-blocking ncclCommSplit, a group of send/receive to itself, empty rows.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "launch/check.h"
#include "launch/communicator.h"
#include "launch/mpi_session.h"
#include "tests/all_to_all_rows.h"
#include "tests/mpi_test_env.h"

namespace rl {
namespace {

using testing::ExchangeAndCheck;
using testing::NoRows;
using testing::RowsSent;

// Every rank decides alike on one host: skip unless each local rank has a device of its own.
bool HaveGpuPerRankOrWarn(const MpiSession& session) {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count >= session.local_size();
  cudaGetLastError();
  if (!ok) {
    WARN("SKIPPED: " << count << " CUDA devices for " << session.local_size()
                     << " local ranks; the NCCL communicator tests did not run");
    SUCCEED();
  }
  return ok;
}

c10::Device DeviceOf(const MpiSession& session) {
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(session.local_rank())};
}

TEST_CASE("nccl all_to_all and split move exactly each source's rows") {
  const MpiSession& session = testing::Session();
  if (!HaveGpuPerRankOrWarn(session)) return;
  const c10::Device device = DeviceOf(session);
  const std::unique_ptr<Communicator> world =
      CreateCommunicator(session, device, CommOptions{std::chrono::seconds(60)});
  REQUIRE(world->backend() == "nccl");
  const int rank = world->rank();
  for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kLong}) {
    ExchangeAndCheck(*world, type, RowsSent, device);
    ExchangeAndCheck(*world, type, NoRows, device);
  }

  const std::unique_ptr<Communicator> ep = world->Split(rank / 2, rank, "ep");
  const int pair_size = std::min(2, world->size() - rank / 2 * 2);
  CHECK(ep->name() == "ep");
  CHECK(ep->size() == pair_size);
  CHECK(ep->rank() == rank % 2);
  at::Tensor t = at::full({4}, rank + 1, at::TensorOptions().dtype(at::kFloat).device(device));
  ep->AllReduce(t, ReduceOp::kSum);
  const int first = rank / 2 * 2;
  const double pair_sum = pair_size == 2 ? 2 * first + 3 : first + 1;
  CHECK(at::equal(t.cpu(), at::full({4}, pair_sum)));
  ExchangeAndCheck(*ep, at::kBFloat16, RowsSent, device);

  const std::unique_ptr<Communicator> reversed =
      world->Split(0, world->size() - 1 - rank, "reversed");
  CHECK(reversed->rank() == world->size() - 1 - rank);
  ExchangeAndCheck(*reversed, at::kFloat, RowsSent, device);

  // Argument errors name the group and leave it usable.
  std::string message;
  try {
    ep->AllToAll(at::zeros({1, 3}, t.options()), {1}, at::zeros({1, 3}, t.options()), {1, 0, 0});
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("nccl all_to_all over 'ep'") != std::string::npos);
  CHECK_THROWS_AS(world->Split(rank == 0 ? -1 : 0, 0, "bad"), Error);
  ep->Barrier();
  world->Barrier();
}

}  // namespace
}  // namespace rl
