// Collectives of the MPI backend on several CPU ranks, with exact-by-construction data: small
// integers stored in float, bf16 and int64 tensors, so every expected value is exact and the
// comparisons are equality, not tolerance.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <vector>

#include "launch/check.h"
#include "launch/mpi_communicator.h"
#include "tests/mpi_test_env.h"

namespace rl {
namespace {

// Element j of rank r's contribution: an integer at most 2*size*13, exact in bf16 for size <= 4.
double Value(int size, int rank, int64_t j) { return size * (rank + 1) * ((j % 13) + 1); }

at::Tensor Contribution(int size, int rank, int64_t numel, at::ScalarType type) {
  std::vector<double> values(numel);
  for (int64_t j = 0; j < numel; ++j) values[j] = Value(size, rank, j);
  return at::tensor(values, at::kDouble).to(type);
}

double SumOverRanks(int size, int64_t j) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += Value(size, r, j);
  return sum;
}


const std::vector<int64_t> kShardSizes = {0, 1, 7, 1023};
const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kBFloat16, at::kLong};

TEST_CASE("all_gather out of place fills every shard from its rank") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const int size = comm.size();
  for (at::ScalarType type : kTypes) {
    for (int64_t n : kShardSizes) {
      const at::Tensor shard = Contribution(size, comm.rank(), n, type);
      const at::Tensor buffer = at::full({size * n}, -1, at::TensorOptions().dtype(type));
      comm.AllGather(shard, buffer);
      for (int r = 0; r < size; ++r) {
        CAPTURE(c10::toString(type), n, r);
        CHECK(at::equal(buffer.narrow(0, r * n, n), Contribution(size, r, n, type)));
      }
    }
  }
}

TEST_CASE("all_gather in place fills the other shards and keeps this rank's") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const int size = comm.size();
  for (at::ScalarType type : kTypes) {
    for (int64_t n : kShardSizes) {
      const at::Tensor buffer = at::full({size * n}, -1, at::TensorOptions().dtype(type));
      buffer.narrow(0, comm.rank() * n, n).copy_(Contribution(size, comm.rank(), n, type));
      comm.AllGatherInPlace(buffer);
      for (int r = 0; r < size; ++r) {
        CAPTURE(c10::toString(type), n, r);
        CHECK(at::equal(buffer.narrow(0, r * n, n), Contribution(size, r, n, type)));
      }
    }
  }
}

TEST_CASE("reduce_scatter sums and means, out of place and in place") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const int size = comm.size();
  const int rank = comm.rank();
  for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    for (int64_t n : kShardSizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        std::vector<double> expected(n);
        for (int64_t i = 0; i < n; ++i) {
          const double sum = SumOverRanks(size, rank * n + i);
          expected[i] = op == ReduceOp::kSum ? sum : sum / size;
        }
        const at::Tensor want = at::tensor(expected, at::kDouble).to(type);
        CAPTURE(c10::toString(type), n, ToString(op));

        const at::Tensor buffer = Contribution(size, rank, size * n, type);
        const at::Tensor shard = at::full({n}, -1, at::TensorOptions().dtype(type));
        comm.ReduceScatter(buffer, shard, op);
        CHECK(at::equal(shard, want));

        const at::Tensor in_place = Contribution(size, rank, size * n, type);
        comm.ReduceScatter(in_place, in_place.narrow(0, rank * n, n), op);
        CHECK(at::equal(in_place.narrow(0, rank * n, n), want));
      }
    }
  }
}

TEST_CASE("all_reduce sum, mean and max") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const int size = comm.size();
  for (int64_t n : kShardSizes) {
    std::vector<double> sum(n), max(n);
    for (int64_t j = 0; j < n; ++j) {
      sum[j] = SumOverRanks(size, j);
      max[j] = Value(size, size - 1, j);
    }
    for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kDouble}) {
      CAPTURE(n, c10::toString(type));
      at::Tensor t = Contribution(size, comm.rank(), n, type);
      comm.AllReduce(t, ReduceOp::kSum);
      CHECK(at::equal(t, at::tensor(sum, at::kDouble).to(type)));
      t = Contribution(size, comm.rank(), n, type);
      comm.AllReduce(t, ReduceOp::kMean);
      CHECK(at::equal(t, (at::tensor(sum, at::kDouble) / size).to(type)));
      t = Contribution(size, comm.rank(), n, type);
      comm.AllReduce(t, ReduceOp::kMax);
      CHECK(at::equal(t, at::tensor(max, at::kDouble).to(type)));
    }
    at::Tensor ints = Contribution(size, comm.rank(), n, at::kLong);
    comm.AllReduce(ints, ReduceOp::kSum);
    CHECK(at::equal(ints, at::tensor(sum, at::kDouble).to(at::kLong)));
  }
}

TEST_CASE("broadcast copies the root's tensor to every rank") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  for (int root = 0; root < comm.size(); ++root) {
    for (int64_t n : kShardSizes) {
      for (at::ScalarType type : kTypes) {
        at::Tensor t = Contribution(comm.size(), comm.rank(), n, type);
        comm.Broadcast(t, root);
        CAPTURE(root, n, c10::toString(type));
        CHECK(at::equal(t, Contribution(comm.size(), root, n, type)));
      }
    }
  }
  comm.Barrier();
}

TEST_CASE("wrong shapes are refused on the calling rank before any rank waits") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const int size = comm.size();
  const at::Tensor shard = at::zeros({3});
  // A buffer whose size is not size * shard: every rank refuses identically, nobody waits.
  CHECK_THROWS_AS(comm.AllGather(shard, at::zeros({3 * size + 1})), Error);
  CHECK_THROWS_AS(comm.ReduceScatter(at::zeros({3 * size + 1}), shard, ReduceOp::kSum), Error);
  CHECK_THROWS_AS(comm.AllGather(shard, at::zeros({3 * size}, at::kDouble)), Error);
  CHECK_THROWS_AS(comm.AllReduce(at::zeros({4}, at::kLong), ReduceOp::kMean), Error);
  CHECK_THROWS_AS(comm.Broadcast(shard, size), Error);
  if (size > 1) {
    CHECK_THROWS_AS(comm.AllGatherInPlace(at::zeros({size + 1})), Error);
  }
  // The communicator is still usable afterwards.
  comm.Barrier();
}

}  // namespace
}  // namespace rl
