// Collectives of the MPI backend on several CPU ranks, with exact-by-construction data: small
// integers stored in float, bf16 and int64 tensors, so every expected value is exact and the
// comparisons are equality, not tolerance. Runs at 2 ranks (comm_collectives_test) and 4
// (comm_collectives_np4_test): at 2 the splits below make the whole world and single ranks, at
// 4 pairs and strided pairs.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "launch/check.h"
#include "launch/mpi_communicator.h"
#include "tests/all_to_all_rows.h"
#include "tests/mpi_test_env.h"

namespace rl {
namespace {

using testing::ExchangeAndCheck;
using testing::NoRows;
using testing::RowsSent;

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

TEST_CASE("all_to_all delivers each source's rows in rank order, uneven counts and zeros") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  for (at::ScalarType type : kTypes) {
    ExchangeAndCheck(comm, type, RowsSent);
    ExchangeAndCheck(comm, type, NoRows);  // zero rows in total: empty tensors on every rank
  }
}

TEST_CASE("all_to_all refuses bad arguments on the calling rank before any rank waits") {
  MpiCommunicator comm(testing::Session(), CommOptions{});
  const int size = comm.size();
  const std::vector<int64_t> ones(size, 1);
  const at::Tensor rows = at::zeros({size, 3});
  const at::Tensor out = at::zeros({size, 3});
  CHECK_THROWS_AS(comm.AllToAll(rows, std::vector<int64_t>(size - 1, 1), out, ones), Error);
  CHECK_THROWS_AS(comm.AllToAll(rows, ones, out, std::vector<int64_t>(size + 1, 1)), Error);
  std::vector<int64_t> negative(size, 1);
  negative[0] = -1;
  negative[size - 1] += 2;
  CHECK_THROWS_AS(comm.AllToAll(rows, negative, out, ones), Error);
  CHECK_THROWS_AS(comm.AllToAll(rows, ones, at::zeros({size + 1, 3}), ones), Error);
  CHECK_THROWS_AS(comm.AllToAll(rows, ones, at::zeros({size, 3}, at::kDouble), ones), Error);
  CHECK_THROWS_AS(comm.AllToAll(rows, ones, at::zeros({size, 4}), ones), Error);
  CHECK_THROWS_AS(comm.AllToAll(rows, ones, rows, ones), Error);  // not in place
  CHECK_THROWS_AS(comm.AllToAll(at::zeros({3, size}).t(), ones, out, ones), Error);
  // The communicator is still usable afterwards.
  ExchangeAndCheck(comm, at::kFloat, RowsSent);
}

// The world ranks of this rank's group when the world splits into consecutive pairs
// (color rank / 2) or strided groups (color rank % 2).
std::vector<int> PairOf(int rank) { return {rank / 2 * 2, rank / 2 * 2 + 1}; }
std::vector<int> StridedOf(int rank, int size) {
  std::vector<int> members;
  for (int r = rank % 2; r < size; r += 2) members.push_back(r);
  return members;
}

// A sub-group's rank, size, all_reduce and all_to_all reach exactly `members` (world ranks).
void CheckGroup(Communicator& group, const std::vector<int>& members, int world_rank) {
  CAPTURE(group.name(), world_rank);
  CHECK(group.backend() == "mpi");
  REQUIRE(group.size() == static_cast<int>(members.size()));
  CHECK(group.rank() == std::find(members.begin(), members.end(), world_rank) - members.begin());
  int64_t member_sum = 0;
  for (int member : members) member_sum += member + 1;
  for (at::ScalarType type : {at::kFloat, at::kLong}) {
    at::Tensor t = at::full({5}, world_rank + 1, at::TensorOptions().dtype(type));
    group.AllReduce(t, ReduceOp::kSum);
    CHECK(at::equal(t, at::full({5}, member_sum, at::TensorOptions().dtype(type))));
  }
  for (at::ScalarType type : kTypes) ExchangeAndCheck(group, type, RowsSent);
}

TEST_CASE("split into consecutive pairs and strided groups reaches exactly the members") {
  MpiCommunicator world(testing::Session(), CommOptions{});
  const int size = world.size();
  const int rank = world.rank();
  REQUIRE(size % 2 == 0);
  const std::unique_ptr<Communicator> ep = world.Split(rank / 2, rank, "ep");
  const std::unique_ptr<Communicator> edp = world.Split(rank % 2, rank, "edp");
  CHECK(ep->name() == "ep");
  CHECK(edp->name() == "edp");
  // Interleaved with each other and with the parent, as expert parallelism uses them.
  CheckGroup(*ep, PairOf(rank), rank);
  CheckGroup(*edp, StridedOf(rank, size), rank);
  ExchangeAndCheck(world, at::kFloat, RowsSent);
  CheckGroup(*ep, PairOf(rank), rank);
}

TEST_CASE("split ranks by key, ties by parent rank") {
  MpiCommunicator world(testing::Session(), CommOptions{});
  const int size = world.size();
  const int rank = world.rank();
  const std::unique_ptr<Communicator> reversed = world.Split(0, size - 1 - rank, "reversed");
  CHECK(reversed->rank() == size - 1 - rank);
  CHECK(reversed->size() == size);
  const std::unique_ptr<Communicator> ties = world.Split(rank % 2, 0, "ties");
  CHECK(ties->rank() == rank / 2);
  // The reversed group's rank r is world rank size-1-r: a broadcast from its rank 0 carries
  // world rank size-1's value.
  at::Tensor t = at::full({3}, rank, at::kLong);
  reversed->Broadcast(t, 0);
  CHECK(at::equal(t, at::full({3}, size - 1, at::kLong)));
}

TEST_CASE("a split of a split, and a child that outlives its parent") {
  std::unique_ptr<Communicator> single;
  std::unique_ptr<Communicator> ep;
  {
    MpiCommunicator world(testing::Session(), CommOptions{});
    ep = world.Split(world.rank() / 2, world.rank(), "ep");
    single = ep->Split(ep->rank(), 0, "single");
  }
  CHECK(single->size() == 1);
  CHECK(single->rank() == 0);
  at::Tensor t = at::full({2}, 7.0);
  single->AllReduce(t, ReduceOp::kSum);
  CHECK(at::equal(t, at::full({2}, 7.0)));
  ExchangeAndCheck(*single, at::kBFloat16, RowsSent);
  CheckGroup(*ep, PairOf(testing::Session().rank()), testing::Session().rank());
}

TEST_CASE("a negative color on one rank is refused on every rank, and the parent stays usable") {
  MpiCommunicator world(testing::Session(), CommOptions{});
  const int last = world.size() - 1;
  std::string message;
  try {
    world.Split(world.rank() == last ? -1 : 0, 0, "bad");
  } catch (const CommError& e) {
    FAIL("a bad color must not abort the parent: " << e.what());
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(fmt::format("rank {} (world rank {}) passed color -1", last, last)) !=
        std::string::npos);
  CHECK_THROWS_AS(world.Split(0, 0, ""), Error);  // a nameless group, refused before waiting
  world.Barrier();
}

}  // namespace
}  // namespace rl
